// Helpers the grammar tests share.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/json_grammar.h"

namespace moeserve::grammar::test_util {

// UTF-8 of a code point (written here independently of the compilers' encoders).
inline std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// The UserError message JsonSchema::compile gives for a schema text, or "no UserError".
inline std::string schema_error(std::string_view schema_text) {
  try {
    JsonSchema::compile(nlohmann::ordered_json::parse(schema_text));
  } catch (const moeserve::UserError& e) {
    return e.what();
  }
  return "no UserError";
}

}  // namespace moeserve::grammar::test_util

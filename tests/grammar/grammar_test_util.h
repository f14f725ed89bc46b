// Helpers the grammar tests share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>
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

constexpr size_t kAll = std::string::npos;

// Feeds `text` to a matcher byte by byte: the index of the first byte rejected, or kAll.
template <class Matcher>
size_t first_rejected(Matcher& m, std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i)
    if (!m.feed(static_cast<unsigned char>(text[i]))) return i;
  return kAll;
}

// An invalid document: accepted up to byte `at`, which is rejected.
inline ::testing::AssertionResult rejected_at(const std::shared_ptr<const JsonSchema>& s, std::string_view text,
                                              size_t at) {
  JsonMatcher m(s);
  const size_t got = first_rejected(m, text);
  if (got == at) return ::testing::AssertionSuccess();
  auto f = ::testing::AssertionFailure() << text << ": expected byte " << at << " rejected, got ";
  if (got == kAll) return f << "all accepted (complete: " << m.can_finish() << ")";
  return f << "byte " << got << " ('" << text[got] << "')";
}

// The bytes a matcher (JsonMatcher, RegexMatcher) accepts next, in order.
template <class Matcher>
std::vector<unsigned char> accepted_bytes(const Matcher& m) {
  std::vector<unsigned char> ok;
  for (int c = 0; c < 256; ++c) {
    Matcher x = m;
    if (x.feed(static_cast<unsigned char>(c))) ok.push_back(static_cast<unsigned char>(c));
  }
  return ok;
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

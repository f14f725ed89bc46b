// Typed access to tokenizer.json fields with errors a user can act on (the file and the field are named).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/pattern.h"

namespace moeserve::tok::json_util {

inline const nlohmann::json& field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object()) throw_user("{}: expected a JSON object, got {}", where, j.type_name());
  auto it = j.find(key);
  if (it == j.end()) throw_user("{}: missing field '{}'", where, key);
  return *it;
}

template <typename T>
T get(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  try {
    return v.get<T>();
  } catch (const nlohmann::json::exception&) {
    throw_user("{}: field '{}' has the wrong type ({})", where, key, v.type_name());
  }
}

template <typename T>
T get_or(const nlohmann::json& j, const char* key, T fallback, const std::string& where) {
  if (!j.is_object()) throw_user("{}: expected a JSON object, got {}", where, j.type_name());
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw_user("{}: field '{}' has the wrong type ({})", where, key, it->type_name());
  }
}

inline std::string type_of(const nlohmann::json& j, const std::string& where) {
  return get<std::string>(j, "type", where);
}

// A Split / Replace "pattern": {"String": "..."} or {"Regex": "..."}.
inline std::unique_ptr<Pattern> pattern(const nlohmann::json& j, const std::string& where) {
  const nlohmann::json& p = field(j, "pattern", where);
  if (p.is_object() && p.contains("String")) return make_literal_pattern(get<std::string>(p, "String", where));
  if (p.is_object() && p.contains("Regex")) return make_regex_pattern(get<std::string>(p, "Regex", where), where);
  throw_user("{}: 'pattern' must be {{\"String\": ...}} or {{\"Regex\": ...}}", where);
}

}  // namespace moeserve::tok::json_util

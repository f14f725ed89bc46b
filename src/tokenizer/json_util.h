// Typed access to tokenizer.json fields with errors a user can act on (the file and the field are named).
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

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
struct is_vector : std::false_type {};
template <typename U>
struct is_vector<std::vector<U>> : std::true_type {};

// v as T, where an integer must fit T: nlohmann's get<> wraps or casts out-of-range numbers silently (and a
// float past the range is undefined behaviour), which fuzzing turned into bogus ids.
template <typename T>
T convert(const nlohmann::json& v, const char* key, const std::string& where) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    bool ok = false;
    if (v.is_number_unsigned()) ok = v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max());
    else if (v.is_number_integer()) ok = v.get<int64_t>() >= int64_t(std::numeric_limits<T>::min()) &&
                                         v.get<int64_t>() <= int64_t(std::numeric_limits<T>::max());
    else if (v.is_number_float()) {
      double d = v.get<double>();
      // Upper bound 2^digits, exact as a double: double(max()) of a 64-bit T rounds up to 2^64 (UB for T(d)).
      ok = d == std::floor(d) && d >= double(std::numeric_limits<T>::min()) &&
           d < std::ldexp(1.0, std::numeric_limits<T>::digits);
      if (ok) return T(d);
    }
    if (!ok) throw_user("{}: field '{}' must be an integer in range, got {}", where, key, v.dump());
    return v.get<T>();
  } else if constexpr (is_vector<T>::value) {
    if (!v.is_array()) throw_user("{}: field '{}' must be a list, got {}", where, key, v.type_name());
    T out;
    for (const auto& e : v) out.push_back(convert<typename T::value_type>(e, key, where));
    return out;
  } else {
    try {
      return v.get<T>();
    } catch (const nlohmann::json::exception&) {
      throw_user("{}: field '{}' has the wrong type ({})", where, key, v.type_name());
    }
  }
}

template <typename T>
T get(const nlohmann::json& j, const char* key, const std::string& where) {
  return convert<T>(field(j, key, where), key, where);
}

template <typename T>
T get_or(const nlohmann::json& j, const char* key, T fallback, const std::string& where) {
  if (!j.is_object()) throw_user("{}: expected a JSON object, got {}", where, j.type_name());
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return convert<T>(*it, key, where);
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

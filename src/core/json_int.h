// A JSON number as an exact int64, for the fields of request bodies and checkpoint files: an integer, or a float
// with an integral value (1e3, 7.0). Compared before any conversion: a float at or past 2^63 and an unsigned above
// INT64_MAX are out of range, never converted (a double outside int64's range converted to int64 is undefined
// behaviour). Header-only, like json_depth.h: its users (server, model) link different libraries.
#pragma once

#include <cmath>
#include <cstdint>

namespace moeserve {

enum class JsonInt { Ok, NotInteger, OutOfRange };

// `Json` is nlohmann::json or nlohmann::ordered_json.
template <typename Json>
JsonInt json_to_int64(const Json& v, int64_t& out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.template get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) return JsonInt::OutOfRange;
    out = int64_t(u);
    return JsonInt::Ok;
  }
  if (v.is_number_integer()) {
    out = v.template get<int64_t>();
    return JsonInt::Ok;
  }
  if (!v.is_number_float()) return JsonInt::NotInteger;
  const double d = v.template get<double>();
  if (std::floor(d) != d) return JsonInt::NotInteger;  // also NaN; +-inf are integral and out of range below
  if (!(d >= -0x1p63 && d < 0x1p63)) return JsonInt::OutOfRange;
  out = int64_t(d);
  return JsonInt::Ok;
}

}  // namespace moeserve

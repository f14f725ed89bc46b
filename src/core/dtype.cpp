#include "core/dtype.h"

#include <cmath>

namespace moeserve {

namespace {
struct DTypeInfo {
  DType t;
  const char* st_name;
  size_t size;
};
constexpr DTypeInfo kInfo[] = {
    {DType::F32, "F32", 4},   {DType::F16, "F16", 2},       {DType::BF16, "BF16", 2},
    {DType::F8E4M3, "F8_E4M3", 1}, {DType::U8, "U8", 1},    {DType::I8, "I8", 1},
    {DType::I32, "I32", 4},   {DType::I64, "I64", 8},       {DType::F64, "F64", 8},
    {DType::BOOL, "BOOL", 1},
};
}  // namespace

size_t dtype_size(DType t) {
  for (const auto& i : kInfo)
    if (i.t == t) return i.size;
  return 0;
}

const char* dtype_name(DType t) {
  for (const auto& i : kInfo)
    if (i.t == t) return i.st_name;
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const auto& i : kInfo)
    if (name == i.st_name) return i.t;
  return std::nullopt;
}

std::optional<DType> dtype_from_torch_name(std::string_view n) {
  if (n == "float32" || n == "float" || n == "fp32") return DType::F32;
  if (n == "bfloat16" || n == "bf16") return DType::BF16;
  if (n == "float16" || n == "half" || n == "fp16") return DType::F16;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while ((man & 0x400) == 0);
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;              // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00;             // overflow -> inf (after rounding)
  if (a < 0x33000001u) return sign;                       // underflow to zero
  int exp = int(a >> 23) - 127;
  uint32_t man = (a & 0x7fffff) | 0x800000;
  if (exp < -14) {  // subnormal half
    int shift = -14 - exp + 13;
    uint32_t half = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return sign | uint16_t(half);
  }
  uint32_t half = uint32_t(exp + 15) << 10 | ((man >> 13) & 0x3ff);
  uint32_t rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
  return sign | uint16_t(half);
}

float fp8e4m3_to_f32(uint8_t v) {
  // e4m3fn: bias 7, no infinities, S.1111.111 is NaN.
  uint32_t sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
  float r;
  if (exp == 0xf && man == 7) return std::nanf("");
  if (exp == 0) r = std::ldexp(float(man), -9);  // subnormal: man/8 * 2^-6
  else r = std::ldexp(1.0f + float(man) / 8.0f, int(exp) - 7);
  return sign ? -r : r;
}

uint8_t f32_to_fp8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate to max finite
  // Search the 127 magnitudes for the nearest, ties to even code: exact and simple (not a hot path).
  uint8_t best = 0;
  float best_err = INFINITY;
  for (uint8_t c = 0; c < 0x7f; ++c) {
    float err = std::fabs(fp8e4m3_to_f32(c) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best_err = err;
      best = c;
    }
  }
  return sign | best;
}

}  // namespace moeserve

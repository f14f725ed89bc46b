// Element types of tensors and their conversions. Quantized formats (FP8 block scale, NVFP4) are a storage
// dtype plus scale tensors; the dtype here only says how one stored element is laid out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace moeserve {

enum class DType : uint8_t { F32, F16, BF16, F8E4M3, U8, I8, I32, I64, F64, BOOL };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
std::optional<DType> dtype_from_safetensors(std::string_view name);
// "float32" / "bfloat16" / "float16" (config.json torch_dtype / dtype; --dtype flag)
std::optional<DType> dtype_from_torch_name(std::string_view name);

inline float bf16_to_f32(uint16_t v) {
  uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, NaN kept a (quiet) NaN: the same as torch's float -> bfloat16 cast.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float fp8e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8e4m3(float f);  // saturating, round to nearest even

}  // namespace moeserve

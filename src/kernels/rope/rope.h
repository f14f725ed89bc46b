// Rotary position embedding, the rotate-half (GPT-NeoX) form transformers uses for Qwen models:
// x' = x * cos + rotate_half(x) * sin over the first rotary_dim elements of each head.
#pragma once

#include <cstdint>
#include <vector>

namespace moeserve::kernels {

struct RopeTable {
  std::vector<float> inv_freq;  // rotary_dim / 2
  float attention_scaling = 1.0f;
};

// x: [T, heads, head_dim] with row stride `token_stride` floats; positions[T].
void apply_rope(float* x, int64_t T, int64_t token_stride, int64_t heads, int64_t head_dim, const int64_t* positions,
                const RopeTable& table);

}  // namespace moeserve::kernels

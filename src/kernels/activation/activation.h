// SwiGLU's activation: out = silu(gate) * up.
#pragma once

#include <cmath>
#include <cstdint>

namespace moeserve::kernels {

inline void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace moeserve::kernels

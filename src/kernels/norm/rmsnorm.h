// RMSNorm as transformers' Qwen3RMSNorm computes it: x * rsqrt(mean(x^2) + eps) * weight, in f32.
#pragma once

#include <cstdint>

namespace moeserve::kernels {

// out[r] = rmsnorm(x[r]) * weight for `rows` rows of `dim` (out may alias x).
void rmsnorm(const float* x, const float* weight, float eps, int64_t rows, int64_t dim, float* out);
// Fused residual add: residual += x; out = rmsnorm(residual) * weight.
void add_rmsnorm(float* residual, const float* x, const float* weight, float eps, int64_t rows, int64_t dim,
                 float* out);

}  // namespace moeserve::kernels

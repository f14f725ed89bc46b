// Dense linear layers: y = x W^T (+ b). Activations are f32 on the CPU; weights stay in the checkpoint's
// dtype (zero copy from the mmapped file) and are widened inside the dot product.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace moeserve {
class ThreadPool;
}

namespace moeserve::kernels {

// A weight matrix [out, in] with what quantized formats add. `scale` holds per-group scales (FP8 block
// scales, NVFP4 group scales) for the formats that have them; the CPU path supports F32 / BF16 / F16 now.
struct LinearWeight {
  Tensor weight;  // [out, in]
  Tensor scale;   // per-group scales; undefined for unquantized weights
  Tensor bias;    // [out] f32; undefined when the layer has none
  int64_t out_features() const { return weight.shape.at(0); }
  int64_t in_features() const { return weight.shape.at(1); }
};

// y[t * y_stride + n] = sum_k x[t * x_stride + k] * W[n, k] + bias[n], for t < T, n < out_features.
void linear(const float* x, int64_t T, int64_t x_stride, const LinearWeight& w, float* y, int64_t y_stride,
            ThreadPool& pool);

// Several independent linears in one parallel pass (the CPU form of a grouped GEMM: MoE experts, or q/k/v
// projections of the same input). Parallelism spans groups and rows, so small groups still use every core.
struct LinearGroup {
  const float* x;
  int64_t T, x_stride;
  const LinearWeight* w;
  float* y;
  int64_t y_stride;
};
void grouped_linear(const std::vector<LinearGroup>& groups, ThreadPool& pool);

// The obviously-right version (one scalar loop) the fast path is tested against.
void linear_reference(const float* x, int64_t T, int64_t x_stride, const LinearWeight& w, float* y, int64_t y_stride);

}  // namespace moeserve::kernels

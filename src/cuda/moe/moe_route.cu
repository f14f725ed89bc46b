// Router on the GPU: softmax over experts, top-k, optional renormalisation. It computes the probabilities
// exactly as kernels::route_topk does on the CPU (float logit - max, exp and sum in double, quotient rounded to
// float) so that both pick the same experts, including between probabilities that are equal in float.
#include <cmath>

#include "core/error.h"
#include "cuda/moe/moe.h"

namespace moeserve::cuda {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::BF16: return "bf16";
    case WeightFormat::FP8Block128: return "fp8_block128";
    case WeightFormat::NVFP4: return "nvfp4";
  }
  return "?";
}

namespace {

constexpr int kRouteMaxPerLane = 16;  // experts per lane: E <= 512
constexpr int kRouteMaxTopK = 16;
constexpr int kRouteWarpsPerBlock = 4;

// (p, e) ranks before (q, f): larger probability, then lower expert index (torch.topk's order).
__device__ __forceinline__ bool route_before(float p, int e, float q, int f) { return p > q || (p == q && e < f); }

// One warp per token; lane l holds experts l, l + 32, ...
__global__ void __launch_bounds__(kRouteWarpsPerBlock * 32)
    route_topk_kernel(const float* logits, int T, int E, int k, bool renormalize, int32_t* ids, float* weights) {
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * kRouteWarpsPerBlock + (threadIdx.x >> 5);
  if (t >= T) return;
  const float* l = logits + size_t(t) * E;
  float v[kRouteMaxPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kRouteMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? l[e] : -INFINITY;
    mx = fmaxf(mx, v[i]);
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
  double sum = 0;
#pragma unroll
  for (int i = 0; i < kRouteMaxPerLane; ++i)
    if (lane + 32 * i < E) sum += exp(double(v[i] - mx));
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
  float p[kRouteMaxPerLane];
#pragma unroll
  for (int i = 0; i < kRouteMaxPerLane; ++i)
    p[i] = lane + 32 * i < E ? float(exp(double(v[i] - mx)) / sum) : -1.0f;  // -1: absent or already taken

  float chosen_p = 0, total = 0;
  for (int j = 0; j < k; ++j) {
    float bp = -1.0f;
    int be = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kRouteMaxPerLane; ++i)
      if (route_before(p[i], lane + 32 * i, bp, be)) bp = p[i], be = lane + 32 * i;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
      const float op = __shfl_xor_sync(0xffffffffu, bp, d);
      const int oe = __shfl_xor_sync(0xffffffffu, be, d);
      if (route_before(op, oe, bp, be)) bp = op, be = oe;
    }
    // Every lane now holds the same winner.
#pragma unroll
    for (int i = 0; i < kRouteMaxPerLane; ++i)
      if (lane + 32 * i == be) p[i] = -1.0f;
    total += bp;  // in selection order, as the CPU sums
    if (lane == j) chosen_p = bp, ids[size_t(t) * k + j] = be;
  }
  if (lane < k) weights[size_t(t) * k + lane] = renormalize ? chosen_p / total : chosen_p;
}

}  // namespace

void moe_route_topk(const float* logits, int T, int E, int k, bool renormalize, int32_t* ids, float* weights,
                    cudaStream_t stream) {
  MS_CHECK(E >= 1 && E <= 32 * kRouteMaxPerLane, "moe_route_topk: {} experts (at most {})", E,
           32 * kRouteMaxPerLane);
  MS_CHECK(k >= 1 && k <= E && k <= kRouteMaxTopK, "moe_route_topk: top_k {} of {} experts (at most {})", k, E,
           kRouteMaxTopK);
  if (T <= 0) return;
  const int blocks = int(ceil_div(T, kRouteWarpsPerBlock));
  route_topk_kernel<<<blocks, kRouteWarpsPerBlock * 32, 0, stream>>>(logits, T, E, k, renormalize, ids, weights);
  MS_CUDA_LAUNCH_CHECK();
}

}  // namespace moeserve::cuda

// Routing of one token by one warp: softmax over the experts' router logits, top-k, optional renormalisation,
// computed exactly as kernels::route_topk does on the CPU (float logit - max, exp and sum in double, quotient
// rounded to float), so that both pick the same experts, including between probabilities that are equal in
// float. Shared by the routing kernels (moe_route.cu) and the fused MoE GEMMs that route for themselves
// (moe_gemm_kernels.cuh), so it is read by nvcc and by NVRTC: built-in types and intrinsics only, and no
// #include but the parameter header (which NVRTC gets in memory too).
#pragma once

#include "moe_kernel_params.h"

namespace moe_route {

// (p, e) ranks before (q, f): larger probability, then lower expert index (torch.topk's order).
__device__ __forceinline__ bool route_before(float p, int e, float q, int f) { return p > q || (p == q && e < f); }

// Lane l holds experts l, l + 32, ... (SLOTS of them: every slot costs the whole warp a double exp and a compare
// in each of the k rounds). The logits row may have been written by other blocks of the same grid: read through
// L2. On return lane j < k holds the j-th pick: its expert in `id` and its weight in `weight`.
template <int SLOTS>
__device__ __forceinline__ void route_select(const float* l, int E, int k, bool renormalize, int lane, int& id,
                                             float& weight) {
  const float neg_inf = __int_as_float(0xff800000);
  float v[SLOTS];
  float mx = neg_inf;
#pragma unroll
  for (int i = 0; i < SLOTS; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? __ldcg(l + e) : neg_inf;
    mx = fmaxf(mx, v[i]);
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
  double ex[SLOTS];  // exp(logit - max) in double, as the CPU computes it; once per expert
  double sum = 0;
#pragma unroll
  for (int i = 0; i < SLOTS; ++i) {
    ex[i] = lane + 32 * i < E ? exp(double(v[i] - mx)) : 0.0;
    sum += ex[i];
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
  float p[SLOTS];
#pragma unroll
  for (int i = 0; i < SLOTS; ++i) p[i] = lane + 32 * i < E ? float(ex[i] / sum) : -1.0f;  // -1: absent or taken

  float chosen_p = 0, total = 0;
  id = -1;
  for (int j = 0; j < k; ++j) {
    float bp = -1.0f;
    int be = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < SLOTS; ++i)
      if (route_before(p[i], lane + 32 * i, bp, be)) bp = p[i], be = lane + 32 * i;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
      const float op = __shfl_xor_sync(0xffffffffu, bp, d);
      const int oe = __shfl_xor_sync(0xffffffffu, be, d);
      if (route_before(op, oe, bp, be)) bp = op, be = oe;
    }
    // Every lane now holds the same winner.
#pragma unroll
    for (int i = 0; i < SLOTS; ++i)
      if (lane + 32 * i == be) p[i] = -1.0f;
    total += bp;  // in selection order, as the CPU sums
    if (lane == j) chosen_p = bp, id = be;
  }
  weight = renormalize ? chosen_p / total : chosen_p;
}

// route_select with the fewest slots that cover E (E <= 32 * moe_kernels::kRouteMaxSlots).
__device__ __forceinline__ void route_select_any(const float* l, int E, int k, bool renormalize, int lane, int& id,
                                                 float& weight) {
  if (E <= 128) route_select<4>(l, E, k, renormalize, lane, id, weight);
  else if (E <= 256) route_select<8>(l, E, k, renormalize, lane, id, weight);
  else route_select<moe_kernels::kRouteMaxSlots>(l, E, k, renormalize, lane, id, weight);
}

}  // namespace moe_route

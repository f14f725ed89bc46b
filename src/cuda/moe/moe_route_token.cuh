// The top-k of one token's router logits by one warp: shared by the routing kernels (route_dev.cuh) and the MoE
// GEMM that routes inside its own launch (moe_gemm_ws.cuh, dense mode). NVRTC compiles it too (the JIT backend):
// no #include, built-in types only.
#pragma once

namespace moe_kernels {

// One warp routes token t from the logits it holds (lane l: expert l + 32 i in v[i], -inf past E): softmax in
// double as the CPU computes it, then k rounds each taking the largest remaining probability, the lowest expert
// index among equals (torch.topk's order); weights renormalised to sum 1 when `renormalize`. ids / weights: [T, k]
// rows, k <= 32.
template <int SLOTS>
__device__ __forceinline__ void route_token_values(const float (&v)[SLOTS], int t, int E, int k, bool renormalize,
                                                   int* ids, float* weights, int lane) {
  float mx = __int_as_float(0xff800000);  // -inf
#pragma unroll
  for (int i = 0; i < SLOTS; ++i) mx = fmaxf(mx, v[i]);
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
  double ex[SLOTS];  // exp(logit - max) in double, once per expert
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

  // Probabilities are >= 0, so their f32 bits order as unsigned integers: key = bits + 1, 0 for absent or taken.
  // One warp-wide max reduction (redux.sync) finds the winning key; one ballot a slot, lowest slot and lane first,
  // finds the lowest expert holding it.
  float chosen_p = 0, total = 0;
  for (int j = 0; j < k; ++j) {
    unsigned key[SLOTS], best = 0;
#pragma unroll
    for (int i = 0; i < SLOTS; ++i) {
      key[i] = p[i] >= 0.0f ? __float_as_uint(p[i]) + 1u : 0u;
      best = max(best, key[i]);
    }
    best = __reduce_max_sync(0xffffffffu, best);
    int be = -1;
#pragma unroll
    for (int i = 0; i < SLOTS; ++i) {
      const unsigned holders = __ballot_sync(0xffffffffu, key[i] == best);
      if (be < 0 && holders != 0) be = 32 * i + __ffs(int(holders)) - 1;
    }
    const float bp = __uint_as_float(best - 1u);
    // Every lane now holds the same winner.
#pragma unroll
    for (int i = 0; i < SLOTS; ++i)
      if (lane + 32 * i == be) p[i] = -1.0f;
    total += bp;  // in selection order, as the CPU sums
    if (lane == j) chosen_p = bp, ids[(long long)t * k + j] = be;
  }
  if (lane < k) weights[(long long)t * k + lane] = renormalize ? chosen_p / total : chosen_p;
}

}  // namespace moe_kernels

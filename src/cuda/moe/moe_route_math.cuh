// The router's arithmetic as device code that every compiler of this repo's kernels accepts: nvcc for the routing
// kernels (moe_route.cu via route_dev.cuh) and the fused MoE kernels, and NVRTC for the JIT backend, which gets this
// file as an in-memory header (so: no #include, only built-in functions). One copy of the math, so that a folded
// route computed inside the MoE kernels picks bitwise what moe_route_folded / moe_route_topk pick.
#pragma once

namespace moe_route {

// The residual fusion's RMS factor 1 / sqrt(mean square + eps) of a row of K elements from a warp's lane sums of
// its per-part sums of squares (lane l having added parts l, l + 32, ... in that order): a fixed xor tree, so every
// kernel that applies a row's norm from its partial sums (gemv_norm_in, the folded route) gets the same bits.
__device__ __forceinline__ float rms_inverse_from_lane_sums(float ss, int K, float eps) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  return rsqrtf(ss / float(K) + eps);  // as rmsnorm / add_rmsnorm
}

// Softmax over E experts and the top k by one warp, the logits held as v[i] = expert lane + 32 i (-inf past E).
// The probabilities as the CPU's kernels::route_topk computes them (float logit - max, exp and sum in double,
// quotient rounded to float), so both pick the same experts, ties included. emit_id(j, e) runs on lane j for slot
// j < k (the slots in selection order); emit_weight(j, w) on lanes j < k (w renormalized over the k when asked).
template <int SLOTS, class EmitId, class EmitWeight>
__device__ __forceinline__ void topk_softmax_warp(const float (&v)[SLOTS], int E, int k, bool renormalize, int lane,
                                                  EmitId emit_id, EmitWeight emit_weight) {
  float mx = __uint_as_float(0xff800000u);  // -inf
#pragma unroll
  for (int i = 0; i < SLOTS; ++i) mx = fmaxf(mx, v[i]);
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

  // Each round takes the largest remaining probability, the lowest expert index among equals (torch.topk's
  // order). Probabilities are >= 0, so their f32 bits order as unsigned integers: key = bits + 1, 0 for absent or
  // taken. One warp-wide max reduction (redux.sync) finds the winning key; one ballot a slot, lowest slot and lane
  // first, finds the lowest expert holding it (five dependent shuffle pairs a round before).
  float chosen_p = 0, total = 0;
  for (int j = 0; j < k; ++j) {
    unsigned key[SLOTS], best = 0;
#pragma unroll
    for (int i = 0; i < SLOTS; ++i) {
      key[i] = p[i] >= 0.0f ? __float_as_uint(p[i]) + 1u : 0u;
      best = key[i] > best ? key[i] : best;
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
    if (lane == j) chosen_p = bp, emit_id(j, be);
  }
  if (lane < k) emit_weight(lane, renormalize ? chosen_p / total : chosen_p);
}

// The folded router's logits of one token (moe_route_folded): from the products u1 = (W_r diag(g_post / g_in)) xn_in
// and u2 = (W_r diag(g_post) W_o) a that rode in the q/k/v and o_proj GEMVs, and the RMS factors of h (the q/k/v
// GEMV's norm input) and x = h + W_o a from their partial sums (nparts <= 32 * kRouteMaxPartsPerLane, in
// gemv_norm_in's order): W_r (g_post x inv_x) = (u1 / inv_h + u2) inv_x. Lane l gets expert l + 32 i in v[i] (-inf
// past E); inv_x is returned for the experts' input. Every load is issued before the first reduction: one L2 round
// trip. The rows were written by earlier kernels: read through L2 (ld.global.cg).
constexpr int kRouteMaxPartsPerLane = 8;  // nparts <= 256: H <= 4096
__device__ __forceinline__ float load_cg_f32(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ float rms_inverse_of_parts(const float* part, int nparts, int H, float eps, int lane) {
  float v[kRouteMaxPartsPerLane];
#pragma unroll
  for (int j = 0; j < kRouteMaxPartsPerLane; ++j) v[j] = lane + 32 * j < nparts ? load_cg_f32(part + lane + 32 * j) : 0.f;
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kRouteMaxPartsPerLane; ++j) ss += v[j];  // absent parts are 0: adding them changes nothing
  return rms_inverse_from_lane_sums(ss, H, eps);
}
template <int SLOTS>
__device__ __forceinline__ float folded_logits(const float* u1, const float* u2, const float* part_h,
                                               const float* part_x, int nparts, int H, float eps, int E, int lane,
                                               float (&v)[SLOTS]) {
  float a[SLOTS], b[SLOTS];
#pragma unroll
  for (int i = 0; i < SLOTS; ++i) {
    const int e = lane + 32 * i;
    a[i] = e < E ? load_cg_f32(u1 + e) : 0.f;
    b[i] = e < E ? load_cg_f32(u2 + e) : 0.f;
  }
  const float inv_h = rms_inverse_of_parts(part_h, nparts, H, eps, lane);
  const float inv_x = rms_inverse_of_parts(part_x, nparts, H, eps, lane);
#pragma unroll
  for (int i = 0; i < SLOTS; ++i) v[i] = lane + 32 * i < E ? (a[i] / inv_h + b[i]) * inv_x : __uint_as_float(0xff800000u);
  return inv_x;
}

}  // namespace moe_route

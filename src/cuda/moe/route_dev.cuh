// The router's top-k and the folded route (moe_route_folded) as device functions of the routing kernels
// (moe_route.cu). Internal header. (Session 20 also ran the folded route as o_proj's last block from here: +25 us a
// step at bs 1 on the H200, session 21; removed.)
#pragma once

#include <cstdint>

#include "cuda/fused_norm.cuh"
#include "cuda/moe/moe.h"

namespace moeserve::cuda::route_dev {

constexpr int kRouteMaxPerLane = 16;  // experts per lane: E <= 512
constexpr int kRouteMaxTopK = 16;

// One round of a warp's top-k over keys held as lane + 32 i (larger is better, 0: absent or taken): the largest key
// (one warp-wide max reduction, redux.sync) and the lowest expert holding it (one ballot a slot, lowest slot and lane
// first; five dependent shuffle pairs a round before); every lane gets both, and the winner's key is cleared.
template <int SLOTS>
__device__ __forceinline__ int take_largest_key(unsigned (&key)[SLOTS], int lane, unsigned& best_out) {
  unsigned best = 0;
#pragma unroll
  for (int i = 0; i < SLOTS; ++i) best = max(best, key[i]);
  best = __reduce_max_sync(0xffffffffu, best);
  int be = -1;
#pragma unroll
  for (int i = 0; i < SLOTS; ++i) {
    const unsigned holders = __ballot_sync(0xffffffffu, key[i] == best);
    if (be < 0 && holders != 0) be = 32 * i + __ffs(int(holders)) - 1;
  }
#pragma unroll
  for (int i = 0; i < SLOTS; ++i)
    if (lane + 32 * i == be) key[i] = 0u;
  best_out = best;
  return be;
}

// One warp routes token t from its logits row l: lane l holds experts l, l + 32, ... (SLOTS of them: the
// dispatcher below picks the fewest that cover E, since every slot costs the whole warp a double exp and a
// compare in each of the k rounds). The row may have been written by other blocks of the same grid (the fused
// router): read through L2. route_token_values: the top-k of a token whose logits the warp holds already (lane l:
// expert l + 32 i in v[i], -INFINITY past E).
template <int SLOTS>
__device__ __forceinline__ void route_token_values(const float (&v)[SLOTS], int t, int E, int k, bool renormalize,
                                                   int32_t* ids, float* weights, int lane) {
  float mx = -INFINITY;
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
  for (int i = 0; i < SLOTS; ++i) p[i] = lane + 32 * i < E ? float(ex[i] / sum) : -1.0f;  // -1: absent

  // Each round takes the largest remaining probability, the lowest expert index among equals (torch.topk's
  // order). Probabilities are >= 0, so their f32 bits order as unsigned integers: key = bits + 1, 0 for absent.
  unsigned key[SLOTS];
#pragma unroll
  for (int i = 0; i < SLOTS; ++i) key[i] = p[i] >= 0.0f ? __float_as_uint(p[i]) + 1u : 0u;
  float chosen_p = 0, total = 0;
  for (int j = 0; j < k; ++j) {
    unsigned best;
    const int be = take_largest_key(key, lane, best);  // every lane now holds the same winner
    const float bp = __uint_as_float(best - 1u);
    total += bp;  // in selection order, as the CPU sums
    if (lane == j) chosen_p = bp, ids[size_t(t) * k + j] = be;
  }
  if (lane < k) weights[size_t(t) * k + lane] = renormalize ? chosen_p / total : chosen_p;
}

// logit(e) gives expert e's logit (e < E).
template <int SLOTS, typename Logit>
__device__ __forceinline__ void route_token_slots(const Logit& logit, int t, int E, int k, bool renormalize,
                                                  int32_t* ids, float* weights, int lane) {
  float v[SLOTS];
#pragma unroll
  for (int i = 0; i < SLOTS; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? logit(e) : -INFINITY;
  }
  route_token_values(v, t, E, k, renormalize, ids, weights, lane);
}

template <typename Logit>
__device__ __forceinline__ void route_token_with(const Logit& logit, int t, int E, int k, bool renormalize,
                                                 int32_t* ids, float* weights, int lane) {
  if (E <= 128) route_token_slots<4>(logit, t, E, k, renormalize, ids, weights, lane);
  else if (E <= 256) route_token_slots<8>(logit, t, E, k, renormalize, ids, weights, lane);
  else route_token_slots<kRouteMaxPerLane>(logit, t, E, k, renormalize, ids, weights, lane);
}

__device__ __forceinline__ void route_token(const float* l, int t, int E, int k, bool renormalize, int32_t* ids,
                                            float* weights, int lane) {
  route_token_with([l](int e) { return __ldcg(l + e); }, t, E, k, renormalize, ids, weights, lane);
}

// ---- The folded router (moe_route_folded): the logits from the two products that rode in the q/k/v and o_proj
// GEMVs, rescaled by the two RMS factors from the residual stream's partial sums, then the top-k (warp w < T routes
// token w); the other warps write the experts' input rmsnorm(x) * w meanwhile (all warps, after routing, at T = 8).
// Every load a warp needs is issued before its first reduction, so each path is one L2 round trip deep.
constexpr int kFoldedWarps = 8;
constexpr int kFoldedThreads = kFoldedWarps * 32;
constexpr int kMaxPartsPerLane = 8;  // nparts <= 256: H <= 4096

// Sums of squares over the parts held as lane + 32 j, in gemv_norm_in's order (each lane its parts in order, then
// rms_inverse_from_lane_sums), so the RMS factor is bitwise the one that kernel applies.
__device__ __forceinline__ float rms_inverse_of(const float (&v)[kMaxPartsPerLane], int H, float eps) {
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxPartsPerLane; ++j) ss += v[j];  // absent parts are 0: adding them changes nothing
  return rms_inverse_from_lane_sums(ss, H, eps);
}

__device__ __forceinline__ void load_parts(const float* part, int nparts, int lane, float (&v)[kMaxPartsPerLane]) {
#pragma unroll
  for (int j = 0; j < kMaxPartsPerLane; ++j) v[j] = lane + 32 * j < nparts ? __ldcg(part + lane + 32 * j) : 0.f;
}

// The folded route by the kFoldedThreads threads of a block (route_folded_kernel), its inputs complete and visible.
template <int SLOTS>
__device__ __forceinline__ void route_folded_body(const FoldedRouterInputs& f, int T, int E, int k, bool renormalize,
                                                  int32_t* ids, float* weights) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp < T) {
    const int t = warp;
    float ph[kMaxPartsPerLane], px[kMaxPartsPerLane], u1[SLOTS], u2[SLOTS];
    load_parts(f.part_h + int64_t(t) * f.nparts, f.nparts, lane, ph);
    load_parts(f.part_x + int64_t(t) * f.nparts, f.nparts, lane, px);
#pragma unroll
    for (int i = 0; i < SLOTS; ++i) {
      const int e = lane + 32 * i;
      u1[i] = e < E ? __ldcg(f.u1 + int64_t(t) * f.ld_u1 + e) : 0.f;
      u2[i] = e < E ? __ldcg(f.u2 + int64_t(t) * f.ld_u2 + e) : 0.f;
    }
    const float inv_h = rms_inverse_of(ph, f.H, f.eps), inv_x = rms_inverse_of(px, f.H, f.eps);
    // u1 = (W_r diag(g_post / g_in)) xn_in with xn_in = h inv_h g_in, so W_r diag(g_post) h = u1 / inv_h; with
    // u2 = (W_r diag(g_post) W_o) a, the router's W_r (g_post x inv_x) for x = h + W_o a is (u1 / inv_h + u2) inv_x.
    float v[SLOTS];
#pragma unroll
    for (int i = 0; i < SLOTS; ++i) {
      const int e = lane + 32 * i;
      v[i] = e < E ? (u1[i] / inv_h + u2[i]) * inv_x : -INFINITY;
      if (f.logits_out != nullptr && e < E) f.logits_out[int64_t(t) * E + e] = v[i];
    }
    route_token_values(v, t, E, k, renormalize, ids, weights, lane);
    if (T < kFoldedWarps) return;  // the other warps write the experts' input
  }
  // The experts' input: each token's float4 columns split evenly over the writing warps.
  const int writers = T < kFoldedWarps ? kFoldedWarps - T : kFoldedWarps;
  const int w = T < kFoldedWarps ? warp - T : warp;
  const int q = f.H / 4, per = (q + writers - 1) / writers, c0 = w * per, c1 = min(q, c0 + per);
  for (int t = 0; t < T; ++t) {
    float px[kMaxPartsPerLane];
    load_parts(f.part_x + int64_t(t) * f.nparts, f.nparts, lane, px);
    const float4* r = reinterpret_cast<const float4*>(f.residual + int64_t(t) * f.H);
    for (int cb = c0; cb < c1; cb += 4 * 32) {
      float4 x[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int c = cb + lane + 32 * u;
        x[u] = c < c1 ? __ldcg(r + c) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      const float inv = rms_inverse_of(px, f.H, f.eps);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int c = cb + lane + 32 * u;
        if (c < c1) store_norm4(f.xn_out + int64_t(t) * f.H + 4 * c, x[u], f.post_norm + 4 * c, inv);
      }
    }
  }
}

}  // namespace moeserve::cuda::route_dev

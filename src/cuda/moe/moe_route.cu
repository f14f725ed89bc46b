// Router on the GPU: softmax over experts, top-k, optional renormalisation. It computes the probabilities
// exactly as kernels::route_topk does on the CPU (float logit - max, exp and sum in double, quotient rounded to
// float) so that both pick the same experts, including between probabilities that are equal in float.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "cuda/device.h"
#include "cuda/fused_norm.cuh"
#include "cuda/launch.h"
#include "cuda/moe/moe.h"
#include "cuda/moe/moe_ptx.cuh"
#include "cuda/pdl.cuh"

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

template <int SLOTS>
__global__ void __launch_bounds__(kFoldedThreads)
    route_folded_kernel(FoldedRouterInputs f, int T, int E, int k, bool renormalize, int32_t* ids, float* weights) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  pdl_enter();
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

// One warp per token.
__global__ void __launch_bounds__(kRouteWarpsPerBlock * 32)
    route_topk_kernel(const float* logits, int T, int E, int k, bool renormalize, int32_t* ids, float* weights) {
  pdl_enter();
  const int t = blockIdx.x * kRouteWarpsPerBlock + (threadIdx.x >> 5);
  if (t >= T) return;
  route_token(logits + size_t(t) * E, t, E, k, renormalize, ids, weights, threadIdx.x & 31);
}

// ---- The router GEMV fused with routing (T <= kRouterTopkMaxTokens). Block (b, g) takes token group g (tokens
// 8 g .. 8 g + 7) and warp w of it expert e = 8 b + w: its weight row (H bf16, 16-byte chunks c = lane + 32 i < H / 8)
// is loaded into registers before the programmatic wait; after it the block stages the group's token rows in shared
// memory, every load in flight at once (session 18's first form had each warp walk its tokens' rows in L2 one
// after another: 8 dependent round trips, +8 us a layer at 64 tokens against the router GEMM + route launches);
// products of bf16 values are exact in f32 and summed in f32. The block of a group that finishes last (the group's
// counter, counter[g], reset by that block) routes the group's tokens, a warp a token. NORM (one group): the staged
// rows are rmsnorm(residual + delta) * norm_w; the last block also writes them to xn_out (the experts' input) and
// adds delta into the residual.
constexpr int kFusedRouterWarps = 8;  // experts a block, and the group's tokens routed at once
constexpr int kFusedRouterMaxChunks = 16;  // 16-byte chunks per lane: H <= 32 * 16 * 8 = 4096
constexpr int kNormPad = 8;                // bf16 of padding per shared row

struct RouterNorm {
  float* residual;
  const bf16* delta;
  const bf16* weight;
  float eps;
  bf16* xn_out;
};

template <int CHUNKS, bool NORM>
__global__ void __launch_bounds__(kFusedRouterWarps * 32)
    router_topk_kernel(const bf16* x, const bf16* w, int T, int H, int E, int k, bool renormalize, float* logits,
                       int* counter, int32_t* ids, float* weights, RouterNorm rn) {
  extern __shared__ __align__(16) bf16 xs[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int e = blockIdx.x * kFusedRouterWarps + warp;
  const int t0 = int(blockIdx.y) * kFusedRouterMaxTokens;  // this block's token group
  T = min(T - t0, kFusedRouterMaxTokens);                    // (NORM: one group, t0 = 0)
  logits += size_t(t0) * E, ids += size_t(t0) * k, weights += size_t(t0) * k;
  const int nch = H / 8;  // 16-byte chunks of a row; lane + 32 i < nch, i < CHUNKS (host)
  uint4 wr[CHUNKS];
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i)
    wr[i] = e < E && lane + 32 * i < nch
                ? __ldcs(reinterpret_cast<const uint4*>(w + size_t(e) * H) + lane + 32 * i)
                : make_uint4(0, 0, 0, 0);
  pdl_enter();
  const int ldx = H + kNormPad;  // the staged rows' pitch
  if constexpr (NORM) {
    norm_rows_to_smem(rn.residual, rn.delta, rn.weight, rn.eps, T, H, xs, ldx);
  } else {
    // The group's rows (T * nch <= kFusedRouterMaxTokens * 32 * CHUNKS chunks) through registers: all loads first.
    constexpr int kPerThread = kFusedRouterMaxTokens * 32 * CHUNKS / (kFusedRouterWarps * 32);
    const uint4* src = reinterpret_cast<const uint4*>(x + size_t(t0) * H);
    uint4 v[kPerThread];
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int i = threadIdx.x + j * kFusedRouterWarps * 32;
      if (i < T * nch) v[j] = __ldcg(src + i);  // not .nc: see pdl.cuh
    }
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int i = threadIdx.x + j * kFusedRouterWarps * 32;
      if (i < T * nch) reinterpret_cast<uint4*>(xs + (i / nch) * ldx)[i % nch] = v[j];
    }
    __syncthreads();
  }
  if (e < E) {
    for (int t = 0; t < T; ++t) {
      const uint4* xr = reinterpret_cast<const uint4*>(xs + t * ldx);
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < CHUNKS; ++i) {
        if (lane + 32 * i < nch) {
          const uint4 xv = xr[lane + 32 * i];
          const __nv_bfloat162* a = reinterpret_cast<const __nv_bfloat162*>(&wr[i]);
          const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float2 fa = __bfloat1622float2(a[j]), fb = __bfloat1622float2(b[j]);
            acc = fmaf(fa.x, fb.x, acc);
            acc = fmaf(fa.y, fb.y, acc);
          }
        }
      }
#pragma unroll
      for (int d = 16; d > 0; d >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, d);
      if (lane == 0) logits[size_t(t) * E + e] = acc;
    }
  }
  if (!finished_last(counter + blockIdx.y, int(gridDim.x))) return;
  if constexpr (NORM) {
    for (int i = threadIdx.x; i < T * H / 8; i += blockDim.x) {
      const int t = i / (H / 8), c = i % (H / 8);
      reinterpret_cast<uint4*>(rn.xn_out + size_t(t) * H)[c] = reinterpret_cast<const uint4*>(xs + t * ldx)[c];
    }
    add_to_residual(rn.residual, rn.delta, T, H);
  }
  for (int t = warp; t < T; t += kFusedRouterWarps)
    route_token(logits + size_t(t) * E, t, E, k, renormalize, ids, weights, lane);
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
  launch_pdl(route_topk_kernel, dim3(blocks), dim3(kRouteWarpsPerBlock * 32), 0, stream, logits, T, E, k,
             renormalize, ids, weights);
}

void moe_route_folded(const FoldedRouterInputs& f, int T, int E, int k, bool renormalize, int32_t* ids,
                      float* weights, cudaStream_t stream) {
  MS_CHECK(T >= 1 && T <= kFusedRouterMaxTokens && T <= kFoldedWarps,
           "moe_route_folded: {} tokens (at most {})", T, kFusedRouterMaxTokens);
  MS_CHECK(E >= 1 && E <= 32 * kRouteMaxPerLane && k >= 1 && k <= E && k <= kRouteMaxTopK,
           "moe_route_folded: top_k {} of {} experts", k, E);
  MS_CHECK(f.H > 0 && f.H % 4 == 0 && f.nparts >= 1 && f.nparts <= 32 * kMaxPartsPerLane && f.u1 && f.u2 && f.part_h && f.part_x && f.residual &&
               f.post_norm && f.xn_out && (reinterpret_cast<uintptr_t>(f.residual) & 15) == 0 &&
               (reinterpret_cast<uintptr_t>(f.xn_out) & 7) == 0 && (reinterpret_cast<uintptr_t>(f.post_norm) & 7) == 0,
           "moe_route_folded: H {} (a multiple of 4), every input, 16-byte aligned residual, 8-byte aligned xn_out and "
           "norm weight", f.H);
  auto kernel = E <= 128 ? route_folded_kernel<4> : E <= 256 ? route_folded_kernel<8> : route_folded_kernel<kRouteMaxPerLane>;
  launch_pdl(kernel, dim3(1), dim3(kFoldedThreads), 0, stream, f, T, E, k, renormalize, ids, weights);
}

bool moe_router_topk_fits(int T, int H, int E, int k) {
  return T >= 1 && T <= kRouterTopkMaxTokens && H > 0 && H % 8 == 0 && H <= 256 * kFusedRouterMaxChunks && E >= 1 &&
         E <= 32 * kRouteMaxPerLane && k >= 1 && k <= E && k <= kRouteMaxTopK;
}

namespace {
template <bool NORM>
void launch_router(const bf16* x, const bf16* router, int T, int H, int E, int k, bool renormalize, float* logits,
                   int* counter, int32_t* ids, float* weights, const RouterNorm& rn, cudaStream_t stream) {
  MS_CHECK(moe_router_topk_fits(T, H, E, k), "moe_router_topk: T {} H {} E {} top_k {} do not fit the fused kernel",
           T, H, E, k);
  MS_CHECK((reinterpret_cast<uintptr_t>(x) & 15) == 0 && (reinterpret_cast<uintptr_t>(router) & 15) == 0 &&
               counter != nullptr,
           "moe_router_topk: x and the router weights must be 16-byte aligned, and a counter is needed");
  MS_CHECK(!NORM || T <= kFusedRouterMaxTokens, "moe_norm_router_topk: {} tokens (one group of at most {})", T,
           kFusedRouterMaxTokens);
  const dim3 grid(unsigned(ceil_div(E, kFusedRouterWarps)), unsigned(router_topk_groups(T)));
  const int chunks = int(ceil_div(H / 8, 32));
  auto kernel = chunks <= 4   ? router_topk_kernel<4, NORM>
                : chunks <= 8 ? router_topk_kernel<8, NORM>
                              : router_topk_kernel<16, NORM>;
  const size_t smem = size_t(std::min(T, kFusedRouterMaxTokens)) * size_t(H + kNormPad) * sizeof(bf16);
  MS_CHECK(raise_dynamic_smem(reinterpret_cast<const void*>(kernel), smem),
           "moe_router_topk: the device refuses {} bytes of shared memory", smem);
  launch_pdl(kernel, grid, dim3(kFusedRouterWarps * 32), smem, stream, x, router, T, H, E, k, renormalize, logits,
             counter, ids, weights, rn);
}
}  // namespace

void moe_router_topk(const bf16* x, const bf16* router, int T, int H, int E, int k, bool renormalize,
                     float* logits, int* counter, int32_t* ids, float* weights, cudaStream_t stream) {
  launch_router<false>(x, router, T, H, E, k, renormalize, logits, counter, ids, weights, RouterNorm{}, stream);
}

bool moe_norm_router_topk_fits(int T, int H, int E, int k) {
  return T <= kFusedNormRouterMaxTokens && moe_router_topk_fits(T, H, E, k);
}

void moe_norm_router_topk(float* residual, const bf16* delta, const bf16* norm_w, float eps, bf16* xn_out,
                          const bf16* router, int T, int H, int E, int k, bool renormalize, float* logits,
                          int* counter, int32_t* ids, float* weights, cudaStream_t stream) {
  MS_CHECK(moe_norm_router_topk_fits(T, H, E, k), "moe_norm_router_topk: T {} (at most {})", T,
           kFusedNormRouterMaxTokens);
  MS_CHECK(residual != nullptr && delta != nullptr && norm_w != nullptr && xn_out != nullptr &&
               (reinterpret_cast<uintptr_t>(residual) & 15) == 0 && (reinterpret_cast<uintptr_t>(delta) & 7) == 0 &&
               (reinterpret_cast<uintptr_t>(norm_w) & 7) == 0 && (reinterpret_cast<uintptr_t>(xn_out) & 15) == 0,
           "moe_norm_router_topk: residual / xn_out 16-byte and delta / norm weight 8-byte aligned");
  launch_router<true>(xn_out, router, T, H, E, k, renormalize, logits, counter, ids, weights,
                      RouterNorm{residual, delta, norm_w, eps, xn_out}, stream);
}

}  // namespace moeserve::cuda

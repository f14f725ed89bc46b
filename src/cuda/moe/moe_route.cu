// Router on the GPU: softmax over experts, top-k, optional renormalisation. It computes the probabilities
// exactly as kernels::route_topk does on the CPU (float logit - max, exp and sum in double, quotient rounded to
// float) so that both pick the same experts, including between probabilities that are equal in float.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "cuda/device.h"
#include "cuda/fused_norm.cuh"
#include "cuda/kernels/kernel_utils.cuh"
#include "cuda/launch.h"
#include "cuda/moe/moe.h"
#include "cuda/moe/moe_ptx.cuh"
#include "cuda/moe/route_dev.cuh"
#include "cuda/pdl.cuh"

namespace moeserve::cuda {

using namespace route_dev;  // the top-k and folded-route device functions (route_dev.cuh)

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::BF16: return "bf16";
    case WeightFormat::FP8Block128: return "fp8_block128";
    case WeightFormat::NVFP4: return "nvfp4";
  }
  return "?";
}

namespace {

constexpr int kRouteWarpsPerBlock = 4;

template <int SLOTS>
__global__ void __launch_bounds__(kFoldedThreads)
    route_folded_kernel(FoldedRouterInputs f, int T, int E, int k, bool renormalize, int32_t* ids, float* weights) {
  pdl_enter();
  route_folded_body<SLOTS>(f, T, E, k, renormalize, ids, weights);
}

// moe_add_norm_route: one block a token row. The add + RMSNorm is rmsnorm_vec4_kernel<NV, true>'s (elementwise.cu)
// arithmetic with the same block shape (launch below), so xn_out and the residual are bitwise add_rmsnorm's. The route:
// warp 0 picks the C = k + kMidRouteExtra experts whose folded logits rank highest, the block computes their logits
// exactly, W_r bf16(xn) from the row it holds (the unfolded router's products, f32 sums), and warp 0 routes with those
// in place of the folded ones. Why exact: the folded logits are ~2^-8 of their scale off the unfolded router's (bf16
// folded weights, q/k/v input and products), enough to swap near-tied experts across the top-k boundary (H200,
// session 36: a routing flip in test_gpu_model's graph decode steps); with the candidates recomputed the choice and
// the chosen experts' weights are the unfolded router's, as long as the true top-k lies within the folded top-C (a
// gap of kMidRouteExtra ranks, far beyond the folded error). Order: the folded ranking does not need the row's norm
// (inv_x scales a token's logits alike), so warp 0 picks the candidates while the other warps load the row, and every
// thread's loads of its slices of the candidates' router rows run under the norm's reduction.
constexpr int kMidRouteExtra = 4;
constexpr int kMidRouteMaxCand = kRouteMaxTopK + kMidRouteExtra;
__device__ __forceinline__ unsigned ordered_key(float f) {  // monotone in f; 0 is below every float's key
  const unsigned b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// 256 threads at most (H <= 8,192: moe_add_norm_route_fits). Rows of up to 2,048 elements (NV <= 2) hold their
// candidate slices in registers from before the reduction; longer rows load them after it.
constexpr int kMidRouteThreads = 256;
template <int NV, int SLOTS>
__global__ void __launch_bounds__(kMidRouteThreads)
    add_norm_route_kernel(float* residual, const bf16* delta, int64_t ld_delta, const bf16* w, float eps, int dim,
                          bf16* out, FoldedMidRoute f, int E, int k, bool renormalize, int32_t* ids, float* weights) {
  __shared__ float scratch[33];
  __shared__ int cand[kMidRouteMaxCand];
  __shared__ float part[kMidRouteThreads / 32][kMidRouteMaxCand];
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t base = int64_t(t) * dim;
  const int nvec = dim >> 2;
  const int C = min(k + kMidRouteExtra, E);
  float wv[NV][4];
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < nvec) detail::load_bf16<4>(w + 4 * i, wv[j]);
  }
  pdl_enter();
  // The row's loads first (every thread), then warp 0's folded ranking.
  const float4* src = reinterpret_cast<const float4*>(residual + base);
  float4 v[NV];
  float b[NV][4];
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < nvec) {
      v[j] = src[i];
      detail::load_bf16<4>(delta + int64_t(t) * ld_delta + 4 * i, b[j]);
    }
  }
  float lg[SLOTS];  // warp 0: the folded logits without the row's inv_x, then the routed ones
  if (warp == 0) {
    float u1[SLOTS], u2[SLOTS];
#pragma unroll
    for (int i = 0; i < SLOTS; ++i) {
      const int e = lane + 32 * i;
      u1[i] = e < E ? __bfloat162float(f.u1[int64_t(t) * f.ld_u1 + e]) : 0.f;
      u2[i] = e < E ? __bfloat162float(f.u2[int64_t(t) * f.ld_u2 + e]) : 0.f;
    }
    const float inv_h = __ldcg(f.inv_h + t);
    unsigned key[SLOTS];
#pragma unroll
    for (int i = 0; i < SLOTS; ++i) {
      const int e = lane + 32 * i;
      // As route_folded_body: W_r (g_post x inv_x) for x = h + W_o a is (u1 / inv_h + u2) inv_x.
      lg[i] = e < E ? u1[i] / inv_h + u2[i] : -INFINITY;
      key[i] = e < E ? ordered_key(lg[i]) : 0u;
    }
    // The C highest, the lowest expert among equals first.
    for (int c = 0; c < C; ++c) {
      unsigned best;
      const int be = take_largest_key(key, lane, best);
      if (lane == 0) cand[c] = be;
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < nvec) {
      float4& a = v[j];
      a.x += b[j][0];
      a.y += b[j][1];
      a.z += b[j][2];
      a.w += b[j][3];
      reinterpret_cast<float4*>(residual + base)[i] = a;
      ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    }
  }
  __syncthreads();  // cand published
  // This thread's slices of the candidates' router rows, in flight during the norm's reduction (NV <= 2).
  constexpr bool kEarly = NV <= 2;
  auto row_slice = [&](int c, int j) {
    const int i = threadIdx.x + j * blockDim.x;
    return c < C && i < nvec ? *reinterpret_cast<const uint2*>(f.router + int64_t(cand[c]) * dim + 4 * i)
                             : make_uint2(0u, 0u);
  };
  uint2 rw[kEarly ? kMidRouteMaxCand : 1][kEarly ? NV : 1];
  if constexpr (kEarly) {
#pragma unroll
    for (int c = 0; c < kMidRouteMaxCand; ++c)
#pragma unroll
      for (int j = 0; j < NV; ++j) rw[c][j] = row_slice(c, j);
  }
  const float inv = rsqrtf(detail::block_sum(ss, scratch) / float(dim) + eps);
  float xq[NV][4];  // the expert input as stored (bf16), which the exact logits multiply
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < nvec) {
      float o[4] = {wv[j][0] * (v[j].x * inv), wv[j][1] * (v[j].y * inv), wv[j][2] * (v[j].z * inv),
                    wv[j][3] * (v[j].w * inv)};
      detail::store_bf16<4>(out + base + 4 * i, o);
#pragma unroll
      for (int c = 0; c < 4; ++c) xq[j][c] = __bfloat162float(__float2bfloat16(o[c]));
    } else {
#pragma unroll
      for (int c = 0; c < 4; ++c) xq[j][c] = 0.f;
    }
  }
#pragma unroll
  for (int c = 0; c < kMidRouteMaxCand; ++c) {
    if (c >= C) continue;
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      uint2 slice;
      if constexpr (kEarly) slice = rw[c][j];
      else slice = row_slice(c, j);
      const __nv_bfloat162* r = reinterpret_cast<const __nv_bfloat162*>(&slice);
      const float2 r01 = __bfloat1622float2(r[0]), r23 = __bfloat1622float2(r[1]);
      acc += r01.x * xq[j][0] + r01.y * xq[j][1] + r23.x * xq[j][2] + r23.y * xq[j][3];
    }
    acc = detail::warp_sum(acc);
    if (lane == 0) part[warp][c] = acc;
  }
  __syncthreads();
  if (warp != 0) return;
  float exact = 0.f;
  if (lane < C)
    for (int w2 = 0; w2 < int(blockDim.x >> 5); ++w2) exact += part[w2][lane];
#pragma unroll
  for (int i = 0; i < SLOTS; ++i) lg[i] *= inv;
  for (int c = 0; c < C; ++c) {
    const float x = __shfl_sync(0xffffffffu, exact, c);
    const int e = cand[c];
#pragma unroll
    for (int i = 0; i < SLOTS; ++i)
      if (lane + 32 * i == e) lg[i] = x;
  }
  if (f.logits_out != nullptr)
#pragma unroll
    for (int i = 0; i < SLOTS; ++i)
      if (lane + 32 * i < E) f.logits_out[int64_t(t) * E + lane + 32 * i] = lg[i];
  route_token_values(lg, t, E, k, renormalize, ids, weights, lane);
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

bool moe_add_norm_route_fits(int H, int E, int k) {
  return H > 0 && H % 4 == 0 && H / 4 <= 8 * kMidRouteThreads && E >= 1 && E <= 32 * kRouteMaxPerLane && k >= 1 && k <= E &&
         k <= kRouteMaxTopK;
}

void moe_add_norm_route(float* residual, const bf16* delta, int64_t ld_delta, const bf16* norm_w, float eps, int T,
                        int H, const FoldedMidRoute& f, int E, int k, bool renormalize, bf16* xn_out, int32_t* ids,
                        float* weights, cudaStream_t stream) {
  MS_CHECK(moe_add_norm_route_fits(H, E, k), "moe_add_norm_route: H {} E {} top_k {} do not fit", H, E, k);
  MS_CHECK(T >= 0 && f.u1 && f.u2 && f.inv_h && f.router && f.ld_u1 >= E && f.ld_u2 >= E && ld_delta >= H && ld_delta % 4 == 0 &&
               aligned_to(residual, 16) && aligned_to(delta, 8) && aligned_to(norm_w, 8) && aligned_to(xn_out, 8),
           "moe_add_norm_route: u1, u2, inv_h, the router weights, strides of at least E / H (delta's a multiple of 4), a 16-byte "
           "aligned residual and 8-byte aligned delta, norm weight, xn_out");
  if (T == 0) return;
  // add_rmsnorm's block shape (launch_rmsnorm) for rows of up to 2,048 vectors: up to 256 threads.
  const int nvec = H / 4;
  const int threads = nvec <= 256 ? int(ceil_div(nvec, 32) * 32) : 256;
  const int per = int(ceil_div(nvec, threads));
  const int nv = per <= 1 ? 1 : per <= 2 ? 2 : per <= 4 ? 4 : 8;
  auto pick = [&](auto slots) {
    constexpr int S = decltype(slots)::value;
    return nv == 1   ? add_norm_route_kernel<1, S>
           : nv == 2 ? add_norm_route_kernel<2, S>
           : nv == 4 ? add_norm_route_kernel<4, S>
                     : add_norm_route_kernel<8, S>;
  };
  auto kernel = E <= 128   ? pick(std::integral_constant<int, 4>{})
                : E <= 256 ? pick(std::integral_constant<int, 8>{})
                           : pick(std::integral_constant<int, kRouteMaxPerLane>{});
  launch_pdl(kernel, dim3(unsigned(T)), dim3(unsigned(threads)), 0, stream, residual, delta, ld_delta, norm_w, eps,
             H, xn_out, f, E, k, renormalize, ids, weights);
  MS_CUDA_LAUNCH_CHECK();
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

// The attention input stage: per-head RMSNorm of q and k (Qwen3's q_norm / k_norm), rotary embedding, and the
// store of k and v into the paged cache. Block (t, y) takes token t's heads [8 y, 8 y + 8), one per warp (so a
// decode step of one token still spreads over several SMs): the cos/sin table of the token's position is
// computed into shared memory, then each warp takes its head (D / 32 consecutive elements a lane for head_dim
// 64 / 128 / 256; any other head_dim up to 256 takes a scalar path).
// Long steps (prefill chunks of at least MOESERVE_QKROPE_TOKENS_MIN tokens, RoPE over the whole head) run a
// token-major kernel instead: a warp a token, walking a range of its heads kUnroll at a time with every load of a
// round issued before the math, the (cos, sin) of its lane's elements computed once in registers. One block a
// token head-group made 40,960 blocks of one 256-byte head a warp per layer of a 16 x 512 prefill step, each
// waiting on a single load: ~100 us a layer against ~45 of byte floor on the H200.
#include <algorithm>

#include "core/env.h"
#include "cuda/kernels/kernel_utils.cuh"
#include "cuda/kernels/ops.h"
#include "cuda/launch.h"
#include "cuda/pdl.cuh"

namespace moeserve::cuda {

namespace {

constexpr int kWarps = 8;

struct QkNormRopeParams {
  bf16* qkv;
  int64_t qkv_stride;
  int heads, kv_heads;
  const bf16* q_norm;
  const bf16* k_norm;
  float eps;
  const int32_t* positions;
  const float* inv_freq;
  int rotary_dim;
  float attention_scaling;
  const int32_t* slots;
  bf16* k_cache;
  bf16* v_cache;
};

template <int N, bool VEC>
__device__ __forceinline__ void load_n(const bf16* p, float* v) {
  if constexpr (VEC) {
    detail::load_bf16<N>(p, v);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = __bfloat162float(p[j]);
  }
}

template <int N, bool VEC>
__device__ __forceinline__ void store_n(bf16* p, const float* v) {
  if constexpr (VEC) {
    detail::store_bf16<N>(p, v);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) p[j] = __float2bfloat16(v[j]);
  }
}

template <int D, bool VEC>
__global__ void __launch_bounds__(kWarps * 32) qk_norm_rope_store_kv_kernel(const QkNormRopeParams p) {
  constexpr int VPL = D / 32;  // elements per lane
  __shared__ float cos_s[D / 2], sin_s[D / 2];
  __shared__ float buf[kWarps][D];
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int half = p.rotary_dim / 2;
  // Before the programmatic wait, everything that does not come from the kernel before: the step's positions and
  // slots (copied in before the step's first kernel), the rotary table and the norm weights.
  if (half > 0) {
    // As transformers (and the CPU reference): the angle in f32, then cos / sin, then the scaling.
    const float pos = float(p.positions[t]);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      float sn, cs;
      sincosf(p.inv_freq[i] * pos, &sn, &cs);
      cos_s[i] = cs * p.attention_scaling;
      sin_s[i] = sn * p.attention_scaling;
    }
  }
  const int32_t slot = p.slots != nullptr ? p.slots[t] : -1;
  const int64_t cache_row = int64_t(slot) * p.kv_heads * D;
  bf16* row = p.qkv + t * p.qkv_stride;
  const int nh = p.heads + 2 * p.kv_heads;
  const int h = blockIdx.y * kWarps + warp;  // this warp's head
  const bf16* norm_w = h < p.heads ? p.q_norm : h < p.heads + p.kv_heads ? p.k_norm : nullptr;
  float wv[VPL];
  if (h < nh && norm_w != nullptr) load_n<VPL, VEC>(norm_w + lane * VPL, wv);
  pdl_enter();
  __syncthreads();
  if (h < nh) {
    bf16* x = row + int64_t(h) * D + lane * VPL;
    if (h >= p.heads + p.kv_heads) {  // v head: stored unchanged
      if (slot >= 0) {
        bf16* dst = p.v_cache + cache_row + int64_t(h - p.heads - p.kv_heads) * D + lane * VPL;
        if constexpr (VEC) {
          detail::copy_bf16<VPL>(dst, x);
        } else {
#pragma unroll
          for (int j = 0; j < VPL; ++j) dst[j] = x[j];
        }
      }
      return;
    }
    const bool is_q = h < p.heads;
    float v[VPL];
    load_n<VPL, VEC>(x, v);
    if (norm_w != nullptr) {
      float ss = 0.0f;
#pragma unroll
      for (int j = 0; j < VPL; ++j) ss += v[j] * v[j];
      const float inv = rsqrtf(detail::warp_sum(ss) / float(D) + p.eps);
#pragma unroll
      for (int j = 0; j < VPL; ++j) v[j] = wv[j] * (v[j] * inv);
    }
    if (half > 0) {
      float* b = buf[warp];
#pragma unroll
      for (int j = 0; j < VPL; ++j) b[lane * VPL + j] = v[j];
      __syncwarp();
#pragma unroll
      for (int j = 0; j < VPL; ++j) {
        const int i = lane * VPL + j;
        if (i < half) {
          v[j] = v[j] * cos_s[i] - b[i + half] * sin_s[i];
        } else if (i < 2 * half) {
          const int k = i - half;
          v[j] = v[j] * cos_s[k] + b[k] * sin_s[k];
        }
      }
      __syncwarp();  // buf is rewritten by this warp's next head
    }
    store_n<VPL, VEC>(x, v);
    if (!is_q && slot >= 0) store_n<VPL, VEC>(p.k_cache + cache_row + int64_t(h - p.heads) * D + lane * VPL, v);
  }
}

// Token-major (see the top): warp w of block (x, y) takes token x * kWarps + w and its heads
// [y * heads_per_block, (y + 1) * heads_per_block). Needs rotary_dim == D and vector alignment.
constexpr int kTokenUnroll = 8;  // heads whose loads are in flight together
template <int D>
__global__ void __launch_bounds__(kWarps * 32) qk_norm_rope_tokens_kernel(const QkNormRopeParams p, int T,
                                                                          int heads_per_block) {
  constexpr int VPL = D / 32;
  using Raw = std::conditional_t<VPL == 2, uint32_t, std::conditional_t<VPL == 4, uint2, uint4>>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * kWarps + warp;
  const int nh = p.heads + 2 * p.kv_heads;
  const int h_begin = int(blockIdx.y) * heads_per_block, h_end = min(nh, h_begin + heads_per_block);
  // Before the programmatic wait: what the kernel before does not write (positions, slots, weights, rotary).
  float cs[VPL], sn[VPL], qw[VPL] = {}, kw[VPL] = {};
  int32_t slot = -1;
  if (t < T) {
    detail::rope_lane_table<VPL>(p.inv_freq, float(p.positions[t]), p.attention_scaling, lane, cs, sn);
    if (p.q_norm != nullptr) detail::load_bf16<VPL>(p.q_norm + lane * VPL, qw);
    if (p.k_norm != nullptr) detail::load_bf16<VPL>(p.k_norm + lane * VPL, kw);
    if (p.slots != nullptr) slot = p.slots[t];
  }
  pdl_enter();
  if (t >= T) return;
  bf16* row = p.qkv + t * p.qkv_stride + lane * VPL;
  const int64_t cache_row = int64_t(slot) * p.kv_heads * D + lane * VPL;
  for (int h0 = h_begin; h0 < h_end; h0 += kTokenUnroll) {
    Raw raw[kTokenUnroll];
#pragma unroll
    for (int u = 0; u < kTokenUnroll; ++u)
      if (h0 + u < h_end) raw[u] = *reinterpret_cast<const Raw*>(row + int64_t(h0 + u) * D);
#pragma unroll
    for (int u = 0; u < kTokenUnroll; ++u) {
      const int h = h0 + u;
      if (h >= h_end) break;
      if (h >= p.heads + p.kv_heads) {  // v head: to the cache unchanged
        if (slot >= 0)
          *reinterpret_cast<Raw*>(p.v_cache + cache_row + int64_t(h - p.heads - p.kv_heads) * D) = raw[u];
        continue;
      }
      const bool is_q = h < p.heads;
      float x[VPL];
      const __nv_bfloat162* hv = reinterpret_cast<const __nv_bfloat162*>(&raw[u]);
#pragma unroll
      for (int j = 0; j < VPL / 2; ++j) {
        const float2 f = __bfloat1622float2(hv[j]);
        x[2 * j] = f.x;
        x[2 * j + 1] = f.y;
      }
      detail::norm_rope_head<VPL>(x, is_q ? qw : kw, (is_q ? p.q_norm : p.k_norm) != nullptr, p.eps, cs, sn, lane);
      detail::store_bf16<VPL>(row + int64_t(h) * D, x);
      if (!is_q && slot >= 0) detail::store_bf16<VPL>(p.k_cache + cache_row + int64_t(h - p.heads) * D, x);
    }
  }
}

// Any head_dim up to kMaxGenericDim (the small test models): lane j holds elements j, j + 32, ...; scalar
// accesses. Same math as the kernel above.
constexpr int kMaxGenericDim = 256;

__global__ void __launch_bounds__(kWarps * 32) qk_norm_rope_store_kv_generic_kernel(const QkNormRopeParams p, int D) {
  constexpr int kMaxPerLane = kMaxGenericDim / 32;
  __shared__ float cos_s[kMaxGenericDim / 2], sin_s[kMaxGenericDim / 2];
  __shared__ float buf[kWarps][kMaxGenericDim];
  pdl_enter();
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int half = p.rotary_dim / 2;
  if (half > 0) {
    const float pos = float(p.positions[t]);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      float sn, cs;
      sincosf(p.inv_freq[i] * pos, &sn, &cs);
      cos_s[i] = cs * p.attention_scaling;
      sin_s[i] = sn * p.attention_scaling;
    }
  }
  __syncthreads();
  const int32_t slot = p.slots != nullptr ? p.slots[t] : -1;
  const int64_t cache_row = int64_t(slot) * p.kv_heads * D;
  bf16* row = p.qkv + t * p.qkv_stride;
  const int nh = p.heads + 2 * p.kv_heads;
  for (int h = blockIdx.y * kWarps + warp; h < nh && h < int(blockIdx.y + 1) * kWarps; h += kWarps) {
    bf16* x = row + int64_t(h) * D;
    if (h >= p.heads + p.kv_heads) {
      if (slot >= 0) {
        bf16* dst = p.v_cache + cache_row + int64_t(h - p.heads - p.kv_heads) * D;
        for (int i = lane; i < D; i += 32) dst[i] = x[i];
      }
      continue;
    }
    const bool is_q = h < p.heads;
    float v[kMaxPerLane];
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int i = lane + 32 * j;
      v[j] = i < D ? __bfloat162float(x[i]) : 0.0f;
    }
    const bf16* w = is_q ? p.q_norm : p.k_norm;
    if (w != nullptr) {
      float ss = 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxPerLane; ++j) ss += v[j] * v[j];
      const float inv = rsqrtf(detail::warp_sum(ss) / float(D) + p.eps);
#pragma unroll
      for (int j = 0; j < kMaxPerLane; ++j) {
        const int i = lane + 32 * j;
        if (i < D) v[j] = __bfloat162float(w[i]) * (v[j] * inv);
      }
    }
    if (half > 0) {
      float* b = buf[warp];
#pragma unroll
      for (int j = 0; j < kMaxPerLane; ++j) {
        const int i = lane + 32 * j;
        if (i < D) b[i] = v[j];
      }
      __syncwarp();
#pragma unroll
      for (int j = 0; j < kMaxPerLane; ++j) {
        const int i = lane + 32 * j;
        if (i < half) {
          v[j] = v[j] * cos_s[i] - b[i + half] * sin_s[i];
        } else if (i < 2 * half) {
          const int k = i - half;
          v[j] = v[j] * cos_s[k] + b[k] * sin_s[k];
        }
      }
      __syncwarp();
    }
    bf16* kdst = (!is_q && slot >= 0) ? p.k_cache + cache_row + int64_t(h - p.heads) * D : nullptr;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < D) {
        x[i] = __float2bfloat16(v[j]);
        if (kdst != nullptr) kdst[i] = x[i];
      }
    }
  }
}

template <int D>
void launch(const QkNormRopeParams& p, dim3 grid, bool vec, cudaStream_t stream) {
  if (vec) {
    launch_pdl(qk_norm_rope_store_kv_kernel<D, true>, grid, dim3(kWarps * 32), 0, stream, p);
  } else {
    launch_pdl(qk_norm_rope_store_kv_kernel<D, false>, grid, dim3(kWarps * 32), 0, stream, p);
  }
}

// Steps of at least this many tokens take the token-major kernel (MOESERVE_QKROPE_TOKENS_MIN; 0 never).
int token_major_min_tokens() {
  static const int v = [] {
    const int n = int(env_int("MOESERVE_QKROPE_TOKENS_MIN", 512, 0, 1 << 30));
    return n == 0 ? (1 << 30) : n;
  }();
  return v;
}

}  // namespace

void qk_norm_rope_store_kv(bf16* qkv, int64_t qkv_stride, int T, int heads, int kv_heads, int head_dim,
                           const bf16* q_norm, const bf16* k_norm, float eps, const int32_t* positions,
                           const RopeArgs& rope, const int32_t* slots, bf16* k_cache, bf16* v_cache,
                           cudaStream_t stream) {
  MS_CHECK(head_dim > 0 && head_dim <= kMaxGenericDim, "qk_norm_rope_store_kv: head_dim {} is not supported (1..{})",
           head_dim, kMaxGenericDim);
  MS_CHECK(T >= 0 && heads > 0 && kv_heads > 0, "qk_norm_rope_store_kv: T {} heads {} kv_heads {}", T, heads,
           kv_heads);
  MS_CHECK(qkv_stride >= int64_t(heads + 2 * kv_heads) * head_dim, "qk_norm_rope_store_kv: qkv_stride {} < {}",
           qkv_stride, int64_t(heads + 2 * kv_heads) * head_dim);
  MS_CHECK(rope.rotary_dim >= 0 && rope.rotary_dim % 2 == 0 && rope.rotary_dim <= head_dim,
           "qk_norm_rope_store_kv: rotary_dim {} (head_dim {})", rope.rotary_dim, head_dim);
  MS_CHECK(rope.rotary_dim == 0 || rope.inv_freq != nullptr, "qk_norm_rope_store_kv: no inv_freq");
  MS_CHECK(slots == nullptr || (k_cache != nullptr && v_cache != nullptr), "qk_norm_rope_store_kv: no cache");
  if (T == 0) return;
  QkNormRopeParams p{qkv,       qkv_stride,     heads, kv_heads,          q_norm, k_norm,  eps,    positions,
                     rope.inv_freq, rope.rotary_dim, rope.attention_scaling, slots,  k_cache, v_cache};
  // Vector accesses of D / 32 elements a lane need every head start aligned to that many bf16.
  const int per_lane = std::max(head_dim / 32, 1);
  const uintptr_t vec_bytes = uintptr_t(per_lane) * sizeof(bf16);
  const bool vec = qkv_stride % per_lane == 0 && detail::aligned_to(qkv, vec_bytes) &&
                   detail::aligned_to(q_norm, vec_bytes) && detail::aligned_to(k_norm, vec_bytes) &&
                   detail::aligned_to(k_cache, vec_bytes) && detail::aligned_to(v_cache, vec_bytes);
  const int nh = heads + 2 * kv_heads;
  // The token-major kernel rotates whole heads per lane pair, as the fused decode attention's input stage does.
  if (vec && attention_input_stage_fusable(AttnShape{heads, kv_heads, head_dim}, rope) &&
      T >= token_major_min_tokens()) {
    // About one wave of 8-warp blocks (8 an SM): long steps give each warp all of its token's heads.
    const int blocks_x = int(ceil_div(T, kWarps));
    const int groups = std::clamp(int(ceil_div(1024, blocks_x)), 1, int(ceil_div(nh, kTokenUnroll)));
    const int per_block = int(ceil_div(nh, groups));
    const dim3 tgrid(unsigned(blocks_x), unsigned(ceil_div(nh, per_block)));
    auto kernel = head_dim == 64    ? qk_norm_rope_tokens_kernel<64>
                  : head_dim == 128 ? qk_norm_rope_tokens_kernel<128>
                                    : qk_norm_rope_tokens_kernel<256>;
    launch_pdl(kernel, tgrid, dim3(kWarps * 32), 0, stream, p, T, per_block);
    return;
  }
  const dim3 grid(unsigned(T), unsigned(ceil_div(nh, kWarps)));
  switch (head_dim) {
    case 64: launch<64>(p, grid, vec, stream); break;
    case 128: launch<128>(p, grid, vec, stream); break;
    case 256: launch<256>(p, grid, vec, stream); break;
    default:
      launch_pdl(qk_norm_rope_store_kv_generic_kernel, grid, dim3(kWarps * 32), 0, stream, p, head_dim);
      break;
  }
}

}  // namespace moeserve::cuda

// Small device helpers shared by the kernels of this folder (internal header: not part of ops.h).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common.h"

namespace moeserve::cuda::detail {

using ::moeserve::cuda::aligned_to;  // (cuda/common.h)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 33 floats of shared memory; the call ends with the block synchronized.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < nwarps ? scratch[lane] : 0.0f;
    t = warp_sum(t);
    if (lane == 0) scratch[32] = t;
  }
  __syncthreads();
  return scratch[32];
}

// N consecutive bf16 <-> f32, with one vector access when the address is aligned to 2 * N bytes
// (N in {1, 2, 4, 8}; the caller guarantees the alignment).
template <int N>
__device__ __forceinline__ void load_bf16(const bf16* p, float* out) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "N");
  if constexpr (N == 1) {
    out[0] = __bfloat162float(*p);
  } else {
    using V = std::conditional_t<N == 2, uint32_t, std::conditional_t<N == 4, uint2, uint4>>;
    V v = *reinterpret_cast<const V*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      float2 f = __bfloat1622float2(h[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
}

template <int N>
__device__ __forceinline__ void store_bf16(bf16* p, const float* in) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "N");
  if constexpr (N == 1) {
    *p = __float2bfloat16(in[0]);
  } else {
    using V = std::conditional_t<N == 2, uint32_t, std::conditional_t<N == 4, uint2, uint4>>;
    V v;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) h[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
    *reinterpret_cast<V*>(p) = v;
  }
}

// Copies N consecutive bf16 (aligned to 2 * N bytes) without conversion.
template <int N>
__device__ __forceinline__ void copy_bf16(bf16* dst, const bf16* src) {
  if constexpr (N == 1) {
    *dst = *src;
  } else {
    using V = std::conditional_t<N == 2, uint32_t, std::conditional_t<N == 4, uint2, uint4>>;
    *reinterpret_cast<V*>(dst) = *reinterpret_cast<const V*>(src);
  }
}

// The rotary (cos, sin) of a lane's elements [lane * VPL, lane * VPL + VPL) of a head of VPL * 32 dims at
// position pos (rotate-half over the whole head: element e pairs with e +- D / 2 and uses frequency e mod D / 2).
// As transformers: the angle in f32, then cos / sin, then the scaling.
template <int VPL>
__device__ __forceinline__ void rope_lane_table(const float* inv_freq, float pos, float scaling, int lane,
                                                float (&cs)[VPL], float (&sn)[VPL]) {
  constexpr int kHalf = VPL * 16;
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    sincosf(inv_freq[(lane * VPL + j) % kHalf] * pos, &sn[j], &cs[j]);
    cs[j] *= scaling;
    sn[j] *= scaling;
  }
}

// The attention input stage of one head, done by one warp (the fused decode attention and the token-major
// qk_norm_rope_store_kv): the lane holds elements [lane * VPL, lane * VPL + VPL) of x (raw, f32); RMSNorm with w (unless null), then the rotate-half RoPE over
// the whole head with the lane's (cos, sin) pairs, whose partner elements sit in lane ^ 16. The same math, in
// the same order, as qk_norm_rope_store_kv.
template <int VPL>
__device__ __forceinline__ void norm_rope_head(float (&x)[VPL], const float (&w)[VPL], bool norm, float eps,
                                               const float (&cs)[VPL], const float (&sn)[VPL], int lane) {
  if (norm) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < VPL; ++j) ss += x[j] * x[j];
    const float inv = rsqrtf(warp_sum(ss) / float(VPL * 32) + eps);
#pragma unroll
    for (int j = 0; j < VPL; ++j) x[j] = w[j] * (x[j] * inv);
  }
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    const float other = __shfl_xor_sync(0xffffffffu, x[j], 16);
    x[j] = lane < 16 ? x[j] * cs[j] - other * sn[j] : x[j] * cs[j] + other * sn[j];
  }
}

}  // namespace moeserve::cuda::detail

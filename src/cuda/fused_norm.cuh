// Device helpers for kernels that take the residual add + RMSNorm of a decode step into their prologue (the
// fused norm + GEMV and norm + router kernels): every block normalizes the step's few token rows itself into
// shared memory, and the block that finishes last writes the updated residual back (before that, every block
// still reads the old residual).
#pragma once

#include "cuda/common.h"

namespace moeserve::cuda {

// dst[0..3] = bf16(w[i] * (v[i] * inv)): four elements of a normalized row, rounded as rmsnorm / add_rmsnorm
// (w 8-byte aligned, dst 8-byte aligned).
__device__ __forceinline__ void store_norm4(bf16* dst, const float4& v, const bf16* w, float inv) {
  const __nv_bfloat162* wb = reinterpret_cast<const __nv_bfloat162*>(w);
  const float2 w0 = __bfloat1622float2(wb[0]), w1 = __bfloat1622float2(wb[1]);
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(dst);
  o[0] = __floats2bfloat162_rn(w0.x * (v.x * inv), w0.y * (v.y * inv));
  o[1] = __floats2bfloat162_rn(w1.x * (v.z * inv), w1.y * (v.w * inv));
}

// The residual fusion's RMS factor 1 / sqrt(mean square + eps) of a row of K elements from a warp's lane sums of
// its per-part sums of squares (lane l having added parts l, l + 32, ... in that order): a fixed xor tree, so every
// kernel that applies a row's norm from its partial sums (gemv_norm_in, moe_route_folded) gets the same bits.
__device__ __forceinline__ float rms_inverse_from_lane_sums(float ss, int K, float eps) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  return rsqrtf(ss / float(K) + eps);  // as rmsnorm / add_rmsnorm
}

// xs[t * ld + k] = bf16(rmsnorm(x_t) * w)[k] for t < T, x_t = residual[t] + float(delta[t]) (delta may be null),
// the norm in f32 as rmsnorm / add_rmsnorm compute it. The whole block works on one row at a time (each thread a
// few float4 kept in registers between the sum of squares and the write: one L2 round trip per row). Needs
// K % 4 == 0, K <= 4 * kNormMaxVec * blockDim.x, residual 16-byte aligned, delta and w 8-byte aligned. Ends
// with the block synchronized. Reads through L2 (__ldcg): the rows come from the kernel before (see pdl.cuh).
constexpr int kNormMaxVec = 8;
__device__ __forceinline__ void norm_rows_to_smem(const float* residual, const bf16* delta, const bf16* w, float eps,
                                                  int T, int K, bf16* xs, int ld) {
  __shared__ float red[33];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5, nv = K / 4;
  for (int t = 0; t < T; ++t) {
    const float4* r = reinterpret_cast<const float4*>(residual + int64_t(t) * K);
    const uint2* d = delta != nullptr ? reinterpret_cast<const uint2*>(delta + int64_t(t) * K) : nullptr;
    float4 v[kNormMaxVec];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kNormMaxVec; ++j) {
      const int i = threadIdx.x + j * blockDim.x;
      if (i < nv) {
        float4 a = __ldcg(r + i);
        if (d != nullptr) {
          const uint2 dv = __ldcg(d + i);
          const float2 d0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&dv.x));
          const float2 d1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&dv.y));
          a.x += d0.x, a.y += d0.y, a.z += d1.x, a.w += d1.y;
        }
        v[j] = a;
        ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    if (warp == 0) {
      float tot = lane < nwarps ? red[lane] : 0.0f;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) tot += __shfl_xor_sync(0xffffffffu, tot, o);
      if (lane == 0) red[32] = tot;
    }
    __syncthreads();
    const float inv = rsqrtf(red[32] / float(K) + eps);
#pragma unroll
    for (int j = 0; j < kNormMaxVec; ++j) {
      const int i = threadIdx.x + j * blockDim.x;
      if (i < nv) store_norm4(xs + t * ld + 4 * i, v[j], w + 4 * i, inv);
    }
  }
  __syncthreads();
}

// Counts this block as finished (after its last read of the old residual); true in the one block that finishes
// last of the `blocks` that count on `counter` (default: the whole grid), which also resets the counter for the next
// launch. Every thread of the block must call it.
__device__ __forceinline__ bool finished_last(int* counter, int blocks = -1) {
  __shared__ int last;
  if (blocks < 0) blocks = int(gridDim.x * gridDim.y * gridDim.z);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1) == blocks - 1;
    if (last) *counter = 0;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// residual[t] += float(delta[t]) for t < T, by one block (the last one: nobody reads the old values any more).
__device__ __forceinline__ void add_to_residual(float* residual, const bf16* delta, int T, int K) {
  for (int i = threadIdx.x; i < T * K / 4; i += blockDim.x) {
    float4 a = __ldcg(reinterpret_cast<float4*>(residual) + i);
    const __nv_bfloat162* db = reinterpret_cast<const __nv_bfloat162*>(delta + 4 * i);
    const float2 d0 = __bfloat1622float2(db[0]), d1 = __bfloat1622float2(db[1]);
    a.x += d0.x, a.y += d0.y, a.z += d1.x, a.w += d1.y;
    reinterpret_cast<float4*>(residual)[i] = a;
  }
}

}  // namespace moeserve::cuda

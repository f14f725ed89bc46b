// Device building blocks of the GPU sampler (sampling_kernel.cuh): constants, the order key, block-wide
// reductions and scans, the bitonic sort of a candidate set, and the three thread-block-cluster hooks.
// Plain CUDA C++ without project includes, so that the same source can also be compiled for a host-side
// emulation of the CUDA features it uses (the hooks below are then supplied by the emulation).
#pragma once

#include <climits>
#include <cstdint>

#if defined(__CUDACC__)
#include <cooperative_groups.h>
#endif

// The threads a block and the namespace of this compilation of the sampler (sampling_256.cu compiles it a second time,
// with 256 threads, in a namespace of its own).
#ifndef MOESERVE_SAMPLING_NS
#define MOESERVE_SAMPLING_NS sampling_detail
#endif

namespace moeserve::cuda::MOESERVE_SAMPLING_NS {

using u64 = unsigned long long;

#ifndef MOESERVE_SAMPLING_THREADS
#define MOESERVE_SAMPLING_THREADS 512
#endif
constexpr int kThreads = MOESERVE_SAMPLING_THREADS;
constexpr int kWarps = kThreads / 32;
constexpr int kClusterBlocks = 8;  // blocks per row (one thread-block cluster), each a slice of the row
constexpr int kBins = 256;         // histogram bins of one selection pass
#ifndef MOESERVE_SAMPLING_CAP
#define MOESERVE_SAMPLING_CAP 4096
#endif
constexpr int kCap = MOESERVE_SAMPLING_CAP;  // candidate tokens gathered in block 0 of a cluster (a power of two)
constexpr int kMaxTop = 64;        // top logprobs per row
constexpr float kMassScale = 1099511627776.0f;  // 2^40: V * 2^40 < 2^64 for V < 2^24
// exp(-28.5) < 2^-41: a token whose temperature-scaled logit lies this far below the top one has mass 0.
constexpr float kMassRange = 28.5f;
constexpr unsigned kFull = 0xffffffffu;

#if defined(__CUDACC__)
__device__ __forceinline__ unsigned cluster_rank() { return cooperative_groups::this_cluster().block_rank(); }
__device__ __forceinline__ void cluster_sync() { cooperative_groups::this_cluster().sync(); }
// The same shared-memory object in block `rank` of this cluster.
template <class T>
__device__ __forceinline__ T* cluster_peer(T* p, unsigned rank) {
  return cooperative_groups::this_cluster().map_shared_rank(p, rank);
}
#endif

// Monotone float -> uint32 map (larger float, larger key). -0 and +0 compare equal as floats, so they share
// a key; NaN is left wherever its bits put it (the CPU's comparisons are undefined for it anyway).
__device__ __forceinline__ uint32_t order_key(float x) {
  if (x == 0.0f) x = 0.0f;
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The largest value, lowest index on ties (as std::max_element / torch.argmax).
struct ArgMax {
  float v;
  int i;
};
__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}

// Running max and sum of exp(x - max): a log-sum-exp that merges in any order.
struct OnlineSum {
  float m;
  double s;
};
__device__ __forceinline__ OnlineSum combine(OnlineSum a, OnlineSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0};
  return {m, a.s * exp(double(a.m) - m) + b.s * exp(double(b.m) - m)};
}

// A prefix of the order (key descending, id ascending): key above `key`, or equal to it with id below `cut`.
struct Prefix {
  uint32_t key;
  int cut;
  __device__ bool has(int v, uint32_t k) const { return k > key || (k == key && v < cut); }
};
constexpr Prefix kEverything{0u, INT_MAX};

__device__ __forceinline__ u64 warp_sum(u64 v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// Sum over the block; every thread gets it. `scratch` holds kWarps values and is free again on return.
__device__ __forceinline__ u64 block_sum(u64 v, u64* scratch) {
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  u64 t = 0;
  for (int w = 0; w < kWarps; ++w) t += scratch[w];
  __syncthreads();
  return t;
}

// Exclusive prefix of v over the block in thread order; `total` gets the block's sum.
__device__ __forceinline__ u64 block_exclusive_scan(u64 v, u64& total, u64* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  u64 incl = v;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const u64 n = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  u64 before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    const u64 t = scratch[w];
    if (w < warp) before += t;
    all += t;
  }
  __syncthreads();
  total = all;
  return before + incl - v;
}

// Sorts keys[0, n) (n a power of two, at most kCap) descending, carrying idx along.
__device__ __forceinline__ void bitonic_sort_desc(u64* keys, uint16_t* idx, int n) {
  for (int k = 2; k <= n; k *= 2)
    for (int j = k / 2; j > 0; j /= 2) {
      for (int i = threadIdx.x; i < n / 2; i += kThreads) {
        const int a = ((i & ~(j - 1)) << 1) | (i & (j - 1)), b = a + j;
        const bool desc = (a & k) == 0;
        const u64 ka = keys[a], kb = keys[b];
        if (desc ? ka < kb : ka > kb) {
          keys[a] = kb;
          keys[b] = ka;
          const uint16_t t = idx[a];
          idx[a] = idx[b];
          idx[b] = t;
        }
      }
      __syncthreads();
    }
}

// Sort key of a candidate: the order key above, the id ascending below (so descending = the CPU's order).
__device__ __forceinline__ u64 rank_key(uint32_t key, int id) { return (u64(key) << 32) | u64(0xffffffffu - uint32_t(id)); }

}  // namespace moeserve::cuda::MOESERVE_SAMPLING_NS

// gpu_layer_persistent: the layer's shapes, parameters and the device helpers v1 and v2 share (see gpu_layer_persistent.cu).
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "bench_ptx.cuh"
#include "bench_ring.cuh"
#include "cuda/kernels/kernel_utils.cuh"

namespace {

using bf16 = __nv_bfloat16;
using namespace bench_ptx;
using moeserve::cuda::detail::warp_max;
using moeserve::cuda::detail::warp_sum;

constexpr int kH = 2048, kHeads = 32, kKvHeads = 4, kDim = 128, kGroup = kHeads / kKvHeads;
constexpr int kQ = kHeads * kDim, kQkv = kQ + 2 * kKvHeads * kDim;  // 4096, 5120
constexpr int kExperts = 128, kTopK = 8, kI = 768, kGu = 2 * kI;
constexpr int kORows = kH + kExperts;  // o_proj and the router stand-in: 2176
constexpr int kCtx = 512, kParts = 32, kKeysPart = kCtx / kParts;
constexpr int kAttnCtas = kKvHeads * kParts;  // 128
constexpr int kPartFloats = 2 + kDim;         // m, l, o
constexpr int kSlot = 8192;
constexpr int kConsumerWarps = 8, kConsumers = kConsumerWarps * 32, kThreads = kConsumers + 32;
constexpr int kMaxRing = 24, kMaxD = 48, kMaxE = 96, kMaxLayers = 48, kOwnRowsMax = 24;
constexpr int kRowsQkv = kSlot / (kH * 2), kRowsO = kSlot / (kQ * 2), kRowsGu = kSlot / (kH * 2),
              kRowsDown = kSlot / (kI * 2);  // 2, 1, 2, 5 rows a slot
constexpr int kRowsMax = kRowsDown;
constexpr int kStages = 7;
enum Stage { kStQkv, kStAttn, kStMerge, kStRouter, kStO, kStGu, kStDown };  // (kStRouter: v2's; v1's o has it)
enum Kind : short { kKindQkv, kKindKv, kKindO, kKindGu, kKindDown };
constexpr int kXsElems = kTopK * kI;  // the largest staged input: the 8 experts' activations
constexpr double kReadTBs = 4.6;      // bench/gpu_read_bw, H200 (session 20)

struct Params {
  const bf16 *wqkv, *wo, *wgu, *wd, *kc, *vc;  // all layers, layer-major
  float* h;                                    // [L + 1][kH]
  float* qkv;                                  // [L][kQkv]
  float* part;                                 // [L][kKvHeads][kParts][kGroup][kPartFloats]
  bf16* attn;                                  // [L][kQ]
  float* o;                                    // [L][kORows]
  float* gu;                                   // [L][kTopK][kGu]
  int* ids;                                    // [L][kTopK] (CTA 0's routing, for the check)
  float* wts;                                  // [L][kTopK]
  unsigned* cnt;                               // [L][kStages], counted across launches (epochs)
  unsigned long long* clocks;                  // [G][L][kStages][2] %globaltimer at each stage's start, work done
  int layers, d_slots, e_slots;
  int no_deps;                                 // 1: nothing waits for the counters (the pipeline's raw rate)
  int interleave;                              // 1: slot t of an op to CTA t % G (else each CTA a contiguous range)
  int no_compute;                              // 1: the consumers wait for each slot and release it, no products
  int producer_sleep;                          // ns a producer lane backs off when it cannot issue (0: spins)
  unsigned long long* item_clocks;             // [2][kMaxE]: CTA 0's issue and landing time of layer 1's E items
  int hint;                                    // 1: weight copies with the L2 evict_first policy
  unsigned epoch;
  int early_route;  // v2: a block routes as soon as the router rows are complete, during o_proj (else after it)
};

struct SlotDesc {
  short kind, j, row0, rows;  // j: the expert slot (gu, down); row0: the first row within the op (or expert)
  short acc0;                 // down: the index of row0 among the CTA's own rows
};

__host__ __device__ inline int split_lo(int n, int c, int g) { return int((long long)n * c / g); }

__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory"); }

// A stage's outputs are visible to every CTA: all consumers are past their writes, one fence, one count.
__device__ __forceinline__ void signal(unsigned* cnt, unsigned long long* done_stamp) {
  consumers_sync();
  if (threadIdx.x == 0) {
    *done_stamp = global_ns();
    __threadfence();
    atomicAdd(cnt, 1u);
  }
}
__device__ __forceinline__ void wait_count(const unsigned* cnt, unsigned target, int no_deps) {
  if (threadIdx.x == 0 && !no_deps)
    while (ld_acquire(cnt) < target) {
    }
  consumers_sync();
}

// Sum over the 256 consumer threads (red: 8 floats of shared memory).
__device__ __forceinline__ float consumers_sum(float v, float* red) {
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  consumers_sync();
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < kConsumerWarps; ++w) s += red[w];
  consumers_sync();
  return s;
}

// Rows [0, rows) of K bf16 weights each (a slot in shared memory) against x (f32 in shared memory, staged once a
// stage so that only the weights are converted: Hopper's integer rate is half its f32 FMA rate), summed over the
// warp: one pass over x with an independent accumulator a row.
template <int RMAX>
__device__ __forceinline__ void rows_dot(const bf16* w, int rows, const float* x, int K, float (&y)[RMAX]) {
  const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll
  for (int r = 0; r < RMAX; ++r) y[r] = 0.f;
  for (int q = threadIdx.x % 32; q < K / 8; q += 32) {
    const float4 xa = x4[2 * q], xb = x4[2 * q + 1];
#pragma unroll
    for (int r = 0; r < RMAX; ++r)
      if (r < rows) {
        const uint4 wv = reinterpret_cast<const uint4*>(w + size_t(r) * K)[q];
        float s2 = y[r];
        s2 = fmaf(__uint_as_float(wv.x << 16), xa.x, s2);
        s2 = fmaf(__uint_as_float(wv.x & 0xffff0000u), xa.y, s2);
        s2 = fmaf(__uint_as_float(wv.y << 16), xa.z, s2);
        s2 = fmaf(__uint_as_float(wv.y & 0xffff0000u), xa.w, s2);
        s2 = fmaf(__uint_as_float(wv.z << 16), xb.x, s2);
        s2 = fmaf(__uint_as_float(wv.z & 0xffff0000u), xb.y, s2);
        s2 = fmaf(__uint_as_float(wv.w << 16), xb.z, s2);
        s2 = fmaf(__uint_as_float(wv.w & 0xffff0000u), xb.w, s2);
        y[r] = s2;
      }
  }
#pragma unroll
  for (int r = 0; r < RMAX; ++r) y[r] = warp_sum(y[r]);
}

// xs = bf16(v * rsqrt(mean(v^2) + eps)) (as f32 or bf16) for v = a (+ b), kH values from global memory.
template <typename T>
__device__ __forceinline__ void stage_norm(const float* a, const float* b, T* xs, float* red) {
  float v[kH / kConsumers], ss = 0.f;
#pragma unroll
  for (int i = 0; i < kH / kConsumers; ++i) {
    const int k = threadIdx.x + kConsumers * i;
    v[i] = __ldcg(a + k) + (b ? __ldcg(b + k) : 0.f);
    ss += v[i] * v[i];
  }
  const float r = rsqrtf(consumers_sum(ss, red) / kH + 1e-6f);
#pragma unroll
  for (int i = 0; i < kH / kConsumers; ++i) xs[threadIdx.x + kConsumers * i] = T(__float2bfloat16_rn(v[i] * r));
  consumers_sync();
}

// The down stage's input: act = bf16(silu(g) u) of the 8 experts' gate/up outputs of layer l (as f32 or bf16).
template <typename T>
__device__ __forceinline__ void stage_act(const Params& p, int l, T* xs) {
  for (int i = threadIdx.x; i < kTopK * kI; i += kConsumers) {
    const int j = i / kI, k = i % kI;
    const float g = __ldcg(p.gu + (size_t(l) * kTopK + j) * kGu + k);
    const float u = __ldcg(p.gu + (size_t(l) * kTopK + j) * kGu + kI + k);
    xs[i] = T(__float2bfloat16_rn(g / (1.f + __expf(-g)) * u));
  }
}

// The attention stage of CTA c < kAttnCtas (kv head c / 32, keys [16 p, 16 p + 16) for p = c % 32): its 8 query
// heads' partial softmax over its keys (ks / vs: their K and V rows in shared memory; the last part's key 15 is the
// new token's, taken from q/k/v) into p.part.
__device__ __forceinline__ void attention_part(const Params& p, int l, int c, const bf16* ks, const bf16* vs,
                                               float* q_s, float* newk, float* newv) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* qkv = p.qkv + size_t(l) * kQkv;
  const int hk = c / kParts, part = c % kParts;
  const float scale = rsqrtf(float(kDim));
  for (int i = threadIdx.x; i < kGroup * kDim; i += kConsumers) q_s[i] = __ldcg(qkv + hk * kGroup * kDim + i) * scale;
  if (threadIdx.x < kDim) {
    newk[threadIdx.x] = __ldcg(qkv + kQ + hk * kDim + threadIdx.x);
    newv[threadIdx.x] = __ldcg(qkv + kQ + kKvHeads * kDim + hk * kDim + threadIdx.x);
  }
  consumers_sync();
  const bool last = part == kParts - 1;  // its key 15 is the new token's
  // Lane: key lane % 16, dims [64 (lane / 16), +64) as 8 chunks of 8, rotated by the key so that the 8 lanes of
  // a 16-byte load phase read 8 different bank groups.
  const int key = lane & 15, hh = lane >> 4;
  const bool newkey = last && key == kKeysPart - 1;
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int d = 64 * hh + 8 * ((i + key) & 7);
    const float* q8 = q_s + warp * kDim + d;
    if (newkey) {
#pragma unroll
      for (int t = 0; t < 8; ++t) s = fmaf(q8[t], newk[d + t], s);
    } else {
      const uint4 k8 = *reinterpret_cast<const uint4*>(ks + key * kDim + d);
      const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&k8);
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const float2 kf = __bfloat1622float2(k2[t]);
        s = fmaf(q8[2 * t], kf.x, s);
        s = fmaf(q8[2 * t + 1], kf.y, s);
      }
    }
  }
  s += __shfl_xor_sync(0xffffffffu, s, 16);
  const float m = warp_max(s);  // lanes k and k + 16 hold the same score
  const float e = __expf(s - m);
  const float lsum = warp_sum(e) * 0.5f;
  float ov[4] = {0.f, 0.f, 0.f, 0.f};
  for (int k = 0; k < kKeysPart; ++k) {
    const float ek = __shfl_sync(0xffffffffu, e, k);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int d = 4 * lane + i;
      const float vd = last && k == kKeysPart - 1 ? newv[d] : __bfloat162float(vs[k * kDim + d]);
      ov[i] = fmaf(ek, vd, ov[i]);
    }
  }
  float* out = p.part + ((((size_t(l) * kKvHeads + hk) * kParts + part) * kGroup + warp) * kPartFloats);
  if (lane == 0) out[0] = m, out[1] = lsum;
#pragma unroll
  for (int i = 0; i < 4; ++i) out[2 + 4 * lane + i] = ov[i];
}

// The merge stage of CTA c < kAttnCtas: 32 output dims of query head c / 4 from the 32 parts (warp 0).
__device__ __forceinline__ void attention_merge(const Params& p, int l, int c) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == 0) {
    const int qh = c / 4, d0 = (c % 4) * 32, hk = qh / kGroup, w = qh % kGroup;
    auto part_ptr = [&](int pp) {
      return p.part + ((((size_t(l) * kKvHeads + hk) * kParts + pp) * kGroup + w) * kPartFloats);
    };
    const float mp = __ldcg(part_ptr(lane)), lp = __ldcg(part_ptr(lane) + 1);  // lane = part
    const float M = warp_max(mp);
    const float sc = __expf(mp - M);
    const float Lsum = warp_sum(lp * sc);
    float a = 0.f;
#pragma unroll 8
    for (int pp = 0; pp < kParts; ++pp) a += __shfl_sync(0xffffffffu, sc, pp) * __ldcg(part_ptr(pp) + 2 + d0 + lane);
    p.attn[size_t(l) * kQ + qh * kDim + d0 + lane] = __float2bfloat16_rn(a / Lsum);
  }
}

// Layer l's routing from o_proj's router rows (o: p.o of the layer): the top 8 of the 128 logits and their softmax
// weights into ids / wts (warp 0; CTA 0 also writes them for the check), then route_ready = l + 1.
__device__ __forceinline__ void route_top8(const Params& p, int l, int c, const float* o, int* ids_s, float* wts_s,
                                           int* route_ready) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == 0) {
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = __ldcg(o + kH + 4 * lane + i);
    float top = 0.f;
    int topi = 0;
    for (int k = 0; k < kTopK; ++k) {
      float bv = v[0];
      int bi = 4 * lane;
#pragma unroll
      for (int i = 1; i < 4; ++i)
        if (v[i] > bv) bv = v[i], bi = 4 * lane + i;
#pragma unroll
      for (int off = 16; off; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
      }
      if (lane == k) top = bv, topi = bi;
      if (bi / 4 == lane) v[bi % 4] = -INFINITY;
    }
    const float mx = __shfl_sync(0xffffffffu, top, 0);
    const float ex = lane < kTopK ? __expf(top - mx) : 0.f;
    const float sum = warp_sum(ex);
    if (lane < kTopK) {
      ids_s[lane] = topi;
      wts_s[lane] = ex / sum;
      if (c == 0) p.ids[l * kTopK + lane] = topi, p.wts[l * kTopK + lane] = ex / sum;
    }
    __syncwarp();
    if (lane == 0) {
      __threadfence_block();
      *reinterpret_cast<volatile int*>(route_ready) = l + 1;
    }
  }
}

}  // namespace

// A decode step of one token through q30b-shaped MoE layers as ONE persistent kernel: the prototype that decides
// whether a persistent decode layer is worth building into the engine (docs/PERF.md, session 31).
//
// Why: the served step at one request spends ~48 us of chain a layer against ~25 us of weight reads (the layer's
// six-odd launches each pay a ramp, a drain and a dependency latency while HBM idles), and gpu_chain's persistent
// form (session 22) gained only 8% because (1) each CTA streamed through a cp.async ring, ~26 GB/s a CTA, below the
// HBM rate at one CTA an SM, and (2) its one FIFO ring stalled at every dependency. Here:
//   - one CTA an SM (cooperative launch), 8 consumer warps and a producer warp whose lanes issue 1-D bulk copies
//     (cp.async.bulk, L2 evict_first) of 8 KB slots, one lane a ring slot (a single issuing thread managed only one
//     copy every ~0.35 us);
//   - two rings: D for what is known before the step (q/k/v and o_proj rows, the cached keys and values), E for the
//     experts' rows, known only once the layer has routed. The producer fills E first whenever it may and D
//     otherwise, so HBM keeps streaming the next layer's dense rows while the consumers wait at a dependency;
//   - the dependencies are counters in global memory (one a layer and stage; a CTA spins on an acquire load).
// The layer, every CTA c of G (>= 128) taking its share of each stage's rows:
//   qkv     x = bf16(rmsnorm(h)); qkv = Wqkv x  (5120 x 2048)
//   attn    CTAs 0-127: kv head c / 32, keys [16 p, 16 p + 16) for p = c % 32, its 8 query heads: partial softmax
//   merge   CTAs 0-127: 32 output dims of query head c / 4 from the 32 partials (a second grid dependency; the engine
//           merges inside a thread-block cluster instead, so this stage is the prototype's extra cost)
//   o       o = Wo attn (2176 x 4096: rows 2048.. stand for the router, whose logits the engine folds into its GEMVs)
//   gu      every CTA routes (top-8 of the 128 logits, softmax over them) and tells the producer, which then streams
//           the 8 experts' gate/up rows (8 x 1536 x 2048 of 128 experts); x2 = bf16(rmsnorm(h + o))
//   down    act = bf16(silu(g) u); h' = h + o + sum_j w_j Wd_j act_j (8 experts' 2048 x 768)
// Not modelled: q/k norm and RoPE, the KV store of the new token, the lm_head and the sampler.
// --no-deps: no stage waits for the one before (wrong outputs, no check): the producer / consumer pipeline's own
// streaming rate; --no-hint: the weight copies without the L2 evict_first policy; --interleave: slot t of an op
// (its rows [t R, t R + R)) to CTA t % G, so that the CTAs stream one moving window of each matrix instead of G
// ranges far apart; --no-compute: the consumers wait for each slot and release it without its products (the copy
// side's own rate); --producer-sleep NS: a producer lane that cannot issue backs off NS ns instead of spinning.
//   gpu_layer_persistent [--layers 8] [--reps 20] [--d-slots 8] [--e-slots 16] [--no-check] [--no-deps] [--no-hint] [--interleave] [--no-compute] [--producer-sleep NS]
// --v2 [--stages 4|8|12] [--per-sm 1|2] [--core] [--early-route] (session 67): the same layer and check with the served
// kernels' streaming instead (see v2 below): every warp its own cp.async ring of S 2 KB slices, whole-K row blocks of
// 16 rows, tensor-core products (--core: CUDA-core), 1 or 2 CTAs an SM (2: S 4 only fits); --early-route: a block
// routes once the router rows are complete, so the experts' rows stream while o_proj completes; --no-hint: the weight
// copies without the L2 evict_first policy (the served streams' default, v2's too); --graph: each run a CUDA graph
// replay (a memset node zeroing the counters, the kernel as a captured cooperative launch), as an engine would run it;
// --no-compute: each slice waited for and released without its products (the loads' own rate in the layer; no check).
// Prints the step time, us a layer, TB/s over the bytes read, x the read floor (4.6 TB/s), each stage's work (start
// to done) over the CTAs, CTA 0's expert copies of layer 1 (issue, landing), and checks every stage of every layer
// against the CPU (from the GPU's own inputs to the stage). A benchmark, not a test: the figures go to docs/PERF.md.
// Session 31 on the H200: correct, 65.9-74.0 us a layer against the served launch chain's ~48.5 (a CTA's bulk
// copies arrive at ~27 GB/s, the CUDA-core products cost 2-5 us a stage, and the attention / routing phases leave
// HBM idle): the design as it stands does not pay; docs/PERF.md says what a next form would need.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "bench_ptx.cuh"
#include "bench_ring.cuh"
#include "core/dtype.h"
#include "core/error.h"
#include "cuda/common.h"
#include "cuda/device.h"
#include "cuda/kernels/kernel_utils.cuh"
#include "gpu_timer.h"

namespace mc = moeserve::cuda;

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

__global__ void __launch_bounds__(kThreads, 1) layer_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ unsigned long long d_full[kMaxRing], d_empty[kMaxRing], e_full[kMaxRing], e_empty[kMaxRing];
  __shared__ SlotDesc dl[kMaxD], el[kMaxE];
  __shared__ int nd, ne, nd_qkv, nd_o, ne_gu, n_own, route_ready;  // nd_o: the first o item
  __shared__ short own_row[kOwnRowsMax];
  __shared__ int ids_s[2][kTopK];
  __shared__ float wts_s[2][kTopK], red[kConsumerWarps], acc[kConsumerWarps][kOwnRowsMax];
  unsigned char* d_ring = smem;
  unsigned char* e_ring = smem + size_t(p.d_slots) * kSlot;
  float* xs = reinterpret_cast<float*>(e_ring + size_t(p.e_slots) * kSlot);
  float* q_s = xs;  // [kGroup][kDim]: the attention stage's, which stages nothing in xs
  float* newk = q_s + kGroup * kDim;
  float* newv = newk + kDim;

  const int c = blockIdx.x, G = gridDim.x, L = p.layers;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    // The CTA's slots of an op of n rows, R rows a slot never crossing a multiple of seg rows, in order: a
    // contiguous range of the rows, or (interleave) slot t of the op to CTA t % G, so that the CTAs read one moving
    // window (seg is then a multiple of R).
    auto own_slots = [&](int n, int R, int seg, auto f) {
      if (p.interleave) {
        for (int t = c; t * R < n; t += G) f(t * R, min(R, n - t * R));
        return;
      }
      const int hi = split_lo(n, c + 1, G);
      for (int v = split_lo(n, c, G); v < hi;) {
        const int rows = min(R, min(hi, (v / seg + 1) * seg) - v);
        f(v, rows);
        v += rows;
      }
    };
    int n = 0;
    own_slots(kQkv, kRowsQkv, kQkv, [&](int v, int rows) { dl[n++] = {kKindQkv, 0, short(v), short(rows), 0}; });
    nd_qkv = n;
    if (c < kAttnCtas) dl[n++] = {kKindKv, 0, 0, 0, 0};
    nd_o = n;
    own_slots(kORows, kRowsO, kORows, [&](int v, int rows) { dl[n++] = {kKindO, 0, short(v), short(rows), 0}; });
    nd = n;
    n = 0;
    own_slots(kTopK * kGu, kRowsGu, kGu, [&](int v, int rows) {
      el[n++] = {kKindGu, short(v / kGu), short(v % kGu), short(rows), 0};
    });
    ne_gu = n;
    for (int j = 0; j < kTopK; ++j) {  // the same own rows of every expert's down matrix
      int own = 0;
      own_slots(kH, kRowsDown, kH, [&](int v, int rows) {
        el[n++] = {kKindDown, short(j), short(v), short(rows), short(own)};
        for (int r = 0; r < rows; ++r) own_row[own + r] = short(v + r);
        own += rows;
      });
      n_own = own;
    }
    ne = n;
    route_ready = 0;
    init_ring_barriers(d_full, p.d_slots, 1);
    init_ring_barriers(e_full, p.e_slots, 1);
    init_ring_barriers(d_empty, p.d_slots, 1);
    init_ring_barriers(e_empty, p.e_slots, 1);
  }
  __syncthreads();

  if (warp == kConsumerWarps) {
    // The producer warp: one lane a ring slot (E slots first, then D), lane s issuing items s, s + slots, ... of its
    // ring, each once its slot is free (and, for E, once the item's layer has routed). One thread issuing every copy
    // managed one every ~0.35 us, ~23 GB/s a CTA with the copies landing ~0.7 us after issue (session 31).
    const bool is_e = lane < p.e_slots;
    if (lane >= p.e_slots + p.d_slots) return;
    const unsigned slot = is_e ? unsigned(lane) : unsigned(lane - p.e_slots);
    const unsigned slots = is_e ? unsigned(p.e_slots) : unsigned(p.d_slots);
    const unsigned per_layer = is_e ? unsigned(ne) : unsigned(nd), total = unsigned(L) * per_layer;
    unsigned long long* empty = is_e ? &e_empty[slot] : &d_empty[slot];
    const unsigned b = smem_addr(is_e ? &e_full[slot] : &d_full[slot]);
    unsigned char* dst = (is_e ? e_ring : d_ring) + size_t(slot) * kSlot;
    const unsigned long long pol = moe_ptx::l2_evict_first_policy();
    int routed = 0;  // layers whose expert ids this lane may read (one fence a layer)
    for (unsigned n = slot; n < total;) {
      const int lay = int(n / per_layer), idx = int(n % per_layer);
      if (is_e && lay >= routed) {
        if (*reinterpret_cast<volatile int*>(&route_ready) <= lay) {
          if (p.producer_sleep) __nanosleep(unsigned(p.producer_sleep));
          continue;
        }
        __threadfence_block();
        routed = lay + 1;
      }
      if (!test_ring_barrier(empty, ((n / slots) & 1u) ^ 1u)) {
        if (p.producer_sleep) __nanosleep(unsigned(p.producer_sleep));  // leave the issue slots to the consumers
        continue;
      }
      const SlotDesc d = is_e ? el[idx] : dl[idx];
      const bf16* src;
      unsigned bytes;
      if (d.kind == kKindKv) {
        const int hk = c / kParts, part = c % kParts;
        const size_t off = ((size_t(lay) * kKvHeads + hk) * kCtx + part * kKeysPart) * kDim;
        arrive_expect_tx(b, 2 * kKeysPart * kDim * 2);
        bulk_copy(dst, p.kc + off, kKeysPart * kDim * 2, b);
        bulk_copy(dst + kKeysPart * kDim * 2, p.vc + off, kKeysPart * kDim * 2, b);
        n += slots;
        continue;
      }
      if (d.kind == kKindQkv) {
        src = p.wqkv + (size_t(lay) * kQkv + d.row0) * kH, bytes = unsigned(d.rows) * kH * 2;
      } else if (d.kind == kKindO) {
        src = p.wo + (size_t(lay) * kORows + d.row0) * kQ, bytes = unsigned(d.rows) * kQ * 2;
      } else if (d.kind == kKindGu) {
        src = p.wgu + ((size_t(lay) * kExperts + ids_s[lay & 1][d.j]) * kGu + d.row0) * kH;
        bytes = unsigned(d.rows) * kH * 2;
      } else {
        src = p.wd + ((size_t(lay) * kExperts + ids_s[lay & 1][d.j]) * kH + d.row0) * kI;
        bytes = unsigned(d.rows) * kI * 2;
      }
      if (is_e && c == 0 && lay == min(1, L - 1)) p.item_clocks[idx] = global_ns();
      arrive_expect_tx(b, bytes);
      if (p.hint) bulk_copy_hint(dst, src, bytes, b, pol);
      else bulk_copy(dst, src, bytes, b);
      n += slots;
    }
    return;
  }

  // The consumers: the stages of every layer in order. Item i of a ring (counted over the layers) lives in slot
  // i % slots and belongs to warp i % 8 (the slot counts are multiples of 8, so a warp owns its slots: it never waits
  // for a phase of a slot whose previous phase another warp may still be reading); the attention's K / V item is
  // read by every warp, after a consumer barrier, and released by its owner after another.
  struct Ring {
    unsigned long long *full, *empty;
    unsigned char* base;
    unsigned slots, per_layer;
  };
  const Ring dr{d_full, d_empty, d_ring, unsigned(p.d_slots), unsigned(nd)},
      er{e_full, e_empty, e_ring, unsigned(p.e_slots), unsigned(ne)};
  auto ring_wait = [&](const Ring& r, unsigned i) -> const bf16* {
    const unsigned s = i % r.slots;
    wait_ring_barrier(&r.full[s], (i / r.slots) & 1u);
    return reinterpret_cast<const bf16*>(r.base + size_t(s) * kSlot);
  };
  auto ring_release = [&](const Ring& r, unsigned i) {
    __syncwarp();
    if (lane == 0) arrive_ring_barrier(&r.empty[i % r.slots]);
  };
  auto mine = [&](unsigned i) { return int(i % kConsumerWarps) == warp; };
  // This warp's items [from, to) of a ring's list for layer l: each slot's rows of K weights against x_of(slot),
  // row r's sum to out(slot, r, y).
  auto items = [&](bool e, int l, int from, int to, int K, auto x_of, auto out) {
    const Ring& ring = e ? er : dr;
    for (int i = from; i < to; ++i) {
      const unsigned item = unsigned(l) * ring.per_layer + unsigned(i);
      if (!mine(item)) continue;
      const SlotDesc d = e ? el[i] : dl[i];
      const bf16* w = ring_wait(ring, item);
      if (e && c == 0 && lane == 0 && l == min(1, L - 1)) p.item_clocks[kMaxE + i] = global_ns();
      if (!p.no_compute) {
        float y[kRowsMax];
        rows_dot(w, d.rows, x_of(d), K, y);
        if (lane == 0)
          for (int r = 0; r < d.rows; ++r) out(d, r, y[r]);
      }
      ring_release(ring, item);
    }
  };
  auto clock_at = [&](int l, int s) { return p.clocks + ((size_t(c) * L + l) * kStages + s) * 2; };
  auto stamp = [&](int l, int s) {
    if (threadIdx.x == 0) *clock_at(l, s) = global_ns();
  };
  const unsigned all = p.epoch * unsigned(G), attn_all = p.epoch * unsigned(kAttnCtas);
  auto x_plain = [&](const SlotDesc&) -> const float* { return xs; };
  for (int l = 0; l < L; ++l) {
    unsigned* cnt = p.cnt + l * kStages;
    const float* h = p.h + size_t(l) * kH;
    const float* o = p.o + size_t(l) * kORows;
    // qkv
    if (l > 0) wait_count(p.cnt + (l - 1) * kStages + kStDown, all, p.no_deps);
    stamp(l, kStQkv);
    stage_norm(h, nullptr, xs, red);
    items(false, l, 0, nd_qkv, kH, x_plain,
          [&](const SlotDesc& d, int r, float y) { p.qkv[size_t(l) * kQkv + d.row0 + r] = y; });
    signal(cnt + kStQkv, clock_at(l, kStQkv) + 1);
    // attn: partial softmax over the CTA's 16 keys for its kv head's 8 query heads
    wait_count(cnt + kStQkv, all, p.no_deps);
    stamp(l, kStAttn);
    if (c < kAttnCtas) {
      const unsigned kv_item = unsigned(l) * unsigned(nd) + unsigned(nd_qkv);
      const bf16* kv = ring_wait(dr, kv_item);
      attention_part(p, l, c, kv, kv + kKeysPart * kDim, q_s, newk, newv);
      consumers_sync();
      if (mine(kv_item)) ring_release(dr, kv_item);
      signal(cnt + kStAttn, clock_at(l, kStAttn) + 1);
    }
    // merge: 32 dims of query head c / 4 from the 32 parts
    wait_count(cnt + kStAttn, attn_all, p.no_deps);
    stamp(l, kStMerge);
    if (c < kAttnCtas) {
      attention_merge(p, l, c);
      signal(cnt + kStMerge, clock_at(l, kStMerge) + 1);
    }
    // o
    wait_count(cnt + kStMerge, attn_all, p.no_deps);
    stamp(l, kStO);
    for (int i = threadIdx.x; i < kQ; i += kConsumers)
      xs[i] = __uint_as_float(unsigned(__ldcg(reinterpret_cast<const unsigned short*>(p.attn) + size_t(l) * kQ + i))
                              << 16);
    consumers_sync();
    items(false, l, nd_o, nd, kQ, x_plain,
          [&](const SlotDesc& d, int r, float y) { p.o[size_t(l) * kORows + d.row0 + r] = y; });
    signal(cnt + kStO, clock_at(l, kStO) + 1);
    // gu: route first (the producer waits for it), then the normalized input
    wait_count(cnt + kStO, all, p.no_deps);
    stamp(l, kStGu);
    route_top8(p, l, c, o, ids_s[l & 1], wts_s[l & 1], &route_ready);
    stage_norm(h, o, xs, red);
    items(true, l, 0, ne_gu, kH, x_plain,
          [&](const SlotDesc& d, int r, float y) { p.gu[(size_t(l) * kTopK + d.j) * kGu + d.row0 + r] = y; });
    signal(cnt + kStGu, clock_at(l, kStGu) + 1);
    // down
    wait_count(cnt + kStGu, all, p.no_deps);
    stamp(l, kStDown);
    stage_act(p, l, xs);
    if (threadIdx.x < kConsumerWarps * kOwnRowsMax) (&acc[0][0])[threadIdx.x] = 0.f;
    consumers_sync();
    items(true, l, ne_gu, ne, kI, [&](const SlotDesc& d) -> const float* { return xs + d.j * kI; },
          [&](const SlotDesc& d, int r, float y) { acc[warp][d.acc0 + r] += wts_s[l & 1][d.j] * y; });
    consumers_sync();
    for (int i = int(threadIdx.x); i < n_own; i += kConsumers) {
      float sum = 0.f;  // the warps' sums in a fixed order: the same bits every run
#pragma unroll
      for (int w = 0; w < kConsumerWarps; ++w) sum += acc[w][i];
      const int r = own_row[i];
      p.h[size_t(l + 1) * kH + r] = __ldcg(h + r) + __ldcg(o + r) + sum;
    }
    signal(cnt + kStDown, clock_at(l, kStDown) + 1);
  }
}

// ---- v2: the served kernels' streaming inside the persistent layer (session 67) ----
// Session 66's gpu_chain clocks put the persistent chain's loss in its blocks' stream rate, not its boundaries, and
// the served lm_head streams this very slice pattern with mma products at 4.4 TB/s one block an SM. So v2 keeps the
// layer above (stages, counters, attention, merge, routing, outputs and the CPU check) and replaces its streaming:
// no producer warp and no bulk copies; 8 warps a block, each streaming its 64-k slices of whole-K row blocks of 16
// weight rows through its own ring of S cp.async stages (bench_ring.cuh, gpu_chain's engine), the products on the
// tensor cores (or the CUDA cores, for the comparison). A block's ring runs ahead across the stages: o_proj's rows
// stream while the attention and its merge wait, the next layer's q/k/v rows while the experts' down rows are
// consumed; the experts' rows only once the block has routed the layer (one FIFO ring: it stops there).
// Row blocks of each op dealt round robin from where the op before ended (so that the blocks that had fewer of one
// op take the extra ones of the next), counted one release add each; the attention and merge stages count CTAs.
namespace v2 {
using bench_ring::Cursor;
using bench_ring::kSliceElems;
using bench_ring::kSliceK;
constexpr int kRb = bench_ring::kRows;  // 16 rows a row block
static_assert(bench_ring::kWarps == kConsumerWarps, "v2 runs the ring's 8 warps as the consumers");
// The ops of a layer: q/k/v, the router rows (o_proj's rows 2048.., the router stand-in), o_proj, the experts' gate/up,
// their down (K: 8 experts x 768).
enum Kind2 { kOpQkv, kOpRouter, kOpO, kOpGu, kOpDown, kOpsLayer };
__host__ __device__ constexpr int op_rows(int k) {
  return k == kOpQkv ? kQkv : k == kOpRouter ? kORows - kH : k == kOpO ? kH : k == kOpGu ? kTopK * kGu : kH;
}
__host__ __device__ constexpr int op_k(int k) { return k == kOpQkv || k == kOpGu ? kH : k == kOpDown ? kTopK * kI : kQ; }
__host__ __device__ constexpr int op_rbs(int k) { return op_rows(k) / kRb; }
__host__ __device__ constexpr int op_prefix(int k) { return k == 0 ? 0 : op_prefix(k - 1) + op_rbs(k - 1); }
constexpr int kLayerRbs = op_prefix(kOpsLayer);  // 1,352
constexpr int kSlicesDown = kI / kSliceK;        // 12 slices an expert in the down op's K
static_assert(kQkv % kRb == 0 && kORows % kRb == 0 && kGu % kRb == 0 && kH % kRb == 0, "whole row blocks");
// Dynamic shared memory: the rings, the staged input (bf16, the largest K), the attention's q / new k, v (f32) and
// its part's K and V rows.
constexpr size_t smem_bytes(int S) {
  return size_t(kConsumerWarps) * S * kSliceElems * 2 + size_t(kTopK * kI) * 2 + size_t(kGroup * kDim + 2 * kDim) * 4 +
         size_t(2 * kKeysPart * kDim) * 2;
}

// A 16-byte global load that the compiler keeps where it is written (before a wait, so that it is in flight during it).
__device__ __forceinline__ uint4 ld_early(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <int S, bool MMA>
__global__ void __launch_bounds__(kConsumers, S <= 5 ? 2 : 1) layer_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ring = reinterpret_cast<bf16*>(smem);                           // [warps][S][16 x 64]
  bf16* xs = ring + kConsumerWarps * S * kSliceElems;                   // [8 x 768] the op's input
  float* q_s = reinterpret_cast<float*>(xs + kTopK * kI);               // [8][128]
  float* newk = q_s + kGroup * kDim;                                    // [128]
  float* newv = newk + kDim;                                            // [128]
  bf16* kv = reinterpret_cast<bf16*>(newv + kDim);                      // [2][16][128]
  __shared__ float partial[kConsumerWarps][kRb], red[kConsumerWarps];
  __shared__ int ids_s[kTopK], routed;  // ids_s: the experts of layer routed - 1 (0: none yet)
  __shared__ float wts_s[kTopK];
  const int c = blockIdx.x, G = gridDim.x, L = p.layers, end_op = kOpsLayer * L;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  bf16* my_ring = ring + warp * S * kSliceElems;
  if (threadIdx.x == 0) routed = 0;
  __syncthreads();

  // Row block rb of op j (layer j / 4, kind j % 4) belongs to CTA (rb + the row blocks dealt before it) % G.
  auto first_item = [&](int op) {
    for (; op < end_op; ++op) {
      const int off = int((static_cast<long long>(op / kOpsLayer) * kLayerRbs + op_prefix(op % kOpsLayer)) % G);
      const int rb = (c - off + G) % G;
      if (rb < op_rbs(op % kOpsLayer)) return Cursor{op, rb, 0};
    }
    return Cursor{end_op, 0, 0};
  };
  auto advance = [&](Cursor& x) {
    if (++x.u < op_k(x.op % kOpsLayer) / kSliceK / kConsumerWarps) return;
    x.u = 0;
    x.rb += G;
    if (x.rb >= op_rbs(x.op % kOpsLayer)) x = first_item(x.op + 1);
  };
  Cursor pc = first_item(0);  // the warp's next slice to issue
  int issued = 0, consumed = 0;
  const unsigned long long policy = moe_ptx::l2_evict_first_policy();  // (the served weight streams' hint)
  // Issues the warp's next slice; false when the ring is full, all is issued, or the slice is an expert's of a layer
  // this block has not routed yet.
  auto issue = [&]() -> bool {
    if (pc.op >= end_op || issued - consumed >= S) return false;
    const int l = pc.op / kOpsLayer, kind = pc.op % kOpsLayer, ks = warp + kConsumerWarps * pc.u;
    if (kind >= kOpGu && *reinterpret_cast<volatile int*>(&routed) != l + 1) return false;
    const bf16* src;
    int ld = kH;
    if (kind == kOpQkv) {
      src = p.wqkv + (size_t(l) * kQkv + pc.rb * kRb) * kH + ks * kSliceK;
    } else if (kind == kOpRouter || kind == kOpO) {
      const int row0 = (kind == kOpRouter ? kH : 0) + pc.rb * kRb;
      src = p.wo + (size_t(l) * kORows + row0) * kQ + ks * kSliceK, ld = kQ;
    } else if (kind == kOpGu) {  // row block rb: rows [16 (rb % 96), +16) of expert slot rb / 96's gate/up
      const int j = pc.rb / (kGu / kRb), row0 = pc.rb % (kGu / kRb) * kRb;
      src = p.wgu + ((size_t(l) * kExperts + ids_s[j]) * kGu + row0) * kH + ks * kSliceK;
    } else {  // k slice ks: slice ks % 12 of expert slot ks / 12's down rows
      const int j = ks / kSlicesDown;
      src = p.wd + ((size_t(l) * kExperts + ids_s[j]) * kH + pc.rb * kRb) * kI + ks % kSlicesDown * kSliceK, ld = kI;
    }
    bench_ring::load_slice(my_ring + (issued % S) * kSliceElems, src, ld, true, lane, src, p.hint != 0, policy);
    ++issued;
    advance(pc);
    return true;
  };
  while (issue()) {
  }  // weights are never written: before any wait

  auto clock_at = [&](int l, int s) { return p.clocks + ((size_t(c) * L + l) * kStages + s) * 2; };
  auto stamp = [&](int l, int s, int what) {
    if (threadIdx.x == 0) clock_at(l, s)[what] = global_ns();
  };
  // Waits until `cnt` has `units` this run; a wait of over 2 s traps (a broken count fails the launch, never hangs).
  auto wait_for = [&](const unsigned* cnt, int units) {
    if (threadIdx.x == 0) {
      const unsigned long long t0 = global_ns();
      while (ld_acquire(cnt) < p.epoch * unsigned(units))
        if (global_ns() - t0 > 2000000000ull) __trap();
    }
    __syncthreads();
  };
  Cursor cc = first_item(0);
  float acc = 0.f, c4[4] = {0.f, 0.f, 0.f, 0.f};
  const int r = lane >> 1, h2 = lane & 1;
  // This block's row blocks of op `op`: each row's sum to out(row, sum), each row block counted on `cnt`, then
  // after_rb() (the same in every thread).
  auto consume_op = [&](int op, unsigned* cnt, auto out, auto after_rb) {
    const int kind = op % kOpsLayer;
    while (cc.op == op) {
      if (issued <= consumed) __trap();  // (a slice consumed before it was issued: a broken schedule, made loud)
      bench_ring::wait_pending(issued - consumed - 1);
      __syncwarp();
      const bf16* sl = my_ring + (consumed % S) * kSliceElems;
      const int ks = warp + kConsumerWarps * cc.u;
      const bf16* xk = xs + ks * kSliceK;
      if (p.no_compute) {  // (the loads' own rate: the slice is waited for and released, no products)
      } else if (kind == kOpDown) {  // each expert's products weighted by its routing weight
        const float wj = wts_s[ks / kSlicesDown];
        if (MMA) {
          float t[4] = {0.f, 0.f, 0.f, 0.f};
          bench_ring::slice_mma(t, sl, xk, lane / 4, lane % 4);
#pragma unroll
          for (int i = 0; i < 4; ++i) c4[i] = fmaf(wj, t[i], c4[i]);
        } else {
          float t = 0.f;
          bench_ring::slice_dot(t, sl, xk, r, h2);
          acc = fmaf(wj, t, acc);
        }
      } else if (MMA) {
        bench_ring::slice_mma(c4, sl, xk, lane / 4, lane % 4);
      } else {
        bench_ring::slice_dot(acc, sl, xk, r, h2);
      }
      Cursor item;
      if (!bench_ring::release_slice(consumed, issue, cc, advance, item)) continue;
      if (MMA) bench_ring::stash_warp_rows_mma(c4, partial, warp, lane);
      else bench_ring::stash_warp_rows(acc, partial, warp, r, h2);
      if (threadIdx.x < kRb) out(item.rb * kRb + int(threadIdx.x), bench_ring::warp_rows_sum(partial, threadIdx.x));
      __syncthreads();
      if (threadIdx.x == 0) red_release_add(cnt);
      after_rb();
    }
  };
  auto nothing = [] {};
  __shared__ int router_done;  // thread 0's view of the router rows' count, for the whole block
  // Routes layer l unless this block already has: when `poll` only if the router rows are complete (no wait).
  auto route = [&](int l, const unsigned* router_cnt, bool poll) {
    if (routed == l + 1) return;
    if (poll) {
      if (threadIdx.x == 0) router_done = ld_acquire(router_cnt) >= p.epoch * unsigned(op_rbs(kOpRouter));
      __syncthreads();
      if (!router_done) return;
    } else {
      wait_for(router_cnt, op_rbs(kOpRouter));
    }
    route_top8(p, l, c, p.o + size_t(l) * kORows, ids_s, wts_s, &routed);
    __syncthreads();
    while (issue()) {
    }  // the experts' rows may go now
  };
  for (int l = 0; l < L; ++l) {
    unsigned* cnt = p.cnt + l * kStages;
    const float* h = p.h + size_t(l) * kH;
    const float* o = p.o + size_t(l) * kORows;
    const int op0 = kOpsLayer * l;
    // q/k/v
    if (cc.op == op0) {
      if (l > 0) wait_for(p.cnt + (l - 1) * kStages + kStDown, op_rbs(kOpDown));
      stage_norm(h, nullptr, xs, red);
      stamp(l, kStQkv, 0);
      consume_op(op0, cnt + kStQkv, [&](int n, float y) { p.qkv[size_t(l) * kQkv + n] = y; }, nothing);
      stamp(l, kStQkv, 1);
    }
    // attention: the part's cached keys and values loaded before the wait for q/k/v
    if (c < kAttnCtas) {
      const size_t off = ((size_t(l) * kKvHeads + c / kParts) * kCtx + (c % kParts) * kKeysPart) * kDim;
      constexpr int kChunks = kKeysPart * kDim / 8;  // 16-byte chunks of K (and of V): 256, one a thread
      static_assert(kChunks == kConsumers, "one K and one V chunk a thread");
      const uint4 kr = ld_early(p.kc + off + threadIdx.x * 8), vr = ld_early(p.vc + off + threadIdx.x * 8);
      wait_for(cnt + kStQkv, op_rbs(kOpQkv));
      reinterpret_cast<uint4*>(kv)[threadIdx.x] = kr;
      reinterpret_cast<uint4*>(kv)[kChunks + threadIdx.x] = vr;
      stamp(l, kStAttn, 0);
      attention_part(p, l, c, kv, kv + kKeysPart * kDim, q_s, newk, newv);
      __syncthreads();
      if (threadIdx.x == 0) red_release_add(cnt + kStAttn);
      stamp(l, kStAttn, 1);
      wait_for(cnt + kStAttn, kAttnCtas);
      stamp(l, kStMerge, 0);
      attention_merge(p, l, c);
      __syncthreads();
      if (threadIdx.x == 0) red_release_add(cnt + kStMerge);
      stamp(l, kStMerge, 1);
    }
    // the router rows, then o_proj; with early_route the block routes as soon as the router rows are complete (at
    // the start of o_proj or after any of its row blocks), so that the experts' rows stream while o_proj completes
    // (top-k is scale-free: a real router's ids come from logits before the norm's scale, known once o_proj is)
    bool staged = false;
    auto stage_attn = [&] {
      wait_for(cnt + kStMerge, kAttnCtas);
      for (int i = threadIdx.x; i < kQ / 8; i += kConsumers)
        reinterpret_cast<uint4*>(xs)[i] = __ldcg(reinterpret_cast<const uint4*>(p.attn + size_t(l) * kQ) + i);
      __syncthreads();
      staged = true;
    };
    if (cc.op == op0 + kOpRouter) {
      stage_attn();
      stamp(l, kStRouter, 0);
      consume_op(op0 + kOpRouter, cnt + kStRouter, [&](int n, float y) { p.o[size_t(l) * kORows + kH + n] = y; },
                 nothing);
      stamp(l, kStRouter, 1);
    }
    auto try_route = [&] {
      if (p.early_route) route(l, cnt + kStRouter, true);
    };
    if (cc.op == op0 + kOpO) {
      if (!staged) stage_attn();
      stamp(l, kStO, 0);
      try_route();
      consume_op(op0 + kOpO, cnt + kStO, [&](int n, float y) { p.o[size_t(l) * kORows + n] = y; }, try_route);
      stamp(l, kStO, 1);
    }
    // the experts' gate/up (every block has some of their 768 row blocks: G <= 768), routed by now
    route(l, cnt + kStRouter, false);
    wait_for(cnt + kStO, op_rbs(kOpO));
    stage_norm(h, o, xs, red);
    stamp(l, kStGu, 0);
    consume_op(op0 + kOpGu, cnt + kStGu, [&](int n, float y) { p.gu[size_t(l) * kTopK * kGu + n] = y; }, nothing);
    stamp(l, kStGu, 1);
    // down, weighted by the routing, plus the residual and o_proj's output
    if (cc.op == op0 + kOpDown) {
      wait_for(cnt + kStGu, op_rbs(kOpGu));
      stage_act(p, l, xs);
      __syncthreads();
      stamp(l, kStDown, 0);
      consume_op(
          op0 + kOpDown, cnt + kStDown,
          [&](int n, float y) { p.h[size_t(l + 1) * kH + n] = __ldcg(h + n) + __ldcg(o + n) + y; }, nothing);
      stamp(l, kStDown, 1);
    }
  }
  moe_ptx::cp_async_wait<0>();
}
}  // namespace v2

float bf2f(uint16_t b) { return moeserve::bf16_to_f32(b); }
float bf16_round(float x) { return moeserve::bf16_to_f32(moeserve::f32_to_bf16(x)); }  // as __float2bfloat16_rn

template <typename T>
std::vector<T> down_load(const T* src, size_t n) {
  std::vector<T> v(n);
  MS_CUDA_CHECK(cudaMemcpy(v.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// y[n] = W[n] . x for W rows of K bf16 (device) and x on the host; mag[n] = sum |W x| (the tolerance's scale).
void cpu_gemv(const bf16* w_dev, int N, int K, const std::vector<float>& x, std::vector<double>& y,
              std::vector<double>& mag) {
  const auto w = down_load(reinterpret_cast<const uint16_t*>(w_dev), size_t(N) * K);
  y.assign(size_t(N), 0.0);
  mag.assign(size_t(N), 0.0);
  for (int n = 0; n < N; ++n) {
    double s = 0, m = 0;
    for (int k = 0; k < K; ++k) {
      const double t = double(bf2f(w[size_t(n) * K + k])) * x[size_t(k)];
      s += t;
      m += std::fabs(t);
    }
    y[size_t(n)] = s, mag[size_t(n)] = m;
  }
}

struct Checker {
  int bad = 0, total = 0;
  void near(const char* what, int layer, int i, double got, double want, double scale) {
    ++total;
    if (std::isfinite(got) && std::fabs(got - want) <= 1e-2 * scale + 1e-4) return;
    if (bad < 10) std::printf("  layer %d %s[%d]: %.6g, CPU %.6g\n", layer, what, i, got, want);
    ++bad;
  }
};

std::vector<float> cpu_norm(const std::vector<float>& a, const float* b) {
  double ss = 0;
  std::vector<float> v(static_cast<size_t>(kH));
  for (int k = 0; k < kH; ++k) v[size_t(k)] = a[size_t(k)] + (b ? b[k] : 0.f), ss += double(v[size_t(k)]) * v[size_t(k)];
  const float r = float(1.0 / std::sqrt(ss / kH + 1e-6));
  for (auto& x : v) x = bf16_round(x * r);
  return v;
}

}  // namespace

static const char* const kUsage =
    "usage: gpu_layer_persistent [--layers 8] [--reps 20] [--d-slots 8] [--e-slots 16] [--no-check] [--no-deps] "
    "[--no-hint] [--interleave] [--no-compute] [--producer-sleep NS] | [--v2 [--stages 4|8|12] [--per-sm 1|2] [--core] "
    "[--early-route] [--graph]]";

static int run(int argc, char** argv) {
  int layers = 8, reps = 20, d_slots = 8, e_slots = 16;
  bool check = true;
  int no_deps = 0, hint = 1, interleave = 0, no_compute = 0, producer_sleep = 0;
  bool use_v2 = false, v2_core = false, early_route = false, use_graph = false;
  int v2_stages = 8, v2_per_sm = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--layers" && i + 1 < argc) layers = std::atoi(argv[++i]);
    else if (s == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (s == "--d-slots" && i + 1 < argc) d_slots = std::atoi(argv[++i]);
    else if (s == "--e-slots" && i + 1 < argc) e_slots = std::atoi(argv[++i]);
    else if (s == "--no-check") check = false;
    else if (s == "--no-deps") no_deps = 1;
    else if (s == "--no-hint") hint = 0;
    else if (s == "--interleave") interleave = 1;
    else if (s == "--no-compute") no_compute = 1;
    else if (s == "--producer-sleep" && i + 1 < argc) producer_sleep = std::atoi(argv[++i]);
    else if (s == "--v2") use_v2 = true;
    else if (s == "--stages" && i + 1 < argc) v2_stages = std::atoi(argv[++i]);
    else if (s == "--per-sm" && i + 1 < argc) v2_per_sm = std::atoi(argv[++i]);
    else if (s == "--core") v2_core = true;
    else if (s == "--early-route") early_route = true;
    else if (s == "--graph") use_graph = true;
    else {
      std::fprintf(stderr, "%s\n", kUsage);
      return 2;
    }
  }
  if (layers < 1 || layers > kMaxLayers || reps < 1 || d_slots < kConsumerWarps || d_slots > kMaxRing ||
      d_slots % kConsumerWarps || e_slots < kConsumerWarps || e_slots > kMaxRing || e_slots % kConsumerWarps ||
      d_slots + e_slots > 32) {
    std::fprintf(stderr, "--layers 1..%d, --reps >= 1, --d-slots / --e-slots multiples of 8 up to %d, 32 together\n", kMaxLayers,
                 kMaxRing);
    return 2;
  }
  if ((early_route || use_graph) && !use_v2) {
    std::fprintf(stderr, "--early-route and --graph are v2's\n");
    return 2;
  }
  if (use_v2 && ((v2_stages != 4 && v2_stages != 8 && v2_stages != 12) || v2_per_sm < 1 || v2_per_sm > 2 || no_deps ||
                 interleave || producer_sleep)) {
    std::fprintf(stderr, "--v2 takes --stages 4, 8 or 12 and --per-sm 1 or 2 (--no-deps, --interleave and "
                         "--producer-sleep are v1's)\n");
    return 2;
  }
  int dev = 0, sms = 0;
  MS_CUDA_CHECK(cudaGetDevice(&dev));
  MS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (sms < kAttnCtas || kH / sms + 1 > kOwnRowsMax) {
    std::fprintf(stderr, "needs at least %d SMs (this GPU has %d)\n", kAttnCtas, sms);
    return 2;
  }
  cudaDeviceProp prop{};
  MS_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  cudaStream_t st;
  MS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  const size_t L = size_t(layers);
  const size_t n_qkv = L * kQkv * kH, n_o = L * kORows * kQ, n_gu = L * kExperts * kGu * kH,
               n_d = L * kExperts * kH * kI, n_kv = L * kKvHeads * kCtx * kDim;
  std::vector<void*> bufs;
  auto alloc = [&](size_t bytes) {
    void* q = nullptr;
    MS_CUDA_CHECK(cudaMalloc(&q, bytes));
    bufs.push_back(q);
    return q;
  };
  auto weights = [&](size_t n, int K, unsigned seed) {
    bf16* w = static_cast<bf16*>(alloc(n * 2));
    fill_bf16_kernel<<<2048, 256, 0, st>>>(w, n, K > 0 ? std::sqrt(3.0f / float(K)) : 1.0f, seed);
    return w;
  };
  Params p{};
  p.wqkv = weights(n_qkv, kH, 11);
  p.wo = weights(n_o, kQ, 23);
  p.wgu = weights(n_gu, kH, 37);
  p.wd = weights(n_d, kI, 41);
  p.kc = weights(n_kv, 0, 53);
  p.vc = weights(n_kv, 0, 59);
  p.h = static_cast<float*>(alloc((L + 1) * kH * 4));
  p.qkv = static_cast<float*>(alloc(L * kQkv * 4));
  p.part = static_cast<float*>(alloc(L * kKvHeads * kParts * kGroup * kPartFloats * 4));
  p.attn = static_cast<bf16*>(alloc(L * kQ * 2));
  p.o = static_cast<float*>(alloc(L * kORows * 4));
  p.gu = static_cast<float*>(alloc(L * kTopK * kGu * 4));
  p.ids = static_cast<int*>(alloc(L * kTopK * 4));
  p.wts = static_cast<float*>(alloc(L * kTopK * 4));
  p.cnt = static_cast<unsigned*>(alloc(L * kStages * 4));
  const size_t max_grid = size_t(sms) * std::max(1, v2_per_sm);
  p.clocks = static_cast<unsigned long long*>(alloc(max_grid * L * kStages * 2 * 8));
  MS_CUDA_CHECK(cudaMemsetAsync(p.clocks, 0, max_grid * L * kStages * 2 * 8, st));
  p.item_clocks = static_cast<unsigned long long*>(alloc(2 * kMaxE * 8));
  MS_CUDA_CHECK(cudaMemsetAsync(p.item_clocks, 0, 2 * kMaxE * 8, st));
  MS_CUDA_CHECK(cudaMemsetAsync(p.cnt, 0, L * kStages * 4, st));
  {
    std::vector<float> h0(static_cast<size_t>(kH));
    for (int k = 0; k < kH; ++k) h0[size_t(k)] = std::sin(0.37f * float(k) + 1.0f) * 2.0f;
    MS_CUDA_CHECK(cudaMemcpyAsync(p.h, h0.data(), kH * 4, cudaMemcpyHostToDevice, st));
  }
  MS_CUDA_CHECK(cudaStreamSynchronize(st));
  p.layers = layers, p.d_slots = d_slots, p.e_slots = e_slots, p.no_deps = no_deps, p.hint = hint;
  p.interleave = interleave, p.no_compute = no_compute, p.producer_sleep = std::max(0, producer_sleep);
  p.early_route = early_route ? 1 : 0;
  if (no_compute) check = false;
  if (no_deps) check = false;  // the stages then read inputs not yet written

  static_assert(kGroup * kDim + 2 * kDim <= kXsElems, "the attention's staging lives in xs");
  // The kernel, its block size, grid and shared memory: v1 one CTA an SM with the two slot rings; v2 `v2_per_sm`
  // CTAs an SM with a ring of `v2_stages` 2 KB slices a warp.
  const void* kernel = reinterpret_cast<const void*>(layer_kernel);
  size_t smem = size_t(d_slots + e_slots) * kSlot + kXsElems * 4;
  int threads = kThreads, grid = sms;
  if (use_v2) {
    using KernelFn = void (*)(Params);
    KernelFn k2 = nullptr;
    if (v2_stages == 4) k2 = v2_core ? v2::layer_kernel<4, false> : v2::layer_kernel<4, true>;
    else if (v2_stages == 8) k2 = v2_core ? v2::layer_kernel<8, false> : v2::layer_kernel<8, true>;
    else k2 = v2_core ? v2::layer_kernel<12, false> : v2::layer_kernel<12, true>;
    kernel = reinterpret_cast<const void*>(k2);
    smem = v2::smem_bytes(v2_stages);
    threads = kConsumers;
    grid = sms * v2_per_sm;
  }
  MS_CHECK(mc::raise_dynamic_smem(kernel, smem), "{} bytes of shared memory a CTA do not fit", smem);
  int per_sm = 0;
  MS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  MS_CHECK(per_sm >= grid / sms, "{} CTAs an SM do not fit with {} bytes of shared memory each ({} do)", grid / sms,
           smem, per_sm);
  auto once = [&] {
    ++p.epoch;
    void* args[] = {&p};
    MS_CUDA_CHECK(cudaLaunchCooperativeKernel(kernel, dim3(unsigned(grid)), dim3(unsigned(threads)), args, smem, st));
  };
  // --graph (v2): the step as a served step would run it - a CUDA graph of a memset node that zeroes the counters and
  // the kernel as a cooperative kernel node (cudaLaunchKernelEx with the cooperative attribute, captured), epoch 1.
  cudaGraphExec_t graph_exec = nullptr;
  if (use_graph) {
    p.epoch = 1;
    cudaGraph_t g = nullptr;
    MS_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    MS_CUDA_CHECK(cudaMemsetAsync(p.cnt, 0, L * kStages * 4, st));
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(grid));
    cfg.blockDim = dim3(unsigned(threads));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    void* args[] = {&p};
    const cudaError_t launched = cudaLaunchKernelExC(&cfg, kernel, args);
    const cudaError_t ended = cudaStreamEndCapture(st, &g);
    MS_CUDA_CHECK(launched);
    MS_CUDA_CHECK(ended);
    MS_CUDA_CHECK(cudaGraphInstantiate(&graph_exec, g, 0));
    MS_CUDA_CHECK(cudaGraphDestroy(g));
  }
  auto replay = [&] { MS_CUDA_CHECK(cudaGraphLaunch(graph_exec, st)); };
  // Bytes a step reads: q/k/v, o (+ router stand-in), the 8 experts' gate/up and down rows, the keys and values.
  const double bytes =
      double(layers) * 2.0 * (double(kQkv) * kH + double(kORows) * kQ + kTopK * (double(kGu) * kH + double(kH) * kI) +
                              2.0 * kKvHeads * kCtx * kDim);
  const double floor_s = bytes / (kReadTBs * 1e12);
  moeserve::bench::GpuTimer t;
  const double s = use_graph ? t.best(reps, replay, st) : t.best(reps, once, st);
  if (use_v2)
    std::printf("%s, %d SMs: %d layers, v2: %d CTAs an SM, %d-stage rings of 2 KB a warp, %s products, %s route%s "
                "(%zu bytes of shared memory a CTA)%s\n",
                prop.name, sms, layers, v2_per_sm, v2_stages,
                no_compute ? "no" : v2_core ? "CUDA-core" : "tensor-core", early_route ? "early" : "late",
                hint ? "" : ", no L2 hint", smem, use_graph ? ", graph replays" : "");
  else
    std::printf("%s, %d SMs: %d layers, D ring %d x 8 KB, E ring %d x 8 KB (%zu bytes of shared memory)%s%s%s%s\n",
                prop.name, sms, layers, d_slots, e_slots, smem, no_deps ? ", no dependencies" : "",
                hint ? "" : ", no L2 hint", interleave ? ", interleaved slots" : "", no_compute ? ", no products" : "");
  if (producer_sleep > 0) std::printf("producer lanes back off %d ns when they cannot issue\n", producer_sleep);
  std::printf("step %.1f us, %.2f us a layer, %.1f MB read: %.3f TB/s, %.2f x the floor (%.1f us at %.1f TB/s)\n",
              s * 1e6, s * 1e6 / layers, bytes * 1e-6, bytes / s * 1e-12, s / floor_s, floor_s * 1e6, kReadTBs);
  {  // every CTA's stage starts and work-done times of the last run, layers 1.. (layer 0 starts cold)
    const auto ck = down_load(p.clocks, size_t(grid) * L * kStages * 2);
    auto at = [&](int cta, int l, int st2, int k) { return ck[((size_t(cta) * L + size_t(l)) * kStages + size_t(st2)) * 2 + size_t(k)]; };
    const char* names[kStages] = {"qkv", "attn", "merge", "router", "o", use_v2 ? "gu" : "route+gu", "down"};
    std::printf("us a layer (mean over layers%s): stage, work (%s -> done) mean / max over CTAs, then from the last "
                "CTA's done to the mean start of the next stage, and the span (the stage's last done after the stage "
                "before's)\n", layers > 1 ? " 1.." : "", use_v2 ? "input staged" : "start");
    auto last_done_of = [&](int l, int st2) {
      unsigned long long d = 0;
      for (int cta = 0; cta < grid; ++cta) d = std::max(d, at(cta, l, st2, 1));
      return d;
    };
    for (int st2 = 0; st2 < kStages; ++st2) {
      double work = 0, wmax = 0, gap = 0, span = 0;
      int n = 0, nl = 0, ns = 0;
      for (int l = layers > 1 ? 1 : 0; l < layers; ++l) {
        const unsigned long long last_done = last_done_of(l, st2);
        double next = 0;
        int nn = 0;
        unsigned long long before = 0;  // the last done of the latest stage before with clocks (v1 has no router)
        for (int b = st2 - 1; b >= -1 && before == 0; --b)
          before = b >= 0 ? last_done_of(l, b) : last_done_of(l - 1, kStages - 1);
        if (before != 0 && last_done > before) span += double(last_done - before) * 1e-3, ++ns;
        for (int cta = 0; cta < grid; ++cta) {
          const unsigned long long a = at(cta, l, st2, 0), d = at(cta, l, st2, 1);
          if (a == 0 || d < a) continue;  // a stage this CTA has no part in
          work += double(d - a) * 1e-3, wmax = std::max(wmax, double(d - a) * 1e-3), ++n;
        }
        const int nst = st2 + 1 < kStages ? st2 + 1 : 0, nlay = st2 + 1 < kStages ? l : l + 1;
        if (nlay >= layers) continue;
        for (int cta = 0; cta < grid; ++cta)
          if (const unsigned long long a = at(cta, nlay, nst, 0); a != 0) next += double(a), ++nn;
        if (nn) gap += (next / nn - double(last_done)) * 1e-3, ++nl;
      }
      std::printf("  %-9s work %6.2f / %6.2f   to the next stage %6.2f   span %6.2f\n", names[st2], n ? work / n : 0.0,
                  wmax, nl ? gap / nl : 0.0, ns ? span / ns : 0.0);
    }
  }
  if (!use_v2) {  // CTA 0's expert items of layer 1: issue and landing times from the first issue (us)
    const auto ic = down_load(p.item_clocks, size_t(2 * kMaxE));
    const unsigned long long t0 = ic[0];
    std::printf("CTA 0, layer %d's expert items, us from the first issue: issued / landed (latency)\n ",
                std::min(1, layers - 1));
    for (int i = 0; i < kMaxE && ic[size_t(i)] != 0; ++i)
      std::printf(" %d:%.2f/%.2f(%.2f)", i, double(ic[size_t(i)] - t0) * 1e-3, double(ic[size_t(kMaxE + i)] - t0) * 1e-3,
                  double(ic[size_t(kMaxE + i)] - ic[size_t(i)]) * 1e-3);
    std::printf("\n");
  }
  int failures = 0;
  if (check) {
    Checker ck;
    const auto h_all = down_load(p.h, (L + 1) * kH);
    const auto qkv_all = down_load(p.qkv, L * kQkv);
    const auto attn_all = down_load(reinterpret_cast<const uint16_t*>(p.attn), L * kQ);
    const auto o_all = down_load(p.o, L * kORows);
    const auto gu_all = down_load(p.gu, L * kTopK * kGu);
    const auto ids = down_load(p.ids, L * kTopK);
    const auto wts = down_load(p.wts, L * kTopK);
    std::vector<double> y, mag;
    for (int l = 0; l < layers; ++l) {
      const std::vector<float> h(h_all.begin() + l * kH, h_all.begin() + (l + 1) * kH);
      const float* qkv = qkv_all.data() + size_t(l) * kQkv;
      const float* o = o_all.data() + size_t(l) * kORows;
      // qkv
      cpu_gemv(p.wqkv + size_t(l) * kQkv * kH, kQkv, kH, cpu_norm(h, nullptr), y, mag);
      for (int n = 0; n < kQkv; ++n) ck.near("qkv", l, n, qkv[n], y[size_t(n)], mag[size_t(n)]);
      // attention, from the GPU's q/k/v
      const auto kc = down_load(reinterpret_cast<const uint16_t*>(p.kc) + size_t(l) * kKvHeads * kCtx * kDim,
                                size_t(kKvHeads) * kCtx * kDim);
      const auto vc = down_load(reinterpret_cast<const uint16_t*>(p.vc) + size_t(l) * kKvHeads * kCtx * kDim,
                                size_t(kKvHeads) * kCtx * kDim);
      for (int qh = 0; qh < kHeads; ++qh) {
        const int hk = qh / kGroup;
        std::vector<double> sc(static_cast<size_t>(kCtx));
        double mx = -1e300;
        for (int t2 = 0; t2 < kCtx; ++t2) {
          double s2 = 0;
          for (int d = 0; d < kDim; ++d) {
            const double kd = t2 == kCtx - 1 ? qkv[kQ + hk * kDim + d]
                                             : bf2f(kc[(size_t(hk) * kCtx + t2) * kDim + d]);
            s2 += double(qkv[qh * kDim + d]) * kd;
          }
          sc[size_t(t2)] = s2 / std::sqrt(double(kDim));
          mx = std::max(mx, sc[size_t(t2)]);
        }
        double sum = 0;
        for (auto& v : sc) v = std::exp(v - mx), sum += v;
        for (int d = 0; d < kDim; ++d) {
          double a = 0, m = 0;
          for (int t2 = 0; t2 < kCtx; ++t2) {
            const double vd = t2 == kCtx - 1 ? qkv[kQ + kKvHeads * kDim + hk * kDim + d]
                                             : bf2f(vc[(size_t(hk) * kCtx + t2) * kDim + d]);
            a += sc[size_t(t2)] * vd, m += sc[size_t(t2)] * std::fabs(vd);
          }
          ck.near("attn", l, qh * kDim + d, bf2f(attn_all[size_t(l) * kQ + size_t(qh) * kDim + size_t(d)]), a / sum,
                  m / sum);
        }
      }
      // o, from the GPU's attention output
      std::vector<float> a(static_cast<size_t>(kQ));
      for (int k = 0; k < kQ; ++k) a[size_t(k)] = bf2f(attn_all[size_t(l) * kQ + size_t(k)]);
      cpu_gemv(p.wo + size_t(l) * kORows * kQ, kORows, kQ, a, y, mag);
      for (int n = 0; n < kORows; ++n) ck.near("o", l, n, o[n], y[size_t(n)], mag[size_t(n)]);
      // routing, from the GPU's logits
      std::vector<int> order(kExperts);
      for (int e = 0; e < kExperts; ++e) order[size_t(e)] = e;
      std::stable_sort(order.begin(), order.end(), [&](int x, int z) { return o[kH + x] > o[kH + z]; });
      double den = 0;
      for (int k = 0; k < kTopK; ++k) den += std::exp(double(o[kH + order[size_t(k)]]) - o[kH + order[0]]);
      for (int k = 0; k < kTopK; ++k) {
        ck.near("expert id", l, k, ids[size_t(l) * kTopK + size_t(k)], order[size_t(k)], 0.0);
        ck.near("expert weight", l, k, wts[size_t(l) * kTopK + size_t(k)],
                std::exp(double(o[kH + order[size_t(k)]]) - o[kH + order[0]]) / den, 0.0);
      }
      // gate/up of the GPU's experts, from h + o
      const auto x2 = cpu_norm(h, o);
      const float* gu = gu_all.data() + size_t(l) * kTopK * kGu;
      std::vector<double> down_sum(size_t(kH), 0.0), down_mag(size_t(kH), 0.0);
      for (int j = 0; j < kTopK; ++j) {
        const int e = ids[size_t(l) * kTopK + size_t(j)];
        cpu_gemv(p.wgu + (size_t(l) * kExperts + size_t(e)) * kGu * kH, kGu, kH, x2, y, mag);
        for (int n = 0; n < kGu; ++n) ck.near("gate/up", l, j * kGu + n, gu[j * kGu + n], y[size_t(n)], mag[size_t(n)]);
        std::vector<float> act(static_cast<size_t>(kI));
        for (int k = 0; k < kI; ++k) {
          const float g = gu[j * kGu + k], u = gu[j * kGu + kI + k];
          act[size_t(k)] = bf16_round(g / (1.f + std::exp(-g)) * u);
        }
        cpu_gemv(p.wd + (size_t(l) * kExperts + size_t(e)) * kH * kI, kH, kI, act, y, mag);
        const double wj = wts[size_t(l) * kTopK + size_t(j)];
        for (int n = 0; n < kH; ++n) down_sum[size_t(n)] += wj * y[size_t(n)], down_mag[size_t(n)] += wj * mag[size_t(n)];
      }
      for (int n = 0; n < kH; ++n)
        ck.near("h", l + 1, n, h_all[size_t(l + 1) * kH + size_t(n)], double(h[size_t(n)]) + o[n] + down_sum[size_t(n)],
                std::fabs(h[size_t(n)]) + std::fabs(o[n]) + down_mag[size_t(n)]);
    }
    std::printf("check against the CPU: %d of %d values out of tolerance\n", ck.bad, ck.total);
    failures += ck.bad > 0;
  }
  if (graph_exec != nullptr) cudaGraphExecDestroy(graph_exec);
  for (void* q : bufs) cudaFree(q);
  cudaStreamDestroy(st);
  if (failures) std::printf("FAILED\n");
  return failures ? 1 : 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_layer_persistent: %s\n", e.what());
    return 1;
  }
}

// The lm_head of an all-greedy decode step of 1-64 rows as an exact screen (lmhead_screen.h; the arithmetic and its
// proof in lmhead_screen_math.h). Why: a decode step streams the 622 MB BF16 lm_head (q30b8l) in ~138 us at 1 token
// (a quarter of the step) and ~160 at 64 (lmhead_argmax) only to take an argmax; an int8 copy is half the bytes, and
// the rows that could still win (on random weights ~1-20 of 151,936 a token) are then evaluated exactly.
//
// 1-8 rows, three launches, programmatic dependents of each other (9-64 rows: lmhead_screen_wide.cu):
//  1. screen: one block per SM slot, persistent over contiguous runs of 16-row blocks, streaming the int8 rows as
//     gemv_stream streams BF16 ones (8 warps split K, per-warp 4-stage cp.async rings of 16 rows x 128 k that run on
//     across row blocks; its first slices and the block's row scales go out before the programmatic wait); the
//     weights become fp16 integers in registers (a byte permute into 0x64XX and one subtraction: exact) and meet
//     the token rows (fp16 in shared memory) in mma.sync m16n8k16 with f32 accumulators; per row and token it writes
//     hi = a + B and keeps the block's max of a - B (lo);
//  2. pick: L = the max of the lo values; each block scans its share of the rows for hi >= L and evaluates those
//     candidates exactly (a warp a candidate: BF16 weights and token row, f32 FMAs in a fixed order, a fixed
//     butterfly), keeping the best (value, lowest id) a token;
//  3. merge: one block a token folds the blocks' bests into the id.
// By default (screen_kernel<true>; MOESERVE_LMHEAD_SCREEN_FOLD=0: the three launches above) the pick and the merge ride
// in the screen's tail, one launch: each block trades its lower bound a token with a grid-wide one after every row block (a global
// atomicMax whose answer is used one row block later), lists in shared memory the rows whose hi reaches the bound it
// holds, and at its end evaluates those that reach the grid's bound as it stands then (every value of it is at most
// the final L: the argmax row is evaluated by its block); the bests meet in a 64-bit atomicMax key a token and the
// last block to finish writes the ids and puts the grid state back to zero for the next launch.
#include "cuda/sampling/lmhead_screen.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstring>

#include "core/env.h"
#include "core/error.h"
#include "cuda/device.h"
#include "cuda/fused_norm.cuh"
#include "cuda/launch.h"
#include "cuda/moe/moe_ptx.cuh"
#include "cuda/pdl.cuh"
#include "cuda/registry.h"
#include "cuda/sampling/lmhead_screen_common.cuh"
#include "cuda/sampling/lmhead_screen_math.h"
#include "cuda/sampling/sampling_device.cuh"

namespace moeserve::cuda {
using namespace screen_detail;
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 16;          // a row block: the MMA's M
constexpr int kTok = 8;            // token rows: the MMA's N
constexpr int kSliceK = 128;       // int8 k a ring stage: 16 rows x 128 bytes
constexpr int kStages = 4;
constexpr int kStageBytes = kRows * kSliceK;  // 2 KB
constexpr int kRingBytes = kWarps * kStages * kStageBytes;  // 64 KB a block
constexpr int kXPad = 8;           // fp16 of padding a shared token row (conflict-free 16-byte reads)
constexpr int kMergeThreads = 256;

struct Workspace {
  float* hi;    // [kTok][V]: a + B
  float* lo;    // [kTok][kMaxGrid]: the screen blocks' max of a - B
  Best* best;   // [kTok][kMaxGrid]: the pick blocks' bests
  Best* topk;   // [kTok][kMaxGrid][kLmheadScreenMaxTopK]: the top-k pick blocks' best k (lmhead_screen_topk)
  int* topk_n;  // [kTok][kMaxGrid]: how many of them each block wrote
};
// The folded form's grid state (the default; MOESERVE_LMHEAD_SCREEN_FOLD=0 does without), zero between launches: lmhead_screen_workspace_init
// zeroes it once, the last block of each launch puts it back. Its own piece past both forms' layouts (the 9-64-row
// form lays its workspace over the same bytes as this form's).
struct FoldState {
  unsigned glo[kTok];             // the grid's lower bound a token (bound_key; 0: none yet)
  unsigned long long key[kTok];   // the best (logit, row) a token (best_key; 0: none yet)
  int done;                       // blocks finished (finished_last's counter)
};
// The layout of the 1-8-row form's workspace (bytes: its size, when asked).
Workspace carve(void* ws, int V, size_t* bytes = nullptr) {
  WsCarve c(ws);
  Workspace w;
  w.hi = c.take<float>(size_t(kTok) * size_t(V) * 4);
  w.lo = c.take<float>(size_t(kTok) * kMaxGrid * 4);
  w.best = c.take<Best>(size_t(kTok) * kMaxGrid * sizeof(Best));
  w.topk = c.take<Best>(size_t(kTok) * kMaxGrid * kLmheadScreenMaxTopK * sizeof(Best));
  w.topk_n = c.take<int>(size_t(kTok) * kMaxGrid * sizeof(int));
  if (bytes != nullptr) *bytes = c.used;
  return w;
}

// ---- quantization (once, at load) ----
// One block a row: amax, the scale, the int8 row, the largest |w - s q| and the bound's coefficient; A by atomicMax
// on the float's bits (non-negative floats order as their bits).
constexpr int kQuantThreads = 256;
__global__ void __launch_bounds__(kQuantThreads) screen_quantize_kernel(const bf16* __restrict__ w, int V, int K,
                                                                         int8_t* q, screen::RowMeta* meta,
                                                                         unsigned* amax_all) {
  const int r = blockIdx.x;
  const bf16* row = w + size_t(r) * K;
  __shared__ float red[kQuantThreads / 32];
  auto block_max = [&](float v) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float m = red[0];
    for (int i = 1; i < kQuantThreads / 32; ++i) m = fmaxf(m, red[i]);
    return m;
  };
  float a = 0.0f;
  int bad = 0;
  for (int k = threadIdx.x; k < K; k += kQuantThreads) {
    const float v = fabsf(__bfloat162float(row[k]));
    a = fmaxf(a, v);
    bad |= !(v < INFINITY);  // NaN or infinite
  }
  // A NaN or infinite weight makes the row's bound NaN, and a NaN bound keeps the row a candidate (the screen's rule;
  // fmaxf would drop a NaN, hence the separate vote).
  bad = __syncthreads_or(bad);
  const float amax = bad ? NAN : block_max(a);
  const float s = screen::row_scale(amax);
  float e = 0.0f;
  for (int k = threadIdx.x; k < K; k += kQuantThreads) {
    const float x = __bfloat162float(row[k]);
    const int qi = screen::quantize(x, s);
    q[size_t(r) * K + k] = int8_t(qi ^ 0x80);  // biased: the byte qi + 128 (int8x4_to_half2x2)
    e = fmaxf(e, screen::quant_error(x, s, qi, amax));
  }
  const float err = block_max(e);
  if (threadIdx.x == 0) {
    meta[r] = screen::RowMeta{s, bad ? NAN : screen::row_coefficient(err, amax, K)};
    if (!bad) atomicMax(amax_all, __float_as_uint(amax));
  }
}

// ---- 1. the screen ----
struct ScreenArgs {
  const bf16* x;  // [M][K]
  int M, K, V;
  const int8_t* q;
  const screen::RowMeta* meta;
  float amax_all;
  float* hi;
  float* lo;
  int evict_first;
  // The folded pick (screen_kernel<true>): the BF16 lm_head, the grid state, the ids.
  const bf16* w;  // [V][K]
  FoldState* fs;
  int32_t* out_ids;
};
constexpr int kFoldCap = 64;  // listed rows a (token, block) in the folded form; more: the block's hi are scanned

__device__ __forceinline__ void mma_f16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                        unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The block's max of a - B for a token so far: its 16 epilogue threads are one half-warp.
__device__ __forceinline__ float half_warp_max(float v) {
#pragma unroll
  for (int o = 8; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// The folded form's lower bound of a half-warp's token: the block's, and the grid's answer to the last trade (held by
// the half-warp's first thread). Warps 0-3, every lane.
__device__ __forceinline__ float fold_bound(float lo_max, unsigned traded, int lane) {
  return fmaxf(half_warp_max(lo_max), bound_of_key(__shfl_sync(0xffffffffu, traded, lane & 16)));
}

// The folded form's end: the final lower bound a token (the block's, raised by the grid's as it stands now: every value
// of either is at most the final L), a warp a token evaluates the block's listed rows that reach it (every row of the
// block's run whose hi reaches it, from the hi rows, when the list overflowed), the bests into the grid's keys; the
// last block writes the ids and zeroes the grid state for the next launch.
__device__ __forceinline__ void fold_tail(const ScreenArgs& a, const Entry* flist, const int* fcnt, float* fbound,
                                          float bound, float lo_max, unsigned traded, int64_t rb0, int64_t rb1) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, er = threadIdx.x % kRows, et = threadIdx.x / kRows;
  if (threadIdx.x < kRows * kTok) {
    bound = fmaxf(bound, fold_bound(lo_max, traded, lane));
    if (er == 0 && et < a.M) fbound[et] = fmaxf(bound, bound_of_key(atomicMax(&a.fs->glo[et], bound_key(bound))));
  }
  __syncthreads();
  for (int t = warp; t < a.M; t += kWarps) {
    const float L = fbound[t];
    const bf16* xr = a.x + int64_t(t) * a.K;
    Best best{-INFINITY, INT_MAX};
    const int n = fcnt[t];
    if (n <= kFoldCap) {
      best = exact_listed(best, flist + t * kFoldCap, n, L, xr, a.w, a.K, lane);
    } else {
      const int64_t r1 = min(rb1 * kRows, int64_t(a.V));
      for (int64_t r0 = rb0 * kRows; r0 < r1; r0 += 32) {
        const int64_t r = r0 + lane;
        const float h = r < r1 ? __ldcg(a.hi + int64_t(t) * a.V + r) : -INFINITY;
        best = exact_kept(best, __ballot_sync(0xffffffffu, r < r1 && h >= L), int(r), xr, a.w, a.K, lane);
      }
    }
    if (lane == 0 && best.id != INT_MAX) atomicMax(&a.fs->key[t], best_key(best.v, best.id));
  }
  // The last block (finished_last puts the counter back) reads every block's keys and zeroes them and the bounds.
  if (finished_last(&a.fs->done, int(gridDim.x)) && threadIdx.x < kTok) {
    const unsigned long long k = atomicExch(&a.fs->key[threadIdx.x], 0ull);
    atomicExch(&a.fs->glo[threadIdx.x], 0u);
    if (threadIdx.x < a.M) a.out_ids[threadIdx.x] = row_of_key(k);
  }
}

// Dynamic shared memory: the rings, the fp16 token rows [M][K + kXPad], the run's row metadata.
size_t screen_smem(int M, int K, int max_run_rows) {
  return size_t(kRingBytes) + size_t(M) * size_t(K + kXPad) * 2 + size_t(max_run_rows) * sizeof(screen::RowMeta);
}

template <bool kFold>
__global__ void __launch_bounds__(kWarps * 32) screen_kernel(const __grid_constant__ ScreenArgs a) {
  __shared__ float partial[2][kWarps][kRows][kTok];
  __shared__ float x1s[kTok], exs[kTok];
  __shared__ Entry flist[kFold ? kTok * kFoldCap : 1];  // the folded form's lists, its counts and final bounds
  __shared__ int fcnt[kTok];
  __shared__ float fbound[kTok];
  extern __shared__ __align__(16) unsigned char screen_smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int M = a.M, K = a.K, V = a.V;
  unsigned char* ring = screen_smem_raw + warp * kStages * kStageBytes;
  __half* xs = reinterpret_cast<__half*>(screen_smem_raw + kRingBytes);
  const int ldxs = K + kXPad;
  screen::RowMeta* metas = reinterpret_cast<screen::RowMeta*>(screen_smem_raw + kRingBytes + size_t(M) * ldxs * 2);
  const int64_t row_blocks = (V + kRows - 1) / kRows;
  const int64_t rb0 = int64_t(blockIdx.x) * row_blocks / gridDim.x;
  const int64_t rb1 = int64_t(blockIdx.x + 1) * row_blocks / gridDim.x;
  const int slices = K / kSliceK;                             // a row block's
  const int per_warp = (slices + kWarps - 1) / kWarps;        // this warp's, padded
  const int64_t total = (rb1 - rb0) * per_warp;
  const unsigned long long wpol = a.evict_first ? moe_ptx::l2_evict_first_policy() : 0ull;
  int64_t next_rb = rb0;
  int next_u = 0;
  // Slice i of the warp: row block rb0 + i / per_warp, k slice warp + kWarps (i % per_warp); row r's 16-byte chunk c
  // at c ^ 4 (r & 1). Padding slices and slices past the run are zero fills that read nothing.
  auto load_next = [&](int64_t i) {
    unsigned char* dst = ring + int(i % kStages) * kStageBytes;
    const bool live = i < total;
    const int sl = warp + kWarps * next_u;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int id = lane + 32 * m, r = id >> 3, c = id & 7;
      const bool ok = live && sl < slices;
      const int64_t row = min(next_rb * kRows + r, int64_t(V) - 1);
      moe_ptx::cp_async16_hint(dst + r * kSliceK + ((c ^ ((r & 1) << 2)) << 4),
                               ok ? a.q + row * K + int64_t(sl) * kSliceK + 16 * c : a.q, ok, a.evict_first != 0,
                               wpol);
    }
    moe_ptx::cp_async_commit();
    if (++next_u == per_warp) next_u = 0, ++next_rb;
  };
  // The weights and their scales are constants: they go out before the programmatic wait.
  for (int i = 0; i < kStages; ++i) load_next(i);
  {
    const int64_t r0 = rb0 * kRows, n = min(rb1 * kRows, int64_t(V)) - r0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) metas[i] = a.meta[r0 + i];
  }
  pdl_enter();
  // The token rows as fp16 (|x16 - x| <= e_x; an infinite e_x when a value overflows), X1 = sum |x| a token: a thread
  // a 16-byte chunk of every token row at a time, all of them in flight together (session 47: a warp a token, a k a
  // lane, was a chain of L2 round trips on the step's critical path while the ring waited), per-warp sums through
  // shared memory (`partial`, free until the first row block ends) added in warp order.
  {
    float s[kTok], e[kTok];
#pragma unroll
    for (int t = 0; t < kTok; ++t) s[t] = 0.0f, e[t] = 0.0f;
    for (int c = threadIdx.x; c < K / 8; c += kWarps * 32) {
      uint4 v[kTok];
#pragma unroll
      for (int t = 0; t < kTok; ++t)
        v[t] = t < M ? __ldcg(reinterpret_cast<const uint4*>(a.x + int64_t(t) * K) + c) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        if (t >= M) continue;
        const bf16* xv = reinterpret_cast<const bf16*>(&v[t]);
        alignas(16) __half h[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) h[i] = screen_half(__bfloat162float(xv[i]), s[t], e[t]);
        *reinterpret_cast<uint4*>(xs + t * ldxs + 8 * c) = *reinterpret_cast<const uint4*>(h);
      }
    }
    float* red = &partial[0][0][0][0];  // [2][kWarps][kTok]: sums, then maxima
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
      for (int o = 16; o > 0; o /= 2) {
        s[t] += __shfl_xor_sync(0xffffffffu, s[t], o);
        e[t] = fmaxf(e[t], __shfl_xor_sync(0xffffffffu, e[t], o));
      }
      if (lane == 0) red[warp * kTok + t] = s[t], red[(kWarps + warp) * kTok + t] = e[t];
    }
    __syncthreads();
    if (threadIdx.x < M) {
      float S = 0.0f, E = 0.0f;  // (a NaN sum stays NaN: every row a candidate)
      for (int w = 0; w < kWarps; ++w)
        S += red[w * kTok + threadIdx.x], E = fmaxf(E, red[(kWarps + w) * kTok + threadIdx.x]);
      x1s[threadIdx.x] = screen::round_up_l1(S, K), exs[threadIdx.x] = screen::ex_term(E, K, a.amax_all);
    }
  }
  if (kFold && threadIdx.x < kTok) fcnt[threadIdx.x] = 0;
  __syncthreads();
  const bool has_token = g < M;
  const __half* xr = xs + (has_token ? g : 0) * ldxs;
  // The epilogue threads (threadIdx.x < kRows * kTok): row threadIdx.x % 16, token threadIdx.x / 16, fixed.
  const int er = threadIdx.x % kRows, et = threadIdx.x / kRows;
  const bool epi = threadIdx.x < kRows * kTok && et < M;
  const float ex1 = epi ? x1s[et] : 0.0f, eex = epi ? exs[et] : 0.0f;
  float lo_max = -INFINITY;
  // The folded form: the thread's copy of the block's lower bound for token et (the same in its half-warp), and the
  // grid's answer to its last trade (held by the half-warp's er == 0 thread, used one row block later).
  float bound = -INFINITY;
  unsigned traded = 0;
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  int64_t rb = rb0;
  int u = 0;
  for (int64_t i = 0; i < total; ++i) {
    moe_ptx::cp_async_wait<kStages - 1>();
    __syncwarp();
    const unsigned char* sl = ring + int(i % kStages) * kStageBytes;
    const int kb = (warp + kWarps * u) * kSliceK;
    if (kb < K) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // Lane (g, q) takes chunk q + 4h of rows g and g + 8 (rows of one parity share the swizzle) and the token
        // row's same 16 k; MMA j sums k = 4j .. 4j + 3 of every lane's chunk (the k order is the lanes', the same in
        // A and B).
        const int ch = (q + 4 * h) ^ ((g & 1) << 2);
        const uint4 wlo = *reinterpret_cast<const uint4*>(sl + g * kSliceK + 16 * ch);
        const uint4 whi = *reinterpret_cast<const uint4*>(sl + (g + 8) * kSliceK + 16 * ch);
        const int k = kb + 16 * (q + 4 * h);
        uint4 b0 = make_uint4(0, 0, 0, 0), b1 = make_uint4(0, 0, 0, 0);
        if (has_token) {
          b0 = *reinterpret_cast<const uint4*>(xr + k);
          b1 = *reinterpret_cast<const uint4*>(xr + k + 8);
        }
        const unsigned wl[4] = {wlo.x, wlo.y, wlo.z, wlo.w}, wh[4] = {whi.x, whi.y, whi.z, whi.w};
        const unsigned bx[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          unsigned l0, l1, h0, h1;
          int8x4_to_half2x2(wl[j], l0, l1);
          int8x4_to_half2x2(wh[j], h0, h1);
          mma_f16(c, l0, h0, l1, h1, bx[2 * j], bx[2 * j + 1]);
        }
      }
    }
    __syncwarp();
    load_next(i + kStages);
    if (++u < per_warp) continue;
    // The warp's last slice of the row block: c[0], c[1] are row g, tokens 2q, 2q + 1; c[2], c[3] row g + 8.
    const int buf = int((rb - rb0) & 1);
    partial[buf][warp][g][2 * q] = c[0];
    partial[buf][warp][g][2 * q + 1] = c[1];
    partial[buf][warp][g + 8][2 * q] = c[2];
    partial[buf][warp][g + 8][2 * q + 1] = c[3];
    c[0] = c[1] = c[2] = c[3] = 0.f;
    __syncthreads();  // buffer buf is complete; the other was summed before any warp got here
    const int64_t n = rb * kRows + er;
    float hi = -INFINITY;
    if (epi && n < V) {
      float acc = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) acc += partial[buf][w][er][et];
      const screen::RowMeta m = metas[n - rb0 * kRows];
      const float approx = m.scale * acc;
      const float b = screen::bound(approx, m.c, ex1, eex);
      hi = approx + b;
      const float lo = approx - b;
      if (!(hi == hi)) hi = INFINITY;  // NaN: a candidate the exact pass decides on
      a.hi[int64_t(et) * V + n] = hi;
      lo_max = fmaxf(lo_max, lo);      // (fmaxf drops a NaN)
    }
    if (kFold && threadIdx.x < kRows * kTok) {  // warps 0-3 whole: a half-warp a token
      bound = fmaxf(bound, fold_bound(lo_max, traded, lane));
      if (epi && n < V && hi >= bound) {
        const int slot = atomicAdd(&fcnt[et], 1);
        if (slot < kFoldCap) flist[et * kFoldCap + slot] = Entry{int(n), hi};
      }
      if (er == 0 && et < M) traded = atomicMax(&a.fs->glo[et], bound_key(bound));
    }
    u = 0, ++rb;
  }
  moe_ptx::cp_async_wait<0>();
  if constexpr (kFold) {
    fold_tail(a, flist, fcnt, fbound, bound, lo_max, traded, rb0, rb1);
  } else if (threadIdx.x < kRows * kTok) {
    lo_max = half_warp_max(lo_max);
    if (er == 0 && et < M) a.lo[et * kMaxGrid + blockIdx.x] = lo_max;
  }
}

// ---- 2. the pick ----
// The (token, row) pairs of rows [r0, r0 + rows) whose a + B (hi [token][V]) reaches their token's bound L[token], as
// (token << 24) | (row - r0) in cand (count: shared, zeroed before), over the block's threads in batches of 8 a thread,
// every load of a batch in flight before the first comparison.
__device__ __forceinline__ void list_candidates(const float* hi, int V, int64_t r0, int64_t rows, int M, const float* L,
                                                int* cand, int* count) {
  const int64_t pairs = rows * M;
  for (int64_t base = 0; base < pairs; base += 8 * kPickThreads) {
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t pr = base + threadIdx.x + int64_t(j) * kPickThreads;
      v[j] = pr < pairs ? __ldcg(hi + (pr / rows) * V + r0 + pr % rows) : -INFINITY;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t pr = base + threadIdx.x + int64_t(j) * kPickThreads;
      if (pr < pairs && v[j] >= L[pr / rows]) cand[atomicAdd(count, 1)] = int((pr / rows) << 24) | int(pr % rows);
    }
  }
}

struct PickArgs {
  const bf16* x;  // [M][K]
  const bf16* w;  // [V][K]
  int M, K, V;
  int screen_blocks;
  const float* hi;
  const float* lo;
  Best* best;
};

__global__ void __launch_bounds__(kPickThreads) pick_kernel(const __grid_constant__ PickArgs a) {
  extern __shared__ int cand[];  // (token << 24) | row - r0
  __shared__ float L[kTok];
  __shared__ int count;
  __shared__ Best wbest[kPickThreads / 32][kTok];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int M = a.M, K = a.K, V = a.V;
  const int64_t r0 = int64_t(blockIdx.x) * V / gridDim.x, r1 = int64_t(blockIdx.x + 1) * V / gridDim.x;
  if (threadIdx.x == 0) count = 0;
  if (lane < kTok) wbest[warp][lane] = Best{-INFINITY, INT_MAX};
  pdl_enter();
  for (int t = warp; t < M; t += kPickThreads / 32) {
    float m = -INFINITY;
#pragma unroll 4
    for (int b = lane; b < a.screen_blocks; b += 32) m = fmaxf(m, __ldcg(a.lo + t * kMaxGrid + b));
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) L[t] = m;
  }
  __syncthreads();
  const int64_t rows = r1 - r0;
  list_candidates(a.hi, V, r0, rows, M, L, cand, &count);
  __syncthreads();
  const int n = count;
  // A warp a candidate (exact_logit: the same value for the same (token, row) whichever block or warp computes it).
  for (int i = warp; i < n; i += kPickThreads / 32) {
    const int t = cand[i] >> 24;
    const int64_t r = r0 + (cand[i] & 0xffffff);
    const float s = exact_logit(a.x + int64_t(t) * K, a.w + r * K, K, lane);
    if (lane == 0) wbest[warp][t] = better(wbest[warp][t], Best{s, int(r)});
  }
  __syncthreads();
  if (threadIdx.x < M) {
    Best b{-INFINITY, INT_MAX};
    for (int w = 0; w < kPickThreads / 32; ++w) b = better(b, wbest[w][threadIdx.x]);
    a.best[threadIdx.x * kMaxGrid + blockIdx.x] = b;
  }
}

// ---- 3. the merge ----
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const Best* best, int blocks, int32_t* out_ids) {
  pdl_enter();
  const Best* p = best + blockIdx.x * kMaxGrid;
  Best b{-INFINITY, INT_MAX};
  for (int i = threadIdx.x; i < blocks; i += kMergeThreads) b = better(b, Best{__ldcg(&p[i].v), __ldcg(&p[i].id)});
  for (int o = 16; o > 0; o /= 2) b = better(b, shfl_xor(b, o));
  __shared__ Best warps[kMergeThreads / 32];
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = b;
  __syncthreads();
  if (threadIdx.x == 0) {
    Best m = warps[0];
    for (int w = 1; w < kMergeThreads / 32; ++w) m = better(m, warps[w]);
    // No row above -inf (every logit NaN or -inf): token 0, as a defined answer of a broken step.
    out_ids[blockIdx.x] = m.id == INT_MAX ? 0 : m.id;
  }
}

// ---- the top-k pick (lmhead_screen_topk; after screen_kernel<false>) ----
struct PickTopkArgs {
  const bf16* x;  // [M][K]
  const bf16* w;  // [V][K]
  int M, K, V;
  int screen_blocks;
  const float* hi;
  const float* lo;
  const SampleRowParams* params;  // [M]
  Best* topk;                     // [kTok][kMaxGrid][kLmheadScreenMaxTopK]
  int* topk_n;                    // [kTok][kMaxGrid]
};
constexpr int kTopkGroups = 2 * kLmheadScreenMaxTopK;  // the most group maxima a threshold is chosen among

// The k a row's candidates must cover: 1 for a greedy row (the sampler's rule: temperature <= 0, top_k 1 or
// min_p > 1), else its top_k (the executor sends only rows of 1..kLmheadScreenMaxTopK; clamped for safety).
__device__ __forceinline__ int row_k(const SampleRowParams& p) {
  if (p.temperature <= 0.0f || p.top_k == 1 || p.min_p > 1.0f) return 1;
  return min(max(p.top_k, 1), kLmheadScreenMaxTopK);
}
// (value descending, id ascending) as one 64-bit key, larger first: the sampler's own order key (sampling_device.cuh;
// distinct ids, distinct keys, so every candidate has a distinct rank).
__device__ __forceinline__ unsigned long long topk_key(float v, int id) {
  return sampling_detail::rank_key(sampling_detail::order_key(v), id);
}

// A warp's threshold for token t: the k-th largest of G group maxima of the screen blocks' lower bounds (the groups
// and why the value bounds the top k: lmhead_screen_math.h's topk_group_count). -inf when fewer than k groups have a
// finite maximum (every row a candidate). Grouping costs a little tightness (the k-th largest of all blocks' maxima
// would be the tightest such value) for G^2 / 32 comparisons a lane instead of blocks^2 / 32.
__device__ float topk_threshold(const float* lo, int blocks, int k, float* gmax, int lane) {
  const int G = screen::topk_group_count(k, blocks, kTopkGroups);
  for (int g = lane; g < G; g += 32) {
    const int b0 = screen::topk_group_begin(g, G, blocks), b1 = screen::topk_group_begin(g + 1, G, blocks);
    float m = -INFINITY;
    for (int b = b0; b < b1; ++b) m = fmaxf(m, __ldcg(lo + b));
    gmax[g] = m;
  }
  __syncwarp();
  float t = -INFINITY;
  for (int g = lane; g < G; g += 32) {
    const float v = gmax[g];
    int gt = 0, ge = 0;
    for (int j = 0; j < G; ++j) gt += gmax[j] > v, ge += gmax[j] >= v;
    if (gt < k && k <= ge && v > -INFINITY) t = v;  // every lane that finds it finds the same value
  }
  for (int o = 16; o > 0; o /= 2) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
  __syncwarp();
  return t;
}

// As pick_kernel, but each block keeps, a token, its candidates' best k by exact logit (the global top k is among
// the union of the blocks' best k) in [token][block][rank], and their number in topk_n.
__global__ void __launch_bounds__(kPickThreads) pick_topk_kernel(const __grid_constant__ PickTopkArgs a) {
  extern __shared__ int cand[];  // (token << 24) | row - r0, then the exact logits at cand + cap
  __shared__ float L[kTok];
  __shared__ int kk[kTok], count;
  __shared__ float gmax[kPickThreads / 32][kTopkGroups];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int M = a.M, K = a.K, V = a.V;
  const int64_t r0 = int64_t(blockIdx.x) * V / gridDim.x, r1 = int64_t(blockIdx.x + 1) * V / gridDim.x;
  const int64_t rows = r1 - r0, pairs = rows * M;
  float* vals = reinterpret_cast<float*>(cand + pairs);
  if (threadIdx.x == 0) count = 0;
  if (threadIdx.x < M) kk[threadIdx.x] = row_k(a.params[threadIdx.x]);
  pdl_enter();
  __syncthreads();
  for (int t = warp; t < M; t += kPickThreads / 32) {
    const float th = topk_threshold(a.lo + t * kMaxGrid, a.screen_blocks, kk[t], gmax[warp], lane);
    if (lane == 0) L[t] = th;
  }
  __syncthreads();
  list_candidates(a.hi, V, r0, rows, M, L, cand, &count);
  __syncthreads();
  const int n = count;
  for (int i = warp; i < n; i += kPickThreads / 32) {
    const int t = cand[i] >> 24;
    const float s = exact_logit(a.x + int64_t(t) * K, a.w + (r0 + (cand[i] & 0xffffff)) * K, K, lane);
    if (lane == 0) vals[i] = s;
  }
  __syncthreads();
  // A candidate's rank among the block's candidates of its token (distinct keys: distinct ranks 0 .. n_t - 1); the
  // first k ranks go out. A block rarely has more than a few candidates; a flat row makes all of its rows candidates
  // (n^2 comparisons: slow, not wrong).
  for (int i = threadIdx.x; i < n; i += kPickThreads) {
    const int t = cand[i] >> 24, id = int(r0) + (cand[i] & 0xffffff);
    const unsigned long long key = topk_key(vals[i], id);
    int rank = 0;
    for (int j = 0; j < n; ++j)
      rank += (cand[j] >> 24) == t && topk_key(vals[j], int(r0) + (cand[j] & 0xffffff)) > key;
    if (rank < kk[t]) a.topk[(int64_t(t) * kMaxGrid + blockIdx.x) * kLmheadScreenMaxTopK + rank] = Best{vals[i], id};
  }
  if (threadIdx.x < M) {
    int nt = 0;
    for (int j = 0; j < n; ++j) nt += (cand[j] >> 24) == int(threadIdx.x);
    a.topk_n[threadIdx.x * kMaxGrid + blockIdx.x] = min(nt, kk[threadIdx.x]);
  }
}

// ---- the 9-64-row top-k pick (lmhead_screen_topk; after wide_screen_hi_kernel) ----
// A block a (row slice, token): blockIdx.y the token, blockIdx.x one of gridDim.x contiguous slices of the vocabulary.
// The token's threshold as pick_topk_kernel takes it (over the wide stream's block maxima); the slice's rows whose a + B
// reaches it listed (the loads of eight rows a thread in flight together), evaluated exactly (a warp a row) and cut to
// the best k, which go out in the order (value descending, id ascending) as the draw expects. A slice lists into a
// shared list of kWTopkCap; one that overflows it (a flat or non-finite row: ~10-40 candidates are usual) is done
// again in windows of kWTopkCap - k rows, each window's candidates cut to the best k together with the best so far.
struct WidePickTopkArgs {
  const bf16* x;  // [M][K]
  const bf16* w;  // [V][K]
  int M, K, V;
  int screen_blocks;
  const float* hi;  // [M][V]
  const float* lo;  // [M][kMaxGrid]
  const SampleRowParams* params;
  Best* topk;   // [M][kMaxGrid][kLmheadScreenMaxTopK]
  int* topk_n;  // [M][kMaxGrid]
};
constexpr int kWTopkCap = 2048;
__global__ void __launch_bounds__(kPickThreads) wide_pick_topk_kernel(const __grid_constant__ WidePickTopkArgs a) {
  __shared__ int cand[kWTopkCap];
  __shared__ float val[kWTopkCap];
  __shared__ Best kept[kLmheadScreenMaxTopK];
  __shared__ float gmax[kTopkGroups];
  __shared__ float L;
  __shared__ int count;
  const int t = int(blockIdx.y), tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int K = a.K, V = a.V;
  const int64_t r0 = int64_t(blockIdx.x) * V / gridDim.x, r1 = int64_t(blockIdx.x + 1) * V / gridDim.x;
  const int k = row_k(a.params[t]);
  pdl_enter();
  if (warp == 0) {
    const float th = topk_threshold(a.lo + t * kMaxGrid, a.screen_blocks, k, gmax, lane);
    if (lane == 0) L = th, count = 0;
  }
  __syncthreads();
  const float th = L;
  const float* hrow = a.hi + int64_t(t) * V;
  const bf16* xr = a.x + int64_t(t) * K;
  int kept_n = 0;              // the best so far, at cand / val [0, kept_n) (count starts each window there)
  int64_t window = r1 - r0;    // the slice at once; after an overflow, windows that cannot overflow
  for (int64_t p = r0; p < r1;) {
    const int64_t e = min(r1, p + window);
    for (int64_t base = p; base < e; base += 8 * kPickThreads) {
      float v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int64_t r = base + tid + j * kPickThreads;
        v[j] = r < e ? __ldcg(hrow + r) : -INFINITY;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int64_t r = base + tid + j * kPickThreads;
        if (r < e && v[j] >= th) {
          const int slot = atomicAdd(&count, 1);
          if (slot < kWTopkCap) cand[slot] = int(r);
        }
      }
    }
    __syncthreads();
    const int n = count;
    __syncthreads();  // every thread has read count
    if (n > kWTopkCap) {
      window = kWTopkCap - kLmheadScreenMaxTopK;
      if (tid == 0) count = kept_n;
      __syncthreads();
      continue;  // this window again, in smaller ones
    }
    for (int i = kept_n + warp; i < n; i += kPickThreads / 32) {
      const float s = exact_logit(xr, a.w + int64_t(cand[i]) * K, K, lane);
      if (lane == 0) val[i] = s;
    }
    __syncthreads();
    for (int i = tid; i < n; i += kPickThreads) {
      const unsigned long long key = topk_key(val[i], cand[i]);
      int rank = 0;
      for (int j = 0; j < n; ++j) rank += topk_key(val[j], cand[j]) > key;
      if (rank < k) kept[rank] = Best{val[i], cand[i]};
    }
    __syncthreads();
    kept_n = min(n, k);
    if (tid < kept_n) cand[tid] = kept[tid].id, val[tid] = kept[tid].v;
    if (tid == 0) count = kept_n;
    __syncthreads();
    p = e;
  }
  Best* out = a.topk + (int64_t(t) * kMaxGrid + blockIdx.x) * kLmheadScreenMaxTopK;
  if (tid < kept_n) out[tid] = Best{val[tid], cand[tid]};
  if (tid == 0) a.topk_n[t * kMaxGrid + blockIdx.x] = kept_n;
}
// Pick blocks a token at 9-64 rows: one wave of them in all (64 registers a thread: four 256-thread blocks an SM), so
// that every slice's exact rows (~300 a token at top_k 20, all slices together) are in flight at once.
int wide_topk_slices(int rows) {
  static const int sms = current_device_multiprocessors();
  return std::clamp(4 * sms / rows, 1, 256);
}

struct Grids {
  int screen_blocks;
  size_t screen_smem;
  int pick_blocks;
  size_t pick_smem;
};
Grids grids_for(int M, int K, int V, bool fold) {
  static const int sms = current_device_multiprocessors();
  Grids g{};
  const int64_t row_blocks = (V + kRows - 1) / kRows;
  // The screen's static shared memory: the partial sums (and the folded form's lists).
  const size_t static_smem = sizeof(float) * 2 * kWarps * kRows * kTok + (fold ? sizeof(Entry) * kTok * kFoldCap : 0);
  for (int per_sm : {2, 1}) {
    g.screen_blocks = int(std::min<int64_t>(int64_t(sms) * per_sm, std::min<int64_t>(row_blocks, kMaxGrid)));
    const int run_rows = int((row_blocks + g.screen_blocks - 1) / g.screen_blocks) * kRows;
    g.screen_smem = screen_smem(M, K, run_rows);
    if (per_sm == 1 || 2 * (g.screen_smem + static_smem + 1024) <= (228u << 10)) break;
  }
  g.pick_blocks = std::min(sms, std::max(1, V));
  g.pick_smem = size_t((V + g.pick_blocks - 1) / g.pick_blocks + 1) * size_t(M) * sizeof(int);
  return g;
}

// The folded form's grid state: past both forms' layouts.
size_t fold_state_offset(int vocab, int K) {
  size_t narrow = 0, wide = 0;
  carve(nullptr, vocab, &narrow);
  carve_wide_topk(nullptr, K, vocab, &wide);  // (the wide form's layout and past it)
  return (std::max(narrow, wide) + 255) / 256 * 256;
}
FoldState* fold_state(void* workspace, int vocab, int K) {
  return reinterpret_cast<FoldState*>(static_cast<char*>(workspace) + fold_state_offset(vocab, K));
}

// The 1-8-row screen kernel's arguments (fs / out_ids: the folded form's grid state and ids; null for the unfolded one).
ScreenArgs screen_args(const bf16* x, int rows, int K, int vocab, const bf16* w, const void* screen_weights,
                       float amax_all, const Workspace& ws, FoldState* fs, int32_t* out_ids) {
  const char* p = static_cast<const char*>(screen_weights);
  return ScreenArgs{x,
                    rows,
                    K,
                    vocab,
                    reinterpret_cast<const int8_t*>(p),
                    reinterpret_cast<const screen::RowMeta*>(p + meta_offset(vocab, K)),
                    amax_all,
                    ws.hi,
                    ws.lo,
                    l2_evict_first_weights() ? 1 : 0,
                    w,
                    fs,
                    out_ids};
}

}  // namespace

bool screen_detail::screen_fold() {
  static const bool on = env_flag("MOESERVE_LMHEAD_SCREEN_FOLD", true);
  return on;
}

size_t lmhead_screen_weight_bytes(int vocab, int K) { return amax_offset(vocab, K) + 256; }

void lmhead_screen_quantize(const bf16* w, int vocab, int K, void* screen_weights, cudaStream_t stream) {
  char* p = static_cast<char*>(screen_weights);
  unsigned* amax = reinterpret_cast<unsigned*>(p + amax_offset(vocab, K));
  MS_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(unsigned), stream));
  screen_quantize_kernel<<<dim3(unsigned(vocab)), dim3(kQuantThreads), 0, stream>>>(
      w, vocab, K, reinterpret_cast<int8_t*>(p), reinterpret_cast<screen::RowMeta*>(p + meta_offset(vocab, K)), amax);
  MS_CUDA_CHECK(cudaGetLastError());
}

float lmhead_screen_amax(const void* screen_weights, int vocab, int K, cudaStream_t stream) {
  unsigned bits = 0;
  MS_CUDA_CHECK(cudaMemcpyAsync(&bits, static_cast<const char*>(screen_weights) + amax_offset(vocab, K),
                                sizeof(bits), cudaMemcpyDeviceToHost, stream));
  MS_CUDA_CHECK(cudaStreamSynchronize(stream));
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

size_t lmhead_screen_workspace_bytes(int vocab, int K) { return fold_state_offset(vocab, K) + sizeof(FoldState); }

void lmhead_screen_workspace_init(void* workspace, int vocab, int K, cudaStream_t stream) {
  MS_CUDA_CHECK(cudaMemsetAsync(fold_state(workspace, vocab, K), 0, sizeof(FoldState), stream));
}

namespace {
// The hidden sizes and vocabularies both screens take: K a multiple of 128 up to 8,192, vocab < 2^24.
bool screen_shape_ok(int K, int vocab) {
  return K >= kSliceK && K % kSliceK == 0 && K <= 8192 && vocab >= 1 && vocab < (1 << 24);
}
// The fewest rows the 9-64-row form takes on sm_90 (MOESERVE_SCREEN_WIDE_FROM, 2-9; 9: the 1-8-row form up to 8).
// Default 5 (H100s; served steps overlapped): at 2 and 4 rows the wide form was 5 us slower alone and the step 2-4 us
// slower (session 49); at 5-7 rows the step 8-13 us faster with it, though alone it is 1.5 us slower at 5-6 rows and
// 3.3 faster at 7 (session 50); at 8 rows 5-7 us faster alone, the step -16 to -18 us (session 49).
bool use_wide(int rows) {
  static const int sm = current_device_sm();
  static const int from = int(env_int("MOESERVE_SCREEN_WIDE_FROM", 5, 2, kTok + 1));
  return rows > kTok || (sm / 10 == 9 && rows >= from);
}
}  // namespace

bool lmhead_screen_supported(int rows, int K, int vocab) {
  static const int sm = current_device_sm();
  return screen_shape_ok(K, vocab) && rows >= 1 && rows <= kWideRows && (use_wide(rows) ? sm / 10 == 9 : sm >= 80);
}

std::string lmhead_screen_code(const DeviceInfo& dev) {
  for (const void* k :
       {reinterpret_cast<const void*>(screen_quantize_kernel), reinterpret_cast<const void*>(screen_kernel<false>),
        reinterpret_cast<const void*>(screen_kernel<true>), reinterpret_cast<const void*>(pick_kernel),
        reinterpret_cast<const void*>(merge_kernel), reinterpret_cast<const void*>(pick_topk_kernel),
        reinterpret_cast<const void*>(wide_pick_topk_kernel)})
    if (std::string why = check_kernel_present(k, dev); !why.empty()) return why;
  if (std::string why = topk_draw_code(dev); !why.empty()) return why;
  if (std::string why = masked_code(dev); !why.empty()) return why;
  return wide_code(dev);
}

void lmhead_screen(const bf16* x, int rows, int K, const bf16* w, const void* screen_weights, float amax_all,
                   int vocab, int32_t* out_ids, void* workspace, cudaStream_t stream) {
  MS_CHECK(lmhead_screen_supported(rows, K, vocab), "lmhead_screen: {} rows of K {} over {} (1-{} rows, K % {} == 0)",
           rows, K, vocab, kWideRows, kSliceK);
  if (use_wide(rows)) return launch_wide(x, rows, K, w, screen_weights, amax_all, vocab, out_ids, workspace, stream);
  const bool fold = screen_fold();
  const Grids g = grids_for(rows, K, vocab, fold);
  const Workspace ws = carve(workspace, vocab);
  const ScreenArgs sa = screen_args(x, rows, K, vocab, w, screen_weights, amax_all, ws,
                                    fold_state(workspace, vocab, K), out_ids);
  auto* kernel = fold ? screen_kernel<true> : screen_kernel<false>;
  MS_CHECK(raise_dynamic_smem(reinterpret_cast<const void*>(kernel), g.screen_smem),
           "lmhead_screen: the device refuses {} bytes of shared memory a block", g.screen_smem);
  launch_pdl(kernel, dim3(unsigned(g.screen_blocks)), dim3(kWarps * 32), g.screen_smem, stream, sa);
  if (fold) return;
  PickArgs pa{x, w, rows, K, vocab, g.screen_blocks, ws.hi, ws.lo, ws.best};
  MS_CHECK(raise_dynamic_smem(reinterpret_cast<const void*>(pick_kernel), g.pick_smem),
           "lmhead_screen: the device refuses {} bytes of shared memory a block", g.pick_smem);
  launch_pdl(pick_kernel, dim3(unsigned(g.pick_blocks)), dim3(kPickThreads), g.pick_smem, stream, pa);
  launch_pdl(merge_kernel, dim3(unsigned(rows)), dim3(kMergeThreads), 0, stream, static_cast<const Best*>(ws.best),
             g.pick_blocks, out_ids);
}

bool lmhead_screen_topk_supported(int rows, int K, int vocab) {
  static const int sm = current_device_sm();
  return screen_shape_ok(K, vocab) && rows >= 1 && rows <= kWideRows && (rows > kTok ? sm / 10 == 9 : sm >= 80);
}

void lmhead_screen_topk(const bf16* x, int rows, int K, const bf16* w, const void* screen_weights, float amax_all,
                        int vocab, const SampleRowParams* params, int32_t* out_ids, void* workspace,
                        cudaStream_t stream) {
  MS_CHECK(lmhead_screen_topk_supported(rows, K, vocab),
           "lmhead_screen_topk: {} rows of K {} over {} (1-{} rows, K % {} == 0)", rows, K, vocab, kWideRows, kSliceK);
  if (rows > kTok) {  // the wide stream (sm_90), a pick block a (slice, token), the draw
    const WideTopkWs ws = carve_wide_topk(workspace, K, vocab);
    const int blocks = launch_wide_hi(x, rows, K, screen_weights, amax_all, vocab, workspace, ws.hi, stream);
    const int slices = wide_topk_slices(rows);
    launch_pdl(wide_pick_topk_kernel, dim3(unsigned(slices), unsigned(rows)), dim3(kPickThreads), 0, stream,
               WidePickTopkArgs{x, w, rows, K, vocab, blocks, ws.hi, ws.lo, params, ws.topk, ws.topk_n});
    launch_topk_draw(ws.topk, ws.topk_n, slices, rows, params, out_ids, stream);
    return;
  }
  const Grids g = grids_for(rows, K, vocab, false);
  const Workspace ws = carve(workspace, vocab);
  const ScreenArgs sa = screen_args(x, rows, K, vocab, w, screen_weights, amax_all, ws, nullptr, nullptr);
  MS_CHECK(raise_dynamic_smem(reinterpret_cast<const void*>(screen_kernel<false>), g.screen_smem),
           "lmhead_screen_topk: the device refuses {} bytes of shared memory a block", g.screen_smem);
  launch_pdl(screen_kernel<false>, dim3(unsigned(g.screen_blocks)), dim3(kWarps * 32), g.screen_smem, stream, sa);
  PickTopkArgs pa{x, w, rows, K, vocab, g.screen_blocks, ws.hi, ws.lo, params, ws.topk, ws.topk_n};
  const size_t smem = 2 * g.pick_smem;  // the candidates and their exact logits
  MS_CHECK(raise_dynamic_smem(reinterpret_cast<const void*>(pick_topk_kernel), smem),
           "lmhead_screen_topk: the device refuses {} bytes of shared memory a block", smem);
  launch_pdl(pick_topk_kernel, dim3(unsigned(g.pick_blocks)), dim3(kPickThreads), smem, stream, pa);
  launch_topk_draw(ws.topk, ws.topk_n, g.pick_blocks, rows, params, out_ids, stream);
}

std::vector<std::vector<std::pair<int, float>>> lmhead_screen_topk_candidates(const void* workspace, int rows,
                                                                              int vocab, int K) {
  const bool wide = rows > kTok;
  const Best* topk = nullptr;
  const int* topk_n = nullptr;
  int blocks = 0;
  if (wide) {
    const WideTopkWs ws = carve_wide_topk(const_cast<void*>(workspace), K, vocab);
    topk = ws.topk, topk_n = ws.topk_n, blocks = wide_topk_slices(rows);
  } else {
    const Workspace ws = carve(const_cast<void*>(workspace), vocab);
    topk = ws.topk, topk_n = ws.topk_n, blocks = grids_for(rows, K, vocab, false).pick_blocks;
  }
  std::vector<int> n(size_t(rows) * kMaxGrid);
  std::vector<Best> e(size_t(rows) * kMaxGrid * kLmheadScreenMaxTopK);
  MS_CUDA_CHECK(cudaDeviceSynchronize());
  MS_CUDA_CHECK(cudaMemcpy(n.data(), topk_n, n.size() * sizeof(int), cudaMemcpyDeviceToHost));
  MS_CUDA_CHECK(cudaMemcpy(e.data(), topk, e.size() * sizeof(Best), cudaMemcpyDeviceToHost));
  std::vector<std::vector<std::pair<int, float>>> out(static_cast<size_t>(rows));
  for (int t = 0; t < rows; ++t)
    for (int b = 0; b < blocks; ++b)
      for (int i = 0; i < n[size_t(t) * kMaxGrid + b]; ++i) {
        const Best& c = e[(size_t(t) * kMaxGrid + b) * kLmheadScreenMaxTopK + i];
        out[size_t(t)].push_back({c.id, c.v});
      }
  return out;
}

}  // namespace moeserve::cuda

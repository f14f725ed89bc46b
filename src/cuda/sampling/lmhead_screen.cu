// The lm_head of an all-greedy decode step of 1-64 rows as an exact screen (lmhead_screen.h; the arithmetic and its
// proof in lmhead_screen_math.h). Why: a decode step streams the 622 MB BF16 lm_head (q30b8l) in ~138 us at 1 token
// (a quarter of the step) and ~160 at 64 (lmhead_argmax) only to take an argmax; an int8 copy is half the bytes, and
// the rows that could still win (on random weights ~1-20 of 151,936 a token) are then evaluated exactly.
//
// 1-8 rows, three launches, programmatic dependents of each other (9-64 rows: the wide form further down):
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
#include "cuda/sampling/lmhead_screen.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstring>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "cuda/device.h"
#include "cuda/launch.h"
#include "cuda/moe/moe_kernel_params.h"
#include "cuda/moe/moe_ptx.cuh"
#include "cuda/pdl.cuh"
#include "cuda/registry.h"
#include "cuda/sampling/lmhead_screen_math.h"
#include "cuda/tma.h"

namespace moeserve::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 16;          // a row block: the MMA's M
constexpr int kTok = 8;            // token rows: the MMA's N
constexpr int kSliceK = 128;       // int8 k a ring stage: 16 rows x 128 bytes
constexpr int kStages = 4;
constexpr int kStageBytes = kRows * kSliceK;  // 2 KB
constexpr int kRingBytes = kWarps * kStages * kStageBytes;  // 64 KB a block
constexpr int kXPad = 8;           // fp16 of padding a shared token row (conflict-free 16-byte reads)
constexpr int kPickThreads = 256;
constexpr int kMergeThreads = 256;
constexpr int kMaxGrid = 1024;     // blocks of the screen / pick grids the workspace is sized for

struct Best {
  float v;
  int id;
};
__device__ __forceinline__ Best better(Best a, Best b) { return (b.v > a.v || (b.v == a.v && b.id < a.id)) ? b : a; }
__device__ __forceinline__ Best shfl_xor(Best s, int o) {
  return Best{__shfl_xor_sync(0xffffffffu, s.v, o), __shfl_xor_sync(0xffffffffu, s.id, o)};
}

// A warp's exact f32 logit of token row xr against weight row wr (lane l: k = 8 l + 256 i, FMAs in i order, a fixed
// butterfly): the same value for the same rows in either pick.
// (The bound of lmhead_screen_math.h counts this chain: K / 32 FMAs a lane, then 5 shuffle additions.)
// The loads of kBatch iterations go out together (one DRAM round trip a row at K <= 2,048 with 8, not eight); past
// K they are zeros, whose FMAs add an exact +0: the same value whatever kBatch.
template <int kBatch = 8>
__device__ __forceinline__ float exact_logit(const bf16* xr, const bf16* wr, int K, int lane) {
  float s = 0.0f;
  for (int k0 = 8 * lane; k0 < K; k0 += kBatch * 256) {
    uint4 wv[kBatch], xv[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int k = k0 + 256 * u;
      wv[u] = k < K ? __ldcs(reinterpret_cast<const uint4*>(wr + k)) : make_uint4(0, 0, 0, 0);
      xv[u] = k < K ? __ldcg(reinterpret_cast<const uint4*>(xr + k)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const unsigned ww[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w}, xx[4] = {xv[u].x, xv[u].y, xv[u].z, xv[u].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s = fmaf(moe_ptx::bf16_lo(xx[j]), moe_ptx::bf16_lo(ww[j]), s);
        s = fmaf(moe_ptx::bf16_hi(xx[j]), moe_ptx::bf16_hi(ww[j]), s);
      }
    }
  }
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// The screen's weights in one allocation: q [V][K] int8, then the row metadata [V], then the largest |w| (A).
size_t meta_offset(int V, int K) { return (size_t(V) * size_t(K) + 255) / 256 * 256; }
size_t amax_offset(int V, int K) { return meta_offset(V, K) + (size_t(V) * sizeof(screen::RowMeta) + 255) / 256 * 256; }

struct Workspace {
  float* hi;    // [kTok][V]: a + B
  float* lo;    // [kTok][kMaxGrid]: the screen blocks' max of a - B
  Best* best;   // [kTok][kMaxGrid]: the pick blocks' bests
};
Workspace carve(void* ws, int V) {
  char* p = static_cast<char*>(ws);
  Workspace w;
  w.hi = reinterpret_cast<float*>(p);
  p += (size_t(kTok) * size_t(V) * 4 + 255) / 256 * 256;
  w.lo = reinterpret_cast<float*>(p);
  p += size_t(kTok) * kMaxGrid * 4;
  w.best = reinterpret_cast<Best*>(p);
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
    q[size_t(r) * K + k] = int8_t(qi);
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
};

// 4 int8 (one 32-bit word) as two fp16 pairs holding the same integers: bytes + 128 placed under 0x64 (1024 + u),
// then 1152 subtracted (exact: every integer of [-128, 127] is an fp16).
__device__ __forceinline__ void int8x4_to_half2x2(unsigned w, unsigned& lo, unsigned& hi) {
  const unsigned u = w ^ 0x80808080u;
  const unsigned a = __byte_perm(u, 0x64646464u, 0x5140), b = __byte_perm(u, 0x64646464u, 0x5342);
  const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
  const __half2 ha = __hsub2(*reinterpret_cast<const __half2*>(&a), bias);
  const __half2 hb = __hsub2(*reinterpret_cast<const __half2*>(&b), bias);
  lo = *reinterpret_cast<const unsigned*>(&ha);
  hi = *reinterpret_cast<const unsigned*>(&hb);
}

__device__ __forceinline__ void mma_f16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                        unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Dynamic shared memory: the rings, the fp16 token rows [M][K + kXPad], the run's row metadata.
size_t screen_smem(int M, int K, int max_run_rows) {
  return size_t(kRingBytes) + size_t(M) * size_t(K + kXPad) * 2 + size_t(max_run_rows) * sizeof(screen::RowMeta);
}

__global__ void __launch_bounds__(kWarps * 32) screen_kernel(const __grid_constant__ ScreenArgs a) {
  __shared__ float partial[2][kWarps][kRows][kTok];
  __shared__ float x1s[kTok], exs[kTok];
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
  // The token rows as fp16 (|x16 - x| <= e_x; an infinite e_x when a value overflows), X1 = sum |x| a token.
  for (int t = warp; t < M; t += kWarps) {
    float s = 0.0f, e = 0.0f;
    for (int k = lane; k < K; k += 32) {
      const float v = __bfloat162float(__ldcg(a.x + int64_t(t) * K + k));
      const __half h = __float2half_rn(v);
      xs[t * ldxs + k] = h;
      s += fabsf(v);
      const float d = fabsf(v - __half2float(h));
      e = fmaxf(e, d == d ? d : INFINITY);
    }
    for (int o = 16; o > 0; o /= 2) {
      s += __shfl_xor_sync(0xffffffffu, s, o);
      e = fmaxf(e, __shfl_xor_sync(0xffffffffu, e, o));
    }
    if (lane == 0) x1s[t] = screen::round_up_l1(s, K), exs[t] = screen::ex_term(e, K, a.amax_all);
  }
  __syncthreads();
  const bool has_token = g < M;
  const __half* xr = xs + (has_token ? g : 0) * ldxs;
  // The epilogue threads (threadIdx.x < kRows * kTok): row threadIdx.x % 16, token threadIdx.x / 16, fixed.
  const int er = threadIdx.x % kRows, et = threadIdx.x / kRows;
  const bool epi = threadIdx.x < kRows * kTok && et < M;
  const float ex1 = epi ? x1s[et] : 0.0f, eex = epi ? exs[et] : 0.0f;
  float lo_max = -INFINITY;
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
    if (epi) {
      const int64_t n = rb * kRows + er;
      if (n < V) {
        float acc = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) acc += partial[buf][w][er][et];
        const screen::RowMeta m = metas[n - rb0 * kRows];
        const float approx = m.scale * acc;
        const float b = screen::bound(approx, m.c, ex1, eex);
        float hi = approx + b;
        const float lo = approx - b;
        if (!(hi == hi)) hi = INFINITY;  // NaN: a candidate the exact pass decides on
        a.hi[int64_t(et) * V + n] = hi;
        lo_max = fmaxf(lo_max, lo);      // (fmaxf drops a NaN)
      }
    }
    u = 0, ++rb;
  }
  moe_ptx::cp_async_wait<0>();
  // The block's lo a token: the 16 epilogue threads of token et are one half-warp.
  if (threadIdx.x < kRows * kTok) {
#pragma unroll
    for (int o = 8; o > 0; o /= 2) lo_max = fmaxf(lo_max, __shfl_xor_sync(0xffffffffu, lo_max, o));
    if (er == 0 && et < M) a.lo[et * kMaxGrid + blockIdx.x] = lo_max;
  }
}

// ---- 2. the pick ----
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
  // The (token, row) pairs of this block's rows in batches of 8 a thread, every load of a batch in flight before
  // the first comparison.
  const int64_t rows = r1 - r0, pairs = rows * M;
  for (int64_t base = 0; base < pairs; base += 8 * kPickThreads) {
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t pr = base + threadIdx.x + int64_t(j) * kPickThreads;
      v[j] = pr < pairs ? __ldcg(a.hi + (pr / rows) * V + r0 + pr % rows) : -INFINITY;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t pr = base + threadIdx.x + int64_t(j) * kPickThreads;
      if (pr < pairs && v[j] >= L[pr / rows]) cand[atomicAdd(&count, 1)] = int((pr / rows) << 24) | int(pr % rows);
    }
  }
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

// ---- the wide screen: 9-64 rows (the same int8 copy, four launches) ----
// 0. prep: the token rows as fp16 with k permuted inside each 16-k group (logical 2q + i <- actual 4q + i, 8 + 2q + i
//    <- 4q + 2 + i: what each lane's 32-bit read of 4 int8 weights becomes in the MMA's A fragment), zero rows up to
//    64, X1 and e_x a token;
// 1. screen: one CTA an SM walking units of 384 rows x all K; a producer thread streams each unit's int8 rows (two
//    192-row TMA boxes of 128 bytes) and the 64 token rows (two 64-column fp16 boxes) into a 3-deep ring of 64 KB
//    stages; two MMA warpgroups of 192 rows (three m64 blocks each) read their weights from shared memory into
//    registers, convert them to fp16 and run wgmma m64n64k16 with A from registers and the token tile as B. A
//    unit's epilogue folds a - B into the block's max a token (shared, monotone), then lists every (row, a + B) that
//    reaches it: a superset of the rows that can reach the global L; after its list, the block trades its max with
//    a grid-wide one (global atomicMax, reset by the prep), so that later units list against the best lower bound
//    found so far anywhere (a 384-row unit alone lists ~10-25 rows a token on q30b8l-like rows; later units ~0-3);
// 2. pick: a block a token takes L over the blocks, evaluates the listed rows with a + B >= L exactly (a warp a
//    row), then every row of the blocks whose list overflowed (all warps, row by row), and writes the argmax.
constexpr int kWTok = 64;                  // token rows (the MMA's N)
constexpr int kWUnit = 384;                // rows a unit: two warpgroups x three m64 blocks
constexpr int kWHalf = kWUnit / 2;         // a consumer warpgroup's rows (one 192-row TMA box)
constexpr int kWSliceK = 128;              // int8 bytes a row a stage
constexpr int kWStages = 3;
constexpr int kWThreads = 384;
constexpr int kWRowBytes = kWUnit * kWSliceK;        // 48 KB
constexpr int kWTokBoxBytes = kWTok * 128;           // 8 KB: 64 tokens x 64 fp16
constexpr int kWStageBytes = kWRowBytes + 2 * kWTokBoxBytes;  // 64 KB
constexpr int kWCap = 128;                 // listed rows a (token, block): ~10-40 expected, more is an overflow
constexpr int kWMaxGrid = 256;             // blocks of the wide screen the lists are sized for (one an SM)

struct Entry {
  int row;
  float hi;
};
// Floats ordered as ints (atomicMax on shared ints keeps the float order; -inf is the identity).
__device__ __forceinline__ int ordered(float f) {
  const int i = __float_as_int(f);
  return i >= 0 ? i : i ^ 0x7fffffff;
}
__device__ __forceinline__ float unordered(int i) { return __int_as_float(i >= 0 ? i : i ^ 0x7fffffff); }

struct WideWs {
  __half* xp;     // [64][K] permuted fp16 token rows
  float* x1;      // [64]
  float* ex;      // [64]
  int* glo;       // [64]: the grid's best lower bound a token so far (ordered), reset by the prep
  unsigned long long* best;  // [64]: the folded pick's best (packed: best_key), reset by the prep
  unsigned* done;            // the folded pick's count of finished blocks, reset by the prep
  float* lo;      // [64][kMaxGrid]
  int* cnt;       // [64][kMaxGrid]
  Entry* list;    // [64][kWMaxGrid][kWCap]
};
WideWs carve_wide(void* ws, int K) {
  char* p = static_cast<char*>(ws);
  WideWs w;
  auto take = [&](size_t bytes) {
    char* r = p;
    p += (bytes + 255) / 256 * 256;
    return r;
  };
  w.xp = reinterpret_cast<__half*>(take(size_t(kWTok) * K * 2));
  w.x1 = reinterpret_cast<float*>(take(kWTok * 4));
  w.ex = reinterpret_cast<float*>(take(kWTok * 4));
  w.glo = reinterpret_cast<int*>(take(kWTok * 4));
  w.best = reinterpret_cast<unsigned long long*>(take(kWTok * 8));
  w.done = reinterpret_cast<unsigned*>(take(4));
  w.lo = reinterpret_cast<float*>(take(size_t(kWTok) * kMaxGrid * 4));
  w.cnt = reinterpret_cast<int*>(take(size_t(kWTok) * kMaxGrid * 4));
  w.list = reinterpret_cast<Entry*>(take(size_t(kWTok) * kWMaxGrid * kWCap * sizeof(Entry)));
  return w;
}
size_t wide_ws_bytes(int K) {
  auto r = [](size_t b) { return (b + 255) / 256 * 256; };
  return r(size_t(kWTok) * K * 2) + 3 * r(kWTok * 4) + r(kWTok * 8) + r(4) + 2 * r(size_t(kWTok) * kMaxGrid * 4) +
         r(size_t(kWTok) * kWMaxGrid * kWCap * sizeof(Entry));
}

__device__ __forceinline__ int permuted_source(int l) {  // actual k (inside the 16-k group) of logical position l
  const int q = (l & 7) >> 1, i = l & 1;
  return 4 * q + i + (l >= 8 ? 2 : 0);
}

__global__ void __launch_bounds__(256) wide_prep_kernel(const bf16* x, int M, int K, float amax_all, WideWs w) {
  pdl_enter();
  const int t = blockIdx.x;
  float s = 0.0f, e = 0.0f;
  for (int k = threadIdx.x; k < K; k += 256) {
    const int src = (k & ~15) + permuted_source(k & 15);
    const float v = t < M ? __bfloat162float(__ldcg(x + int64_t(t) * K + src)) : 0.0f;
    const __half h = __float2half_rn(v);
    w.xp[int64_t(t) * K + k] = h;
    s += fabsf(v);
    const float d = fabsf(v - __half2float(h));
    e = fmaxf(e, d == d ? d : INFINITY);
  }
  __shared__ float rs[8], re[8];
  for (int o = 16; o > 0; o /= 2) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
    e = fmaxf(e, __shfl_xor_sync(0xffffffffu, e, o));
  }
  if (threadIdx.x % 32 == 0) rs[threadIdx.x / 32] = s, re[threadIdx.x / 32] = e;
  __syncthreads();
  if (threadIdx.x == 0) {
    float S = 0.0f, E = 0.0f;
    for (int i = 0; i < 8; ++i) S += rs[i], E = fmaxf(E, re[i]);  // (a NaN sum stays NaN: every row a candidate)
    w.x1[t] = screen::round_up_l1(S, K);
    w.ex[t] = screen::ex_term(E, K, amax_all);
    w.glo[t] = ordered(-INFINITY);
    w.best[t] = 0;  // below every key
    if (t == 0) *w.done = 0;
  }
}

#if MOE_HAVE_WGMMA
__device__ __forceinline__ void wgmma_rs_f16_n64(float (&d)[32], const unsigned (&a)[4], unsigned long long b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, "
      "%35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}
// Registers a wgmma still reads (A) or writes (D) stay where they are until after its wait (the compiler sees a use).
__device__ __forceinline__ void keep(unsigned (&a)[3][4]) {
#pragma unroll
  for (int j = 0; j < 3; ++j) asm volatile("" : "+r"(a[j][0]), "+r"(a[j][1]), "+r"(a[j][2]), "+r"(a[j][3]));
}
__device__ __forceinline__ void keep(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i]));
}
#endif

struct WideArgs {
  moe_kernels::TmaDesc wmap;  // the int8 rows as [V, K / 2] 2-byte elements, boxes of 64 x 192 rows
  moe_kernels::TmaDesc xmap;  // the permuted fp16 tokens [64, K], boxes of 64 x 64 rows
  int M, K, V, units;
  const screen::RowMeta* meta;
  const float* x1;
  const float* ex;
  int* glo;
  float* lo;
  int* cnt;
  Entry* list;
  // The folded pick (wide_screen_kernel<true>, MOESERVE_LMHEAD_SCREEN_FOLD=1): each block evaluates its own listed
  // rows that reach the grid's lower bound as it finds it at the end, folds them into best (a 64-bit atomicMax a
  // token), and the last block to finish writes the ids; no pick launch.
  const bf16* x;  // [M][K]
  const bf16* w;  // [V][K]
  unsigned long long* best;
  unsigned* done;
  int32_t* out_ids;
};

// A (logit, row) pair as one 64-bit key whose unsigned order is the pick's: the larger logit, then the lower row.
// 0 is below every key; a NaN logit never gets one.
__device__ __forceinline__ unsigned long long best_key(float v, int row) {
  return (static_cast<unsigned long long>(unsigned(ordered(v)) ^ 0x80000000u) << 32) | (0xffffffffu - unsigned(row));
}

template <bool kFold>
__global__ void __launch_bounds__(kWThreads, 1) wide_screen_kernel(const __grid_constant__ WideArgs a) {
#if MOE_HAVE_WGMMA
  using namespace moe_ptx;
  extern __shared__ char wide_smem_raw[];
  char* smem = align_smem(wide_smem_raw, 1024);
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem + kWStages * kWStageBytes);
  int* lo_s = reinterpret_cast<int*>(bars + 2 * kWStages);  // [64] ordered
  int* cnt_s = lo_s + kWTok;                                 // [64]
  float* x1_s = reinterpret_cast<float*>(cnt_s + kWTok);    // [64]
  float* ex_s = x1_s + kWTok;                                 // [64]
  const unsigned ring = smem_addr(smem), full0 = smem_addr(bars), empty0 = full0 + kWStages * 8;
  const int tid = threadIdx.x, wg = tid / 128;
  if (tid == 0) {
    for (int s = 0; s < kWStages; ++s) {
      mbar_init(full0 + s * 8, 1);
      mbar_init(empty0 + s * 8, 2);
    }
    fence_proxy_async_smem();
  }
  if (tid < kWTok) lo_s[tid] = ordered(-INFINITY), cnt_s[tid] = 0;
  __syncthreads();
  const int KT = a.K / kWSliceK;
  const int my_units = a.units > int(blockIdx.x) ? (a.units - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  const int total = my_units * KT;
  if (wg == 0) {
    if (tid == 0) {
      // Slice s: unit blockIdx.x + (s / KT) gridDim.x, k bytes (s % KT) 128. The first pass's weight boxes before the
      // wait; the token boxes (written by the prep launch) after it.
      const int pre = total < kWStages ? total : kWStages;
      auto weights = [&](int s, unsigned st) {
        const int unit = int(blockIdx.x) + (s / KT) * int(gridDim.x);
        const int c0 = (s % KT) * (kWSliceK / 2);
        tma_load_2d(st, &a.wmap, c0, unit * kWUnit, full0 + (s % kWStages) * 8);
        tma_load_2d(st + kWHalf * kWSliceK, &a.wmap, c0, unit * kWUnit + kWHalf, full0 + (s % kWStages) * 8);
      };
      auto tokens = [&](int s, unsigned st) {
        const int c0 = (s % KT) * kWSliceK;  // fp16 columns
        tma_load_2d(st + kWRowBytes, &a.xmap, c0, 0, full0 + (s % kWStages) * 8);
        tma_load_2d(st + kWRowBytes + kWTokBoxBytes, &a.xmap, c0 + 64, 0, full0 + (s % kWStages) * 8);
      };
      for (int s = 0; s < pre; ++s) {
        mbar_arrive_expect_tx(full0 + s * 8, kWStageBytes);
        weights(s, ring + unsigned(s * kWStageBytes));
      }
      pdl_wait();
      pdl_launch_dependents();
      for (int s = 0; s < pre; ++s) tokens(s, ring + unsigned(s * kWStageBytes));
      for (int s = pre; s < total; ++s) {
        const int stage = s % kWStages;
        mbar_wait(empty0 + stage * 8, ((s / kWStages) & 1) ^ 1);
        const unsigned st = ring + unsigned(stage * kWStageBytes);
        mbar_arrive_expect_tx(full0 + stage * 8, kWStageBytes);
        weights(s, st);
        tokens(s, st);
      }
    } else {
      pdl_wait();
    }
    return;
  }
  pdl_wait();
  const int cw = wg - 1, ctid = tid - 128, warp = (ctid / 32) & 3, lane = ctid % 32, g = lane / 4, q = lane % 4;
  if (ctid < kWTok) x1_s[ctid] = __ldcg(a.x1 + ctid), ex_s[ctid] = __ldcg(a.ex + ctid);
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  int s = 0;  // slices consumed
  // One set of A fragments a warpgroup: rebuilt after the wgmmas that read it complete; the other warpgroup's
  // MMAs keep the tensor pipe busy meanwhile.
  unsigned A[3][4];
  bool pending = false;
  for (int ui = 0; ui < my_units; ++ui) {
    const int unit = int(blockIdx.x) + ui * int(gridDim.x);
    float d[3][32];
#pragma unroll
    for (int j = 0; j < 3; ++j)
#pragma unroll
      for (int i = 0; i < 32; ++i) d[j][i] = 0.0f;
    for (int kt = 0; kt < KT; ++kt, ++s) {
      const int stage = s % kWStages;
      mbar_wait(full0 + stage * 8, (s / kWStages) & 1);
      const char* wt = smem + stage * kWStageBytes + cw * kWHalf * kWSliceK;
      const unsigned tok = ring + unsigned(stage * kWStageBytes + kWRowBytes);
#pragma unroll
      for (int kk = 0; kk < kWSliceK / 16; ++kk) {
        if (pending) {
          wgmma_wait<0>();
          keep(A);
        }
        // Slice s - 1 of this unit is read once its last wgmmas are done (the unit's last slice: after the loop).
        if (kk == 0 && kt > 0 && ctid % 128 == 0) mbar_arrive(empty0 + ((s - 1) % kWStages) * 8);
#pragma unroll
        for (int j = 0; j < 3; ++j) {
          const int r = 64 * j + 16 * warp + g;  // r and r + 8 share r % 8, hence the 16-byte chunk's swizzle
          const int off = 16 * (kk ^ (r & 7)) + 4 * q;
          const unsigned w0 = *reinterpret_cast<const unsigned*>(wt + r * kWSliceK + off);
          const unsigned w1 = *reinterpret_cast<const unsigned*>(wt + (r + 8) * kWSliceK + off);
          int8x4_to_half2x2(w0, A[j][0], A[j][2]);
          int8x4_to_half2x2(w1, A[j][1], A[j][3]);
        }
        wgmma_fence();
        const unsigned long long bd = wgmma_desc_sw128(tok + unsigned((kk / 4) * kWTokBoxBytes + (kk % 4) * 32));
#pragma unroll
        for (int j = 0; j < 3; ++j) wgmma_rs_f16_n64(d[j], A[j], bd);
        wgmma_commit();
        pending = true;
      }
    }
    // This thread's six rows (block j, rows 16 warp + g (+ 8)): their metadata, loaded while the last MMAs run. Rows
    // past V (the TMA's zero fill) get a NaN scale: they never raise the maximum (fmaxf drops a NaN) and are never
    // listed.
    screen::RowMeta meta[3][2];
#pragma unroll
    for (int j = 0; j < 3; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = unit * kWUnit + cw * kWHalf + 64 * j + 16 * warp + g + 8 * h;
        meta[j][h] = r < a.V ? a.meta[r] : screen::RowMeta{NAN, 0.0f};
      }
    wgmma_wait<0>();
    keep(A);
#pragma unroll
    for (int j = 0; j < 3; ++j) keep(d[j]);
    pending = false;
    if (ctid % 128 == 0) mbar_arrive(empty0 + ((s - 1) % kWStages) * 8);  // the unit's last slice
    // Epilogue. d[j][4 i + 2 h + e]: row 64 j + 16 warp + g + 8 h, token 8 i + 2 q + e. Each accumulator becomes
    // its hi = a + B; the token's max of a - B over this warp's rows goes to the block's (shared, monotone).
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = 8 * i + 2 * q + e;
        const float x1n = x1_s[n], exn = ex_s[n];
        float m = -INFINITY;
#pragma unroll
        for (int j = 0; j < 3; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float& v = d[j][4 * i + 2 * h + e];
            const float approx = meta[j][h].scale * v;
            const float b = screen::bound(approx, meta[j][h].c, x1n, exn);
            const float hi = approx + b;
            m = fmaxf(m, approx - b);
            v = hi == hi ? hi : INFINITY;
          }
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
        if (g == 0 && n < a.M && m == m) atomicMax(lo_s + n, ordered(m));
      }
    asm volatile("bar.sync 1, 256;\n" ::: "memory");  // the unit's maxima are in
#pragma unroll
    for (int j = 0; j < 3; ++j)
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int n = 8 * i + 2 * q + e;
            const int r = unit * kWUnit + cw * kWHalf + 64 * j + 16 * warp + g + 8 * h;
            const float hi = d[j][4 * i + 2 * h + e];
            if (n < a.M && r < a.V && hi >= unordered(lo_s[n])) {
              const int slot = atomicAdd(cnt_s + n, 1);
              if (slot < kWCap) a.list[(size_t(n) * kWMaxGrid + blockIdx.x) * kWCap + slot] = Entry{r, hi};
            }
          }
    // The block's maximum to the grid's and the grid's back (its latency hides behind the next unit's MMAs; any value
    // read by a listing thread meanwhile is a lower bound of the exact maximum, as every value of either is).
    if (ctid < a.M) {
      if (ui + 1 < my_units) atomicMax(lo_s + ctid, atomicMax(a.glo + ctid, lo_s[ctid]));
      else atomicMax(a.glo + ctid, lo_s[ctid]);  // the last unit: for the blocks still running (no wait)
    }
  }
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  if (ctid < a.M) {
    a.lo[ctid * kMaxGrid + blockIdx.x] = unordered(lo_s[ctid]);
    a.cnt[ctid * kMaxGrid + blockIdx.x] = cnt_s[ctid];
  }
  if constexpr (!kFold) return;
  // The folded pick. The lower bound a token: this block's, raised by the grid's as it stands now (every value of
  // either is at most the final L, so every row that reaches the final L, the argmax among them, is evaluated by its
  // block). A warp a token at a time; its listed entries 32 at a time, a ballot; every row of the block's units when
  // its list overflowed.
  const int cwarp = ctid / 32;
  for (int t = cwarp; t < a.M; t += 8) {
    const float L = fmaxf(unordered(lo_s[t]), unordered(__ldcg(a.glo + t)));
    const bf16* xr = a.x + int64_t(t) * a.K;
    Best best{-INFINITY, INT_MAX};
    const int n = cnt_s[t];
    if (n > kWCap) {
      for (int ui = 0; ui < my_units; ++ui) {
        const int unit = int(blockIdx.x) + ui * int(gridDim.x);
        for (int r = unit * kWUnit; r < min(a.V, (unit + 1) * kWUnit); ++r)
          best = better(best, Best{exact_logit<4>(xr, a.w + int64_t(r) * a.K, a.K, lane), r});
      }
    } else {
      const Entry* e = a.list + (size_t(t) * kWMaxGrid + blockIdx.x) * kWCap;
      for (int i0 = 0; i0 < n; i0 += 32) {
        const int i = i0 + lane;
        Entry en{0, -INFINITY};
        if (i < n) en = e[i];  // written by this block before the barrier
        unsigned keepers = __ballot_sync(0xffffffffu, i < n && en.hi >= L);
        while (keepers) {
          const int src = __ffs(keepers) - 1;
          keepers &= keepers - 1;
          const int r = __shfl_sync(0xffffffffu, en.row, src);
          best = better(best, Best{exact_logit<4>(xr, a.w + int64_t(r) * a.K, a.K, lane), r});
        }
      }
    }
    if (lane == 0 && best.id != INT_MAX) atomicMax(a.best + t, best_key(best.v, best.id));
  }
  // The last block to finish writes the ids (its reads of best after the fence see every block's atomics).
  __shared__ bool last;
  __threadfence();
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  if (ctid == 0) last = atomicAdd(a.done, 1u) == gridDim.x - 1;
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  if (last && ctid < a.M) {
    __threadfence();
    const unsigned long long k = atomicAdd(a.best + ctid, 0ull);
    a.out_ids[ctid] = k == 0 ? 0 : int(0xffffffffu - unsigned(k & 0xffffffffu));
  }
#else
  (void)a;
#endif
}

struct WidePickArgs {
  const bf16* x;  // [M][K]
  const bf16* w;  // [V][K]
  int K, V, units, blocks;
  const float* lo;
  const int* cnt;
  const Entry* list;
  int32_t* out_ids;
};

// One block a token, in four phases, each with its global loads issued together (the pick is a chain of L2 and DRAM
// round trips, not bandwidth): (1) every screen block's lower bound and list length at once (a thread a block): L,
// and the lists' offsets by a block-wide scan; (2) the listed entries flat over all threads, 8 loads in flight a
// thread: those with a + B >= L go to a shared candidate list; (3) a warp a candidate, its exact logit
// (exact_logit); (4) every row of the blocks whose list overflowed (all warps, row by row), or of every block when
// the candidates overflow their shared list (a NaN or infinite token row: every row a candidate). The best wins.
constexpr int kWCand = 2048;  // a token's candidates the pick holds (~1-60 expected)
__global__ void __launch_bounds__(kPickThreads) wide_pick_kernel(const __grid_constant__ WidePickArgs a) {
  static_assert(kWMaxGrid <= kPickThreads, "a thread a screen block");
  pdl_enter();
  const int t = blockIdx.x, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  __shared__ int off[kWMaxGrid + 1];
  __shared__ float wmax[kPickThreads / 32];
  __shared__ int wsum[kPickThreads / 32];
  __shared__ Best wb[kPickThreads / 32];
  __shared__ int n_over, n_cand;
  __shared__ short over[kWMaxGrid];
  __shared__ int cand[kWCand];
  if (tid == 0) n_over = 0, n_cand = 0;
  // (1) A thread a screen block: its lower bound and list length.
  float lo = -INFINITY;
  int len = 0;
  if (tid < a.blocks) {
    lo = __ldcg(a.lo + t * kMaxGrid + tid);
    len = __ldcg(a.cnt + t * kMaxGrid + tid);
  }
  __syncthreads();  // n_over, n_cand
  if (len > kWCap) over[atomicAdd(&n_over, 1)] = short(tid), len = 0;
  int incl = len;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  float m = lo;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 31) wsum[warp] = incl;
  if (lane == 0) wmax[warp] = m;
  __syncthreads();
  int base = 0, sum = 0;
  float L = -INFINITY;
#pragma unroll
  for (int w = 0; w < kPickThreads / 32; ++w) {
    base += w < warp ? wsum[w] : 0;
    sum += wsum[w];
    L = fmaxf(L, wmax[w]);
  }
  if (tid < a.blocks) off[tid] = base + incl - len;
  if (tid == 0) off[a.blocks] = sum;
  __syncthreads();
  // (2) The entries of all lists, flat: entry i of block b is at off[b] + i.
  const int total = off[a.blocks];
  for (int i0 = 0; i0 < total; i0 += 8 * kPickThreads) {
    Entry en[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int i = i0 + tid + j * kPickThreads;
      en[j] = Entry{-1, -INFINITY};
      if (i < total) {
        int lo_b = 0, hi_b = a.blocks - 1;  // the last b with off[b] <= i
        while (lo_b < hi_b) {
          const int mid = (lo_b + hi_b + 1) / 2;
          if (off[mid] <= i) lo_b = mid;
          else hi_b = mid - 1;
        }
        const Entry* e = a.list + (size_t(t) * kWMaxGrid + lo_b) * kWCap + (i - off[lo_b]);
        en[j] = Entry{__ldcg(&e->row), __ldcg(&e->hi)};
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (en[j].row >= 0 && en[j].hi >= L) {
        const int c = atomicAdd(&n_cand, 1);
        if (c < kWCand) cand[c] = en[j].row;
      }
  }
  __syncthreads();
  const bf16* xr = a.x + int64_t(t) * a.K;
  Best best{-INFINITY, INT_MAX};
  const int nc = n_cand;
  if (nc <= kWCand) {
    // (3) A warp a candidate.
    for (int i = warp; i < nc; i += kPickThreads / 32) {
      const int r = cand[i];
      best = better(best, Best{exact_logit(xr, a.w + int64_t(r) * a.K, a.K, lane), r});
    }
    // (4) The overflowed blocks' rows.
    for (int i = 0; i < n_over; ++i)
      for (int u = over[i]; u < a.units; u += a.blocks)
        for (int r = u * kWUnit + warp; r < min(a.V, (u + 1) * kWUnit); r += kPickThreads / 32)
          best = better(best, Best{exact_logit(xr, a.w + int64_t(r) * a.K, a.K, lane), r});
  } else {
    for (int r = warp; r < a.V; r += kPickThreads / 32)
      best = better(best, Best{exact_logit(xr, a.w + int64_t(r) * a.K, a.K, lane), r});
  }
  if (lane == 0) wb[warp] = best;
  __syncthreads();
  if (tid == 0) {
    Best b = wb[0];
    for (int i = 1; i < kPickThreads / 32; ++i) b = better(b, wb[i]);
    a.out_ids[t] = b.id == INT_MAX ? 0 : b.id;
  }
}

struct Grids {
  int screen_blocks;
  size_t screen_smem;
  int pick_blocks;
  size_t pick_smem;
};
Grids grids_for(int M, int K, int V) {
  static const int sms = current_device_multiprocessors();
  Grids g{};
  const int64_t row_blocks = (V + kRows - 1) / kRows;
  for (int per_sm : {2, 1}) {
    g.screen_blocks = int(std::min<int64_t>(int64_t(sms) * per_sm, std::min<int64_t>(row_blocks, kMaxGrid)));
    const int run_rows = int((row_blocks + g.screen_blocks - 1) / g.screen_blocks) * kRows;
    g.screen_smem = screen_smem(M, K, run_rows);
    if (per_sm == 1 || 2 * (g.screen_smem + sizeof(float) * 2 * kWarps * kRows * kTok + 1024) <= (228u << 10)) break;
  }
  g.pick_blocks = std::min(sms, std::max(1, V));
  g.pick_smem = size_t((V + g.pick_blocks - 1) / g.pick_blocks + 1) * size_t(M) * sizeof(int);
  return g;
}

int wide_blocks(int vocab) {
  static const int sms = current_device_multiprocessors();
  return std::min({sms, (vocab + kWUnit - 1) / kWUnit, kWMaxGrid});
}

void launch_wide(const bf16* x, int rows, int K, const bf16* w, const void* screen_weights, float amax_all, int vocab,
                 int32_t* out_ids, void* workspace, cudaStream_t stream) {
  const WideWs ws = carve_wide(workspace, K);
  launch_pdl(wide_prep_kernel, dim3(unsigned(kWTok)), dim3(256), 0, stream, x, rows, K, amax_all, ws);
  const char* p = static_cast<const char*>(screen_weights);
  WideArgs a{};
  encode_bf16_tma_2d(&a.wmap, p, vocab, K / 2, kWHalf);  // the int8 rows as 2-byte pairs: boxes of 128 bytes
  encode_bf16_tma_2d(&a.xmap, ws.xp, kWTok, K, kWTok);
  a.M = rows, a.K = K, a.V = vocab, a.units = (vocab + kWUnit - 1) / kWUnit;
  a.meta = reinterpret_cast<const screen::RowMeta*>(p + meta_offset(vocab, K));
  a.x1 = ws.x1, a.ex = ws.ex, a.glo = ws.glo, a.lo = ws.lo, a.cnt = ws.cnt, a.list = ws.list;
  static const bool fold = env_flag("MOESERVE_LMHEAD_SCREEN_FOLD", false);
  a.x = x, a.w = w, a.best = ws.best, a.done = ws.done, a.out_ids = out_ids;
  const int blocks = wide_blocks(vocab);
  const size_t smem = size_t(kWStages) * kWStageBytes + 2 * kWStages * 8 + 4 * kWTok * 4 + 1024;
  auto* kernel = fold ? wide_screen_kernel<true> : wide_screen_kernel<false>;
  MS_CHECK(raise_dynamic_smem(reinterpret_cast<const void*>(kernel), smem),
           "lmhead_screen: the device refuses {} bytes of shared memory a block", smem);
  launch_pdl(kernel, dim3(unsigned(blocks)), dim3(kWThreads), smem, stream, a);
  if (fold) return;
  WidePickArgs pa{x, w, K, vocab, a.units, blocks, ws.lo, ws.cnt, ws.list, out_ids};
  launch_pdl(wide_pick_kernel, dim3(unsigned(rows)), dim3(kPickThreads), 0, stream, pa);
}

}  // namespace

LmheadScreenLists lmhead_screen_wide_lists(const void* workspace, int rows, int K, int vocab) {
  const WideWs ws = carve_wide(const_cast<void*>(workspace), K);
  std::vector<int> cnt(size_t(kWTok) * kMaxGrid);
  MS_CUDA_CHECK(cudaDeviceSynchronize());
  MS_CUDA_CHECK(cudaMemcpy(cnt.data(), ws.cnt, cnt.size() * sizeof(int), cudaMemcpyDeviceToHost));
  LmheadScreenLists r;
  for (int t = 0; t < rows; ++t)
    for (int b = 0; b < wide_blocks(vocab); ++b) {
      const int n = cnt[size_t(t) * kMaxGrid + b];
      r.longest = std::max(r.longest, n);
      r.overflowed += n > kWCap;
    }
  return r;
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

size_t lmhead_screen_workspace_bytes(int vocab, int K) {
  const size_t narrow = (size_t(kTok) * size_t(vocab) * 4 + 255) / 256 * 256 + size_t(kTok) * kMaxGrid * (4 + sizeof(Best));
  return std::max(narrow, wide_ws_bytes(K));
}

bool lmhead_screen_supported(int rows, int K, int vocab) {
  static const int sm = current_device_sm();
  const bool shape = K >= kSliceK && K % kSliceK == 0 && K <= 8192 && vocab >= 1 && vocab < (1 << 24);
  return shape && rows >= 1 && (rows <= kTok ? sm >= 80 : rows <= kWTok && sm / 10 == 9);
}

std::string lmhead_screen_code(const DeviceInfo& dev) {
  for (const void* k : {reinterpret_cast<const void*>(screen_quantize_kernel), reinterpret_cast<const void*>(screen_kernel),
                        reinterpret_cast<const void*>(pick_kernel), reinterpret_cast<const void*>(merge_kernel),
                        reinterpret_cast<const void*>(wide_prep_kernel), reinterpret_cast<const void*>(wide_screen_kernel<false>),
                        reinterpret_cast<const void*>(wide_screen_kernel<true>),
                        reinterpret_cast<const void*>(wide_pick_kernel)})
    if (std::string why = check_kernel_present(k, dev); !why.empty()) return why;
  return "";
}

void lmhead_screen(const bf16* x, int rows, int K, const bf16* w, const void* screen_weights, float amax_all,
                   int vocab, int32_t* out_ids, void* workspace, cudaStream_t stream) {
  MS_CHECK(lmhead_screen_supported(rows, K, vocab), "lmhead_screen: {} rows of K {} over {} (1-{} rows, K % {} == 0)",
           rows, K, vocab, kWTok, kSliceK);
  if (rows > kTok) return launch_wide(x, rows, K, w, screen_weights, amax_all, vocab, out_ids, workspace, stream);
  const Grids g = grids_for(rows, K, vocab);
  const Workspace ws = carve(workspace, vocab);
  const char* p = static_cast<const char*>(screen_weights);
  ScreenArgs sa{x,
                rows,
                K,
                vocab,
                reinterpret_cast<const int8_t*>(p),
                reinterpret_cast<const screen::RowMeta*>(p + meta_offset(vocab, K)),
                amax_all,
                ws.hi,
                ws.lo,
                l2_evict_first_weights() ? 1 : 0};
  MS_CHECK(raise_dynamic_smem(reinterpret_cast<const void*>(screen_kernel), g.screen_smem),
           "lmhead_screen: the device refuses {} bytes of shared memory a block", g.screen_smem);
  launch_pdl(screen_kernel, dim3(unsigned(g.screen_blocks)), dim3(kWarps * 32), g.screen_smem, stream, sa);
  PickArgs pa{x, w, rows, K, vocab, g.screen_blocks, ws.hi, ws.lo, ws.best};
  MS_CHECK(raise_dynamic_smem(reinterpret_cast<const void*>(pick_kernel), g.pick_smem),
           "lmhead_screen: the device refuses {} bytes of shared memory a block", g.pick_smem);
  launch_pdl(pick_kernel, dim3(unsigned(g.pick_blocks)), dim3(kPickThreads), g.pick_smem, stream, pa);
  launch_pdl(merge_kernel, dim3(unsigned(rows)), dim3(kMergeThreads), 0, stream, static_cast<const Best*>(ws.best),
             g.pick_blocks, out_ids);
}

}  // namespace moeserve::cuda

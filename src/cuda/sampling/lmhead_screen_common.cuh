// What the lm_head screen's two forms share (lmhead_screen.cu: the int8 copy, 1-8 rows and the entry points;
// lmhead_screen_wide.cu: 9-64 rows): the exact pass and the (logit, id) order of the picks, the int8 -> fp16
// conversion, the copy's layout, floats ordered as ints, and the wide form's entry points.
#pragma once

#include <cuda_fp16.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/common.h"
#include "cuda/device.h"
#include "cuda/moe/moe_ptx.cuh"
#include "cuda/sampling/lmhead_screen.h"
#include "cuda/sampling/lmhead_screen_math.h"
#include "cuda/sampling/sampling_types.h"

namespace moeserve::cuda::screen_detail {

constexpr int kPickThreads = 256;
constexpr int kMaxGrid = 1024;     // blocks of the screen / pick grids the workspace is sized for

// A listed row of a screen block: a row that may reach the lower bound, with its hi = a + B.
struct Entry {
  int row;
  float hi;
};
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

// A warp's exact pass over the rows a ballot keeps (lane i holds a row; keep's bit i: evaluate it), into best.
template <int kBatch = 8>
__device__ __forceinline__ Best exact_kept(Best best, unsigned keep, int row, const bf16* xr, const bf16* w, int K,
                                           int lane) {
  while (keep) {
    const int src = __ffs(int(keep)) - 1;
    keep &= keep - 1;
    const int r = __shfl_sync(0xffffffffu, row, src);
    best = better(best, Best{exact_logit<kBatch>(xr, w + int64_t(r) * K, K, lane), r});
  }
  return best;
}
// ... over the n listed entries of a (token, block) whose hi reaches L, 32 at a time (the list written by this block
// before a barrier).
template <int kBatch = 8>
__device__ __forceinline__ Best exact_listed(Best best, const Entry* list, int n, float L, const bf16* xr,
                                             const bf16* w, int K, int lane) {
  for (int i0 = 0; i0 < n; i0 += 32) {
    const int i = i0 + lane;
    const Entry en = i < n ? list[i] : Entry{0, -INFINITY};
    best = exact_kept<kBatch>(best, __ballot_sync(0xffffffffu, i < n && en.hi >= L), en.row, xr, w, K, lane);
  }
  return best;
}

// A token value as the fp16 the screen's MMAs take, its |x| added to X1's sum and its rounding error to e_x's maximum
// (infinite when the value overflows fp16 or is NaN): what both forms' token staging feeds the bound.
__device__ __forceinline__ __half screen_half(float f, float& sum_abs, float& max_err) {
  const __half h = __float2half_rn(f);
  sum_abs += fabsf(f);
  const float d = fabsf(f - __half2float(h));
  max_err = fmaxf(max_err, d == d ? d : INFINITY);
  return h;
}

// The screen's weights in one allocation: q [V][K] int8 stored biased (the byte q + 128, i.e. q ^ 0x80, so that the
// fp16 conversion needs no xor), then the row metadata [V], then the largest |w| (A).
inline size_t meta_offset(int V, int K) { return (size_t(V) * size_t(K) + 255) / 256 * 256; }
inline size_t amax_offset(int V, int K) { return meta_offset(V, K) + (size_t(V) * sizeof(screen::RowMeta) + 255) / 256 * 256; }

// 4 biased int8 (one 32-bit word of bytes q + 128) as two fp16 pairs holding the integers q: each byte u placed under
// 0x64 (1024 + u), then 1152 subtracted (exact: every integer of [-128, 127] is an fp16). Two PRMT and two HADD2 a
// word (session 48: the xor of unbiased bytes was a fifth instruction in the wide screen's issue-bound loop).
__device__ __forceinline__ void int8x4_to_half2x2(unsigned u, unsigned& lo, unsigned& hi) {
  const unsigned a = __byte_perm(u, 0x64646464u, 0x5140), b = __byte_perm(u, 0x64646464u, 0x5342);
  const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
  const __half2 ha = __hsub2(*reinterpret_cast<const __half2*>(&a), bias);
  const __half2 hb = __hsub2(*reinterpret_cast<const __half2*>(&b), bias);
  lo = *reinterpret_cast<const unsigned*>(&ha);
  hi = *reinterpret_cast<const unsigned*>(&hb);
}

// Floats ordered as ints (atomicMax on shared ints keeps the float order; -inf is the identity).
__device__ __forceinline__ int ordered(float f) {
  const int i = __float_as_int(f);
  return i >= 0 ? i : i ^ 0x7fffffff;
}
__device__ __forceinline__ float unordered(int i) { return __int_as_float(i >= 0 ? i : i ^ 0x7fffffff); }

// The folded picks' grid-wide values (the default) as unsigned keys for atomicMax, 0 below every
// key. A (logit, row) pair as one 64-bit key whose order is the pick's: the larger logit, then the lower row (a NaN
// logit never gets one); the row of key 0 (no row: every logit NaN) is token 0, as the unfolded picks answer.
__device__ __forceinline__ unsigned long long best_key(float v, int row) {
  return (static_cast<unsigned long long>(unsigned(ordered(v)) ^ 0x80000000u) << 32) | (0xffffffffu - unsigned(row));
}
__device__ __forceinline__ int row_of_key(unsigned long long k) {
  return k == 0 ? 0 : int(0xffffffffu - unsigned(k & 0xffffffffu));
}
// A lower bound (never NaN) as a 32-bit key, and back: key 0 (none yet) is -inf.
__device__ __forceinline__ unsigned bound_key(float v) { return unsigned(ordered(v)) ^ 0x80000000u; }
__device__ __forceinline__ float bound_of_key(unsigned k) {
  return k == 0 ? -INFINITY : unordered(int(k ^ 0x80000000u));
}


// Consecutive 256-byte-aligned pieces of a workspace, in the order they are taken; `used` is the bytes taken so far,
// so that carving from a null base gives a layout's size from the same code that lays it out.
struct WsCarve {
  uintptr_t base;
  size_t used = 0;
  explicit WsCarve(void* ws) : base(reinterpret_cast<uintptr_t>(ws)) {}
  template <class T>
  T* take(size_t bytes) {
    T* p = reinterpret_cast<T*>(base + used);
    used += (bytes + 255) / 256 * 256;
    return p;
  }
};

constexpr int kWideRows = 64;  // the 9-64-row form's token rows (its MMA's N)

// Both forms' picks inside their stream kernels' tails (the default; MOESERVE_LMHEAD_SCREEN_FOLD=0: their own launches).
bool screen_fold();

// The 9-64-row form (lmhead_screen_wide.cu): its workspace bytes, whether this binary holds its kernels for `dev`
// ("" if so), and its launches (a prep, the stream, a pick with MOESERVE_LMHEAD_SCREEN_FOLD=0).
size_t wide_ws_bytes(int K);
std::string wide_code(const DeviceInfo& dev);
void launch_wide(const bf16* x, int rows, int K, const bf16* w, const void* screen_weights, float amax_all, int vocab,
                 int32_t* out_ids, void* workspace, cudaStream_t stream);
// lmhead_screen_topk at 9-64 rows: the wide stream writing every (token, row)'s a + B (hi [64][V]) and each block's own
// max a - B (lo [64][kMaxGrid], as the 1-8-row form's), then the pick's best k a (token, pick block) in topk
// [64][kMaxGrid][kLmheadScreenMaxTopK] / topk_n [64][kMaxGrid]: the workspace's layout past the wide form's (bytes:
// where it ends), and the prep + stream launches writing the caller's carved hi (returns the stream's blocks).
struct WideTopkWs {
  const float* lo;
  float* hi;
  Best* topk;
  int* topk_n;
};
WideTopkWs carve_wide_topk(void* ws, int K, int V, size_t* bytes = nullptr);
int launch_wide_hi(const bf16* x, int rows, int K, const void* screen_weights, float amax_all, int vocab,
                   void* workspace, float* hi, cudaStream_t stream);

// lmhead_screen_topk's draw (lmhead_screen_topk.cu): a block a token row merges the pick blocks' best k
// (topk [row][kMaxGrid][kLmheadScreenMaxTopK], topk_n [row][kMaxGrid], `blocks` of them) and draws its token as the GPU
// sampler draws from a candidate set; and whether this binary holds its kernel for `dev` ("" if so).
void launch_topk_draw(const Best* topk, const int* topk_n, int blocks, int rows, const SampleRowParams* params,
                      int32_t* out_ids, cudaStream_t stream);
std::string topk_draw_code(const DeviceInfo& dev);
// lmhead_screen_masked's kernels (lmhead_screen_masked.cu): "" when this binary holds them for `dev`.
std::string masked_code(const DeviceInfo& dev);

}  // namespace moeserve::cuda::screen_detail

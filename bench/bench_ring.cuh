// The per-warp weight rings of the benchmark GEMV chains (gpu_chain, gpu_layer_persistent's v2 kernel): a block of
// 8 warps computes row blocks of 16 weight rows over the whole K, warp w taking the 64-k slices w, w + 8, ... of each,
// each warp streaming its slices through its own ring of S shared-memory stages by cp.async (the served GEMV's loader
// pattern), the products on the CUDA cores (slice_dot) or the tensor cores (slice_mma, the served GEMV's mma.sync lane
// mapping), the warps' row sums combined through shared memory at the row block's end.
#pragma once

#include <cuda_bf16.h>

#include "bench_ptx.cuh"
#include "cuda/moe/moe_ptx.cuh"

namespace bench_ring {

using bf16 = __nv_bfloat16;
using bench_ptx::dot8;
using moe_ptx::cp_async16;
using moe_ptx::cp_async_commit;
using moe_ptx::cp_async_wait;

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kRows = 16;                       // rows a row block
constexpr int kSliceK = 64;                     // k a slice: 16 rows x 128 bytes = 2 KB
constexpr int kSliceElems = kRows * kSliceK;

// A block's work: items (op, row block) in op order; in the launch form one item, in the persistent form every
// row block rb = blockIdx.x + gridDim.x i of every op. Warp w takes slices w, w + 8, ... of an item's K / 64.
struct Cursor {
  int op, rb, u;
};

// One warp's 64-k slice of 16 rows (row r at src + r K) into its ring stage, swizzled; !ok: a zero fill. hint: the
// copies with the L2 policy `policy` (moe_ptx::l2_evict_first_policy(), as the served weight streams), else none.
__device__ __forceinline__ void load_slice(bf16* dst, const bf16* src, int ld, bool ok, int lane, const bf16* any,
                                           bool hint = false, unsigned long long policy = 0) {
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int id = lane + 32 * m, r = id >> 3, c = id & 7;
    moe_ptx::cp_async16_hint(dst + r * kSliceK + ((c ^ (r & 7)) << 3), ok ? src + int64_t(r) * ld + 8 * c : any, ok,
                             hint, policy);
  }
  cp_async_commit();
}

// Waits until at most n (0 <= n < 16) of this thread's cp.async groups are still in flight.
__device__ __forceinline__ void wait_pending(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    case 7: cp_async_wait<7>(); break;
    case 8: cp_async_wait<8>(); break;
    case 9: cp_async_wait<9>(); break;
    case 10: cp_async_wait<10>(); break;
    default: cp_async_wait<11>(); break;
  }
}

// acc += lane (r = lane / 2, h = lane % 2)'s share of row r of a ring slice times the input at xk: four 16-byte chunks.
__device__ __forceinline__ void slice_dot(float& acc, const bf16* sl, const bf16* xk, int r, int h) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = 4 * h + i;
    acc += dot8(*reinterpret_cast<const uint4*>(sl + r * kSliceK + ((c ^ (r & 7)) << 3)),
                *reinterpret_cast<const uint4*>(xk + 8 * c));
  }
}

// The same slice's products on the tensor cores (mma.m16n8k16, the token as column 0 of B; the served GEMV's lane
// mapping, gemv.cu): lane (g, q) feeds rows g and g + 8 and, for g = 0, the token, at k chunks q and q + 4 of the
// slice; c[0] / c[2] of lanes q = 0 gather rows g / g + 8.
__device__ __forceinline__ void slice_mma(float (&c)[4], const bf16* sl, const bf16* xk, int g, int q) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int ch = q + 4 * hh, sw = (ch ^ (g & 7)) << 3;  // rows g and g + 8 share the swizzle
    const uint4 lo = *reinterpret_cast<const uint4*>(sl + g * kSliceK + sw);
    const uint4 hi = *reinterpret_cast<const uint4*>(sl + (g + 8) * kSliceK + sw);
    const uint4 b = g == 0 ? *reinterpret_cast<const uint4*>(xk + 8 * ch) : make_uint4(0, 0, 0, 0);
    const unsigned a0[4] = {lo.x, hi.x, lo.y, hi.y}, b0[2] = {b.x, b.y};
    const unsigned a1[4] = {lo.z, hi.z, lo.w, hi.w}, b1[2] = {b.z, b.w};
    moe_ptx::mma_bf16_16816(c, a0, b0);
    moe_ptx::mma_bf16_16816(c, a1, b1);
  }
}

// The warps' sums of the block's 16 rows (lane pairs of each warp hold a row's halves) into `partial`, then a block
// barrier: row t's sum is partial[0][t] + ... + partial[kWarps - 1][t] (warp_rows_sum). acc restarts at zero.
__device__ __forceinline__ void stash_warp_rows(float& acc, float (&partial)[kWarps][kRows], int warp, int r, int h) {
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  if (h == 0) partial[warp][r] = acc;
  acc = 0.f;
  __syncthreads();
}
// The same from slice_mma's accumulators (lanes q = 0 hold rows g and g + 8 in c[0] / c[2]); c restarts at zero.
__device__ __forceinline__ void stash_warp_rows_mma(float (&c)[4], float (&partial)[kWarps][kRows], int warp,
                                                    int lane) {
  if (lane % 4 == 0) partial[warp][lane / 4] = c[0], partial[warp][lane / 4 + 8] = c[2];
  c[0] = c[1] = c[2] = c[3] = 0.f;
  __syncthreads();
}
__device__ __forceinline__ float warp_rows_sum(const float (&partial)[kWarps][kRows], int row) {
  float v = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) v += partial[w][row];
  return v;
}

// After a warp's products of its ring slice: the stage freed and refilled, the consumer's cursor moved on; true when
// the slice was the last of its item (`item`: the item it belonged to), whose sums are then due.
template <class Issue, class Advance>
__device__ __forceinline__ bool release_slice(int& consumed, Issue&& issue, Cursor& cc, Advance&& advance,
                                              Cursor& item) {
  __syncwarp();
  ++consumed;
  issue();
  item = cc;
  advance(cc);
  return cc.u == 0 && !(cc.op == item.op && cc.rb == item.rb);
}


}  // namespace bench_ring

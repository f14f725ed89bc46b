// lmhead_screen_topk's draw (lmhead_screen.h): after the screen and the top-k pick (lmhead_screen.cu), one block a token
// row merges the pick blocks' best k (the row's exact top k is among them) and draws the row's token with the GPU
// sampler's own candidate-set path (sampling_kernel.cuh's draw_in_set, compiled here in a namespace of its own): the
// same top-k / top-p / min-p cuts, the same fixed-point masses and the same walk in vocabulary order, so that the token
// is the one sample() draws from a logit row holding the same values.
#define MOESERVE_SAMPLING_NS sampling_detail_topk
#define MOESERVE_SAMPLING_THREADS 128  // a block a row over <= k candidates: few warps, cheap barriers
#include "cuda/sampling/sampling_kernel.cuh"

#include <algorithm>

#include "cuda/launch.h"
#include "cuda/pdl.cuh"
#include "cuda/registry.h"
#include "cuda/sampling/lmhead_screen.h"
#include "cuda/sampling/lmhead_screen_common.cuh"

namespace moeserve::cuda {
namespace sampling_detail_topk {
namespace {

using screen_detail::kMaxGrid;

struct DrawArgs {
  const screen_detail::Best* topk;  // [row][kMaxGrid][kLmheadScreenMaxTopK]
  const int* topk_n;                // [row][kMaxGrid]
  int blocks;
  const SampleRowParams* params;
  int32_t* out_ids;
};

// Block-wide: cuts the n candidates in s.cand_id / s.cand_val to their best k in the order (value descending, id
// ascending), in that order, and returns how many are left. Up to kCountUpTo candidates each finds its rank by counting
// those before it (no barrier inside: ~1 us for a few hundred), beyond that a bitonic sort.
constexpr int kCountUpTo = 1024;
static_assert(kLmheadScreenMaxTopK <= kThreads, "keep_best_k: a thread an entry of the best k");
__device__ int keep_best_k(Smem& s, int n, int k) {
  if (n <= k) return n;
  __shared__ int best_id[kLmheadScreenMaxTopK];
  __shared__ float best_val[kLmheadScreenMaxTopK];
  if (n <= kCountUpTo) {
    for (int i = int(threadIdx.x); i < n; i += kThreads) {
      const u64 key = rank_key(order_key(s.cand_val[i]), s.cand_id[i]);
      int rank = 0;
      for (int j = 0; j < n; ++j) rank += rank_key(order_key(s.cand_val[j]), s.cand_id[j]) > key;
      if (rank < k) best_id[rank] = s.cand_id[i], best_val[rank] = s.cand_val[i];
    }
  } else {
    sort_candidates(s, n, [](float x) { return order_key(x); });
    if (int(threadIdx.x) < k) {
      const int i = s.u.set.idx[threadIdx.x];
      best_id[threadIdx.x] = s.cand_id[i], best_val[threadIdx.x] = s.cand_val[i];
    }
  }
  __syncthreads();
  if (int(threadIdx.x) < k) s.cand_id[threadIdx.x] = best_id[threadIdx.x], s.cand_val[threadIdx.x] = best_val[threadIdx.x];
  __syncthreads();
  return k;
}

// Block `row`: (1) the k-th best of the pick blocks' heads (each block's list is in the order, its best first) in the
// order (value descending, id ascending): the k heads at or above it are k distinct rows, so no entry below it is in
// the row's top k, and only the entries at or above it - a prefix of each list, ~k-2k of them in all where the blocks'
// lists hold ~15-20 k - are gathered; (2) those into s.cand_id / s.cand_val in windows of at most kCap (when more pass,
// e.g. on a flat row, each full window is cut to its best k before the next fills it: the top k survives every cut),
// cut to the row's best k (what draw_in_set keeps of them anyway); (3) the argmax, then the draw.
__global__ void __launch_bounds__(kThreads) topk_draw_kernel(const __grid_constant__ DrawArgs a) {
  extern __shared__ __align__(16) char smem[];
  Smem& s = *reinterpret_cast<Smem*>(smem);
  __shared__ int off[kMaxGrid], pass[kMaxGrid];
  __shared__ u64 head[kMaxGrid];
  __shared__ u64 theta;
  const int row = int(blockIdx.x), tid = int(threadIdx.x);
  const SampleRowParams p = a.params[row];
  const bool greedy = p.temperature <= 0.0f || p.top_k == 1 || p.min_p > 1.0f;
  const int k = greedy ? 1 : min(max(p.top_k, 1), kLmheadScreenMaxTopK);
  const int* cnt = a.topk_n + int64_t(row) * kMaxGrid;
  const screen_detail::Best* lists = a.topk + int64_t(row) * kMaxGrid * kLmheadScreenMaxTopK;
  const auto key_of = [&](int b, int i) {
    const screen_detail::Best c = lists[int64_t(b) * kLmheadScreenMaxTopK + i];
    return rank_key(order_key(c.v), c.id);
  };
  pdl_enter();
  if (tid == 0) theta = 0;  // below every key: everything passes when fewer than k blocks have a head
  for (int b = tid; b < a.blocks; b += kThreads) head[b] = __ldcg(cnt + b) > 0 ? key_of(b, 0) : 0ull;
  __syncthreads();
  for (int b = tid; b < a.blocks; b += kThreads) {
    const u64 h = head[b];
    int above = 0;
    for (int j = 0; j < a.blocks; ++j) above += head[j] > h;
    if (h != 0 && above == k - 1) theta = h;  // heads are distinct rows: one thread finds it
  }
  __syncthreads();
  const u64 th = theta;
  // Each block's passing prefix, and its first entry in their concatenation (a thread a run of consecutive blocks).
  const int per = (a.blocks + kThreads - 1) / kThreads, b0 = min(a.blocks, tid * per), b1 = min(a.blocks, b0 + per);
  u64 mine = 0;
  for (int b = b0; b < b1; ++b) {
    const int c = __ldcg(cnt + b);
    int n = 0;
#pragma unroll 4
    for (int i = 0; i < c; ++i) n += key_of(b, i) >= th;  // a prefix (the list is in the order): loads in flight together
    pass[b] = n;
    mine += u64(n);
  }
  u64 total64 = 0;
  u64 run = block_exclusive_scan(mine, total64, s.scratch);
  for (int b = b0; b < b1; ++b) off[b] = int(run), run += u64(pass[b]);
  __syncthreads();
  const int total = int(total64);
  int n = 0;
  for (int w0 = 0; w0 < total;) {
    const int len = min(kCap - n, total - w0);
    for (int b = tid; b < a.blocks; b += kThreads) {
      const int e0 = max(off[b], w0), e1 = min(off[b] + pass[b], w0 + len);
      for (int e = e0; e < e1; ++e) {
        const screen_detail::Best c = lists[int64_t(b) * kLmheadScreenMaxTopK + (e - off[b])];
        s.cand_id[n + e - w0] = c.id;
        s.cand_val[n + e - w0] = c.v;
      }
    }
    n += len;
    w0 += len;
    __syncthreads();
    n = keep_best_k(s, n, k);
  }
  // The argmax as the sampler's first phase takes it (the largest value, the lowest id on ties).
  ArgMax best{-INFINITY, INT_MAX};
  for (int i = tid; i < n; i += kThreads) best = better(best, ArgMax{s.cand_val[i], s.cand_id[i]});
#pragma unroll
  for (int o = 16; o > 0; o /= 2)
    best = better(best, ArgMax{__shfl_xor_sync(kFull, best.v, o), __shfl_xor_sync(kFull, best.i, o)});
  if (tid % 32 == 0) s.red_best[tid / 32] = best;
  __syncthreads();
  best = s.red_best[0];
  for (int w = 1; w < kWarps; ++w) best = better(best, s.red_best[w]);
  __syncthreads();
  int tok = best.i == INT_MAX ? 0 : best.i;
  if (!greedy && n > 0 && best.v > -INFINITY) {
    const Filters f{Mass{p.temperature, __fdiv_rn(best.v, p.temperature)},
                    k,
                    kEverything,
                    kEverything,
                    p.top_p < 1.0f,
                    p.top_p,
                    p.min_p,
                    0ull,
                    double(p.random >> 11) * 0x1p-53};
    const int drawn = draw_in_set(s, n, f);
    if (drawn >= 0) tok = drawn;
  }
  if (tid == 0) a.out_ids[row] = tok;
}

}  // namespace
}  // namespace sampling_detail_topk

namespace screen_detail {

void launch_topk_draw(const Best* topk, const int* topk_n, int blocks, int rows, const SampleRowParams* params,
                      int32_t* out_ids, cudaStream_t stream) {
  using namespace sampling_detail_topk;
  MS_CHECK(blocks >= 1 && blocks <= kMaxGrid, "lmhead_screen_topk: {} pick blocks (1-{})", blocks, kMaxGrid);
  const size_t smem = sizeof(Smem);
  MS_CHECK(raise_dynamic_smem(reinterpret_cast<const void*>(topk_draw_kernel), smem),
           "lmhead_screen_topk: the device refuses {} bytes of shared memory a block", smem);
  launch_pdl(topk_draw_kernel, dim3(unsigned(rows)), dim3(kThreads), smem, stream,
             DrawArgs{topk, topk_n, blocks, params, out_ids});
}

std::string topk_draw_code(const DeviceInfo& dev) {
  return check_kernel_present(reinterpret_cast<const void*>(sampling_detail_topk::topk_draw_kernel), dev);
}

}  // namespace screen_detail
}  // namespace moeserve::cuda

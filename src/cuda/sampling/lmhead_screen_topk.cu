// lmhead_screen_topk's draw (lmhead_screen.h): after the screen and the top-k pick (lmhead_screen.cu), one block a token
// row merges the pick blocks' best k (the row's exact top k is among them) and draws the row's token with the GPU
// sampler's own candidate-set path (sampling_kernel.cuh's draw_in_set, compiled here in a namespace of its own): the
// same top-k / top-p / min-p cuts, the same fixed-point masses and the same walk in vocabulary order, so that the token
// is the one sample() draws from a logit row holding the same values.
#define MOESERVE_SAMPLING_NS sampling_detail_topk
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

// Block `row`: the candidates into s.cand_id / s.cand_val in windows of at most kCap (when the blocks' lists hold more,
// each full window is cut to its best k before the next fills it: the order's top k survives every cut), then the
// argmax, then the draw.
__global__ void __launch_bounds__(kThreads) topk_draw_kernel(const __grid_constant__ DrawArgs a) {
  extern __shared__ __align__(16) char smem[];
  Smem& s = *reinterpret_cast<Smem*>(smem);
  __shared__ int off[kMaxGrid];
  const int row = int(blockIdx.x), tid = int(threadIdx.x);
  const SampleRowParams p = a.params[row];
  const bool greedy = p.temperature <= 0.0f || p.top_k == 1 || p.min_p > 1.0f;
  const int k = greedy ? 1 : min(max(p.top_k, 1), kLmheadScreenMaxTopK);
  const int* cnt = a.topk_n + int64_t(row) * kMaxGrid;
  const screen_detail::Best* lists = a.topk + int64_t(row) * kMaxGrid * kLmheadScreenMaxTopK;
  pdl_enter();
  // Each block's first entry in the concatenation (a thread a run of consecutive blocks).
  const int per = (a.blocks + kThreads - 1) / kThreads, b0 = min(a.blocks, tid * per), b1 = min(a.blocks, b0 + per);
  u64 mine = 0;
  for (int b = b0; b < b1; ++b) mine += u64(__ldcg(cnt + b));
  u64 total64 = 0;
  u64 run = block_exclusive_scan(mine, total64, s.scratch);
  for (int b = b0; b < b1; ++b) off[b] = int(run), run += u64(__ldcg(cnt + b));
  __syncthreads();
  const int total = int(total64);
  int n = 0;
  for (int w0 = 0; w0 < total;) {
    const int len = min(kCap - n, total - w0);
    for (int b = tid; b < a.blocks; b += kThreads) {
      const int e0 = max(off[b], w0), e1 = min(off[b] + __ldcg(cnt + b), w0 + len);
      for (int e = e0; e < e1; ++e) {
        const screen_detail::Best c = lists[int64_t(b) * kLmheadScreenMaxTopK + (e - off[b])];
        s.cand_id[n + e - w0] = c.id;
        s.cand_val[n + e - w0] = c.v;
      }
    }
    n += len;
    w0 += len;
    __syncthreads();
    if (w0 < total && n > k) {  // more to come: keep this window's best k
      sort_candidates(s, n, [](float x) { return order_key(x); });
      int id = 0;
      float v = 0.0f;
      if (tid < k) id = s.cand_id[s.u.set.idx[tid]], v = s.cand_val[s.u.set.idx[tid]];
      __syncthreads();
      if (tid < k) s.cand_id[tid] = id, s.cand_val[tid] = v;
      __syncthreads();
      n = k;
    }
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

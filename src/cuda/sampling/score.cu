// score_forced_rows (score.h): a block a row.
//   Pass 1 (the row once, float4 loads): the raw log-sum-exp (online, merged in double), the argmax and each
//   thread's own largest value.
//   Top n > 1: the n-th largest of the threads' maxima lies at or below the row's n-th largest value (n threads
//   hold a value at least that large), so the row's top n are among the values at or above it: pass 2 gathers those
//   into shared memory and n block-wide argmax rounds order them. When more than kCap tie there (a flat row), the
//   rounds run over the whole row instead: exact, only slower.
#include <cfloat>
#include <climits>

#include "cuda/sampling/score.h"
#include "cuda/sampling/sampling_device.cuh"

namespace moeserve::cuda {
namespace {

// The sampler's (value, id) pair and its order (larger value first, lower id on ties), and its mergeable log-sum-exp.
using sampling_detail::better;
using sampling_detail::combine;
using sampling_detail::kFull;
using sampling_detail::OnlineSum;
using Pair = sampling_detail::ArgMax;

constexpr int kThreads = 256, kWarps = kThreads / 32, kCap = 2048;

__device__ __forceinline__ bool before(Pair a, Pair b) { return a.v > b.v || (a.v == b.v && a.i < b.i); }
constexpr Pair kNone{-INFINITY, INT_MAX};

__device__ __forceinline__ Pair warp_first(Pair p) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) p = better(p, Pair{__shfl_xor_sync(kFull, p.v, o), __shfl_xor_sync(kFull, p.i, o)});
  return p;
}

struct Smem {
  Pair warp[kWarps];
  int warp_above[kWarps];
  OnlineSum warp_sum[kWarps];
  float thread_max[kThreads];
  Pair pick;
  float thresh;
  int n_cand;
  float cand_v[kCap];
  int cand_i[kCap];
};

// The block's first pair of `p` (every thread's), in every thread.
__device__ Pair block_first(Pair p, Smem& s) {
  p = warp_first(p);
  const int w = threadIdx.x / 32;
  __syncthreads();  // s.warp / s.pick may still be read by the previous call
  if (threadIdx.x % 32 == 0) s.warp[w] = p;
  __syncthreads();
  if (threadIdx.x == 0) {
    Pair b = s.warp[0];
    for (int q = 1; q < kWarps; ++q) b = better(b, s.warp[q]);
    s.pick = b;
  }
  __syncthreads();
  return s.pick;
}

// Calls f(v, x) for every token of the row this thread owns (whole float4s where the row is 16-byte aligned).
template <class F>
__device__ __forceinline__ void for_row(const float* x, int V, bool vec, F f) {
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll 4
    for (int i = threadIdx.x; i < V / 4; i += kThreads) {
      const float4 q = __ldg(x4 + i);
      f(4 * i, q.x);
      f(4 * i + 1, q.y);
      f(4 * i + 2, q.z);
      f(4 * i + 3, q.w);
    }
  } else {
    for (int v = threadIdx.x; v < V; v += kThreads) f(v, __ldg(x + v));
  }
}

__global__ void __launch_bounds__(kThreads) score_kernel(SampleArgs a) {
  __shared__ Smem s;
  const int row = blockIdx.x, V = a.vocab, tid = threadIdx.x;
  const SampleRowParams p = a.params[row];
  if (p.forced < 0) return;
  const float* x = a.logits + int64_t(row) * V;
  const bool vec = (V & 3) == 0 && (reinterpret_cast<uintptr_t>(a.logits) & 15) == 0;

  // Pass 1: log-sum-exp, the argmax, this thread's maximum, the tokens above the forced one.
  const float xf = x[p.forced];
  float m = -INFINITY, sum = 0.0f;
  Pair best = kNone;
  int above = 0;
  for_row(x, V, vec, [&](int v, float r) {
    above += r > xf;
    if (before(Pair{r, v}, best)) best = Pair{r, v};
    if (r > -INFINITY) {  // (NaN compares false everywhere: left out)
      if (r > m) {
        sum = sum * __expf(m - r) + 1.0f;
        m = r;
      } else {
        sum += __expf(r - m);
      }
    }
  });
  const float mine = best.v;
  OnlineSum os{m, double(sum)};
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    os = combine(os, OnlineSum{__shfl_xor_sync(kFull, os.m, o), __shfl_xor_sync(kFull, os.s, o)});
    above += __shfl_xor_sync(kFull, above, o);
  }
  if (tid % 32 == 0) s.warp_sum[tid / 32] = os, s.warp_above[tid / 32] = above;
  s.thread_max[tid] = mine;
  const Pair top1 = block_first(best, s);  // (its barriers publish warp_sum / warp_above / thread_max)
  OnlineSum g = s.warp_sum[0];
  for (int q = 1; q < kWarps; ++q) g = combine(g, s.warp_sum[q]);
  const double lse = double(g.m) + log(g.s);

  if (tid == 0) {
    a.out_ids[row] = p.forced;
    if (a.out_logprobs) a.out_logprobs[row] = float(double(xf) - lse);
    if (a.out_ranks) {
      int n_above = 0;
      for (int q = 0; q < kWarps; ++q) n_above += s.warp_above[q];
      a.out_ranks[row] = 1 + n_above;
    }
  }
  if (a.max_top <= 0 || !a.top_ids || !a.top_logprobs) return;
  int32_t* top_ids = a.top_ids + int64_t(row) * a.max_top;
  float* top_lp = a.top_logprobs + int64_t(row) * a.max_top;
  const int n = min(min(p.top_logprobs, a.max_top), V);
  for (int j = max(n, 0) + tid; j < a.max_top; j += kThreads) top_ids[j] = -1, top_lp[j] = -INFINITY;
  if (n <= 0) return;
  auto put = [&](int j, Pair q) {
    if (tid == 0) top_ids[j] = q.i, top_lp[j] = float(double(q.v) - lse);
  };
  put(0, top1);
  if (n == 1) return;

  // The n-th largest thread maximum: the thread whose maximum ranks n - 1 (ties by thread index) writes it.
  int rank = 0;
  for (int u = 0; u < kThreads; ++u) {
    const float o = s.thread_max[u];
    rank += o > mine || (o == mine && u < tid);
  }
  if (tid == 0) s.n_cand = 0;
  if (rank == n - 1) s.thresh = mine;
  __syncthreads();
  const float thresh = s.thresh;
  for_row(x, V, vec, [&](int v, float r) {
    if (r >= thresh) {
      const int k = atomicAdd(&s.n_cand, 1);
      if (k < kCap) s.cand_v[k] = r, s.cand_i[k] = v;
    }
  });
  __syncthreads();
  const int nc = s.n_cand;
  Pair prev = top1;
  for (int j = 1; j < n; ++j) {  // the first pair after `prev` in the order, j times
    Pair b = kNone;
    if (nc <= kCap) {
      for (int k = tid; k < nc; k += kThreads) {
        const Pair q{s.cand_v[k], s.cand_i[k]};
        if (before(prev, q) && before(q, b)) b = q;
      }
    } else {
      for_row(x, V, vec, [&](int v, float r) {
        const Pair q{r, v};
        if (before(prev, q) && before(q, b)) b = q;
      });
    }
    prev = block_first(b, s);
    put(j, prev);
  }
}

}  // namespace

void score_forced_rows(const SampleArgs& a, cudaStream_t stream) {
  MS_CHECK(a.rows >= 0 && a.vocab > 0, "score_forced_rows: {} rows of {} tokens", a.rows, a.vocab);
  if (a.rows == 0) return;
  MS_CHECK(a.logits && a.params && a.out_ids, "score_forced_rows: logits, params and out_ids are required");
  score_kernel<<<a.rows, kThreads, 0, stream>>>(a);
  MS_CUDA_LAUNCH_CHECK();
}

}  // namespace moeserve::cuda

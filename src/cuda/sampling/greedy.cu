#include "cuda/sampling/greedy.h"

#include <cfloat>

namespace moeserve::cuda {

namespace {

constexpr int kThreads = 1024;

// Running state of one thread: the best (value, id) seen and the sum of exp(x - max) over its elements.
struct State {
  float max;
  int id;
  float sum;
};

__device__ __forceinline__ void add(State& s, float x, int id) {
  if (x == -INFINITY) return;  // adds nothing to the sum (and would make it NaN against an empty state)
  if (x > s.max) {
    s.sum = s.sum * __expf(s.max - x) + 1.0f;
    s.max = x;
    s.id = id;
  } else {
    s.sum += __expf(x - s.max);
    if (x == s.max && id < s.id) s.id = id;
  }
}

__device__ __forceinline__ State merge(State a, State b) {
  if (b.max > a.max || (b.max == a.max && b.id < a.id)) {
    State t = a;
    a = b;
    b = t;
  }
  // a has the larger max (or the same max and the lower id).
  if (b.max == -INFINITY) return a;
  a.sum += b.sum * __expf(b.max - a.max);
  return a;
}

__global__ void __launch_bounds__(kThreads) greedy_kernel(const float* __restrict__ logits, int vocab,
                                                          int32_t* __restrict__ out_ids, float* __restrict__ out_lp) {
  const float* row = logits + int64_t(blockIdx.x) * vocab;
  State s{-INFINITY, INT_MAX, 0.0f};
  // Aligned 16-byte loads over the bulk of the row, scalar loads for the ends.
  const int head = int((16 - (reinterpret_cast<uintptr_t>(row) & 15)) / 4) & 3;
  const int n_head = min(head, vocab);
  for (int i = threadIdx.x; i < n_head; i += kThreads) add(s, row[i], i);
  const int n4 = (vocab - n_head) / 4;
  const float4* v4 = reinterpret_cast<const float4*>(row + n_head);
  for (int i = threadIdx.x; i < n4; i += kThreads) {
    const float4 v = __ldg(v4 + i);
    const int b = n_head + 4 * i;
    add(s, v.x, b);
    add(s, v.y, b + 1);
    add(s, v.z, b + 2);
    add(s, v.w, b + 3);
  }
  for (int i = n_head + 4 * n4 + threadIdx.x; i < vocab; i += kThreads) add(s, row[i], i);
  // Warp, then block reduction (deterministic order).
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    State t{__shfl_xor_sync(0xffffffffu, s.max, o), __shfl_xor_sync(0xffffffffu, s.id, o),
            __shfl_xor_sync(0xffffffffu, s.sum, o)};
    s = merge(s, t);
  }
  __shared__ State warps[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warps[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = warps[lane];
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      State t{__shfl_xor_sync(0xffffffffu, s.max, o), __shfl_xor_sync(0xffffffffu, s.id, o),
              __shfl_xor_sync(0xffffffffu, s.sum, o)};
      s = merge(s, t);
    }
    if (lane == 0) {
      out_ids[blockIdx.x] = s.id;
      if (out_lp) out_lp[blockIdx.x] = -logf(s.sum);  // logit(argmax) - max - log(sum) with logit == max
    }
  }
}

}  // namespace

void sample_greedy(const float* logits, int rows, int vocab, int32_t* out_ids, float* out_logprobs,
                   cudaStream_t stream) {
  MS_CHECK(vocab > 0, "vocabulary of {} tokens", vocab);
  if (rows <= 0) return;
  greedy_kernel<<<rows, kThreads, 0, stream>>>(logits, vocab, out_ids, out_logprobs);
  MS_CUDA_LAUNCH_CHECK();
}

}  // namespace moeserve::cuda

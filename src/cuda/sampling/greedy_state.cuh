// The greedy sampler's running state (argmax with the lowest id on ties, and the sum of exp(x - max) for the raw
// logprob) as device functions, shared by the greedy kernels (greedy.cu) and the streaming lm_head GEMV that can end
// in the argmax (gemv.cu, gemv_stream_argmax). Internal header.
#pragma once

#include <climits>
#include <cmath>

namespace moeserve::cuda::greedy_dev {

// Running state of one thread: the best (value, id) seen and the sum of exp(x - max) over its elements.
struct State {
  float max;
  int id;
  float sum;
};

__device__ __forceinline__ State empty_state() { return State{-INFINITY, INT_MAX, 0.0f}; }

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

// s merged with lane (lane ^ o)'s state for o = from, from / 2, ..., 1 (a fixed xor tree; every lane of the warp
// takes part).
__device__ __forceinline__ State shfl_merge(State s, int from) {
#pragma unroll
  for (int o = from; o > 0; o /= 2) {
    State t{__shfl_xor_sync(0xffffffffu, s.max, o), __shfl_xor_sync(0xffffffffu, s.id, o),
            __shfl_xor_sync(0xffffffffu, s.sum, o)};
    s = merge(s, t);
  }
  return s;
}

}  // namespace moeserve::cuda::greedy_dev

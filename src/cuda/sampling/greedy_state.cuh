// The greedy sampler's running state and its merges (device code, shared by greedy.cu and the lm_head stream GEMV
// that samples greedily in its epilogue, gemv.cu): the largest logit with the lowest id among equal ones (as the CPU
// sampler), and the sum of exp(logit - max) for the raw logprob of that id, -log(sum).
#pragma once

#include <climits>
#include <cmath>

namespace moeserve::cuda::greedy {

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

// The states of WIDTH consecutive lanes (a power of two up to 32; every lane of the warp takes part) merged by a
// butterfly of shuffles: every lane of a group ends with the group's state.
template <int WIDTH = 32>
__device__ __forceinline__ State shfl_reduce(State s) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o /= 2) {
    State t{__shfl_xor_sync(0xffffffffu, s.max, o), __shfl_xor_sync(0xffffffffu, s.id, o),
            __shfl_xor_sync(0xffffffffu, s.sum, o)};
    s = merge(s, t);
  }
  return s;
}

}  // namespace moeserve::cuda::greedy

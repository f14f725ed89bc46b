// The greedy sampler's running state and its two updates, shared by the all-greedy sampler (greedy.cu) and the
// lm_head with the argmax in it (lmhead_argmax.cu), so that both pick the same token (the lowest id on ties, as the
// CPU) and compute the same raw logprob. Device code only.
#pragma once

#include <cfloat>
#include <climits>

namespace moeserve::cuda::greedy_state {

// The best (value, id) seen and the sum of exp(x - max) over the elements seen.
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

// Lane ^ o's state (a butterfly step).
__device__ __forceinline__ State shfl_xor(State s, int o) {
  return State{__shfl_xor_sync(0xffffffffu, s.max, o), __shfl_xor_sync(0xffffffffu, s.id, o),
               __shfl_xor_sync(0xffffffffu, s.sum, o)};
}

}  // namespace moeserve::cuda::greedy_state

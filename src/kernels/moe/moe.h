// Mixture-of-Experts layer on the CPU: softmax router, top-k (renormalised when norm_topk_prob), SwiGLU
// experts, weighted combine. Tokens are grouped by expert so that each expert's weights are read once per
// step, as the GPU grouped GEMM does.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/gemm/linear.h"

namespace moeserve::kernels {

struct ExpertWeights {
  LinearWeight gate, up;  // [moe_intermediate, hidden] each (views into a fused gate_up tensor or separate)
  LinearWeight down;      // [hidden, moe_intermediate]
};

struct MoEWeights {
  LinearWeight router;  // [num_experts, hidden] f32
  std::vector<ExpertWeights> experts;
  int64_t top_k = 0;
  bool norm_topk_prob = false;
};

// ids/weights: [T, top_k], experts in descending probability (torch.topk order; ties: lower index first).
void route_topk(const float* logits, int64_t T, int64_t E, int64_t top_k, bool renormalize, int32_t* ids,
                float* weights);

// Sees (and may change) the router's logits [T, E] before the top-k: diagnostics and tests only (e.g. what a
// routing flip at a near-tie would do to a token).
using RouterLogitsHook = std::function<void(float* logits, int64_t T, int64_t E)>;

// out[T, H] = sum over the token's top-k experts of weight * expert(x). hook: optional, see RouterLogitsHook.
void moe_forward(const float* x, int64_t T, int64_t H, const MoEWeights& w, float* out, ThreadPool& pool,
                 const RouterLogitsHook* hook = nullptr);

}  // namespace moeserve::kernels

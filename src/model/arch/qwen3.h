// Qwen3ForCausalLM and Qwen3MoeForCausalLM: pre-norm decoder layers with per-head q/k RMSNorm, rotary
// embeddings, grouped-query attention, and a SwiGLU MLP or a softmax-top-k MoE (per mlp_only_layers and
// decoder_sparse_step).
#pragma once

#include <functional>
#include <memory>
#include <utility>

#include "kernels/gemm/linear.h"
#include "kernels/moe/moe.h"
#include "kernels/rope/rope.h"
#include "model/model.h"
#include "model/safetensors.h"

namespace moeserve {

struct Qwen3Layer {
  kernels::LinearWeight q, k, v, o;
  Tensor q_norm, k_norm, input_norm, post_norm;  // f32
  bool is_moe = false;
  kernels::LinearWeight gate, up, down;  // dense MLP
  kernels::MoEWeights moe;
};

class Qwen3Model : public CausalLM {
 public:
  // `prefix` is where the decoder lives in the checkpoint ("model." for Qwen3 / Qwen3-MoE).
  static std::unique_ptr<Qwen3Model> load(const ModelConfig& cfg, const Checkpoint& ckpt,
                                          const std::string& prefix = "model.");
  const ModelConfig& config() const override { return cfg_; }
  void forward(const ForwardBatch& batch, KVPool& kv, float* logits, ThreadPool& pool) override;
  size_t active_weight_bytes() const override;

  // Read access for device backends that copy the weights (the CUDA model uploads from these views).
  const Tensor& embed_weight() const { return embed; }
  const kernels::LinearWeight& lm_head_weight() const { return lm_head; }
  const Tensor& final_norm_weight() const { return final_norm; }
  const std::vector<Qwen3Layer>& layer_weights() const { return layers; }
  const kernels::RopeTable& rope_table() const { return rope; }

  // Diagnostics and tests: called in every MoE layer with the router's logits [T, E] before the top-k, which it may
  // change (what a routing flip at a near-tie does to a token). Empty: none.
  using RouterHook = std::function<void(int64_t layer, float* logits, int64_t T, int64_t E)>;
  void set_router_hook(RouterHook hook) { router_hook_ = std::move(hook); }

 private:
  ModelConfig cfg_;
  Checkpoint ckpt_;  // keeps the mappings alive
  Tensor embed;      // [vocab, hidden]
  kernels::LinearWeight lm_head;
  Tensor final_norm;
  std::vector<Qwen3Layer> layers;
  kernels::RopeTable rope;
  RouterHook router_hook_;
};

}  // namespace moeserve

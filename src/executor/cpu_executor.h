// The CPU executor: the reference model (CausalLM) with an f32 KV pool in host memory and a thread pool.
#pragma once

#include <memory>

#include "core/threadpool.h"
#include "executor/executor.h"

namespace moeserve {

class CpuExecutor : public Executor {
 public:
  // kv_tokens: KV capacity in tokens (rounded up to pages).
  CpuExecutor(std::unique_ptr<CausalLM> model, int64_t kv_tokens, int64_t page_size, int threads);
  const ModelConfig& config() const override { return model_->config(); }
  KVPool& kv() override { return *kv_; }
  void step(const ForwardBatch& batch, const std::vector<SampleSpec>& specs, std::vector<Sampled>& out) override;
  void forward_logits(const ForwardBatch& batch, std::vector<float>& logits) override;
  std::string device_name() const override { return "cpu"; }
  size_t active_weight_bytes() const override { return model_->active_weight_bytes(); }
  nlohmann::json info() const override;

 private:
  std::unique_ptr<CausalLM> model_;
  ThreadPool pool_;
  std::unique_ptr<KVPool> kv_;
  std::vector<float> logits_, scratch_, logprobs_;
};

}  // namespace moeserve

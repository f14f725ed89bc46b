// The model runner owns an executor (CPU or CUDA: the model, its KV storage, its sampler) and runs steps.
// It also offers a single-request generate() loop (prefill in chunks, then decode) for `moeserve generate`
// and the tests; the server's scheduler drives step() directly with batches of many requests.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "executor/executor.h"

namespace moeserve {

struct RunnerOptions {
  int64_t max_total_tokens = 0;  // KV capacity in tokens; 0: min(context length, 65536)
  int64_t page_size = 16;
  int64_t chunked_prefill_size = 512;
  int threads = 0;  // 0: all cores
};

struct GenerateRequest {
  std::vector<int32_t> input_ids;
  int64_t max_new_tokens = 16;
  kernels::SamplerParams sampling;
  uint64_t seed = 0;
  int64_t top_logprobs = 0;  // 0: none
  bool ignore_eos = false;
  std::vector<int64_t> stop_token_ids;  // in addition to the model's eos ids
};

struct GenerateResult {
  std::vector<int32_t> output_ids;
  std::vector<float> output_logprobs;                          // logprob of each output token
  std::vector<std::vector<kernels::TokenLogprob>> top_logprobs;  // per output token, when asked
  std::string finish_reason = "length";                        // length | stop
  int64_t matched_stop = -1;
  double prefill_seconds = 0, decode_seconds = 0;
};

class ModelRunner {
 public:
  // The CPU executor.
  ModelRunner(std::unique_ptr<CausalLM> model, const RunnerOptions& opts);
  ModelRunner(std::unique_ptr<Executor> executor, const RunnerOptions& opts);
  Executor& executor() { return *exec_; }
  const ModelConfig& config() const { return exec_->config(); }
  KVPool& kv() { return exec_->kv(); }
  const RunnerOptions& options() const { return opts_; }
  // eos ids: generation_config.json's, else config.json's.
  void set_eos_ids(std::vector<int64_t> ids) { eos_ids_ = std::move(ids); }
  const std::vector<int64_t>& eos_ids() const { return eos_ids_; }

  // logits: [batch.logit_rows.size(), vocab].
  void forward(const ForwardBatch& batch, std::vector<float>& logits) { exec_->forward_logits(batch, logits); }
  void step(const ForwardBatch& batch, const std::vector<SampleSpec>& specs, std::vector<Sampled>& out) {
    exec_->step(batch, specs, out);
  }
  // The overlap schedule (Executor::launch / collect).
  void launch(const ForwardBatch& batch, const std::vector<SampleSpec>& specs,
              const std::vector<int32_t>& later_masks = {}) {
    exec_->launch(batch, specs, later_masks);
  }
  void complete_launch(std::vector<std::vector<uint32_t>>& masks) { exec_->complete_launch(masks); }
  void collect(std::vector<Sampled>& out) { exec_->collect(out); }

  // UserError for ids outside the vocabulary, an empty prompt, or a prompt + max_new_tokens beyond the
  // context or the KV capacity.
  GenerateResult generate(const GenerateRequest& req);

 private:
  void init();
  std::unique_ptr<Executor> exec_;
  RunnerOptions opts_;
  std::vector<int64_t> eos_ids_;
};

}  // namespace moeserve

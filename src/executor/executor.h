// The device-specific half of the model runner: runs a forward step over a batch and picks one token per
// logit row. The CPU executor samples on the host; the CUDA executor samples on the GPU and copies back only
// the sampled ids (and logprobs when asked). The KV page bookkeeping (KVPool's allocator) is shared with the
// scheduler; where the pages' storage lives is the executor's business.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/sampling/sampling.h"
#include "kv/kv_pool.h"
#include "model/model.h"

namespace moeserve {

// How to pick the next token of one logit row.
struct SampleSpec {
  kernels::SamplerParams sampler;
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;  // over generated tokens
  float repetition_penalty = 1.0f;                          // over prompt and generated tokens
  const std::vector<int32_t>* prompt = nullptr;             // for the penalties (may be null when none apply)
  const std::vector<int32_t>* output = nullptr;
  const std::vector<std::pair<int32_t, float>>* bias = nullptr;  // logit_bias (may be null): added after the penalties
  std::vector<int32_t> banned;                              // ids that may not be picked (eos under min_tokens)
  // A grammar's mask (grammar::Constraint::allowed_tokens): bit t % 32 of word t / 32 set where token t may be
  // picked, the tokens past its bits never; empty: every token. Applied after the penalties, biases and bans.
  std::vector<uint32_t> allowed;
  std::mt19937_64* rng = nullptr;                           // the request's generator
  bool logprob = false;                                     // logprob of the chosen token
  int64_t top_logprobs = 0;                                 // top-n logprobs of the raw distribution
  // >= 0: the row's token is this one, whatever the logits say (a scored prompt position: its logprob and top
  // logprobs are the raw logits', the sampling parameters are not used).
  int32_t forced_token = -1;
  bool penalized() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }
  bool biased() const { return bias != nullptr && !bias->empty(); }
  bool masked() const { return !allowed.empty(); }
  bool may_pick(int64_t t) const {
    return !masked() || (size_t(t) >> 5 < allowed.size() && ((allowed[size_t(t) >> 5] >> (t & 31)) & 1u));
  }
  // Whether the logits are changed by per-token lists (penalties, logit_bias or bans).
  bool listed() const { return penalized() || biased() || !banned.empty(); }
  // Whether the logits are changed before sampling at all.
  bool modifies_logits() const { return listed() || masked(); }
  bool forced() const { return forced_token >= 0; }
};

struct Sampled {
  int32_t token = -1;
  float logprob = 0.0f;                      // when asked: log_softmax(raw logits)[token]
  int32_t rank = 0;                          // forced rows: 1 + the tokens whose raw logit is larger (vLLM's rank)
  std::vector<kernels::TokenLogprob> top;    // when asked
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual const ModelConfig& config() const = 0;
  virtual KVPool& kv() = 0;
  // Forward over the batch, then one token per logit row (specs[i] for batch.logit_rows[i]).
  virtual void step(const ForwardBatch& batch, const std::vector<SampleSpec>& specs, std::vector<Sampled>& out) = 0;
  // The overlap schedule: launch() starts a step and returns without waiting for it; collect() waits for the
  // oldest launched step and hands back its samples. A batch with previous_samples takes those tokens from the
  // samples of the step launched just before it (ForwardBatch::previous_samples), so the scheduler can launch step n + 1 while
  // step n still runs and process step n's results meanwhile. The specs are read during launch(). The CPU
  // executor runs the step inside launch() (these defaults); the CUDA executor only enqueues it.
  void launch(const ForwardBatch& batch, const std::vector<SampleSpec>& specs) { launch(batch, specs, {}); }
  // Grammar masks under the overlap schedule: a constrained row's mask depends on the token the step in flight is
  // sampling for it. `later` lists such logit rows (ascending): launch() then starts only the step's forward, and
  // complete_launch() - called after the step before is collected, before anything else is launched - gives their
  // masks (in `later`'s order, as SampleSpec::allowed; an empty one allows every token) and starts the sampling, so
  // that the masks are computed while the forward runs. The rows count as masked from the start.
  virtual void launch(const ForwardBatch& batch, const std::vector<SampleSpec>& specs,
                      const std::vector<int32_t>& later);
  virtual void complete_launch(std::vector<std::vector<uint32_t>>& masks);
  virtual void collect(std::vector<Sampled>& out);
  // Forgets launched steps that will never be collected (after a failure or an abort of everything).
  virtual void drop_launched() {
    launched_.clear();
    pending_.reset();
  }
  // The logit rows' logits on the host, [rows, vocab] f32 (tests and parity checks).
  virtual void forward_logits(const ForwardBatch& batch, std::vector<float>& logits) = 0;
  virtual std::string device_name() const = 0;
  virtual size_t active_weight_bytes() const = 0;
  // For /get_server_info: {"device", "kernel_backends": {family: {backend, reason}}, "cuda_graphs": {...}}.
  virtual nlohmann::json info() const = 0;
  // The most top logprobs per token this executor returns (the CPU: any number).
  virtual int64_t max_top_logprobs() const { return INT64_MAX; }
  // The most logit rows a step may have (the prompt logprobs' rows are capped by it). The CPU holds every row's
  // logits at once: 256 rows (~155 MB at a 151,936-token vocabulary); the GPU a row a token of its largest step (it
  // runs the lm_head and the sampler over a step's rows in slices).
  virtual int64_t max_logit_rows() const { return 256; }
  // Runs the batch once with per-op device timing and returns the breakdown (GPU executors; for benchmarks).
  virtual std::string profile_step(const ForwardBatch& batch) {
    (void)batch;
    return "per-op profiles need the CUDA executor\n";
  }

 private:
  std::deque<std::vector<Sampled>> launched_;  // the default launch(): results waiting for collect()
  // The default launch() with `later` rows: the step's logits and specs until complete_launch() samples them.
  struct Pending {
    std::vector<float> logits;
    std::vector<SampleSpec> specs;
    std::vector<int32_t> later;
  };
  std::unique_ptr<Pending> pending_;
};

// The CPU sampler: penalties, bans, then kernels::sample_token with the request's generator. `scratch` and
// `logprobs` are reused buffers.
Sampled sample_on_cpu(const float* logits, int64_t V, const SampleSpec& s, std::vector<float>& scratch,
                      std::vector<float>& logprobs);

}  // namespace moeserve

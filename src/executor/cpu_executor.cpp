#include "executor/cpu_executor.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"

namespace moeserve {

namespace {
// The token sampled from the logits after the penalties, biases, bans and mask (scratch: their copy).
int32_t sample_modified(const float* logits, int64_t V, const SampleSpec& s, std::vector<float>& scratch) {
  scratch.assign(logits, logits + V);
  float* lg = scratch.data();
  if (s.penalized()) {
    std::unordered_map<int32_t, int64_t> counts;
    if (s.output)
      for (int32_t t : *s.output) counts[t]++;
    if (s.repetition_penalty != 1.0f) {
      std::vector<uint8_t> seen(size_t(V), 0);
      if (s.prompt)
        for (int32_t t : *s.prompt) seen[t] = 1;
      for (auto& [t, n] : counts) seen[t] = 1;
      for (int64_t t = 0; t < V; ++t)
        if (seen[t]) lg[t] = lg[t] > 0 ? lg[t] / s.repetition_penalty : lg[t] * s.repetition_penalty;
    }
    for (auto& [t, n] : counts) lg[t] -= s.presence_penalty + s.frequency_penalty * float(n);
  }
  if (s.biased())
    for (auto [t, b] : *s.bias)
      if (t >= 0 && t < V) lg[t] += b;
  for (int32_t b : s.banned)
    if (b >= 0 && b < V) lg[b] = -INFINITY;
  if (s.masked())
    for (int64_t t = 0; t < V; ++t)
      if (!s.may_pick(t)) lg[t] = -INFINITY;
  return kernels::sample_token(lg, V, s.sampler, *s.rng);
}
}  // namespace

Sampled sample_on_cpu(const float* logits, int64_t V, const SampleSpec& s, std::vector<float>& scratch,
                      std::vector<float>& logprobs) {
  Sampled out;
  if (s.forced()) {  // a scored prompt position: its token as given, the raw logits' logprobs
    MS_CHECK(s.forced_token < V, "forced token {} outside the vocabulary of {}", s.forced_token, V);
    out.token = s.forced_token;
    const float x = logits[out.token];
    out.rank = 1 + int32_t(std::count_if(logits, logits + V, [x](float v) { return v > x; }));
  } else {
    out.token = sample_modified(logits, V, s, scratch);
  }
  if (s.logprob || s.top_logprobs > 0) {
    logprobs.resize(size_t(V));
    kernels::log_softmax(logits, V, logprobs.data());
    out.logprob = logprobs[out.token];
    if (s.top_logprobs > 0) out.top = kernels::top_logprobs(logprobs.data(), V, s.top_logprobs);
  }
  return out;
}

CpuExecutor::CpuExecutor(std::unique_ptr<CausalLM> model, int64_t kv_tokens, int64_t page_size, int threads)
    : model_(std::move(model)), pool_(threads) {
  const ModelConfig& c = model_->config();
  KVPoolShape s;
  s.num_layers = c.num_layers;
  s.page_size = page_size;
  s.num_pages = (kv_tokens + page_size - 1) / page_size;
  s.kv_heads = c.num_kv_heads;
  s.head_dim = c.head_dim;
  // The f32 pool is allocated and zeroed at once: a capacity past the machine's memory would exhaust it (or
  // overflow the byte count), so it is refused first, in doubles.
  const double need = double(s.num_layers) * double(s.num_pages) * double(s.page_size) * double(s.kv_heads) *
                      double(s.head_dim) * 2.0 * sizeof(float);
  const double have = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  if (have > 0 && need > 0.9 * have)
    throw_user("--max-total-tokens {}: the CPU KV cache (f32) would need {:.1f} GiB, more than 90% of this machine's "
               "{:.1f} GiB of memory; give a smaller --max-total-tokens",
               kv_tokens, need / double(1 << 30), have / double(1 << 30));
  kv_ = std::make_unique<KVPool>(s);
  log_info("KV cache: {} tokens in {} pages of {} ({:.1f} MiB, f32, CPU); {} threads", s.num_pages * s.page_size,
           s.num_pages, s.page_size, need / (1 << 20), pool_.num_threads());
}

nlohmann::json CpuExecutor::info() const {
  const std::string why = "CPU device: the reference kernels (AVX2 when available) are the only backend";
  nlohmann::json b = nlohmann::json::object();
  for (const char* f : {"attention", "moe", "gemm", "sampling"}) b[f] = {{"backend", "cpu"}, {"reason", why}};
  return {{"device", "cpu"}, {"kernel_backends", b}, {"cuda_graphs", {{"enabled", false}, {"reason", "CPU device"}}}};
}

void CpuExecutor::forward_logits(const ForwardBatch& batch, std::vector<float>& logits) {
  logits.resize(batch.logit_rows.size() * size_t(config().vocab_size));
  model_->forward(batch, *kv_, logits.data(), pool_);
}

void CpuExecutor::step(const ForwardBatch& batch, const std::vector<SampleSpec>& specs, std::vector<Sampled>& out) {
  forward_logits(batch, logits_);
  const int64_t V = config().vocab_size;
  out.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) out[i] = sample_on_cpu(logits_.data() + i * V, V, specs[i], scratch_, logprobs_);
}

void Executor::launch(const ForwardBatch& batch, const std::vector<SampleSpec>& specs,
                      const std::vector<int32_t>& later) {
  MS_CHECK(!pending_, "a step launched before the one before it was completed (complete_launch)");
  ForwardBatch resolved;
  const ForwardBatch* b = &batch;
  if (!batch.previous_samples.empty()) {
    MS_CHECK(batch.previous_samples.size() == batch.tokens.size(), "previous_samples: {} entries for {} tokens",
             batch.previous_samples.size(), batch.tokens.size());
    const int64_t rows = launched_.empty() ? 0 : int64_t(launched_.back().size());
    resolved = batch;
    resolved.previous_samples.clear();
    for (size_t i = 0; i < resolved.tokens.size(); ++i) {
      const int32_t r = batch.previous_samples[i];
      if (r < 0) continue;
      MS_CHECK(r < rows, "token {} takes sample {} of the previous step, which is not in flight or has {} rows", i,
               r, rows);
      resolved.tokens[i] = launched_.back()[size_t(r)].token;
    }
    b = &resolved;
  }
  if (later.empty()) {
    std::vector<Sampled> out;
    step(*b, specs, out);
    launched_.push_back(std::move(out));
    return;
  }
  for (size_t i = 0; i < later.size(); ++i)
    MS_CHECK(later[i] >= 0 && size_t(later[i]) < specs.size() && (i == 0 || later[i] > later[i - 1]),
             "later mask rows must be ascending logit rows of the step ({} rows)", specs.size());
  auto p = std::make_unique<Pending>();
  forward_logits(*b, p->logits);  // the batch's block tables may change before complete_launch(): read them now
  p->specs = specs;
  p->later = later;
  pending_ = std::move(p);
}

void Executor::complete_launch(std::vector<std::vector<uint32_t>>& masks) {
  MS_CHECK(pending_ != nullptr, "complete_launch() without a step launched with later masks");
  Pending& p = *pending_;
  MS_CHECK(masks.size() == p.later.size(), "{} masks for {} later rows", masks.size(), p.later.size());
  for (size_t i = 0; i < masks.size(); ++i) p.specs[size_t(p.later[i])].allowed = std::move(masks[i]);
  const int64_t V = config().vocab_size;
  std::vector<float> scratch, logprobs;
  std::vector<Sampled> out(p.specs.size());
  for (size_t i = 0; i < p.specs.size(); ++i)
    out[i] = sample_on_cpu(p.logits.data() + i * size_t(V), V, p.specs[i], scratch, logprobs);
  launched_.push_back(std::move(out));
  pending_.reset();
}

void Executor::collect(std::vector<Sampled>& out) {
  MS_CHECK(!launched_.empty() || !pending_, "collect() of a step whose masks were not given (complete_launch)");
  MS_CHECK(!launched_.empty(), "collect() without a launched step");
  out = std::move(launched_.front());
  launched_.pop_front();
}

}  // namespace moeserve

#include "executor/model_runner.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/log.h"
#include "executor/cpu_executor.h"

namespace moeserve {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

// Default KV capacity when none is given: the context length, at most 65,536 tokens.
static int64_t default_kv_tokens(const ModelConfig& c, int64_t requested) {
  return requested > 0 ? requested : std::min<int64_t>(c.max_position_embeddings, 65536);
}

ModelRunner::ModelRunner(std::unique_ptr<CausalLM> model, const RunnerOptions& opts) : opts_(opts) {
  if (opts_.page_size <= 0) throw_user("--page-size must be positive, got {}", opts_.page_size);
  opts_.max_total_tokens = default_kv_tokens(model->config(), opts_.max_total_tokens);
  exec_ = std::make_unique<CpuExecutor>(std::move(model), opts_.max_total_tokens, opts_.page_size, opts_.threads);
  init();
}

ModelRunner::ModelRunner(std::unique_ptr<Executor> executor, const RunnerOptions& opts)
    : exec_(std::move(executor)), opts_(opts) {
  init();
}

void ModelRunner::init() {
  opts_.page_size = exec_->kv().shape().page_size;
  opts_.max_total_tokens = exec_->kv().shape().num_pages * opts_.page_size;
  eos_ids_ = exec_->config().eos_token_ids;
}

GenerateResult ModelRunner::generate(const GenerateRequest& req) {
  const ModelConfig& c = config();
  const int64_t P = int64_t(req.input_ids.size()), V = c.vocab_size;
  if (P == 0) throw_user("the prompt is empty: give at least one input id");
  for (int32_t id : req.input_ids)
    if (id < 0 || id >= V) throw_user("input id {} is outside the vocabulary [0, {})", id, V);
  if (req.max_new_tokens < 0) throw_user("max_new_tokens must be >= 0, got {}", req.max_new_tokens);
  if (req.top_logprobs > exec_->max_top_logprobs())
    throw_user("--top-logprobs {}: the {} executor returns at most {} per token", req.top_logprobs,
               exec_->device_name(), exec_->max_top_logprobs());
  const int64_t total = P + req.max_new_tokens;
  if (total > c.max_position_embeddings)
    throw_user("prompt ({} tokens) + max_new_tokens ({}) = {} exceeds the context length {}", P, req.max_new_tokens,
               total, c.max_position_embeddings);
  PageAllocator& alloc = kv().allocator();
  const int64_t pages = kv().pages_for(std::max<int64_t>(total, 1));
  if (!alloc.can_allocate(pages))
    throw_user("prompt + max_new_tokens needs {} KV tokens but the cache holds {} (raise --max-total-tokens)",
               total, alloc.num_free() * opts_.page_size);
  BlockTable table;
  table.pages = alloc.allocate(pages);
  struct Release {
    PageAllocator& a;
    BlockTable& t;
    ~Release() { a.free(t.pages); }
  } release{alloc, table};

  GenerateResult res;
  std::mt19937_64 rng(req.seed);
  std::vector<SampleSpec> specs(1);
  specs[0].sampler = req.sampling;
  specs[0].rng = &rng;
  specs[0].logprob = true;
  specs[0].top_logprobs = req.top_logprobs;
  std::vector<Sampled> sampled;
  auto emit = [&]() -> bool {  // returns true when generation must stop
    int32_t tok = sampled.at(0).token;
    res.output_ids.push_back(tok);
    res.output_logprobs.push_back(sampled[0].logprob);
    if (req.top_logprobs > 0) res.top_logprobs.push_back(sampled[0].top);
    bool stop = std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), tok) != req.stop_token_ids.end();
    if (!req.ignore_eos) stop |= std::find(eos_ids_.begin(), eos_ids_.end(), tok) != eos_ids_.end();
    if (stop) {
      res.finish_reason = "stop";
      res.matched_stop = tok;
    }
    return stop;
  };

  double t0 = now_s();
  // Prefill in chunks; logits only for the prompt's last token.
  const int64_t chunk = std::max<int64_t>(1, opts_.chunked_prefill_size);
  for (int64_t b = 0; b < P; b += chunk) {
    int64_t e = std::min(P, b + chunk);
    ForwardBatch fb;
    fb.tokens.assign(req.input_ids.begin() + b, req.input_ids.begin() + e);
    for (int64_t p = b; p < e; ++p) fb.positions.push_back(p);
    fb.seqs.push_back({table.pages.data(), b, e - b, 0});
    if (e == P) {
      fb.logit_rows.push_back(e - b - 1);
      step(fb, specs, sampled);
    } else {
      step(fb, {}, sampled);
    }
  }
  double t1 = now_s();
  res.prefill_seconds = t1 - t0;
  if (req.max_new_tokens == 0) return res;
  bool stop = emit();
  for (int64_t pos = P; !stop && int64_t(res.output_ids.size()) < req.max_new_tokens; ++pos) {
    ForwardBatch fb;
    fb.tokens = {res.output_ids.back()};
    fb.positions = {pos};
    fb.seqs.push_back({table.pages.data(), pos, 1, 0});
    fb.logit_rows = {0};
    step(fb, specs, sampled);
    stop = emit();
  }
  res.decode_seconds = now_s() - t1;
  return res;
}

}  // namespace moeserve

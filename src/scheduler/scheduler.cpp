#include "scheduler/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"

namespace moeserve {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Length: return "length";
    case FinishReason::Stop: return "stop";
    case FinishReason::Abort: return "abort";
    default: return "";
  }
}

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Scheduler::Scheduler(ModelRunner& runner, const SchedulerOptions& opts)
    : runner_(runner),
      opts_(opts),
      cache_(runner.kv().allocator(), runner.kv().shape().page_size, opts.enable_prefix_cache) {
  if (opts_.max_running_requests <= 0) throw_user("--max-running-requests must be positive");
  if (opts_.chunked_prefill_size <= 0) throw_user("--chunked-prefill-size must be positive");
  if (opts_.async_delivery) out_queue_ = std::make_unique<OutputQueue>();
  if (!opts_.step_trace_path.empty()) {
    trace_.reset(std::fopen(opts_.step_trace_path.c_str(), "w"));
    if (!trace_) throw_user("cannot write the step trace to {}", opts_.step_trace_path);
    std::setvbuf(trace_.get(), nullptr, _IOLBF, 0);  // a line a step, readable while the server runs
    std::fprintf(trace_.get(),
                 "launched_s,launch_ms,collected_s,decodes,prompt_tokens,prompt_seqs,sampled,running,waiting\n");
  }
}

void Scheduler::trace_step(const LaunchedStep& st, double collected_s) {
  int64_t decodes = 0, prompt_tokens = 0, prompt_seqs = 0, sampled = 0;
  for (size_t i = 0; i < st.plan.size(); ++i) {
    const auto& [r, chunk] = st.plan[i];
    if (chunk == 1 && r->computed >= int64_t(r->prompt.size())) ++decodes;  // a generated token
    else prompt_tokens += chunk, ++prompt_seqs;
    if (st.logit_row_of[i] >= 0) ++sampled;
  }
  std::fprintf(trace_.get(), "%.6f,%.3f,%.6f,%lld,%lld,%lld,%lld,%zu,%zu\n", st.launched_s, st.launch_s * 1e3,
               collected_s,
               (long long)decodes, (long long)prompt_tokens, (long long)prompt_seqs, (long long)sampled,
               running_.size(), waiting_.size());
}

void Scheduler::validate(const Request& r) const {
  const ModelConfig& c = runner_.config();
  const int64_t P = int64_t(r.prompt.size());
  if (P == 0) throw_user("the prompt is empty");
  for (int32_t id : r.prompt)
    if (id < 0 || id >= c.vocab_size) throw_user("token id {} is outside the vocabulary [0, {})", id, c.vocab_size);
  if (P >= c.max_position_embeddings)
    throw_user("the prompt has {} tokens, but the context length is {} (at least one token must be generated)", P,
               c.max_position_embeddings);
  if (r.params.max_new_tokens < 0) throw_user("max_new_tokens must be >= 0");
  const int64_t max_top = runner_.executor().max_top_logprobs();
  if (std::max(r.params.top_logprobs, r.params.prompt_top_n()) > max_top)
    throw_user("{} top logprobs per token were asked for; the {} executor returns at most {}",
               std::max(r.params.top_logprobs, r.params.prompt_top_n()), runner_.executor().device_name(), max_top);
  const int64_t capacity = runner_.kv().shape().num_pages * runner_.kv().shape().page_size;
  if (P + 1 > capacity)
    throw_user("the prompt has {} tokens, more than the whole KV cache holds ({} tokens; raise --max-total-tokens)",
               P, capacity);
}

void Scheduler::add(std::shared_ptr<Request> r) {
  if (!r->params.seed) r->rng.seed(std::random_device{}());
  else r->rng.seed(*r->params.seed);
  const int64_t P = int64_t(r->prompt.size()), start = r->params.prompt_logprob_start;
  r->prompt_scored = start >= 0 ? std::min(std::max<int64_t>(start, 1), P) : P;
  r->arrival_s = now_s();
  if (r->params.grammar) {  // the document may end at an eos token (even under ignore_eos: nothing else could) or a stop id
    std::vector<int32_t> ends(r->params.stop_token_ids.begin(), r->params.stop_token_ids.end());
    for (int64_t e : runner_.eos_ids()) ends.push_back(int32_t(e));
    r->constraint = std::make_unique<grammar::Constraint>(r->params.grammar, std::move(ends));
    ++stats_.constrained_requests;
  }
  waiting_.push_back(std::move(r));
}

bool Scheduler::allocate(int64_t n, std::vector<int32_t>& out) {
  PageAllocator& a = runner_.kv().allocator();
  if (!a.can_allocate(n)) cache_.evict(n - a.num_free());
  if (!a.can_allocate(n)) return false;
  auto pages = a.allocate(n);
  out.insert(out.end(), pages.begin(), pages.end());
  return true;
}

bool Scheduler::ensure_pages(Request& r, int64_t upto_tokens) {
  int64_t need = runner_.kv().pages_for(upto_tokens) - int64_t(r.pages.size());
  return need <= 0 || allocate(need, r.pages);
}

void Scheduler::release_kv(Request& r) {
  if (r.pages.empty() && r.prefix.nodes.empty()) return;
  std::vector<int32_t> tokens(size_t(r.computed));
  for (int64_t i = 0; i < r.computed; ++i) tokens[i] = r.token_at(i);
  cache_.release(tokens.data(), r.computed, r.pages, r.prefix);
  r.pages.clear();
  r.prefix = {};
  r.computed = 0;
}

void Scheduler::preempt(std::shared_ptr<Request> victim) {
  log_info("KV cache full: preempting request {} ({} tokens computed); it will recompute", victim->id,
           victim->computed);
  release_kv(*victim);  // its KV goes to the prefix cache, so recomputation is mostly a cache hit
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  waiting_.push_front(std::move(victim));
  ++stats_.preemptions;
}

void Scheduler::finish(Request& r, FinishReason why) {
  r.finish = why;
  release_kv(r);
}

bool Scheduler::try_admit(const std::shared_ptr<Request>& r) {
  const int64_t total = r->total_tokens();
  // At least the last token is computed, so that the step yields logits.
  std::vector<int32_t> tokens(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) tokens[i] = r->token_at(i);
  // A request scoring its prompt computes every position from the one before its next scored token.
  const int64_t limit = r->scoring_prompt() ? std::min(total - 1, r->prompt_scored - 1) : total - 1;
  PrefixCache::Match m = cache_.match(tokens.data(), limit);
  cache_.lock(m);
  std::vector<int32_t> pages = m.pages;
  const int64_t need = runner_.kv().pages_for(total) - int64_t(m.pages.size());
  if (!allocate(need, pages)) {
    cache_.unlock(m.nodes);
    return false;
  }
  r->pages = std::move(pages);
  r->prefix = std::move(m);
  r->computed = r->prefix.tokens() * cache_.page_size();
  if (r->output.empty()) {
    r->cached_tokens = r->computed;
    stats_.prompt_tokens += int64_t(r->prompt.size());
    stats_.cached_prompt_tokens += r->cached_tokens;
  }
  r->admitted_order = ++admitted_counter_;
  return true;
}

void Scheduler::share_prompt_pages(Request& r) {
  const int64_t upto = std::min(r.computed, int64_t(r.prompt.size()));
  if (upto / cache_.page_size() <= int64_t(r.prefix.nodes.size())) return;
  cache_.insert_running(r.prompt.data(), upto, r.pages, r.prefix);
}

// SGLang defers a waiting request whose prefix matches one in the same batch by 32 tokens or more where the tree
// matches fewer (its "in-batch prefix caching"); here the same rule, as FCFS: the head waits, nobody overtakes it.
constexpr int64_t kSharedPrefixMin = 32;

bool Scheduler::waits_for_shared_prefix(const Request& r) {
  // (A preempted request recomputing, or one scoring its prompt from the start, would not take the pages anyway.)
  if (!cache_.enabled() || !r.output.empty() || r.scoring_prompt()) return false;
  const int64_t ps = cache_.page_size();
  const int64_t usable = (int64_t(r.prompt.size()) - 1) / ps;  // full pages before the last prompt token
  int64_t best = 0;                                            // pages shared with a prefilling request
  for (const auto& o : running_) {
    if (o->computed >= int64_t(o->prompt.size())) continue;  // its prompt pages are in the tree or its own
    const int64_t n = std::min(usable, int64_t(o->prompt.size()) / ps);  // pages both prompts fill
    int64_t same = 0;
    while (same < n * ps && o->prompt[size_t(same)] == r.prompt[size_t(same)]) ++same;
    best = std::max(best, same / ps);
  }
  if (best * ps < kSharedPrefixMin) return false;
  const PrefixCache::Match m = cache_.match(r.prompt.data(), usable * ps);
  return (best - m.tokens()) * ps >= kSharedPrefixMin;
}

SampleSpec Scheduler::sample_spec(Request& r, int64_t pending) const {
  const SamplingParams& p = r.params;
  SampleSpec s;
  s.sampler = kernels::SamplerParams{p.temperature, p.top_k, p.top_p, p.min_p};
  s.presence_penalty = p.presence_penalty;
  s.frequency_penalty = p.frequency_penalty;
  s.repetition_penalty = p.repetition_penalty;
  s.prompt = &r.prompt;
  s.output = &r.output;
  const int64_t V = runner_.config().vocab_size;
  // min_new_tokens bans the ends; a JSON grammar bans them itself until its document is complete, and then allows
  // nothing else, so for a constrained request the grammar decides (its output may end before min_new_tokens).
  if (int64_t(r.output.size()) + pending < p.min_new_tokens && !r.constraint) {
    if (!p.ignore_eos)
      for (int64_t e : runner_.eos_ids())
        if (e >= 0 && e < V) s.banned.push_back(int32_t(e));
    for (int64_t e : p.stop_token_ids)
      if (e >= 0 && e < V) s.banned.push_back(int32_t(e));
  }
  if (!p.logit_bias.empty()) s.bias = &p.logit_bias;
  // (A constrained request's grammar mask is added by launch(), every such row of the step side by side, or, where
  // the step in flight samples the token before it, by complete_masks() once that token is in.)
  s.rng = &r.rng;
  s.logprob = p.return_logprob || p.top_logprobs > 0;
  s.top_logprobs = p.top_logprobs;
  return s;
}

void Scheduler::accept_token(Request& r, const Sampled& smp, std::vector<RequestOutput>& outs) {
  const ModelConfig& c = runner_.config();
  const SamplingParams& p = r.params;
  const auto& eos = runner_.eos_ids();
  const int32_t tok = smp.token;
  RequestOutput o;
  if (p.max_new_tokens == 0) {  // the prompt only (SGLang's way to cache a prefix; OpenAI's echo of the prompt)
    finish(r, FinishReason::Length);
    o.finish = r.finish;
    outs.push_back(std::move(o));
    return;
  }
  if (r.constraint && !r.constraint->accept(tok)) {  // the samplers honour the mask: a stuck grammar or a bug
    finish(r, FinishReason::Abort);
    o.finish = r.finish;
    o.abort_message = r.constraint->stuck()
                          ? "the JSON schema allows no token here (more alternatives open than the grammar follows)"
                          : fmt::format("internal error: token {} broke the request's JSON grammar", tok);
    outs.push_back(std::move(o));
    return;
  }
  o.new_tokens.push_back(tok);
  if (p.return_logprob || p.top_logprobs > 0) {
    o.new_logprobs.push_back(smp.logprob);
    if (p.top_logprobs > 0) o.new_top_logprobs.push_back(smp.top);
  }
  if (r.output.empty()) r.first_token_s = now_s();
  r.output.push_back(tok);
  ++stats_.generated_tokens;
  bool is_stop = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) != p.stop_token_ids.end();
  if (!p.ignore_eos) is_stop |= std::find(eos.begin(), eos.end(), int64_t(tok)) != eos.end();
  if (is_stop && (int64_t(r.output.size()) > p.min_new_tokens - 1 || r.constraint)) {
    r.matched_stop_token = tok;
    finish(r, FinishReason::Stop);
  } else if (int64_t(r.output.size()) >= p.max_new_tokens || r.total_tokens() >= c.max_position_embeddings) {
    finish(r, FinishReason::Length);
  }
  o.finish = r.finish;
  o.matched_stop_token = r.matched_stop_token;
  outs.push_back(std::move(o));
}

bool Scheduler::step() {
  const double t_begin = now_s();
  struct StepTimer {
    SchedulerStats& s;
    double t0;
    ~StepTimer() { s.step_seconds += now_s() - t0; }
  } step_timer{stats_, t_begin};
  Delivery deliveries;
  if (!launched_.empty()) {
    // The overlap schedule: a step is in flight. Launch the one after it if its batch is known already, then
    // take the running step's results (the device works on the next one meanwhile).
    launch_ahead();
    collect_oldest(deliveries);
    deliver(deliveries);
    complete_masks();
    return true;
  }
  // Aborts first: they free pages for everyone else.
  auto abort_out = [&](const std::shared_ptr<Request>& r, const std::string& msg) {
    RequestOutput o;
    o.finish = FinishReason::Abort;
    o.abort_message = msg;
    deliveries.push_back({r, o});
  };
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->abort_requested) {
      (*it)->finish = FinishReason::Abort;
      abort_out(*it, "aborted by the client");
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->abort_requested) {
      finish(**it, FinishReason::Abort);
      abort_out(*it, "aborted by the client");
      it = running_.erase(it);
    } else {
      ++it;
    }
  }

  // Which requests compute how many tokens this step.
  int64_t budget = std::max<int64_t>(opts_.chunked_prefill_size, int64_t(running_.size()));
  std::vector<std::pair<std::shared_ptr<Request>, int64_t>> plan;
  auto plan_running = [&](bool decodes) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      auto r = running_[i];
      if ((r->remaining() == 1) != decodes) continue;
      int64_t chunk = std::min(r->remaining(), budget);
      while (!ensure_pages(*r, r->computed + chunk)) {
        // Out of pages: preempt the newest running request (possibly this one).
        auto victim = *std::max_element(running_.begin(), running_.end(), [](auto& a, auto& b) {
          return a->admitted_order < b->admitted_order;
        });
        plan.erase(std::remove_if(plan.begin(), plan.end(), [&](auto& pr) { return pr.first == victim; }), plan.end());
        bool self = victim == r;
        size_t vi = size_t(std::find(running_.begin(), running_.end(), victim) - running_.begin());
        preempt(victim);
        if (vi <= i) --i;  // running_ shifted
        if (self) {
          chunk = 0;
          break;
        }
      }
      if (chunk == 0) continue;
      plan.push_back({r, chunk});
      budget -= chunk;
    }
  };
  plan_running(true);
  plan_running(false);
  // Recompute the budget from the plan (preemptions may have removed entries).
  budget = std::max<int64_t>(opts_.chunked_prefill_size, int64_t(running_.size()));
  for (auto& [r, chunk] : plan) budget -= chunk;
  while (!waiting_.empty() && budget > 0 && int64_t(running_.size()) < opts_.max_running_requests) {
    auto r = waiting_.front();
    // FCFS: the head waits for pages (or for a prefill it shares a prefix with), nobody overtakes it
    if (waits_for_shared_prefix(*r) || !try_admit(r)) break;
    waiting_.pop_front();
    running_.push_back(r);
    int64_t chunk = std::min(r->remaining(), budget);
    plan.push_back({r, chunk});
    budget -= chunk;
  }

  fit_logit_rows(plan);
  if (plan.empty()) {
    deliver(deliveries);
    return !deliveries.empty();
  }

  StepBatch b;
  for (auto& [r, chunk] : plan) add_chunk(b, r, r->computed, chunk);
  launch(std::move(b));
  if (opts_.overlap_schedule) launch_ahead();
  collect_oldest(deliveries);
  deliver(deliveries);
  complete_masks();
  return true;
}

std::pair<int64_t, int64_t> Scheduler::scored_positions(const Request& r, int64_t computed, int64_t chunk) {
  // Position q's logits score the prompt token at q + 1, for q + 1 in [prompt_scored, prompt size).
  return {std::max(computed, r.prompt_scored - 1), std::min(computed + chunk, int64_t(r.prompt.size()) - 1)};
}

int64_t Scheduler::logit_rows_for(const Request& r, int64_t computed, int64_t chunk) {
  const auto [first, end] = scored_positions(r, computed, chunk);
  return std::max<int64_t>(end - first, 0) + (computed + chunk == r.total_tokens() ? 1 : 0);
}

void Scheduler::fit_logit_rows(Plan& plan) const {
  bool any = false;
  for (auto& [r, chunk] : plan) any |= r->scoring_prompt();
  if (!any) return;
  const int64_t max_rows = runner_.executor().max_logit_rows();
  int64_t used = 0;  // every other entry: at most its sampling row
  for (auto& [r, chunk] : plan)
    if (!r->scoring_prompt()) ++used;
  for (auto& [r, chunk] : plan) {
    if (!r->scoring_prompt()) continue;
    const int64_t left = max_rows - used;
    // The rows grow by at most one a token: shrink to the first scored positions that fit (none: wait a step).
    const int64_t unscored = scored_positions(*r, r->computed, chunk).first - r->computed;  // positions before them
    chunk = std::min(chunk, std::max<int64_t>(unscored + left, 0));
    while (chunk > 0 && logit_rows_for(*r, r->computed, chunk) > left) --chunk;
    used += chunk > 0 ? logit_rows_for(*r, r->computed, chunk) : 0;
  }
  plan.erase(std::remove_if(plan.begin(), plan.end(), [](auto& e) { return e.second == 0; }), plan.end());
}

void Scheduler::add_chunk(StepBatch& b, const std::shared_ptr<Request>& r, int64_t computed, int64_t chunk,
                          int64_t sample_row, std::optional<SampleSpec> spec) {
  ForwardBatch& fb = b.fb;
  const int64_t pending = sample_row >= 0 ? 1 : 0, row = int64_t(fb.tokens.size());
  for (int64_t p = computed; p < computed + chunk; ++p) {
    if (pending > 0 && p == r->total_tokens()) {
      fb.previous_samples.resize(fb.tokens.size(), -1);
      fb.previous_samples.push_back(int32_t(sample_row));
      fb.tokens.push_back(0);
    } else {
      fb.tokens.push_back(r->token_at(p));
    }
    fb.positions.push_back(p);
  }
  fb.seqs.push_back({r->pages.data(), computed, chunk, row});
  // Prompt logprobs: a row a scored position, its prompt token forced (SampleSpec::forced_token: the logprobs of
  // the raw logits), before the sampling row.
  b.step.score_first.push_back(int64_t(fb.logit_rows.size()));
  const auto [first_scored, end_scored] = scored_positions(*r, computed, chunk);
  for (int64_t q = first_scored; q < end_scored; ++q) {
    fb.logit_rows.push_back(row + (q - computed));
    SampleSpec s;
    s.sampler.temperature = 0.0f;
    s.forced_token = r->prompt[size_t(q + 1)];
    s.rng = &r->rng;
    s.logprob = true;
    s.top_logprobs = r->params.prompt_top_n();
    b.specs.push_back(std::move(s));
  }
  b.step.score_rows.push_back(int64_t(fb.logit_rows.size()) - b.step.score_first.back());
  int64_t logit_row = -1;
  if (computed + chunk == r->total_tokens() + pending) {
    logit_row = int64_t(fb.logit_rows.size());
    fb.logit_rows.push_back(row + chunk - 1);
    b.specs.push_back(spec ? std::move(*spec) : sample_spec(*r, pending));
    if (r->constraint) b.masks.push_back({b.specs.size() - 1, r.get(), pending > 0});
  }
  b.step.plan.push_back({r, chunk});
  b.step.logit_row_of.push_back(logit_row);
}

template <class F>
void Scheduler::compute_masks(size_t n, F mask_of) {
  if (n == 0) return;
  const double t0 = now_s();
  // Each Constraint has its own scratch and the vocabulary is read only: the rows' masks side by side.
  if (n > 1 && !mask_pool_)
    mask_pool_ = std::make_unique<ThreadPool>(int(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)));
  auto fill = [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      auto [r, words] = mask_of(size_t(i));
      r->constraint->allowed_tokens(*words);
    }
  };
  if (n == 1) fill(0, 1);
  else mask_pool_->parallel_for(int64_t(n), 1, fill);
  stats_.grammar_mask_seconds += now_s() - t0;
  stats_.grammar_masks += int64_t(n);
}

void Scheduler::launch(StepBatch b) {
  if (!b.fb.previous_samples.empty()) b.fb.previous_samples.resize(b.fb.tokens.size(), -1);
  std::vector<StepBatch::Mask> now;
  std::vector<int32_t> later;
  for (const auto& m : b.masks) {
    if (!m.later) now.push_back(m);
    else later.push_back(int32_t(m.spec)), b.step.later_masks.push_back({int32_t(m.spec), m.r});
  }
  compute_masks(now.size(), [&](size_t i) { return std::pair{now[i].r, &b.specs[now[i].spec].allowed}; });
  const double t0 = now_s();
  runner_.launch(b.fb, b.specs, later);
  const double t1 = now_s();
  stats_.forward_seconds += t1 - t0;
  b.step.launched_s = t0;
  b.step.launch_s = t1 - t0;
  launched_.push_back(std::move(b.step));
}

void Scheduler::complete_masks() {
  if (launched_.empty() || launched_.back().later_masks.empty()) return;
  auto& later = launched_.back().later_masks;
  std::vector<std::vector<uint32_t>> masks(later.size());
  // A request that ended with the step before (its row is dropped at collection) keeps an empty mask: any token.
  std::vector<size_t> live;
  for (size_t i = 0; i < later.size(); ++i)
    if (later[i].second->finish == FinishReason::None) live.push_back(i);
  compute_masks(live.size(), [&](size_t i) { return std::pair{later[live[i]].second, &masks[live[i]]}; });
  const double t0 = now_s();
  runner_.complete_launch(masks);
  stats_.forward_seconds += now_s() - t0;
  later.clear();
}

void Scheduler::launch_ahead() {
  if (launched_.size() != 1) return;
  if (opts_.overlap_mixed_steps) {
    if (launch_ahead_mixed()) ++stats_.overlapped_steps;
    return;
  }
  const LaunchedStep& cur = launched_.back();
  // Admissions, aborts, prefill chunks, penalties and bans go through the ordinary path, one step at a time.
  if (!waiting_.empty() && int64_t(running_.size()) < opts_.max_running_requests) return;
  if (cur.plan.size() != running_.size()) return;
  const int64_t max_pos = runner_.config().max_position_embeddings;
  bool any_continues = false;
  std::vector<SampleSpec> specs;
  for (size_t i = 0; i < cur.plan.size(); ++i) {
    Request& r = *cur.plan[i].first;
    if (cur.logit_row_of[i] != int64_t(i) || r.abort_requested || r.finish != FinishReason::None) return;
    const int64_t generated = int64_t(r.output.size()) + 1;  // once the running step's token is in
    // Its eos / stop-id bans change per token (a constrained request's grammar decides instead; its mask comes once
    // the running step's token is in: complete_masks).
    if (generated < r.params.min_new_tokens && !r.constraint) return;
    SampleSpec s = sample_spec(r, 1);
    if (s.penalized()) return;  // the penalties need the running step's token on the host
    const int64_t pos = r.computed + cur.plan[i].second;  // where that token goes
    if (pos + 1 > max_pos) return;
    any_continues |= generated < r.params.max_new_tokens && pos + 1 < max_pos;
    specs.push_back(std::move(s));
  }
  if (!any_continues) return;  // every request ends with the running step
  for (size_t i = 0; i < cur.plan.size(); ++i) {
    Request& r = *cur.plan[i].first;
    if (!ensure_pages(r, r.computed + cur.plan[i].second + 1)) return;  // the ordinary path decides whom to preempt
  }
  StepBatch b;
  for (size_t i = 0; i < cur.plan.size(); ++i) {
    const std::shared_ptr<Request>& r = cur.plan[i].first;
    add_chunk(b, r, r->computed + cur.plan[i].second, 1, int64_t(i), std::move(specs[i]));
  }
  launch(std::move(b));
  ++stats_.overlapped_steps;
}

// The step the ordinary path would build once the running step (cur) is collected, built now: each running
// request as it will stand then (cur's chunk computed; one more, unknown, token if cur samples it), decodes first,
// then prompt chunks, then admissions, under the same budget. Declines (the ordinary path runs next) where the
// host needs cur's results: an abort, penalties or eos bans on a request cur samples, a preemption.
bool Scheduler::launch_ahead_mixed() {
  const LaunchedStep& cur = launched_.back();
  for (auto& r : waiting_)
    if (r->abort_requested) return false;
  const int64_t max_pos = runner_.config().max_position_embeddings;
  std::unordered_map<const Request*, size_t> in_cur;  // request -> its entry of cur's plan
  for (size_t i = 0; i < cur.plan.size(); ++i) in_cur.emplace(cur.plan[i].first.get(), i);
  struct Next {
    std::shared_ptr<Request> r;
    int64_t computed;    // after cur
    int64_t sample_row;  // >= 0: cur samples r's next token for this logit row (still on the device)
    std::optional<SampleSpec> spec;
    int64_t remaining() const { return r->total_tokens() + (sample_row >= 0 ? 1 : 0) - computed; }
  };
  std::vector<Next> state;
  for (auto& r : running_) {
    // (a request scoring its prompt: the ordinary path fits its rows, fit_logit_rows)
    if (r->abort_requested || r->finish != FinishReason::None || r->scoring_prompt()) return false;
    Next n{r, r->computed, -1, std::nullopt};
    if (auto it = in_cur.find(r.get()); it != in_cur.end()) {
      n.computed += cur.plan[it->second].second;
      n.sample_row = cur.logit_row_of[it->second];
    }
    if (n.sample_row >= 0) {
      const int64_t generated = int64_t(r->output.size()) + 1;
      // Ends with cur for sure (length or context): no row. A stop token is not known yet: it keeps its row,
      // which collect_oldest drops.
      if (generated >= r->params.max_new_tokens || r->total_tokens() + 1 >= max_pos) continue;
      // Its eos / stop-id bans change per token (a constrained request's grammar decides instead; its mask comes
      // once cur's token is in: complete_masks).
      if (generated < r->params.min_new_tokens && !r->constraint) return false;
      n.spec = sample_spec(*r, 1);
      if (n.spec->penalized()) return false;  // the penalties need cur's token on the host
    }
    state.push_back(std::move(n));
  }
  int64_t budget = std::max<int64_t>(opts_.chunked_prefill_size, int64_t(running_.size()));
  std::vector<std::pair<Next*, int64_t>> plan;
  for (bool decodes : {true, false})
    for (Next& n : state) {
      if (budget <= 0) break;
      const int64_t remaining = n.remaining();
      if (remaining <= 0 || (remaining == 1) != decodes) continue;
      const int64_t chunk = std::min(remaining, budget);
      if (!ensure_pages(*n.r, n.computed + chunk)) return false;  // the ordinary path decides whom to preempt
      plan.push_back({&n, chunk});
      budget -= chunk;
    }
  std::vector<Next> admitted;
  admitted.reserve(waiting_.size());
  while (!waiting_.empty() && budget > 0 && int64_t(running_.size()) < opts_.max_running_requests) {
    auto r = waiting_.front();
    if (r->scoring_prompt() || waits_for_shared_prefix(*r) || !try_admit(r)) break;  // FCFS, as in step()
    waiting_.pop_front();
    running_.push_back(r);
    admitted.push_back({r, r->computed, -1, std::nullopt});
    const int64_t chunk = std::min(r->remaining(), budget);
    plan.push_back({&admitted.back(), chunk});
    budget -= chunk;
  }
  if (plan.empty()) return false;
  StepBatch b;
  for (auto& [n, chunk] : plan) add_chunk(b, n->r, n->computed, chunk, n->sample_row, std::move(n->spec));
  launch(std::move(b));
  return true;
}

void Scheduler::collect_oldest(Delivery& deliveries) {
  LaunchedStep st = std::move(launched_.front());
  launched_.pop_front();
  const double t0 = now_s();
  runner_.collect(sampled_);
  stats_.forward_seconds += now_s() - t0;
  ++stats_.steps;
  if (trace_) trace_step(st, now_s());
  std::vector<RequestOutput> outs;
  for (size_t i = 0; i < st.plan.size(); ++i) {
    auto& [r, chunk] = st.plan[i];
    // A request that finished in the step before this one was launched ahead of it: its row is dropped (its
    // pages went back already; nothing of it is read again).
    if (r->finish != FinishReason::None) continue;
    r->computed += chunk;
    // New prompt pages only from a chunk that computed prompt positions (a request whose sharing stopped at another's
    // page would otherwise look the tree up again every decode step).
    if (r->computed - chunk < int64_t(r->prompt.size())) share_prompt_pages(*r);
    if (st.logit_row_of[i] < 0 && st.score_rows[i] == 0) continue;
    outs.clear();
    if (st.logit_row_of[i] >= 0) accept_token(*r, sampled_.at(size_t(st.logit_row_of[i])), outs);
    else outs.emplace_back();
    RequestOutput& o = outs.back();
    for (int64_t k = 0; k < st.score_rows[i]; ++k) {  // the prompt positions this step scored, in order
      const Sampled& s = sampled_.at(size_t(st.score_first[i] + k));
      o.new_prompt_logprobs.push_back(s.logprob);
      o.new_prompt_ranks.push_back(s.rank);
      if (r->params.prompt_top_n() > 0) o.new_prompt_top_logprobs.push_back(s.top);
    }
    r->prompt_scored += st.score_rows[i];
    o.prompt_tokens = int64_t(r->prompt.size());
    o.completion_tokens = int64_t(r->output.size());
    o.cached_tokens = r->cached_tokens;
    deliveries.push_back({r, std::move(o)});
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [](auto& r) { return r->finish != FinishReason::None; }),
                 running_.end());
}

double run_sinks(Delivery& deliveries) {
  const double t0 = now_s();
  // A sink that throws is a bug in the layer above: that request is aborted, the engine and the other
  // requests carry on.
  for (auto& [r, o] : deliveries) {
    try {
      r->sink(o);
    } catch (const std::exception& e) {
      log_error("request {}: output handler failed: {}; aborting the request", r->id, e.what());
      r->abort_requested = true;
    }
  }
  return now_s() - t0;
}

OutputQueue::OutputQueue() : thread_([this] { loop(); }) {}

OutputQueue::~OutputQueue() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void OutputQueue::push(Delivery d) {
  if (d.empty()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(d));
  }
  cv_.notify_one();
}

void OutputQueue::flush() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
}

void OutputQueue::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stop_ with nothing left to deliver
    Delivery d = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    const double s = run_sinks(d);
    busy_ns_ += int64_t(s * 1e9);
    d.clear();  // drop the request references outside the lock
    lk.lock();
    busy_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

void Scheduler::deliver(Delivery& deliveries) {
  if (out_queue_) {
    out_queue_->push(std::move(deliveries));
    deliveries.clear();
    return;
  }
  stats_.deliver_seconds += run_sinks(deliveries);
}

void Scheduler::abort_all(const std::string& message) {
  if (!launched_.empty()) {
    launched_.clear();  // their results are of no use now (and after a device failure not to be waited for)
    runner_.executor().drop_launched();
  }
  for (auto& r : running_) finish(*r, FinishReason::Abort);
  Delivery deliveries;
  for (auto& r : running_) deliveries.push_back({r, {}});
  for (auto& r : waiting_) deliveries.push_back({r, {}});
  running_.clear();
  waiting_.clear();
  for (auto& [r, o] : deliveries) {
    r->finish = FinishReason::Abort;
    o.finish = FinishReason::Abort;
    o.abort_message = message;
  }
  deliver(deliveries);
}

int64_t Scheduler::flush_prefix_cache() { return cache_.flush(); }

SchedulerStats Scheduler::stats() const {
  SchedulerStats s = stats_;
  if (out_queue_) s.deliver_seconds += out_queue_->seconds();
  s.running = int64_t(running_.size());
  s.waiting = int64_t(waiting_.size());
  const PageAllocator& a = runner_.kv().allocator();
  s.kv_pages_total = a.num_pages();
  s.kv_pages_cached = cache_.cached_pages();
  s.kv_pages_used = a.num_pages() - a.num_free();
  return s;
}

void Scheduler::check_integrity() const {
  int64_t held = 0;
  for (auto& r : running_) held += int64_t(r->pages.size()) - int64_t(r->prefix.nodes.size());
  cache_.check_integrity(held);
  for (auto& r : waiting_) MS_CHECK(r->pages.empty(), "a waiting request holds pages");
}

}  // namespace moeserve

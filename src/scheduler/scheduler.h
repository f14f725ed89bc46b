// Continuous batching: every step runs one forward over the running requests' next tokens (decodes of one
// token and chunks of prefills) under a token budget, admits waiting requests FCFS when KV pages allow
// (reusing cached prefixes), preempts the newest request when pages run out (its KV goes to the prefix cache
// and it recomputes later), samples, and reports outputs through each request's sink.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "executor/model_runner.h"
#include "kv/prefix_cache.h"
#include "scheduler/request.h"

namespace moeserve {

struct SchedulerOptions {
  int64_t max_running_requests = 64;
  int64_t chunked_prefill_size = 512;  // tokens per step (decodes included)
  bool enable_prefix_cache = true;
};

struct SchedulerStats {
  int64_t running = 0, waiting = 0;
  int64_t kv_pages_used = 0, kv_pages_total = 0, kv_pages_cached = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, cached_prompt_tokens = 0;
  int64_t preemptions = 0, steps = 0;
};

class Scheduler {
 public:
  Scheduler(ModelRunner& runner, const SchedulerOptions& opts);

  // UserError if the request can never run here (empty, ids outside the vocabulary, longer than the context
  // or than the whole KV cache).
  void validate(const Request& r) const;
  void add(std::shared_ptr<Request> r);
  bool idle() const { return running_.empty() && waiting_.empty(); }
  // One iteration: aborts, admission, forward, sampling, delivery. Returns false if there was nothing to do.
  bool step();
  // Aborts everything (engine failure or shutdown): every sink gets an Abort with the message.
  void abort_all(const std::string& message);
  int64_t flush_prefix_cache();
  SchedulerStats stats() const;
  PrefixCache& prefix_cache() { return cache_; }
  void check_integrity() const;

 private:
  bool ensure_pages(Request& r, int64_t upto_tokens);
  bool allocate(int64_t n, std::vector<int32_t>& out);
  void preempt(std::shared_ptr<Request> victim);
  void finish(Request& r, FinishReason why);
  void release_kv(Request& r);
  bool try_admit(const std::shared_ptr<Request>& r);
  void deliver(std::vector<std::pair<std::shared_ptr<Request>, RequestOutput>>& deliveries);
  SampleSpec sample_spec(Request& r) const;
  void accept_token(Request& r, const Sampled& s, std::vector<RequestOutput>& outs);

  ModelRunner& runner_;
  SchedulerOptions opts_;
  PrefixCache cache_;
  std::deque<std::shared_ptr<Request>> waiting_;
  std::vector<std::shared_ptr<Request>> running_;
  int64_t admitted_counter_ = 0;
  SchedulerStats stats_;
  std::vector<Sampled> sampled_;
};

}  // namespace moeserve

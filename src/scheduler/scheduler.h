// Continuous batching: every step runs one forward over the running requests' next tokens (decodes of one
// token and chunks of prefills) under a token budget, admits waiting requests FCFS when KV pages allow
// (reusing cached prefixes), preempts the newest request when pages run out (its KV goes to the prefix cache
// and it recomputes later), samples, and reports outputs through each request's sink.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <memory>
#include <vector>

#include "core/threadpool.h"
#include "executor/model_runner.h"
#include "kv/prefix_cache.h"
#include "scheduler/request.h"

namespace moeserve {

struct SchedulerOptions {
  int64_t max_running_requests = 64;
  int64_t chunked_prefill_size = 512;  // tokens per step (decodes included)
  bool enable_prefix_cache = true;
  // Run the sinks (detokenizing, parsers, response chunks) on a delivery thread, in order, so that they overlap
  // the next step instead of delaying it. Off: sinks run inside step() (tests that step by hand).
  bool async_delivery = false;
  // The overlap schedule: while a decode step runs on the device, the next one (the same requests, each fed the
  // token the running step samples) is already launched, so the device never waits for the host's work between
  // steps (processing outputs, scheduling, preparing the metadata). Used while every running request decodes
  // plainly (no penalties, no bans, nothing waiting to be admitted, pages available); a request that finishes
  // in the running step has its row of the next step dropped.
  bool overlap_schedule = false;
  // With it, look-ahead steps also carry prompt chunks and admit waiting requests (the batch the ordinary path
  // would build once the running step is in, its decodes fed the running step's samples on the device), so
  // prefill-heavy phases overlap too. Off: only all-decode batches are launched ahead.
  bool overlap_mixed_steps = true;
  // Diagnostics: one CSV line a collected step (when its launch began and how long the launch took on the host, when
  // it was collected, its decodes, prompt tokens and sequences, sampled rows, and the running / waiting counts
  // then) written to this file. Empty: off.
  std::string step_trace_path;
};

using Delivery = std::vector<std::pair<std::shared_ptr<Request>, RequestOutput>>;

// The delivery thread: runs each batch's sinks in submission order (so each request sees its outputs in
// order). A sink that throws gets its request aborted at the next step; the others carry on.
class OutputQueue {
 public:
  OutputQueue();
  ~OutputQueue();  // delivers what is queued, then stops
  void push(Delivery d);
  void flush();  // returns once everything pushed so far has been delivered
  double seconds() const { return double(busy_ns_.load()) * 1e-9; }

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Delivery> queue_;
  bool stop_ = false, busy_ = false;
  std::atomic<int64_t> busy_ns_{0};
  std::thread thread_;
};

// Calls every sink of a batch; returns the seconds it took.
double run_sinks(Delivery& d);

struct SchedulerStats {
  int64_t running = 0, waiting = 0;
  int64_t kv_pages_used = 0, kv_pages_total = 0, kv_pages_cached = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, cached_prompt_tokens = 0;
  int64_t preemptions = 0, steps = 0;
  int64_t overlapped_steps = 0;  // steps launched while the step before was still running (overlap schedule)
  // Where the engine thread's time goes: whole steps, the executor's forward + sampling (device time plus its
  // launch and copy overhead), and output delivery (detokenizing, parsers, response chunks).
  double step_seconds = 0, forward_seconds = 0, deliver_seconds = 0;
  // Constrained decoding: requests admitted with a grammar, the token masks computed for their rows and the engine
  // thread's wall time computing them (the rows of a step side by side; a look-ahead step's while its forward runs).
  int64_t constrained_requests = 0, grammar_masks = 0;
  double grammar_mask_seconds = 0;
};

class Scheduler {
 public:
  Scheduler(ModelRunner& runner, const SchedulerOptions& opts);

  // UserError if the request can never run here (empty, ids outside the vocabulary, longer than the context
  // or than the whole KV cache).
  void validate(const Request& r) const;
  void add(std::shared_ptr<Request> r);
  bool idle() const { return running_.empty() && waiting_.empty() && launched_.empty(); }
  // One iteration: aborts, admission, forward, sampling, delivery. Returns false if there was nothing to do.
  bool step();
  // Aborts everything (engine failure or shutdown): every sink gets an Abort with the message.
  void abort_all(const std::string& message);
  int64_t flush_prefix_cache();
  SchedulerStats stats() const;
  PrefixCache& prefix_cache() { return cache_; }
  // Waits until every output produced so far reached its sink (with async delivery).
  void flush_outputs() {
    if (out_queue_) out_queue_->flush();
  }
  void check_integrity() const;

 private:
  bool ensure_pages(Request& r, int64_t upto_tokens);
  bool allocate(int64_t n, std::vector<int32_t>& out);
  void preempt(std::shared_ptr<Request> victim);
  void finish(Request& r, FinishReason why);
  void release_kv(Request& r);
  bool try_admit(const std::shared_ptr<Request>& r);
  // The prefix cache while requests run: a request's computed prompt pages join the tree as its prefill goes
  // (share_prompt_pages, after each collected step), and a waiting request that shares at least kSharedPrefixMin
  // prompt tokens more with a request still prefilling than the tree holds waits for that prefill instead of
  // computing the same pages beside it (waits_for_shared_prefix: the n choices of one request, a burst of requests
  // with one system prompt).
  void share_prompt_pages(Request& r);
  bool waits_for_shared_prefix(const Request& r);
  void deliver(Delivery& deliveries);
  // How to sample r's next token; `pending` tokens of r are still being sampled on the device (the overlap
  // schedule), so the eos / stop-id bans of min_new_tokens count them as generated.
  SampleSpec sample_spec(Request& r, int64_t pending = 0) const;
  void accept_token(Request& r, const Sampled& s, std::vector<RequestOutput>& outs);
  using Plan = std::vector<std::pair<std::shared_ptr<Request>, int64_t>>;  // request, tokens this step
  struct LaunchedStep {
    Plan plan;
    std::vector<int64_t> logit_row_of;  // per plan entry: its logit row, or -1
    // Per plan entry: its prompt-logprob rows (the first, and how many; they score its next prompt positions).
    std::vector<int64_t> score_first, score_rows;
    double launched_s = 0, launch_s = 0;  // for the step trace: when the launch began, and how long it took
    // Constrained rows whose masks wait for the step in flight (Executor::launch's `later`): logit row, request.
    std::vector<std::pair<int32_t, Request*>> later_masks;
  };
  // A step's batch as it is built: the forward batch, the plan with its logit rows, one spec a logit row.
  struct StepBatch {
    ForwardBatch fb;
    LaunchedStep step;
    std::vector<SampleSpec> specs;
    // Constrained rows: spec, request, and whether its mask waits for the token the step in flight samples for it
    // (complete_masks) or launch() fills it in.
    struct Mask {
      size_t spec;
      Request* r;
      bool later;
    };
    std::vector<Mask> masks;
  };
  // Prompt logprobs: the positions q of r's chunk [computed, computed + chunk) whose logits score a prompt token (the
  // one at q + 1), as [first, end); the logit rows the chunk takes (those, and the sampling row where the chunk ends
  // r's tokens); and the chunks shrunk so that a step's rows fit the executor.
  static std::pair<int64_t, int64_t> scored_positions(const Request& r, int64_t computed, int64_t chunk);
  static int64_t logit_rows_for(const Request& r, int64_t computed, int64_t chunk);
  void fit_logit_rows(Plan& plan) const;
  // Appends r's tokens [computed, computed + chunk) to b, with a logit row where they end r's known tokens.
  // sample_row >= 0: r's token at total_tokens() is the one the running step samples for that logit row (a
  // placeholder here, filled in on the device), so r's tokens end one further. `spec`: r's sampling spec when
  // the caller has it already.
  void add_chunk(StepBatch& b, const std::shared_ptr<Request>& r, int64_t computed, int64_t chunk,
                 int64_t sample_row = -1, std::optional<SampleSpec> spec = std::nullopt);
  void launch(StepBatch b);
  // Computes the masks of rows [0, n) side by side (up to 8 threads): mask_of(i) -> {request, its words}.
  template <class F>
  void compute_masks(size_t n, F mask_of);
  // The look-ahead step's later masks, now that the step before it is collected: computed and handed to the
  // executor, which then starts its sampling.
  void complete_masks();
  void launch_ahead();
  bool launch_ahead_mixed();
  void collect_oldest(Delivery& deliveries);
  void trace_step(const LaunchedStep& st, double collected_s);

  ModelRunner& runner_;
  SchedulerOptions opts_;
  PrefixCache cache_;
  std::deque<std::shared_ptr<Request>> waiting_;
  std::vector<std::shared_ptr<Request>> running_;
  int64_t admitted_counter_ = 0;
  SchedulerStats stats_;
  std::vector<Sampled> sampled_;
  std::unique_ptr<ThreadPool> mask_pool_;  // the constrained rows' token masks, computed side by side (made on first use)
  std::deque<LaunchedStep> launched_;  // launched, not yet collected (two at most)
  std::unique_ptr<OutputQueue> out_queue_;  // with async_delivery
  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, FileCloser> trace_;  // with step_trace_path
};

}  // namespace moeserve

// The engine: one thread that owns the scheduler and the model runner and steps them while there is work.
// Any thread may submit or abort requests; outputs reach each request's sink on the engine thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "scheduler/scheduler.h"

namespace moeserve {

class Engine {
 public:
  Engine(std::unique_ptr<ModelRunner> runner, const SchedulerOptions& opts);
  ~Engine();  // stops the thread; pending requests are aborted

  const ModelConfig& config() const { return runner_->config(); }
  ModelRunner& runner() { return *runner_; }
  // UserError for a request that can never run here. Thread-safe (reads only the immutable configuration).
  void validate(const Request& r) const { scheduler_.validate(r); }
  // Validates and queues. Thread-safe.
  void submit(std::shared_ptr<Request> r);
  // Marks a request to be aborted at the next step (client disconnect). Thread-safe, cheap.
  void abort(const std::shared_ptr<Request>& r);
  // Runs fn on the engine thread before the next step (e.g. /flush_cache), then `after` once stats() reflects
  // what fn did. Thread-safe.
  void post(std::function<void(Scheduler&)> fn, std::function<void()> after = {});
  SchedulerStats stats() const;
  bool failed() const { return failed_; }
  std::string failure() const;
  void stop();

 private:
  void loop();

  std::unique_ptr<ModelRunner> runner_;
  Scheduler scheduler_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Request>> inbox_;
  std::vector<std::pair<std::function<void(Scheduler&)>, std::function<void()>>> tasks_;
  bool stop_ = false;
  std::atomic<bool> failed_{false};
  std::string failure_;
  SchedulerStats stats_;  // copied after every step, read by /metrics without touching the scheduler
  std::thread thread_;
};

}  // namespace moeserve

#include "scheduler/engine.h"

#include "core/error.h"
#include "core/log.h"

namespace moeserve {

namespace {
// The engine thread only steps; sinks run on the scheduler's delivery thread, overlapping the next step.
SchedulerOptions with_async_delivery(SchedulerOptions o) {
  o.async_delivery = true;
  return o;
}
}  // namespace

Engine::Engine(std::unique_ptr<ModelRunner> runner, const SchedulerOptions& opts)
    : runner_(std::move(runner)), scheduler_(*runner_, with_async_delivery(opts)) {
  stats_ = scheduler_.stats();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { stop(); }

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Engine::submit(std::shared_ptr<Request> r) {
  scheduler_.validate(*r);  // reads only the immutable config: safe off the engine thread
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (failed_) throw InternalError("the engine has failed: " + failure_);
    if (stop_) throw UserError("the server is shutting down");
    inbox_.push_back(std::move(r));
  }
  cv_.notify_one();
}

void Engine::abort(const std::shared_ptr<Request>& r) {
  r->abort_requested = true;
  cv_.notify_one();
}

void Engine::post(std::function<void(Scheduler&)> fn, std::function<void()> after) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    tasks_.push_back({std::move(fn), std::move(after)});
  }
  cv_.notify_one();
}

SchedulerStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

std::string Engine::failure() const {
  std::lock_guard<std::mutex> lk(mu_);
  return failure_;
}

void Engine::loop() {
  for (;;) {
    std::vector<std::shared_ptr<Request>> incoming;
    std::vector<std::pair<std::function<void(Scheduler&)>, std::function<void()>>> tasks;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !inbox_.empty() || !tasks_.empty() || !scheduler_.idle(); });
      if (stop_) break;
      incoming.swap(inbox_);
      tasks.swap(tasks_);
    }
    try {
      for (auto& r : incoming) scheduler_.add(std::move(r));
      if (!tasks.empty()) {
        for (auto& t : tasks) t.first(scheduler_);
        {
          std::lock_guard<std::mutex> lk(mu_);
          stats_ = scheduler_.stats();
        }
        for (auto& t : tasks)
          if (t.second) t.second();
      }
      scheduler_.step();
    } catch (const std::exception& e) {
      // A failure inside a step is a bug or a device fault: fail every request cleanly, report unhealthy.
      log_error("engine step failed: {}", e.what());
      {
        std::lock_guard<std::mutex> lk(mu_);
        failure_ = e.what();
      }
      failed_ = true;
      scheduler_.abort_all(std::string("internal error: ") + e.what());
    }
    std::lock_guard<std::mutex> lk(mu_);
    stats_ = scheduler_.stats();
  }
  scheduler_.abort_all("the server is shutting down");
  scheduler_.flush_outputs();
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& r : inbox_) {
    RequestOutput o;
    o.finish = FinishReason::Abort;
    o.abort_message = "the server is shutting down";
    r->sink(o);
  }
  inbox_.clear();
}

}  // namespace moeserve

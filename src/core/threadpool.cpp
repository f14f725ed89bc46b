#include "core/threadpool.h"

#include <algorithm>

namespace moeserve {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks() {
  for (;;) {
    int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= num_chunks_) break;
    int64_t b = c * chunk_, e = std::min(n_, b + chunk_);
    (*fn_)(b, e);
    chunks_done_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      active_workers_.fetch_add(1, std::memory_order_acquire);
    }
    run_chunks();
    active_workers_.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int threads = num_threads();
  bool nested = in_job_.exchange(true);
  if (nested || threads == 1 || n <= grain) {
    fn(0, n);
    if (!nested) in_job_ = false;
    return;
  }
  // About 4 chunks per thread balances uneven rows without much scheduling overhead.
  int64_t chunk = std::max(grain, (n + threads * 4 - 1) / (threads * 4));
  {
    // A worker that woke late for the previous job may still be inside run_chunks; it registers under the
    // lock, so with the lock held and no active worker, nobody reads the job fields while we write them.
    std::unique_lock<std::mutex> lk(mu_);
    while (active_workers_.load(std::memory_order_acquire) != 0) {
      lk.unlock();
      std::this_thread::yield();
      lk.lock();
    }
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    num_chunks_ = (n + chunk - 1) / chunk;
    next_chunk_ = 0;
    chunks_done_ = 0;
    ++generation_;
  }
  cv_.notify_all();
  run_chunks();
  while (chunks_done_.load(std::memory_order_acquire) < num_chunks_) std::this_thread::yield();
  in_job_ = false;
}

}  // namespace moeserve

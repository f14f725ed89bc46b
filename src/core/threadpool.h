// A fixed pool of worker threads for data-parallel CPU kernels. The calling thread takes part in the work,
// so a pool of N threads uses N-1 workers. parallel_for calls must not nest (a nested call runs inline).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moeserve {

// The most threads a --threads flag accepts: far above any core count, far below what makes thread creation fail.
constexpr int kMaxPoolThreads = 1024;

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads = 0);  // 0: std::thread::hardware_concurrency()
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint ranges covering [0, n), in chunks of at least `grain` items.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop();
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
  bool stop_ = false;

  // The job in flight.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 1, num_chunks_ = 0;
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<int64_t> chunks_done_{0};
  std::atomic<int> active_workers_{0};
  std::atomic<bool> in_job_{false};
};

}  // namespace moeserve

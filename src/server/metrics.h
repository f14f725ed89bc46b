// Prometheus metrics: counters and histograms updated from any thread, rendered in the text format.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "scheduler/scheduler.h"

namespace moeserve::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  std::string render(const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); last is +Inf
  double sum_ = 0;
  uint64_t n_ = 0;
};

struct Metrics {
  Histogram ttft{{0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram itl{{0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
  Histogram e2e{{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}};
  std::atomic<int64_t> requests_total{0}, requests_failed{0}, requests_aborted{0};
  std::string render(const SchedulerStats& s, int64_t page_size, bool cuda_graphs) const;
};

}  // namespace moeserve::server

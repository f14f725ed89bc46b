// Best-of-N GPU timing with events for the benchmark programs (gpu_read_bw, gpu_chain).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "cuda/common.h"

namespace moeserve::bench {

struct GpuTimer {
  cudaEvent_t a, b;
  GpuTimer() {
    MS_CUDA_CHECK(cudaEventCreate(&a));
    MS_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~GpuTimer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;
  // Best time in seconds of `reps` runs of f on stream s (after one untimed run).
  template <typename F>
  double best(int reps, F f, cudaStream_t s = nullptr) {
    f();
    MS_CUDA_CHECK(cudaGetLastError());
    MS_CUDA_CHECK(cudaStreamSynchronize(s));
    float best_ms = 1e30f;
    for (int r = 0; r < reps; ++r) {
      MS_CUDA_CHECK(cudaEventRecord(a, s));
      f();
      MS_CUDA_CHECK(cudaEventRecord(b, s));
      MS_CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      MS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      best_ms = std::min(best_ms, ms);
    }
    MS_CUDA_CHECK(cudaGetLastError());
    return double(best_ms) * 1e-3;
  }
};

}  // namespace moeserve::bench

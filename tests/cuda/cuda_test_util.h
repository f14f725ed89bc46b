// Helpers shared by the GPU tests: skipping without a device, and device buffers freed at scope exit.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "cuda/common.h"
#include "cuda/device.h"

#define SKIP_WITHOUT_GPU() \
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device"

namespace moeserve::cuda_test {

// count elements of T on the device (at least one allocated); upload / download of the whole buffer.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { MS_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T))); }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { upload(h); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void upload(const std::vector<T>& h) {
    if (!h.empty()) MS_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    if (n) MS_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  // NaN everywhere (bf16 and f32), finished before returning: the tests' streams do not order with the legacy
  // default stream that cudaMemset uses.
  void poison() {
    MS_CUDA_CHECK(cudaMemset(p, 0xFF, std::max<size_t>(n, 1) * sizeof(T)));
    MS_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

}  // namespace moeserve::cuda_test

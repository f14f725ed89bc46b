// Shared by every CUDA source: the BF16 type, error checks that throw (never abort), small device helpers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/error.h"

namespace moeserve::cuda {

using bf16 = __nv_bfloat16;

// Throws InternalError naming the call, file and line when a CUDA runtime call fails.
void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line);

#define MS_CUDA_CHECK(call)                                                              \
  do {                                                                                  \
    cudaError_t ms_cuda_err_ = (call);                                                  \
    if (ms_cuda_err_ != cudaSuccess) ::moeserve::cuda::throw_cuda_error(ms_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: a bad configuration shows up here, not later.
#define MS_CUDA_LAUNCH_CHECK() MS_CUDA_CHECK(cudaGetLastError())

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline bool aligned_to(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Device time of one fn() in microseconds by CUDA events on `stream`: the mean over `iters` calls after `warm` untimed
// ones (startup trials and benchmarks; fn launches on that stream).
template <class F>
double event_time_us(cudaStream_t stream, int iters, F&& fn, int warm = 2) {
  for (int i = 0; i < warm; ++i) fn();
  cudaEvent_t a, b;
  MS_CUDA_CHECK(cudaEventCreate(&a));
  MS_CUDA_CHECK(cudaEventCreate(&b));
  MS_CUDA_CHECK(cudaEventRecord(a, stream));
  for (int i = 0; i < iters; ++i) fn();
  MS_CUDA_CHECK(cudaEventRecord(b, stream));
  MS_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  MS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1000.0 * ms / iters;
}

}  // namespace moeserve::cuda

// CUDA device discovery. Compiled only when nvcc is found; everything else in moeserve works without it.
// This is the seed of the CUDA backend: kernels, registries and the graph runner grow here.
#pragma once

#include <string>
#include <vector>

namespace moeserve::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  size_t total_memory = 0, free_memory = 0;
};

// Devices visible to this process; empty (never an error) when there is no GPU or no driver.
std::vector<DeviceInfo> list_devices();
// The SM architectures whose code this binary contains, e.g. {90} for sm_90a.
std::vector<int> compiled_architectures();

// RMSNorm on the GPU for f32 rows (a first kernel, tested against the CPU reference). Throws InternalError
// on CUDA failures.
void rmsnorm_f32(const float* x_host, const float* w_host, float eps, int rows, int dim, float* out_host);

}  // namespace moeserve::cuda

// Builds a model runner for a device: the CPU reference executor, or the CUDA executor when this build has
// CUDA and a GPU is visible (--device auto prefers the GPU). Server and CLI share this one entry point.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "executor/model_runner.h"

namespace moeserve {

struct LaunchOptions {
  std::string model_path;
  std::string device = "auto";  // auto | cuda | cpu
  RunnerOptions runner;         // page size, chunked prefill, KV tokens (0: automatic), CPU threads
  int64_t max_running_requests = 64;
  double mem_fraction_static = 0.0;
  std::vector<int64_t> cuda_graph_bs;
  int64_t cuda_graph_max_bs = 160;
  bool disable_cuda_graph = false;
  std::string attention_backend = "auto", moe_backend = "auto", gemm_backend = "auto";
};

// True when this binary has the CUDA backend and the driver reports at least one GPU.
bool cuda_device_available();
// "cuda" or "cpu" for --device auto|cuda|cpu; UserError for cuda on a build or machine without it.
std::string resolve_device(const std::string& device);

std::unique_ptr<ModelRunner> make_runner(const LaunchOptions& o);

// The kernel-backend table of this machine (`moeserve backends`); model_path optional (the model's shapes).
std::string backends_report(const std::string& model_path);

}  // namespace moeserve

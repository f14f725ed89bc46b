// The CUDA executor: loads a checkpoint onto one GPU, selects and self-tests the kernel backends, plans the
// memory (weights, activations, KV pages from --mem-fraction-static), captures decode CUDA graphs, and runs
// steps: metadata up in one copy, forward and sampling on the GPU, sampled ids (and logprobs) back.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cuda/model/backends.h"
#include "executor/executor.h"

namespace moeserve::cuda {

struct GpuOptions {
  int device = 0;
  double mem_fraction_static = 0.0;  // 0: 0.85
  int64_t max_total_tokens = 0;      // 0: what the memory fraction allows
  int64_t page_size = 16;
  int64_t max_tokens_per_step = 8192;  // the scheduler's token budget (chunked prefill + decodes)
  int64_t max_running_requests = 128;
  std::vector<int64_t> cuda_graph_bs;  // empty: 1, 2, 4, 8, 12, 16, 24, 32, then steps of 8
  int64_t cuda_graph_max_bs = 160;
  bool disable_cuda_graph = false;
  BackendRequest backends;
  int threads = 0;  // host threads for weight upload (0: all cores)
};

// UserError when there is no usable GPU, the model does not fit, or a requested backend cannot run here.
std::unique_ptr<Executor> make_gpu_executor(const std::string& model_dir, const GpuOptions& opts);

// The decode batch sizes captured for these options, largest first.
std::vector<int> cuda_graph_sizes(const GpuOptions& opts);

}  // namespace moeserve::cuda

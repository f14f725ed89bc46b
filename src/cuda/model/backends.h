// Backend selection for one model on one GPU: for each op family, every registered backend is checked
// (architecture claim, code in this binary or JIT-compiled for this GPU), self-tested against the CPU
// reference, timed on the model's own shapes when `auto` must choose (the timings are cached on disk), and
// the choice is explained. `moeserve backends` prints the same reports.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cuda/gemm/gemm.h"
#include "cuda/moe/moe.h"
#include "cuda/registry.h"
#include "model/config.h"

namespace moeserve::cuda {

struct BackendRequest {
  std::string attention = "auto", moe = "auto", gemm = "auto";
  bool timed_trials = true;
  // For `moeserve backends`: report every backend, choose nothing, never throw.
  bool report_only = false;
};

// The shapes the trials use.
struct ModelShapes {
  int hidden = 2048, qkv_out = 5120, attn_width = 4096, vocab = 151936, head_dim = 128;
  bool moe = true;
  MoeShape moe_shape{128, 2048, 768, 8, WeightFormat::BF16, 512};
  int max_tokens = 512;
};
// A model's shapes for steps of up to max_tokens tokens (the GEMM trial stops at 512; the MoE plan takes them all).
ModelShapes model_shapes(const ModelConfig& c, int max_tokens);

struct SelectedBackends {
  std::vector<std::unique_ptr<GemmBackend>> gemms;
  std::vector<std::unique_ptr<MoeBackend>> moes;
  GemmBackend* gemm = nullptr;
  MoeBackend* moe = nullptr;
  std::string attention;
  bool lmhead_argmax = false;  // greedy steps of 32-64 rows take lmhead_argmax (self-test passed, switch on)
  bool lmhead_screen = false;  // greedy steps of 1-8 rows without logprobs take lmhead_screen (passed, switch on)
  bool lmhead_screen_topk = false;  // sampled steps of 1-64 rows with top_k <= 64 take lmhead_screen_topk (idem)
  bool capturable = true;  // every chosen backend can be recorded in a CUDA graph
  std::vector<BackendReport> reports;
};

SelectedBackends select_backends(const DeviceInfo& dev, const ModelShapes& shapes, const BackendRequest& req);

// The table `moeserve backends` prints (and the server logs at debug level).
std::string format_backend_table(const std::vector<BackendReport>& reports);

}  // namespace moeserve::cuda

// `moeserve serve` options (SGLang's flag names), parsed once at startup.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moeserve::cli {
class FlagSet;
}

namespace moeserve::server {

struct ServeOptions {
  std::string model_path, tokenizer_path, served_model_name, chat_template;
  std::string host = "127.0.0.1";
  int64_t port = 30000;
  int64_t tp_size = 1, ep_size = 1, nnodes = 1, node_rank = 0;
  std::string dist_init_addr;
  std::string dtype = "auto", quantization, device = "auto", kv_cache_dtype = "auto";
  std::string attention_backend = "auto", moe_runner_backend = "auto", fp4_gemm_backend = "auto";
  std::string gemm_backend = "auto";
  std::string reasoning_parser, tool_call_parser;
  int64_t context_length = 0;
  double mem_fraction_static = 0.0;
  int64_t max_running_requests = 0, max_total_tokens = 0, chunked_prefill_size = 0, page_size = 0;
  bool disable_radix_cache = false, disable_cuda_graph = false, disable_custom_all_reduce = false;
  bool disable_overlap_schedule = false;
  std::vector<int64_t> cuda_graph_bs;
  int64_t cuda_graph_max_bs = 160;
  bool skip_tokenizer_init = false, trust_remote_code = false, enable_metrics = true;
  std::string api_key, log_level = "info";
  int64_t random_seed = 0;
  std::string speculative_algorithm, speculative_draft_model_path;
  int64_t speculative_num_steps = 0, speculative_eagle_topk = 0, speculative_num_draft_tokens = 0;
  int64_t threads = 0;            // CPU threads for the CPU backend (0: all cores)
  int64_t max_body_bytes = 32 << 20;
  int64_t shutdown_timeout_s = 30;
};

void register_serve_flags(cli::FlagSet& f, ServeOptions& o);
// Checks combinations the flag parser cannot (UserError naming the flag and what would work) and resolves the ones
// that depend on each other: --cuda-graph-bs sets --cuda-graph-max-bs to its largest size unless that flag was given
// (cuda_graph_max_bs_given), and may not exceed it when it was.
void validate_serve_options(ServeOptions& o, bool cuda_graph_max_bs_given = false);

}  // namespace moeserve::server

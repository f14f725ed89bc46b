#include "server/options.h"

#include <algorithm>

#include "cli/flags.h"
#include "core/error.h"
#include "core/threadpool.h"

namespace moeserve::server {

void register_serve_flags(cli::FlagSet& f, ServeOptions& o) {
  f.add_string("model-path", &o.model_path, "Hugging Face checkpoint folder (default: the built-in demo model)");
  f.add_string("tokenizer-path", &o.tokenizer_path, "folder with tokenizer.json (default: the model folder)");
  f.add_string("served-model-name", &o.served_model_name, "model name in the API (default: the model path)");
  f.add_string("chat-template", &o.chat_template, "a Jinja chat template file overriding the model's");
  f.add_string("host", &o.host, "address to listen on");
  f.add_int("port", &o.port, "port to listen on", 1, 65535);
  f.add_int("tp-size", &o.tp_size, "tensor parallel size", 1, 64);
  f.alias("tp", "tp-size");
  f.add_int("ep-size", &o.ep_size, "expert parallel size", 1, 64);
  f.alias("ep", "ep-size");
  f.add_int("nnodes", &o.nnodes, "number of nodes", 1, 1);
  f.add_int("node-rank", &o.node_rank, "rank of this node", 0, 0);
  f.add_string("dist-init-addr", &o.dist_init_addr, "multi-node rendezvous address (single node only for now)");
  f.add_string("dtype", &o.dtype, "activation dtype", {"auto", "bfloat16", "float16", "float32"});
  f.add_string("quantization", &o.quantization, "weight quantization (default: from the checkpoint)",
               {"", "fp8", "modelopt_fp4", "modelopt"});
  f.add_string("device", &o.device, "where to run", {"auto", "cuda", "cpu"});
  f.add_string("kv-cache-dtype", &o.kv_cache_dtype, "KV cache dtype", {"auto", "bfloat16", "float32"});
  f.add_string("attention-backend", &o.attention_backend, "attention kernel backend", {"auto", "cpu", "flash_paged", "reference_paged"});
  f.add_string("moe-runner-backend", &o.moe_runner_backend,
               "MoE kernel backend (`moeserve backends` shows which can run here)",
               {"auto", "cpu", "cublas_ref", "fused_sm90", "jit", "fused_sm100_build"});
  f.add_string("gemm-backend", &o.gemm_backend, "dense GEMM kernel backend", {"auto", "cublas", "cublaslt", "gemv"});
  f.add_string("fp4-gemm-backend", &o.fp4_gemm_backend, "FP4 GEMM kernel backend", {"auto"});
  f.add_string("reasoning-parser", &o.reasoning_parser, "split reasoning from content",
               {"", "qwen3", "qwen3-thinking", "deepseek-r1"});
  f.add_string("tool-call-parser", &o.tool_call_parser, "parse tool calls", {"", "qwen3_coder", "hermes", "qwen25"});
  f.add_int("context-length", &o.context_length, "maximum context (default: the model's)", 0, int64_t(1) << 30);
  f.add_double("mem-fraction-static", &o.mem_fraction_static, "fraction of GPU memory for weights + KV", 0, 1);
  f.add_int("max-running-requests", &o.max_running_requests, "requests decoded together (0: automatic)", 0,
            int64_t(1) << 20);
  f.add_int("max-total-tokens", &o.max_total_tokens, "KV cache capacity in tokens (0: automatic)", 0,
            int64_t(1) << 40);
  f.add_int("chunked-prefill-size", &o.chunked_prefill_size, "tokens per step (0: automatic)", 0, int64_t(1) << 24);
  f.add_int("page-size", &o.page_size, "KV cache page size in tokens (0: automatic)", 0, 4096);
  f.add_bool("disable-radix-cache", &o.disable_radix_cache, "disable prefix caching");
  f.add_int_list("cuda-graph-bs", &o.cuda_graph_bs,
                 "decode batch sizes to capture (1-4096; the largest sets --cuda-graph-max-bs unless it is given)", 1,
                 4096);
  f.add_int("cuda-graph-max-bs", &o.cuda_graph_max_bs, "largest captured decode batch", 1, 4096);
  f.add_bool("disable-cuda-graph", &o.disable_cuda_graph, "no CUDA graphs");
  f.add_bool("disable-overlap-schedule", &o.disable_overlap_schedule,
             "wait for each step before scheduling the next (default: the next is launched while one runs)");
  f.add_bool("disable-custom-all-reduce", &o.disable_custom_all_reduce, "use NCCL all-reduce only");
  f.add_bool("skip-tokenizer-init", &o.skip_tokenizer_init, "serve token ids only (no tokenizer)");
  f.add_bool("trust-remote-code", &o.trust_remote_code, "accepted for compatibility; moeserve never runs checkpoint code");
  f.add_string("api-key", &o.api_key, "require Authorization: Bearer KEY");
  f.add_string("log-level", &o.log_level, "log level", {"debug", "info", "warning", "error"});
  f.add_int("random-seed", &o.random_seed, "seed for requests without one", 0);
  f.add_string("speculative-algorithm", &o.speculative_algorithm, "speculative decoding", {"", "EAGLE", "NEXTN", "MTP"});
  f.add_string("speculative-draft-model-path", &o.speculative_draft_model_path, "draft model");
  f.add_int("speculative-num-steps", &o.speculative_num_steps, "draft steps", 0);
  f.add_int("speculative-eagle-topk", &o.speculative_eagle_topk, "draft top-k", 0);
  f.add_int("speculative-num-draft-tokens", &o.speculative_num_draft_tokens, "draft tokens", 0);
  f.add_int("threads", &o.threads, "CPU backend threads (0: all cores)", 0, kMaxPoolThreads);
  f.add_int("max-body-bytes", &o.max_body_bytes, "largest accepted request body", 1024);
  f.add_int("shutdown-timeout", &o.shutdown_timeout_s, "seconds in-flight requests get on SIGTERM", 0);
  f.add_bool("enable-metrics", &o.enable_metrics, "serve /metrics (always on)");
}

void validate_serve_options(ServeOptions& o, bool cuda_graph_max_bs_given) {
  if (!o.cuda_graph_bs.empty()) {
    const int64_t largest = *std::max_element(o.cuda_graph_bs.begin(), o.cuda_graph_bs.end());
    if (!cuda_graph_max_bs_given) {
      o.cuda_graph_max_bs = largest;  // as SGLang: the list decides
    } else if (largest > o.cuda_graph_max_bs) {
      throw_user("--cuda-graph-bs {} is larger than --cuda-graph-max-bs {}: raise --cuda-graph-max-bs or drop it",
                 largest, o.cuda_graph_max_bs);
    }
  }
  if (o.tp_size > 1 || o.ep_size > 1)
    throw_user("--tp-size {} / --ep-size {}: tensor and expert parallelism need the CUDA backend, which this build "
               "cannot run yet; use --tp-size 1", o.tp_size, o.ep_size);
  if (!o.speculative_algorithm.empty())
    throw_user("--speculative-algorithm {}: speculative decoding is not implemented yet", o.speculative_algorithm);
  if (!o.quantization.empty())
    throw_user("--quantization {}: quantized weights are not supported yet (BF16/FP16/FP32 checkpoints only)",
               o.quantization);
}

}  // namespace moeserve::server

// `moeserve bench` without the command line: builds the workload, warms the server up, runs the timed load and
// computes the report. Flag names (see cli/cmd_bench.cpp) follow SGLang's bench_serving.
#pragma once

#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "benchclient/metrics.h"

namespace moeserve::bench {

struct BenchConfig {
  std::string backend = "sglang";
  std::string base_url;  // overrides host and port
  std::string host = "127.0.0.1";
  int64_t port = 30000;
  std::string endpoint;  // "" = the backend's (/generate, /v1/completions, /v1/chat/completions)
  std::string model;     // "" = OpenAI backends ask GET /v1/models, else omit it
  std::string api_key;

  std::string dataset_name = "random";  // random | sharegpt
  std::string dataset_path;
  int64_t num_prompts = 1000;
  int64_t seed = 1;
  int64_t random_input_len = 1024, random_output_len = 1024;
  double random_range_ratio = 0.0;
  std::string random_prompt_format = "auto";  // auto (text for openai-chat, else ids) | ids | text
  int64_t vocab_size = 0;                     // 0 = GET /get_model_info
  int64_t sharegpt_output_len = 0, sharegpt_context_len = 0;

  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  int64_t max_concurrency = 0;  // 0 = no limit
  int64_t warmup_requests = 1;
  double request_timeout_s = 6 * 3600;

  double temperature = 0.0;
  bool disable_ignore_eos = false, disable_stream = false;
  std::string extra_request_body;  // JSON object merged into every request body
  bool flush_cache = false;        // POST /flush_cache before the timed run

  bool disable_tqdm = false;
  std::string output_file;  // append one JSON line
  bool output_details = false;
};

struct BenchOutcome {
  RunInfo info;
  std::vector<RequestResult> results;
  BenchMetrics metrics;
  nlohmann::json json;
  std::string report;
  size_t connections_opened = 0;
};

// Notes and the progress bar go to `log` (nullptr: quiet). Throws UserError for bad settings, an unreachable
// server, or a warm-up in which no request succeeded.
BenchOutcome run_benchmark(const BenchConfig& cfg, std::FILE* log);

// The seed of the arrival times of a run with --seed seed (a stream apart from the dataset's).
uint64_t arrival_seed(int64_t seed);

// The first positive "vocab_size" in a /get_model_info answer (at the top or in nested objects), 0 if none.
int64_t find_vocab_size(const nlohmann::json& model_info);

}  // namespace moeserve::bench

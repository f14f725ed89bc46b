// Benchmark workloads: the requests to send (random or ShareGPT-format prompts with their output lengths) and
// when to send them (Poisson or gamma-distributed arrivals). Everything is deterministic from a seed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::bench {

struct BenchRequest {
  // Exactly one of the two is the prompt: token ids (is_ids) or text.
  bool is_ids = false;
  std::vector<int32_t> prompt_ids;
  std::string prompt_text;
  int64_t prompt_len = 0;  // tokens: exact for ids, an estimate for text (the server's count wins when it gives one)
  int64_t output_len = 0;  // max new tokens asked for
};

// Tokenizer-free length estimate for text: about 4 characters per token (at least 1 for non-empty text).
int64_t estimate_tokens(const std::string& text);

struct RandomDatasetOptions {
  int64_t num_prompts = 1000;
  int64_t input_len = 1024;
  int64_t output_len = 1024;
  double range_ratio = 0.0;  // lengths uniform in [max(int(len * ratio), 1), len], as SGLang's random dataset
  bool as_text = false;      // text made of common one-token English words instead of token ids
  int64_t vocab_size = 0;    // ids uniform in [0, vocab_size); needed unless as_text
  uint64_t seed = 1;
};
std::vector<BenchRequest> make_random_dataset(const RandomDatasetOptions& opts);

struct ShareGptOptions {
  int64_t num_prompts = 1000;
  int64_t fixed_output_len = 0;  // > 0: every request asks for this many tokens
  int64_t context_len = 0;       // > 0: drop prompt + output longer than this (else SGLang's 1024 / 2048 rule)
  uint64_t seed = 1;
};
// The file: a JSON list of {"conversations": [{"from": "human"|"gpt", "value": "..."} ...]}. The first human
// turn is the prompt, the next gpt turn gives the output length (its estimated tokens) unless fixed.
std::vector<BenchRequest> load_sharegpt_dataset(const std::string& path, const ShareGptOptions& opts);
std::vector<BenchRequest> sharegpt_from_json(const nlohmann::json& data, const ShareGptOptions& opts,
                                             const std::string& source = "ShareGPT data");

// Send times in seconds from the start, non-decreasing, the first at 0. rate = inf: all at 0. Otherwise gaps
// are gamma-distributed with mean 1/rate and shape `burstiness` (1 = exponential gaps = Poisson arrivals).
std::vector<double> make_arrival_times(int64_t n, double rate, double burstiness, uint64_t seed);

}  // namespace moeserve::bench

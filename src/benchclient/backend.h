// The three request protocols a benchmark speaks: what to POST for a prompt, and how to read the streamed
// answer into token timings.
//  sglang       POST /generate {"text"|"input_ids", "sampling_params", "stream"}; events carry the cumulative
//               "text" and meta_info.completion_tokens, then "data: [DONE]".
//  openai       POST /v1/completions {"prompt" (text or token ids), "max_tokens", "stream_options"}; events carry
//               choices[0].text; the last one the usage.
//  openai-chat  POST /v1/chat/completions {"messages": [{"role": "user", "content"}]}; choices[0].delta.
// A response event is token-bearing when it adds output: new text, reasoning or tool-call deltas, or (sglang) a
// higher completion_tokens (servers running without a tokenizer send no text). The number of tokens it carries
// is the completion_tokens increase when the server reports one (sglang meta_info, OpenAI continuous usage),
// else 1. See metrics.h for how the timings follow from these events.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "benchclient/dataset.h"
#include "benchclient/metrics.h"

namespace moeserve::bench {

enum class Backend { kSglang, kOpenAiCompletions, kOpenAiChat };

// Accepts SGLang / vLLM names too: sglang-native; vllm, sglang-oai, lmdeploy (completions); vllm-chat,
// sglang-oai-chat (chat). Anything else is a UserError listing the choices.
Backend parse_backend(const std::string& name);
std::vector<std::string> backend_names();
const char* backend_name(Backend b);
const char* default_endpoint(Backend b);

struct SamplingOptions {
  std::string model;  // "": not sent
  double temperature = 0.0;
  bool ignore_eos = true;
  bool stream = true;
  nlohmann::json extra_body;  // JSON object merged (RFC 7386 merge patch) into every request body
};

std::string build_request_body(Backend b, const BenchRequest& req, int64_t max_tokens, const SamplingOptions& s);

// "HTTP 400: <message>": the message from an OpenAI-shaped {"error": {"message"}}, {"detail"}, {"message"}, or the
// start of the body.
std::string describe_http_error(int status, const std::string& reason, std::string_view body);

// Reads one response (streamed events, or one JSON body when the server did not stream) of a backend.
class ResponseReader {
 public:
  ResponseReader(Backend b, double start_s) : backend_(b), start_s_(start_s) {}

  void on_event(std::string_view data, double t_s);
  void on_json_body(std::string_view body, double t_s);

  const std::string& error() const { return error_; }
  bool saw_done() const { return saw_done_; }
  int64_t token_events() const { return token_events_; }
  // Fills ttft, itl, latency, prompt/output lengths and chars of r (not success / status / error).
  void fill(RequestResult& r, double end_s, int64_t dataset_prompt_len) const;

 private:
  void on_object(const nlohmann::json& j, double t_s, bool whole);
  void on_sglang_counts(int64_t prompt_tokens, int64_t completion_tokens, int64_t text_bytes, double t_s);
  void on_tokens(int64_t k, double t_s);
  void set_error(std::string msg) {
    if (error_.empty()) error_ = std::move(msg);
  }

  Backend backend_;
  double start_s_;
  double ttft_s_ = -1, last_token_s_ = 0;
  std::vector<double> itl_s_;
  int64_t tokens_seen_ = 0, token_events_ = 0, output_chars_ = 0;
  int64_t reported_completion_ = -1, reported_prompt_ = -1;
  bool saw_done_ = false;
  std::string error_;
};

}  // namespace moeserve::bench

// The HTTP API's request shapes, parsed from JSON into one typed request at the edge. Everything invalid is
// an ApiError carrying the HTTP status and the offending parameter, turned into an OpenAI error object.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "scheduler/request.h"

namespace moeserve::server {

class TextLayer;

class ApiError : public UserError {
 public:
  ApiError(int status, const std::string& msg, std::string param = "")
      : UserError(msg), status(status), param(std::move(param)) {}
  int status;
  std::string param;
};

enum class ApiKind { Chat, Completion, Generate };

struct ApiRequest {
  ApiKind kind = ApiKind::Chat;
  std::string model;
  std::vector<std::vector<int32_t>> prompts;  // completions and a native batch may carry several; chat exactly one
  bool batch = false;  // native /generate given a list of prompts: a list of results (streamed events carry "index")
  std::vector<std::string> prompt_texts;      // for echo (empty when the prompt was token ids)
  SamplingParams sampling;
  bool max_tokens_given = false;
  std::vector<std::string> stop;
  int64_t n = 1;
  bool stream = false, include_usage = false;
  bool continuous_usage = false;  // vLLM's stream_options.continuous_usage_stats: usage so far in every chunk
  bool include_stop_str = false;  // vLLM's include_stop_str_in_output / SGLang's no_stop_trim: a matched stop
                                  // string stays at the end of the text
  bool logprobs = false;        // OpenAI logprobs / native return_logprob
  int64_t top_logprobs = 0;
  bool return_text_in_logprobs = false;  // native
  bool echo = false;
  // vLLM's prompt_logprobs (chat and completions): every prompt position's logprob and rank and its top n (the first
  // position has none); -1: not asked.
  int64_t prompt_logprobs = -1;
  bool skip_special_tokens = true;
  bool separate_reasoning = true;
  bool thinking_enabled = true, starts_in_reasoning = false;
  nlohmann::ordered_json tools;  // null or a list
  std::string tool_choice = "auto";  // none | auto | required | function
  std::string tool_choice_function;
  // tool_choice required / named with a tool-call parser: the call's opening, already in the prompt; the
  // output continues it, so parsers see forced_prefix + output.
  std::string forced_prefix;
};

struct ParseContext {
  const TextLayer* text = nullptr;
  std::string served_model_name, model_path;
  int64_t context_length = 0;
  int64_t vocab_size = 0;
  // generation_config.json: the sampling defaults when a request is silent (SGLang's behaviour).
  float default_temperature = 1.0f, default_top_p = 1.0f, default_min_p = 0.0f, default_repetition_penalty = 1.0f;
  int64_t default_top_k = -1;
  std::string tool_call_parser;  // "" when none
  std::string reasoning_parser;  // "" when none
};

// A 404 naming the served model unless `name` is its served name or its model path (OpenAI requests' "model",
// GET /v1/models/{name}).
void check_model_name(const std::string& name, const ParseContext& ctx);

// What a chat template renders from a request: messages (normalised), tools, chat_template_kwargs and
// add_generation_prompt, each checked (400 naming the field). /v1/chat/completions and /tokenize with messages.
struct ChatTemplateInputs {
  nlohmann::ordered_json messages, tools, kwargs = nlohmann::ordered_json::object();
  bool add_generation_prompt = true;
};
ChatTemplateInputs parse_chat_template_inputs(const nlohmann::ordered_json& body);

ApiRequest parse_chat_request(const nlohmann::ordered_json& body, const ParseContext& ctx);
ApiRequest parse_completion_request(const nlohmann::ordered_json& body, const ParseContext& ctx);
ApiRequest parse_generate_request(const nlohmann::ordered_json& body, const ParseContext& ctx);

// Parses a body as JSON (400 with the parser's message otherwise); the top level must be an object.
nlohmann::ordered_json parse_body(const std::string& body);

// Chat messages normalised for the template: roles checked, text parts joined, tool call arguments kept.
nlohmann::ordered_json normalize_messages(const nlohmann::ordered_json& messages);

}  // namespace moeserve::server

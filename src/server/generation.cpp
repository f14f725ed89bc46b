#include "server/generation.h"

#include <algorithm>
#include <chrono>
#include <ctime>

#include "core/log.h"
#include "parsers/reasoning.h"
#include "parsers/tool_calls.h"

namespace moeserve::server {

using json = nlohmann::ordered_json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

// Longest suffix of `text` that is a proper prefix of some stop string: it might become a stop match, so it
// is held back until the next token decides.
size_t stop_holdback(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& s : stops)
    for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k)
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  return hold;
}

class Generation : public std::enable_shared_from_this<Generation> {
 public:
  Generation(ServerContext& ctx, ApiRequest req, std::shared_ptr<http::Responder> resp)
      : ctx_(ctx), req_(std::move(req)), resp_(std::move(resp)), created_(std::time(nullptr)), t0_(now_s()) {
    uint64_t n = ctx_.next_id.fetch_add(1);
    const char* prefix = req_.kind == ApiKind::Chat ? "chatcmpl-" : req_.kind == ApiKind::Completion ? "cmpl-" : "";
    // Unique across restarts too: the process start time salts the counter.
    static const uint64_t salt = uint64_t(std::chrono::system_clock::now().time_since_epoch().count());
    id_ = fmt::format("{}{:016x}", prefix, (n + salt) * 0x9e3779b97f4a7c15ull);
  }

  void start();

 private:
  struct Choice {
    size_t index = 0, prompt_index = 0;
    std::weak_ptr<Request> request;
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    std::vector<std::vector<kernels::TokenLogprob>> tops;
    // The prompt's logprobs (SamplingParams::prompt_logprob_start): positions max(1, start) .. in order.
    std::vector<float> prompt_logprobs;
    std::vector<std::vector<kernels::TokenLogprob>> prompt_tops;
    std::vector<int32_t> prompt_ranks;
    std::unique_ptr<tok::StreamingDetokenizer> detok;
    std::string text;      // visible text so far (after a stop string is cut)
    size_t released = 0;   // bytes of text handed on (streamed or final)
    size_t logprobs_released = 0;
    bool finished = false;
    std::string finish_reason;
    json matched = nullptr;
    int64_t prompt_tokens = 0, cached_tokens = 0;
    double last_token_s = 0;
    std::unique_ptr<parsers::ReasoningParser> reasoning;
    std::unique_ptr<parsers::ToolCallParser> tools;
    bool sent_role = false, had_tool_calls = false, forced_fed = false;
    bool sent_prompt_logprobs = false;  // streamed: the first chunk of the choice carries them
    int tool_calls_seen = 0;
  };

  void on_output(Choice& c, const RequestOutput& o);
  void release(Choice& c);
  void stream_piece(Choice& c, const std::string& piece);
  void stream_finish(Choice& c);
  void finish_all();
  void fail(const std::string& message, int status);
  json usage() const;
  json chat_logprobs(const Choice& c, size_t from, size_t to) const;
  json completion_logprobs(const Choice& c, size_t from, size_t to, bool with_prompt = false) const;
  json vllm_prompt_logprobs(const Choice& c) const;
  json native_input_logprobs(const Choice& c, bool tops) const;
  json native_logprob_list(const Choice& c) const;
  json native_meta(const Choice& c) const;
  std::string token_text(int32_t id) const;
  bool want_reasoning() const { return req_.kind == ApiKind::Chat && !ctx_.reasoning_parser.empty() && req_.separate_reasoning; }
  bool want_tools() const {
    return req_.kind == ApiKind::Chat && !ctx_.tool_call_parser.empty() && req_.tool_choice != "none" &&
           req_.tools.is_array() && !req_.tools.empty();
  }

  // nlohmann::ordered_json keeps OpenAI's field order; the responder's json overloads would sort keys.
  void send_json(const json& j) { resp_->send_data(dump(j)); }
  // An OpenAI stream chunk, with the usage so far when the client asked for it in every chunk.
  void send_chunk(json j) {
    if (req_.continuous_usage && j.contains("choices") && !j["choices"].empty()) j["usage"] = usage();
    send_json(j);
  }
  void respond_ordered(const json& j) { resp_->respond(200, "application/json", dump(j)); }

  ServerContext& ctx_;
  ApiRequest req_;
  std::shared_ptr<http::Responder> resp_;
  std::string id_;
  std::time_t created_;
  double t0_;
  std::vector<std::unique_ptr<Choice>> choices_;
  size_t finished_ = 0;
  bool failed_ = false;
};

std::string Generation::token_text(int32_t id) const {
  // Models pad their vocabulary past the tokenizer's (Qwen3: 151936 vs 151669): such ids have no text.
  if (!ctx_.text->has_tokenizer() || id >= ctx_.text->tokenizer().vocab_size()) return "";
  return ctx_.text->tokenizer().decode(std::vector<int32_t>{id}, false);
}

void Generation::start() {
  auto self = shared_from_this();
  std::vector<std::shared_ptr<Request>> requests;
  for (size_t p = 0; p < req_.prompts.size(); ++p)
    for (int64_t k = 0; k < req_.n; ++k) {
      auto c = std::make_unique<Choice>();
      c->index = choices_.size();
      c->prompt_index = p;
      if (ctx_.text->has_tokenizer())
        c->detok = std::make_unique<tok::StreamingDetokenizer>(ctx_.text->tokenizer(), req_.skip_special_tokens);
      if (want_reasoning())
        c->reasoning = parsers::ReasoningParser::create(ctx_.reasoning_parser, req_.starts_in_reasoning, req_.thinking_enabled);
      if (want_tools()) c->tools = parsers::ToolCallParser::create(ctx_.tool_call_parser, req_.tools);
      auto r = std::make_shared<Request>();
      r->id = ctx_.next_id.fetch_add(1);
      r->prompt = req_.prompts[p];
      r->params = req_.sampling;
      r->params.return_logprob = req_.logprobs;
      r->params.top_logprobs = req_.top_logprobs;
      if (r->params.seed) r->params.seed = *r->params.seed + uint64_t(k);  // n samples: different, reproducible
      Choice* cp = c.get();
      r->sink = [self, cp](const RequestOutput& o) { self->on_output(*cp, o); };
      ctx_.engine->validate(*r);  // before anything is submitted: all or nothing
      c->request = r;
      requests.push_back(r);
      choices_.push_back(std::move(c));
    }
  std::weak_ptr<Generation> weak = self;
  resp_->on_disconnect([weak, eng = ctx_.engine] {
    if (auto g = weak.lock())
      for (auto& c : g->choices_)
        if (auto r = c->request.lock()) eng->abort(r);
  });
  if (req_.stream) resp_->start_stream();
  ctx_.metrics->requests_total++;
  for (auto& r : requests) ctx_.engine->submit(r);
}

void Generation::on_output(Choice& c, const RequestOutput& o) {
  if (c.finished || failed_) return;
  double now = now_s();
  c.prompt_tokens = o.prompt_tokens ? o.prompt_tokens : c.prompt_tokens;
  c.cached_tokens = o.cached_tokens ? o.cached_tokens : c.cached_tokens;
  if (o.finish == FinishReason::Abort) {
    if (o.abort_message.rfind("internal error", 0) == 0 || o.abort_message.find("shutting down") != std::string::npos) {
      fail(o.abort_message, 503);
      return;
    }
    ctx_.metrics->requests_aborted++;
    c.finished = true;
    c.finish_reason = "abort";
    if (++finished_ == choices_.size()) finish_all();
    return;
  }
  c.prompt_logprobs.insert(c.prompt_logprobs.end(), o.new_prompt_logprobs.begin(), o.new_prompt_logprobs.end());
  c.prompt_tops.insert(c.prompt_tops.end(), o.new_prompt_top_logprobs.begin(), o.new_prompt_top_logprobs.end());
  c.prompt_ranks.insert(c.prompt_ranks.end(), o.new_prompt_ranks.begin(), o.new_prompt_ranks.end());
  for (size_t i = 0; i < o.new_tokens.size(); ++i) {
    if (c.tokens.empty()) ctx_.metrics->ttft.observe(now - t0_);
    else ctx_.metrics->itl.observe(now - c.last_token_s);
    c.last_token_s = now;
    c.tokens.push_back(o.new_tokens[i]);
    if (i < o.new_logprobs.size()) c.logprobs.push_back(o.new_logprobs[i]);
    if (i < o.new_top_logprobs.size()) c.tops.push_back(o.new_top_logprobs[i]);
    if (c.detok && o.new_tokens[i] < ctx_.text->tokenizer().vocab_size()) c.text += c.detok->push(o.new_tokens[i]);
  }
  bool engine_done = o.finish == FinishReason::Stop || o.finish == FinishReason::Length;
  if (engine_done && c.detok) c.text += c.detok->finish();
  // Stop strings, matched across token boundaries, are cut and never emitted.
  if (!req_.stop.empty()) {
    size_t longest = 0;
    for (auto& s : req_.stop) longest = std::max(longest, s.size());
    size_t from = c.released > longest ? c.released - longest : 0;
    size_t best = std::string::npos;
    const std::string* which = nullptr;
    for (auto& s : req_.stop) {
      size_t p = c.text.find(s, from);
      if (p != std::string::npos && p < best) best = p, which = &s;
    }
    if (which) {
      c.text.resize(best + (req_.include_stop_str ? which->size() : 0));
      c.finished = true;
      c.finish_reason = "stop";
      c.matched = *which;
      if (auto r = c.request.lock()) ctx_.engine->abort(r);  // its Abort output is ignored: c.finished
    }
  }
  if (!c.finished && engine_done) {
    c.finished = true;
    c.finish_reason = o.finish == FinishReason::Stop ? "stop" : "length";
    if (o.finish == FinishReason::Stop) c.matched = o.matched_stop_token;
  }
  release(c);
  if (c.finished) {
    ctx_.metrics->e2e.observe(now - t0_);
    if (req_.stream) stream_finish(c);
    if (++finished_ == choices_.size()) finish_all();
  }
}

void Generation::release(Choice& c) {
  size_t upto = c.finished ? c.text.size() : c.text.size() - stop_holdback(c.text, req_.stop);
  // /generate streams an event for every token (its text may not have grown) and a last one at the finish, which
  // with max_new_tokens 0 is the only one.
  if (upto <= c.released && !(req_.stream && req_.kind == ApiKind::Generate && (!c.tokens.empty() || c.finished)))
    return;
  std::string piece = upto > c.released ? c.text.substr(c.released, upto - c.released) : "";
  c.released = std::max(c.released, upto);
  if (req_.stream) stream_piece(c, piece);
}

json Generation::chat_logprobs(const Choice& c, size_t from, size_t to) const {
  json content = json::array();
  for (size_t i = from; i < to && i < c.logprobs.size(); ++i) {
    std::string t = token_text(c.tokens[i]);
    json e = {{"token", t}, {"logprob", c.logprobs[i]}, {"bytes", bytes_of(t)}, {"top_logprobs", json::array()}};
    if (i < c.tops.size())
      for (auto& tl : c.tops[i]) {
        std::string tt = token_text(tl.id);
        e["top_logprobs"].push_back({{"token", tt}, {"logprob", tl.logprob}, {"bytes", bytes_of(tt)}});
      }
    content.push_back(std::move(e));
  }
  return json{{"content", content}};
}

json Generation::completion_logprobs(const Choice& c, size_t from, size_t to, bool with_prompt) const {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = 0;
  auto add = [&](int32_t id, json lp, const std::vector<kernels::TokenLogprob>* top) {
    std::string t = token_text(id);
    tokens.push_back(t);
    lps.push_back(std::move(lp));
    offsets.push_back(offset);
    offset += t.size();
    json tj = nullptr;
    if (req_.top_logprobs > 0 && top != nullptr) {
      tj = json::object();
      // (a prompt position's list may be longer: prompt_logprobs asked for more)
      for (size_t k = 0; k < top->size() && k < size_t(req_.top_logprobs); ++k)
        tj[token_text((*top)[k].id)] = (*top)[k].logprob;
    }
    tops.push_back(std::move(tj));
  };
  // Echo with logprobs: the prompt's tokens first, the first without a logprob (nothing precedes it), as OpenAI's.
  if (with_prompt) {
    const std::vector<int32_t>& prompt = req_.prompts[c.prompt_index];
    for (size_t i = 0; i < prompt.size(); ++i) {
      const bool scored = i >= 1 && i - 1 < c.prompt_logprobs.size();
      add(prompt[i], scored ? json(c.prompt_logprobs[i - 1]) : json(nullptr),
          scored && i - 1 < c.prompt_tops.size() ? &c.prompt_tops[i - 1] : nullptr);
    }
  }
  for (size_t i = from; i < to && i < c.logprobs.size(); ++i) add(c.tokens[i], c.logprobs[i], i < c.tops.size() ? &c.tops[i] : nullptr);
  return json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// vLLM's prompt_logprobs: null for the first prompt token, then a map a position from token id (a string) to
// {logprob, rank, decoded_token}: the prompt token's entry, then its position's top n with ranks 1 .. n (a prompt
// token among them keeps its top-n entry, as vLLM builds the map).
json Generation::vllm_prompt_logprobs(const Choice& c) const {
  const std::vector<int32_t>& prompt = req_.prompts[c.prompt_index];
  auto entry = [&](int32_t id, float lp, int32_t rank) {
    return json{{"logprob", lp}, {"rank", rank}, {"decoded_token", token_text(id)}};
  };
  json l = json::array();
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (i == 0 || i - 1 >= c.prompt_logprobs.size()) {
      l.push_back(nullptr);
      continue;
    }
    json m = json::object();
    m[std::to_string(prompt[i])] = entry(prompt[i], c.prompt_logprobs[i - 1],
                                         i - 1 < c.prompt_ranks.size() ? c.prompt_ranks[i - 1] : 0);
    if (i - 1 < c.prompt_tops.size())
      for (size_t k = 0; k < c.prompt_tops[i - 1].size() && k < size_t(req_.prompt_logprobs); ++k) {
        const kernels::TokenLogprob& t = c.prompt_tops[i - 1][k];
        m[std::to_string(t.id)] = entry(t.id, t.logprob, int32_t(k + 1));
      }
    l.push_back(std::move(m));
  }
  return l;
}

// SGLang's input_token_logprobs ([logprob, id, text], null logprob for position 0) from logprob_start_len on, or
// input_top_logprobs (a list of [logprob, id, text] a position, null for position 0).
json Generation::native_input_logprobs(const Choice& c, bool tops) const {
  const std::vector<int32_t>& prompt = req_.prompts[c.prompt_index];
  const size_t start = size_t(std::max<int64_t>(req_.sampling.prompt_logprob_start, 0));
  const size_t first = std::max<size_t>(start, 1);  // c.prompt_logprobs[k] is position first + k
  auto text = [&](int32_t id) { return req_.return_text_in_logprobs ? json(token_text(id)) : json(nullptr); };
  json l = json::array();
  for (size_t i = start; i < prompt.size(); ++i) {
    const bool scored = i >= first && i - first < c.prompt_logprobs.size();
    if (!tops) {
      l.push_back(json::array({scored ? json(c.prompt_logprobs[i - first]) : json(nullptr), prompt[i], text(prompt[i])}));
    } else if (scored && i - first < c.prompt_tops.size()) {
      json s = json::array();
      for (auto& tl : c.prompt_tops[i - first]) s.push_back(json::array({tl.logprob, tl.id, text(tl.id)}));
      l.push_back(std::move(s));
    } else {
      l.push_back(nullptr);
    }
  }
  return l;
}

json Generation::native_logprob_list(const Choice& c) const {
  json l = json::array();
  for (size_t i = 0; i < c.logprobs.size(); ++i)
    l.push_back(json::array({c.logprobs[i], c.tokens[i], req_.return_text_in_logprobs ? json(token_text(c.tokens[i])) : json(nullptr)}));
  return l;
}

json Generation::native_meta(const Choice& c) const {
  json fr = nullptr;
  if (c.finished) {
    fr = {{"type", c.finish_reason}};
    if (c.finish_reason == "stop") fr["matched"] = c.matched;
    if (c.finish_reason == "length") fr["length"] = c.tokens.size();
  }
  json meta = {{"id", fmt::format("{}-{}", id_, c.index)},
               {"finish_reason", fr},
               {"prompt_tokens", c.prompt_tokens},
               {"completion_tokens", c.tokens.size()},
               {"cached_tokens", c.cached_tokens},
               {"e2e_latency", now_s() - t0_}};
  if (req_.logprobs && req_.sampling.prompt_logprob_start >= 0) {
    meta["input_token_logprobs"] = native_input_logprobs(c, false);
    if (req_.top_logprobs > 0) meta["input_top_logprobs"] = native_input_logprobs(c, true);
  }
  if (req_.logprobs) {
    meta["output_token_logprobs"] = native_logprob_list(c);
    if (req_.top_logprobs > 0) {
      json tops = json::array();
      for (auto& step : c.tops) {
        json s = json::array();
        for (auto& tl : step)
          s.push_back(json::array({tl.logprob, tl.id, req_.return_text_in_logprobs ? json(token_text(tl.id)) : json(nullptr)}));
        tops.push_back(s);
      }
      meta["output_top_logprobs"] = tops;
    }
  }
  return meta;
}

void Generation::stream_piece(Choice& c, const std::string& piece) {
  size_t lp_to = c.tokens.size();
  if (req_.kind == ApiKind::Generate) {
    if (!c.tokens.empty() || c.finished) {
      json ev = {{"text", c.text.substr(0, c.released)}, {"output_ids", c.tokens}, {"meta_info", native_meta(c)}};
      if (req_.batch || choices_.size() > 1) ev["index"] = c.index;
      send_json(ev);
    }
    return;
  }
  if (req_.kind == ApiKind::Completion) {
    std::string text = piece;
    const bool first = req_.echo && !c.sent_role;  // the echoed prompt (and its logprobs) lead the first chunk
    if (first && c.prompt_index < req_.prompt_texts.size()) text = req_.prompt_texts[c.prompt_index] + text;
    c.sent_role = true;
    if (text.empty() && lp_to == c.logprobs_released) return;
    json ch = {{"index", c.index}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (req_.logprobs) ch["logprobs"] = completion_logprobs(c, c.logprobs_released, lp_to, first);
    if (req_.prompt_logprobs >= 0 && !c.sent_prompt_logprobs) ch["prompt_logprobs"] = vllm_prompt_logprobs(c);
    c.sent_prompt_logprobs = true;
    c.logprobs_released = lp_to;
    send_chunk({{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", req_.model},
                {"choices", json::array({ch})}});
    return;
  }
  // Chat: role first, then reasoning / content / tool-call deltas.
  auto send_delta = [&](json delta, json logprobs, bool first = false) {
    json ch = {{"index", c.index}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)}, {"finish_reason", nullptr}};
    json chunk = {{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", req_.model},
                  {"choices", json::array({ch})}};
    if (first && req_.prompt_logprobs >= 0) chunk["prompt_logprobs"] = vllm_prompt_logprobs(c);  // as vLLM's response
    send_chunk(chunk);
  };
  if (!c.sent_role) {
    send_delta({{"role", "assistant"}, {"content", ""}}, nullptr, true);
    c.sent_role = true;
  }
  std::string content = piece, reasoning;
  if (c.reasoning) {
    auto r = c.finished ? [&] {
      auto a = c.reasoning->push(piece);
      auto b = c.reasoning->finish();
      return parsers::ReasoningResult{a.reasoning + b.reasoning, a.content + b.content};
    }() : c.reasoning->push(piece);
    reasoning = r.reasoning;
    content = r.content;
  }
  std::vector<parsers::ToolCallDelta> calls;
  if (c.tools) {
    if (!c.forced_fed) {
      content = req_.forced_prefix + content;
      c.forced_fed = true;
    }
    auto t = c.tools->push(content);
    content = t.content;
    calls = t.calls;
    if (c.finished) {
      auto f = c.tools->finish();
      content += f.content;
      calls.insert(calls.end(), f.calls.begin(), f.calls.end());
    }
  }
  json lp = nullptr;
  if (req_.logprobs && lp_to > c.logprobs_released) {
    lp = chat_logprobs(c, c.logprobs_released, lp_to);
    c.logprobs_released = lp_to;
  }
  if (!reasoning.empty()) send_delta({{"reasoning_content", reasoning}}, nullptr);
  if (!content.empty() || !lp.is_null()) send_delta({{"content", content}}, lp);
  for (auto& d : calls) {
    c.had_tool_calls = true;
    json tc = {{"index", d.index}};
    if (!d.id.empty()) tc["id"] = d.id;
    if (!d.id.empty()) tc["type"] = "function";
    json fn = json::object();
    if (!d.name.empty()) fn["name"] = d.name;
    fn["arguments"] = d.arguments_fragment;
    tc["function"] = fn;
    send_delta({{"tool_calls", json::array({tc})}}, nullptr);
  }
}

void Generation::stream_finish(Choice& c) {
  if (req_.kind == ApiKind::Generate) return;  // the last event already carried finish_reason
  // A call cut off by max_tokens still reports "length", as SGLang does.
  std::string reason = c.had_tool_calls && c.finish_reason == "stop" ? "tool_calls" : c.finish_reason;
  json ch = {{"index", c.index}, {"logprobs", nullptr}, {"finish_reason", reason}};
  if (req_.kind == ApiKind::Chat) {
    ch["delta"] = json::object();
    if (c.finish_reason == "stop" && c.matched.is_string()) ch["matched_stop"] = c.matched;
    json chunk = {{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", req_.model},
                  {"choices", json::array({ch})}};
    // No text was streamed (max_tokens 0): the prompt's logprobs come with the last chunk.
    if (req_.prompt_logprobs >= 0 && !c.sent_role) chunk["prompt_logprobs"] = vllm_prompt_logprobs(c);
    send_chunk(chunk);
  } else {
    // A completion with no text (max_tokens 0) echoes its prompt here (and its logprobs with them).
    const bool first = req_.echo && !c.sent_role;
    ch["text"] = first && c.prompt_index < req_.prompt_texts.size() ? req_.prompt_texts[c.prompt_index] : "";
    if (first && req_.logprobs) ch["logprobs"] = completion_logprobs(c, 0, c.tokens.size(), true);
    if (req_.prompt_logprobs >= 0 && !c.sent_prompt_logprobs) ch["prompt_logprobs"] = vllm_prompt_logprobs(c);
    c.sent_prompt_logprobs = true;
    c.sent_role = true;
    send_chunk({{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", req_.model},
                {"choices", json::array({ch})}});
  }
}

// Each distinct prompt counts once (as OpenAI counts the n choices of a prompt), and so do its cached tokens: the
// most any of its choices took from the prefix cache. The first choice to prefill a prompt usually reports 0 and its
// siblings, which share the pages it computed, nearly all of it (SGLang sums them instead, which can exceed
// prompt_tokens; OpenAI's cached_tokens is a part of prompt_tokens).
json Generation::usage() const {
  int64_t completion = 0;
  std::vector<int64_t> cached_of(req_.prompts.size(), -1);  // -1: no choice of that prompt
  for (auto& c : choices_) {
    completion += int64_t(c->tokens.size());
    cached_of[c->prompt_index] = std::max(cached_of[c->prompt_index], c->cached_tokens);
  }
  int64_t prompt = 0, cached = 0;
  for (size_t i = 0; i < cached_of.size(); ++i) {
    if (cached_of[i] < 0) continue;
    prompt += int64_t(req_.prompts[i].size());
    cached += cached_of[i];
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

void Generation::fail(const std::string& message, int status) {
  if (failed_) return;
  failed_ = true;
  ctx_.metrics->requests_failed++;
  for (auto& c : choices_)
    if (auto r = c->request.lock()) ctx_.engine->abort(r);
  if (req_.stream) {
    send_json({{"error", {{"message", message}, {"type", "server_error"}, {"param", nullptr}, {"code", status}}}});
    resp_->send_done();
    resp_->end();
  } else {
    resp_->respond_error(status, message, "server_error");
  }
}

void Generation::finish_all() {
  bool all_aborted = std::all_of(choices_.begin(), choices_.end(), [](auto& c) { return c->finish_reason == "abort"; });
  if (req_.stream) {
    if (req_.include_usage && req_.kind != ApiKind::Generate)
      send_json({{"id", id_}, {"object", req_.kind == ApiKind::Chat ? "chat.completion.chunk" : "text_completion"},
                         {"created", created_}, {"model", req_.model}, {"choices", json::array()}, {"usage", usage()}});
    resp_->send_done();
    resp_->end();
    return;
  }
  if (all_aborted) {
    resp_->respond_error(499, "the request was aborted", "invalid_request_error");
    return;
  }
  if (req_.kind == ApiKind::Generate) {
    json items = json::array();
    for (auto& c : choices_)
      items.push_back({{"text", c->text}, {"output_ids", c->tokens}, {"meta_info", native_meta(*c)}});
    respond_ordered(items.size() == 1 && !req_.batch ? items[0] : items);
    return;
  }
  json out_choices = json::array();
  for (auto& cp : choices_) {
    Choice& c = *cp;
    if (req_.kind == ApiKind::Completion) {
      std::string text = c.text;
      if (req_.echo && c.prompt_index < req_.prompt_texts.size()) text = req_.prompt_texts[c.prompt_index] + text;
      json ch = {{"index", c.index}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", c.finish_reason}};
      if (req_.logprobs) ch["logprobs"] = completion_logprobs(c, 0, c.tokens.size(), req_.echo);
      if (req_.prompt_logprobs >= 0) ch["prompt_logprobs"] = vllm_prompt_logprobs(c);
      if (c.finish_reason == "stop" && c.matched.is_string()) ch["matched_stop"] = c.matched;
      out_choices.push_back(ch);
      continue;
    }
    std::string content = c.text, reasoning;
    bool has_reasoning = false;
    if (want_reasoning()) {
      auto p = parsers::ReasoningParser::create(ctx_.reasoning_parser, req_.starts_in_reasoning, req_.thinking_enabled);
      auto r = p->parse_full(c.text);
      reasoning = r.reasoning;
      content = r.content;
      has_reasoning = true;
    }
    json msg = {{"role", "assistant"}, {"content", content}};
    if (has_reasoning) msg["reasoning_content"] = reasoning.empty() ? json(nullptr) : json(reasoning);
    std::string reason = c.finish_reason;
    if (want_tools()) {
      auto p = parsers::ToolCallParser::create(ctx_.tool_call_parser, req_.tools);
      auto t = p->parse_full(req_.forced_prefix + content);
      if (!t.calls.empty()) {
        json calls = json::array();
        for (auto& tc : t.calls)
          calls.push_back({{"id", tc.id}, {"type", "function"}, {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}});
        msg["content"] = t.content.empty() ? json(nullptr) : json(t.content);
        msg["tool_calls"] = calls;
        if (reason == "stop") reason = "tool_calls";
      }
    }
    json ch = {{"index", c.index}, {"message", msg}, {"logprobs", nullptr}, {"finish_reason", reason}};
    if (req_.logprobs) ch["logprobs"] = chat_logprobs(c, 0, c.tokens.size());
    if (c.finish_reason == "stop" && c.matched.is_string()) ch["matched_stop"] = c.matched;
    out_choices.push_back(ch);
  }
  json out = {{"id", id_},
              {"object", req_.kind == ApiKind::Chat ? "chat.completion" : "text_completion"},
              {"created", created_},
              {"model", req_.model},
              {"choices", out_choices},
              {"usage", usage()}};
  // vLLM's chat response carries the prompt's logprobs once, beside the choices (they share the prompt).
  if (req_.kind == ApiKind::Chat && req_.prompt_logprobs >= 0 && !choices_.empty())
    out["prompt_logprobs"] = vllm_prompt_logprobs(*choices_.front());
  respond_ordered(out);
}

}  // namespace

void start_generation(ServerContext& ctx, ApiRequest req, std::shared_ptr<http::Responder> responder) {
  auto g = std::make_shared<Generation>(ctx, std::move(req), std::move(responder));
  g->start();
}

}  // namespace moeserve::server

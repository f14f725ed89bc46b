#include "server/protocol.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/json_depth.h"
#include "core/json_int.h"
#include "grammar/ebnf.h"
#include "parsers/reasoning.h"
#include "parsers/tool_calls.h"
#include "server/text.h"
#include "server/tool_grammar.h"

namespace moeserve::server {

using nlohmann::ordered_json;
using json = nlohmann::ordered_json;

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw ApiError(400, msg, param); }

// Typed optional fields. null counts as absent, as OpenAI's API treats it.
struct Body {
  const json& j;
  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  double number(const char* k, double def, double lo, double hi) const {
    if (!has(k)) return def;
    if (!j[k].is_number()) bad(k, fmt::format("'{}' must be a number, got {}", k, j[k].dump()));
    double v = j[k].get<double>();
    if (!(v >= lo && v <= hi)) bad(k, fmt::format("'{}' must be between {} and {}, got {}", k, lo, hi, v));
    return v;
  }
  // An int64 in [lo, hi] (core/json_int.h: integral floats such as 1e3 too, compared exactly).
  int64_t integer(const char* k, int64_t def, int64_t lo, int64_t hi) const {
    if (!has(k)) return def;
    const json& v = j[k];
    int64_t x = 0;
    const JsonInt got = json_to_int64(v, x);
    if (got == JsonInt::NotInteger) bad(k, fmt::format("'{}' must be an integer, got {}", k, v.dump()));
    if (got == JsonInt::OutOfRange || x < lo || x > hi)
      bad(k, fmt::format("'{}' must be between {} and {}, got {}", k, lo, hi, v.dump()));
    return x;
  }
  bool boolean(const char* k, bool def) const {
    if (!has(k)) return def;
    if (!j[k].is_boolean()) bad(k, fmt::format("'{}' must be true or false, got {}", k, j[k].dump()));
    return j[k].get<bool>();
  }
  std::string str(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    if (!j[k].is_string()) bad(k, fmt::format("'{}' must be a string, got {}", k, j[k].dump()));
    return j[k].get<std::string>();
  }
};

std::vector<int32_t> token_list(const json& v, const char* param, int64_t vocab) {
  std::vector<int32_t> r;
  for (auto& t : v) {
    if (!t.is_number_integer()) bad(param, fmt::format("'{}' must hold token ids (integers), got {}", param, t.dump()));
    int64_t id = t.get<int64_t>();
    if (id < 0 || id >= vocab) bad(param, fmt::format("token id {} is outside the vocabulary [0, {})", id, vocab));
    r.push_back(int32_t(id));
  }
  return r;
}

std::vector<std::string> stop_list(const Body& b, const char* k) {
  std::vector<std::string> r;
  if (!b.has(k)) return r;
  const json& v = b.j[k];
  if (v.is_string()) {
    r.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (auto& s : v) {
      if (!s.is_string()) bad(k, fmt::format("'{}' must be a string or a list of strings", k));
      r.push_back(s.get<std::string>());
    }
  } else {
    bad(k, fmt::format("'{}' must be a string or a list of strings", k));
  }
  if (r.size() > 64) bad(k, "at most 64 stop strings");
  r.erase(std::remove(r.begin(), r.end(), std::string()), r.end());
  return r;
}

std::vector<int64_t> id_list(const Body& b, const char* k) {
  std::vector<int64_t> r;
  if (!b.has(k)) return r;
  if (!b.j[k].is_array()) bad(k, fmt::format("'{}' must be a list of token ids", k));
  for (auto& t : b.j[k]) {
    if (!t.is_number_integer()) bad(k, fmt::format("'{}' must hold integers", k));
    r.push_back(t.get<int64_t>());
  }
  return r;
}

// OpenAI's logit_bias: {"token id": bias in [-100, 100]}; the ids decimal and inside the vocabulary.
std::vector<std::pair<int32_t, float>> logit_bias(const Body& b, int64_t vocab) {
  std::vector<std::pair<int32_t, float>> r;
  if (!b.has("logit_bias")) return r;
  const json& m = b.j["logit_bias"];
  if (!m.is_object()) bad("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
  for (auto it = m.begin(); it != m.end(); ++it) {
    const std::string& k = it.key();
    int64_t id = 0;
    // Canonical decimal (no sign, no leading zero): the object's keys are unique, so the ids are.
    bool digits = !k.empty() && k.size() <= 10 && (k.size() == 1 || k[0] != '0');
    for (char c : k) digits = digits && c >= '0' && c <= '9';
    if (digits) id = std::stoll(k);
    if (!digits || id >= vocab)
      bad("logit_bias", fmt::format("logit_bias: '{}' is not a token id (0 to {}, decimal)", k.substr(0, 40), vocab - 1));
    const json& v = it.value();
    if (!v.is_number() || !(v.get<double>() >= -100.0 && v.get<double>() <= 100.0))
      bad("logit_bias", fmt::format("logit_bias: the bias of token {} must be a number from -100 to 100, got {}", id,
                                    v.dump().substr(0, 40)));
    r.emplace_back(int32_t(id), float(v.get<double>()));
  }
  return r;
}

void check_model(const Body& b, const ParseContext& ctx, ApiRequest& r) {
  r.model = b.str("model", ctx.served_model_name);
  if (!r.model.empty()) check_model_name(r.model, ctx);
  r.model = ctx.served_model_name;
}

// Constrained decoding: the grammar a request's output must follow - a JSON schema (OpenAI's response_format
// json_object / json_schema, vLLM's guided_json and structured_outputs {"json": ...}, SGLang's json_schema, a schema
// as a JSON string) or a regular expression (vLLM's guided_regex / guided_choice and structured_outputs {"regex"} /
// {"choice"}, SGLang's regex, and an EBNF grammar of a regular language - vLLM's guided_grammar / structured_outputs
// {"grammar"}, SGLang's ebnf - expanded into one: grammar/ebnf.h); null when none. Recursive grammars and structural
// tags are not implemented: a request that asks for one is refused rather than answered with text its client would
// take for conforming output.
std::shared_ptr<grammar::ConstraintSpec> requested_grammar(const Body& b, const ParseContext& ctx) {
  std::shared_ptr<grammar::ConstraintSpec> spec;
  std::string from;
  // One grammar a request; `build` compiles it (a UserError from the compiler becomes a 400 naming the field).
  auto take = [&](const std::string& field, auto build) {
    if (spec) bad(field, fmt::format("'{}' and '{}' both constrain the output: send one", from, field));
    spec = std::make_shared<grammar::ConstraintSpec>();
    from = field;
    try {
      build(*spec);
    } catch (const ApiError&) {
      throw;
    } catch (const UserError& e) {
      bad(field, fmt::format("'{}': {}", field, e.what()));
    }
  };
  auto schema = [&](const std::string& field, const json& j) {
    json parsed;
    const json* sj = &j;
    if (j.is_string()) {  // SGLang's json_schema and vLLM's guided_json may carry the schema as a JSON string
      parsed = json::parse(j.get_ref<const std::string&>(), nullptr, false);
      if (parsed.is_discarded()) bad(field, fmt::format("'{}' is a string that is not valid JSON", field));
      sj = &parsed;
    }
    if (!sj->is_object() && !sj->is_boolean())
      bad(field, fmt::format("'{}' must be a JSON schema (an object), got {}", field, sj->dump().substr(0, 80)));
    take(field, [&](grammar::ConstraintSpec& s) { s.schema = grammar::JsonSchema::compile(*sj); });
  };
  // A grammar given as text, compiled to a regex: a regular expression, or an EBNF grammar expanded into one.
  auto textual = [&](const std::string& field, const json& j, const char* what, auto compile) {
    if (!j.is_string()) bad(field, fmt::format("'{}' must be {} (a string)", field, what));
    take(field, [&](grammar::ConstraintSpec& s) { s.regex = compile(j.get_ref<const std::string&>()); });
  };
  auto regex = [&](const std::string& field, const json& j) {
    textual(field, j, "a regular expression", [](const std::string& t) { return grammar::Regex::compile(t); });
  };
  auto ebnf = [&](const std::string& field, const json& j) {
    textual(field, j, "an EBNF grammar", [](const std::string& t) { return grammar::compile_ebnf(t); });
  };
  auto choice = [&](const std::string& field, const json& j) {
    if (!j.is_array() || j.empty() || !std::all_of(j.begin(), j.end(), [](const json& c) { return c.is_string(); }))
      bad(field, fmt::format("'{}' must be a non-empty list of strings", field));
    take(field, [&](grammar::ConstraintSpec& s) { s.regex = grammar::Regex::choice(j.get<std::vector<std::string>>()); });
  };
  if (b.has("response_format")) {
    const json& rf = b.j["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
      bad("response_format", "'response_format' must be an object with a 'type': text, json_object or json_schema");
    const std::string& type = rf["type"].get_ref<const std::string&>();
    if (type == "json_object") {
      take("response_format", [](grammar::ConstraintSpec& s) { s.schema = grammar::JsonSchema::any_object(); });
    } else if (type == "json_schema") {
      if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
        bad("response_format", "response_format json_schema needs 'json_schema': {\"name\": ..., \"schema\": {...}}");
      const json& js = rf["json_schema"];
      // OpenAI's schema is optional: without one, any JSON value.
      schema("response_format", js.contains("schema") && !js["schema"].is_null() ? js["schema"] : json::object());
    } else if (type != "text") {
      bad("response_format", fmt::format("response_format type '{}' is not supported (text, json_object, json_schema)",
                                         type.substr(0, 40)));
    }
  }
  if (b.has("guided_json")) schema("guided_json", b.j["guided_json"]);
  if (b.has("json_schema")) schema("json_schema", b.j["json_schema"]);
  if (b.has("guided_regex")) regex("guided_regex", b.j["guided_regex"]);
  if (b.has("regex")) regex("regex", b.j["regex"]);
  if (b.has("guided_choice")) choice("guided_choice", b.j["guided_choice"]);
  if (b.has("guided_grammar")) ebnf("guided_grammar", b.j["guided_grammar"]);
  if (b.has("ebnf")) ebnf("ebnf", b.j["ebnf"]);
  if (b.has("structured_outputs")) {
    const json& so = b.j["structured_outputs"];
    if (!so.is_object()) bad("structured_outputs", "'structured_outputs' must be an object such as {\"json\": {...}}");
    for (auto it = so.begin(); it != so.end(); ++it) {
      if (it.value().is_null()) continue;
      if (it.key() == "json") schema("structured_outputs", it.value());
      else if (it.key() == "regex") regex("structured_outputs", it.value());
      else if (it.key() == "choice") choice("structured_outputs", it.value());
      else if (it.key() == "grammar") ebnf("structured_outputs", it.value());
      else if (it.key() != "disable_fallback" && it.key() != "disable_any_whitespace" &&
               it.key() != "disable_additional_properties" && it.key() != "whitespace_pattern")
        bad("structured_outputs", fmt::format("structured_outputs '{}' is not supported (json, regex, choice, grammar are)",
                                              it.key().substr(0, 40)));
    }
  }
  if (b.has("structural_tag"))
    bad("structural_tag", "'structural_tag' asks for constrained decoding by structural tags, which this server does "
                          "not support (JSON schemas, regular expressions, choices and regular EBNF grammars are: "
                          "response_format, guided_json / guided_regex / guided_choice / guided_grammar, json_schema / "
                          "regex / ebnf)");
  if (spec && !ctx.text->has_tokenizer())
    bad(from, "constrained decoding needs the tokenizer (this server runs with --skip-tokenizer-init)");
  if (spec) spec->vocab = ctx.text->grammar_vocabulary(ctx.vocab_size);
  return spec;
}

// The sampling fields every endpoint shares, with generation_config.json's defaults. OpenAI bodies carry them
// at the top level (temperature up to 2, "min_tokens"); SGLang's in sampling_params ("min_new_tokens").
void sampling_fields(const Body& b, const ParseContext& ctx, double max_temperature, const char* min_tokens_key,
                     ApiRequest& r) {
  SamplingParams& s = r.sampling;
  s.grammar = requested_grammar(b, ctx);
  s.temperature = float(b.number("temperature", ctx.default_temperature, 0.0, max_temperature));
  s.top_p = float(b.number("top_p", ctx.default_top_p, 1e-9, 1.0));
  s.top_k = b.integer("top_k", ctx.default_top_k, -1, 1 << 30);
  if (s.top_k == 0) s.top_k = -1;
  s.min_p = float(b.number("min_p", ctx.default_min_p, 0.0, 1.0));
  s.presence_penalty = float(b.number("presence_penalty", 0.0, -2.0, 2.0));
  s.frequency_penalty = float(b.number("frequency_penalty", 0.0, -2.0, 2.0));
  s.repetition_penalty = float(b.number("repetition_penalty", ctx.default_repetition_penalty, 1e-6, 10.0));
  s.ignore_eos = b.boolean("ignore_eos", false);
  s.min_new_tokens = b.integer(min_tokens_key, 0, 0, 1 << 30);
  s.stop_token_ids = id_list(b, "stop_token_ids");
  s.logit_bias = logit_bias(b, ctx.vocab_size);
  if (b.has("seed")) s.seed = uint64_t(b.integer("seed", 0, INT64_MIN, INT64_MAX));
  r.stop = stop_list(b, "stop");
  r.n = b.integer("n", 1, 1, 128);
  r.skip_special_tokens = b.boolean("skip_special_tokens", true);
  r.include_stop_str = b.boolean("include_stop_str_in_output", false) || b.boolean("no_stop_trim", false);
}

// Sampling and streaming fields shared by the OpenAI endpoints (and their common extensions).
void openai_sampling(const Body& b, const ParseContext& ctx, ApiRequest& r) {
  sampling_fields(b, ctx, 2.0, "min_tokens", r);
  r.stream = b.boolean("stream", false);
  if (b.has("stream_options")) {
    if (!b.j["stream_options"].is_object()) bad("stream_options", "'stream_options' must be an object");
    Body so{b.j["stream_options"]};
    r.include_usage = so.boolean("include_usage", false);
    r.continuous_usage = so.boolean("continuous_usage_stats", false);
  }
  // vLLM's prompt_logprobs: the prompt scored from its second token, with this many top logprobs a position (its -1,
  // the whole vocabulary, is refused by the range).
  r.prompt_logprobs = b.integer("prompt_logprobs", -1, 0, 20);
  if (r.prompt_logprobs >= 0) {
    r.sampling.prompt_logprob_start = 0;
    r.sampling.prompt_top_logprobs = r.prompt_logprobs;
  }
}

void set_max_tokens(const Body& b, const ParseContext& ctx, ApiRequest& r) {
  int64_t longest = 0;
  for (auto& p : r.prompts) longest = std::max<int64_t>(longest, int64_t(p.size()));
  if (longest >= ctx.context_length)
    bad("messages", fmt::format("This model's maximum context length is {} tokens, but the prompt has {} tokens",
                                ctx.context_length, longest));
  const char* key = b.has("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  r.max_tokens_given = b.has(key);
  int64_t room = ctx.context_length - longest;
  int64_t v = b.integer(key, room, 0, INT64_MAX / 2);
  r.sampling.max_new_tokens = std::min(v, room);  // clamped to what fits, like SGLang
}

std::string text_of_content(const json& content, size_t index) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    bad("messages", fmt::format("messages[{}].content must be a string or a list of content parts", index));
  std::string out;
  for (auto& part : content) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      bad("messages", fmt::format("messages[{}].content parts need a 'type'", index));
    std::string type = part["type"];
    if (type != "text")
      bad("messages", fmt::format("messages[{}]: content part type '{}' is not supported (text only)", index, type));
    if (!part.contains("text") || !part["text"].is_string())
      bad("messages", fmt::format("messages[{}]: a text part needs a string 'text'", index));
    if (!out.empty()) out += "\n";
    out += part["text"].get<std::string>();
  }
  return out;
}

}  // namespace

json parse_body(const std::string& body) {
  if (json_nesting_exceeds(body))
    throw ApiError(400,
                   fmt::format("the request body nests arrays and objects more than {} levels deep", kMaxJsonDepth));
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

json normalize_messages(const json& messages) {
  if (!messages.is_array()) bad("messages", "'messages' must be a list");
  if (messages.empty()) bad("messages", "'messages' must not be empty");
  static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool", "function"};
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object()) bad("messages", fmt::format("messages[{}] must be an object", i));
    if (!m.contains("role") || !m["role"].is_string()) bad("messages", fmt::format("messages[{}] needs a 'role'", i));
    std::string role = m["role"];
    if (std::none_of(std::begin(kRoles), std::end(kRoles), [&](const char* r) { return role == r; }))
      bad("messages", fmt::format("messages[{}]: unknown role '{}' (valid: system, developer, user, assistant, tool)",
                                  i, role));
    json n = m;
    if (m.contains("content")) n["content"] = text_of_content(m["content"], i);
    else if (role != "assistant") bad("messages", fmt::format("messages[{}] ({}) needs 'content'", i, role));
    else n["content"] = "";
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (!m["tool_calls"].is_array()) bad("messages", fmt::format("messages[{}].tool_calls must be a list", i));
      for (auto& tc : n["tool_calls"]) {
        // Templates read arguments as a mapping; OpenAI sends a JSON string. Give them the object when it parses.
        if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
            tc["function"].contains("arguments") && tc["function"]["arguments"].is_string()) {
          const std::string& text = tc["function"]["arguments"].get_ref<const std::string&>();
          if (json_nesting_exceeds(text)) continue;  // stays a string
          try {
            json a = json::parse(text);
            if (a.is_object()) tc["function"]["arguments"] = std::move(a);
          } catch (const json::exception&) {
          }
        }
      }
    }
    out.push_back(std::move(n));
  }
  return out;
}

ChatTemplateInputs parse_chat_template_inputs(const json& body) {
  Body b{body};
  ChatTemplateInputs in;
  if (!b.has("messages")) bad("messages", "'messages' is required");
  in.messages = normalize_messages(body["messages"]);
  if (b.has("chat_template_kwargs")) {
    if (!body["chat_template_kwargs"].is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    in.kwargs = body["chat_template_kwargs"];
  }
  if (b.has("tools")) {
    if (!body["tools"].is_array()) bad("tools", "'tools' must be a list");
    for (auto& t : body["tools"])
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
          !t["function"]["name"].is_string())
        bad("tools", "each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}");
    in.tools = body["tools"];
  }
  in.add_generation_prompt = b.boolean("add_generation_prompt", true);
  return in;
}

// A chat request's constrained output leaves the reasoning section, which the reasoning parser separates, free:
// the grammar starts after </think> (as vLLM's and SGLang's reasoning-aware structured outputs do).
void constrain_after_reasoning(const ParseContext& ctx, ApiRequest& r) {
  if (!r.forced_prefix.empty())
    bad("tool_choice", "tool_choice 'required' or a named function already fixes the output as a tool call; it "
                       "cannot also follow a constrained-decoding grammar (response_format, guided_*, regex)");
  if (ctx.reasoning_parser.empty() || !r.separate_reasoning || !r.thinking_enabled) return;
  const auto open = ctx.text->token_id("<think>"), close = ctx.text->token_id("</think>");
  if (!close) return;  // no end of reasoning to wait for
  auto spec = std::make_shared<grammar::ConstraintSpec>(*r.sampling.grammar);
  const bool inside = parsers::ReasoningParser::create(ctx.reasoning_parser, r.starts_in_reasoning, true)->in_reasoning();
  spec->start = inside ? grammar::ConstraintSpec::Start::kReasoning : grammar::ConstraintSpec::Start::kMaybeReasoning;
  spec->think_open = open.value_or(-1);
  spec->think_close = *close;
  r.sampling.grammar = std::move(spec);
}

ApiRequest parse_chat_request(const json& body, const ParseContext& ctx) {
  Body b{body};
  ApiRequest r;
  r.kind = ApiKind::Chat;
  check_model(b, ctx, r);
  openai_sampling(b, ctx, r);
  r.logprobs = b.boolean("logprobs", false);
  r.top_logprobs = b.integer("top_logprobs", 0, 0, 20);
  if (r.top_logprobs > 0 && !r.logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  r.separate_reasoning = b.boolean("separate_reasoning", true);
  ChatTemplateInputs in = parse_chat_template_inputs(body);
  if (in.kwargs.contains("enable_thinking") && in.kwargs["enable_thinking"].is_boolean())
    r.thinking_enabled = in.kwargs["enable_thinking"].get<bool>();
  r.tools = in.tools;
  if (b.has("tool_choice")) {
    const json& tc = body["tool_choice"];
    if (tc.is_string()) {
      r.tool_choice = tc.get<std::string>();
      if (r.tool_choice != "none" && r.tool_choice != "auto" && r.tool_choice != "required")
        bad("tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", ...}");
    } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
               tc["function"].contains("name") && tc["function"]["name"].is_string()) {
      r.tool_choice = "function";
      r.tool_choice_function = tc["function"]["name"];
    } else {
      bad("tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if (r.tool_choice != "none" && r.tool_choice != "auto" && (r.tools.is_null() || r.tools.empty()))
      bad("tool_choice", "'tool_choice' names a tool, but no 'tools' were given");
    if (r.tool_choice == "function") {
      bool found = false;
      for (auto& t : r.tools) found |= t["function"]["name"] == r.tool_choice_function;
      if (!found) bad("tool_choice", fmt::format("'tool_choice' names '{}', which is not in 'tools'", r.tool_choice_function));
    }
  }
  std::string prompt = ctx.text->render_chat(in.messages, in.tools, in.add_generation_prompt, in.kwargs);
  bool tool_grammar = false;
  if ((r.tool_choice == "required" || r.tool_choice == "function") && !ctx.tool_call_parser.empty()) {
    // The model continues inside a call of the right function (or some function): no thinking first. Where the
    // parser's syntax has a grammar (tool_grammar.h) and no other grammar was asked for (that is a 400 below), the
    // call follows the tools' parameters.
    ToolCallGrammar g;
    if (!r.sampling.grammar && ctx.text->has_tokenizer())
      g = tool_call_grammar(ctx.tool_call_parser, r.tools, r.tool_choice == "function" ? r.tool_choice_function : "",
                            b.boolean("parallel_tool_calls", true));
    if (g.spec) {
      g.spec->vocab = ctx.text->grammar_vocabulary(ctx.vocab_size);
      r.sampling.grammar = std::move(g.spec);
      r.forced_prefix = std::move(g.prefix);
      tool_grammar = true;
    } else {
      r.forced_prefix = parsers::forced_tool_call_prefix(ctx.tool_call_parser, r.tool_choice_function);
    }
    prompt += r.forced_prefix;
    r.thinking_enabled = false;
  }
  // A template that opened <think> at the end of the prompt means the output starts inside reasoning.
  std::string tail = prompt.substr(prompt.size() > 16 ? prompt.size() - 16 : 0);
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
  r.starts_in_reasoning = tail.size() >= 7 && tail.compare(tail.size() - 7, 7, "<think>") == 0;
  if (r.sampling.grammar && !tool_grammar) constrain_after_reasoning(ctx, r);
  r.prompts.push_back(ctx.text->encode(prompt, false));
  if (r.prompts.back().empty())
    bad("messages", "the chat template renders these messages as an empty prompt (a template may skip roles it does "
                    "not know): nothing to generate from");
  r.prompt_texts.push_back(prompt);
  set_max_tokens(b, ctx, r);
  return r;
}

ApiRequest parse_completion_request(const json& body, const ParseContext& ctx) {
  Body b{body};
  ApiRequest r;
  r.kind = ApiKind::Completion;
  check_model(b, ctx, r);
  if (!b.has("prompt")) bad("prompt", "'prompt' is required");
  const json& p = body["prompt"];
  // prompt_texts is what echo prepends, one a prompt (by index); a token-id prompt echoes its decoded text, as vLLM's.
  r.echo = b.boolean("echo", false);
  auto add_text = [&](const std::string& s) {
    r.prompts.push_back(ctx.text->encode(s, true));
    if (r.echo) r.prompt_texts.push_back(s);
  };
  auto add_ids = [&](const json& ids) {
    r.prompts.push_back(token_list(ids, "prompt", ctx.vocab_size));
    if (!r.echo) return;
    if (!ctx.text->has_tokenizer())
      bad("echo", "'echo' of token-id prompts needs the tokenizer (this server runs with --skip-tokenizer-init)");
    r.prompt_texts.push_back(ctx.text->decode(r.prompts.back(), false));
  };
  if (p.is_string()) {
    add_text(p.get<std::string>());
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    add_ids(p);
  } else if (p.is_array() && !p.empty()) {
    if (p.size() > 256) bad("prompt", "at most 256 prompts per request");  // before encoding any of them
    for (auto& e : p) {
      if (e.is_string()) add_text(e.get<std::string>());
      else if (e.is_array()) add_ids(e);
      else bad("prompt", "'prompt' must be a string, a list of strings, token ids or lists of token ids");
    }
  } else {
    bad("prompt", "'prompt' must be a string, a list of strings, token ids or lists of token ids (and not empty)");
  }
  for (auto& pr : r.prompts)
    if (pr.empty()) bad("prompt", "a prompt is empty");
  openai_sampling(b, ctx, r);
  r.top_logprobs = b.integer("logprobs", 0, 0, 20);
  r.logprobs = b.has("logprobs");
  // OpenAI's echo with logprobs scores the prompt too (its tokens' logprobs first, the first token's null): lm-eval's
  // loglikelihood tasks read them.
  if (r.echo && r.logprobs) {
    r.sampling.prompt_logprob_start = 0;
    // With prompt_logprobs too, the engine scores the larger top n; each response field keeps its own.
    r.sampling.prompt_top_logprobs = std::max(r.prompt_logprobs, r.top_logprobs);
  }
  set_max_tokens(b, ctx, r);
  if (!r.max_tokens_given) r.sampling.max_new_tokens = std::min<int64_t>(r.sampling.max_new_tokens, 16);  // OpenAI's default
  return r;
}

ApiRequest parse_generate_request(const json& body, const ParseContext& ctx) {
  Body b{body};
  ApiRequest r;
  r.kind = ApiKind::Generate;
  r.model = ctx.served_model_name;
  // As SGLang: exactly one of the two (which one to serve would otherwise be a guess). Either may be a batch (a list
  // of texts, a list of token-id lists): one result a prompt, in order, as a list (streamed: events with "index").
  if (b.has("input_ids") && b.has("text")) bad("text", "give either 'text' or 'input_ids', not both");
  if (b.has("input_ids")) {
    const json& ids = body["input_ids"];
    if (!ids.is_array() || ids.empty()) bad("input_ids", "'input_ids' must be a non-empty list of token ids");
    r.batch = ids[0].is_array();
    if (r.batch && ids.size() > 256) bad("input_ids", "at most 256 prompts per request");
    for (size_t i = 0; i < (r.batch ? ids.size() : 1); ++i) {
      const json& one = r.batch ? ids[i] : ids;
      if (!one.is_array() || one.empty())
        bad("input_ids", fmt::format("input_ids[{}] must be a non-empty list of token ids (a batch is a list of them)", i));
      r.prompts.push_back(token_list(one, "input_ids", ctx.vocab_size));
    }
  } else if (b.has("text")) {
    const json& t = body["text"];
    r.batch = t.is_array();
    if (r.batch && t.empty()) bad("text", "'text' is an empty list");
    if (r.batch && t.size() > 256) bad("text", "at most 256 prompts per request");
    if (!t.is_string() && !r.batch) bad("text", "'text' must be a string or a list of strings");
    for (size_t i = 0; i < (r.batch ? t.size() : 1); ++i) {
      const json& one = r.batch ? t[i] : t;
      if (!one.is_string()) bad("text", fmt::format("text[{}] must be a string", i));
      r.prompt_texts.push_back(one);
      r.prompts.push_back(ctx.text->encode(one.get<std::string>(), true));
      if (r.prompts.back().empty()) bad("text", r.batch ? fmt::format("text[{}] is empty", i) : "'text' is empty");
    }
  } else {
    bad("text", "give 'text' or 'input_ids'");
  }
  json sp = json::object();
  if (b.has("sampling_params")) {
    if (body["sampling_params"].is_array())
      bad("sampling_params", "a list of sampling_params (one a prompt) is not supported: give one object for the whole "
                             "batch, or send one request per prompt");
    if (!body["sampling_params"].is_object()) bad("sampling_params", "'sampling_params' must be an object");
    sp = body["sampling_params"];
  }
  Body s{sp};
  SamplingParams& p = r.sampling;
  sampling_fields(s, ctx, 100.0, "min_new_tokens", r);
  if (b.has("seed")) p.seed = uint64_t(b.integer("seed", 0, INT64_MIN, INT64_MAX));
  r.stream = b.boolean("stream", false);
  r.logprobs = b.boolean("return_logprob", false);
  r.top_logprobs = b.integer("top_logprobs_num", 0, 0, 100);
  if (r.top_logprobs > 0) r.logprobs = true;
  r.return_text_in_logprobs = b.boolean("return_text_in_logprobs", false);
  // SGLang's input_token_logprobs: the prompt's tokens from logprob_start_len on (-1, its default: none).
  const int64_t start = b.integer("logprob_start_len", -1, -1, INT64_MAX);
  if (r.logprobs && start >= 0) r.sampling.prompt_logprob_start = start;
  int64_t P = 0;  // the longest prompt: every prompt's output must fit beside it (as set_max_tokens)
  for (auto& pr : r.prompts) P = std::max<int64_t>(P, int64_t(pr.size()));
  if (P >= ctx.context_length)
    bad(r.prompt_texts.empty() ? "input_ids" : "text",
        fmt::format("The prompt has {} tokens, but the context length is {}", P, ctx.context_length));
  int64_t v = s.integer("max_new_tokens", 128, 0, INT64_MAX / 2);
  p.max_new_tokens = std::min(v, ctx.context_length - P);
  return r;
}

void check_model_name(const std::string& name, const ParseContext& ctx) {
  if (name != ctx.served_model_name && name != ctx.model_path)
    throw ApiError(404, fmt::format("The model `{}` does not exist (this server serves `{}`)", name.substr(0, 200),
                                    ctx.served_model_name), "model");
}

}  // namespace moeserve::server

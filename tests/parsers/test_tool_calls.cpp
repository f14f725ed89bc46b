#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <random>

#include "chunking.h"
#include "core/error.h"
#include "parsers/tool_calls.h"

namespace moeserve::parsers {
namespace {

using nlohmann::ordered_json;
using testing::chunkings;
using testing::describe;

const ordered_json& tools() {
  static const ordered_json t = ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
      "parameters": {"type": "object", "properties": {
        "location": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}}, "required": ["location"]}}},
    {"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {
        "a": {"type": "number"}, "b": {"type": "number"}, "precise": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "filters": {"type": "object"}, "tags": {"type": "array"}}}}},
    {"type": "function", "function": {"name": "ping"}}
  ])");
  return t;
}

// Deterministic ids: call_0, call_1, ... per parser.
std::unique_ptr<ToolCallParser> make(const std::string& name, const ordered_json& t = tools()) {
  auto counter = std::make_shared<int>(0);
  return ToolCallParser::create(name, t, [counter] { return "call_" + std::to_string((*counter)++); });
}

ToolParseResult stream(ToolCallParser& p, const testing::Chunks& chunks) {
  ToolParseResult total;
  auto add = [&](const ToolStreamDelta& d) {
    total.content += d.content;
    for (const ToolCallDelta& c : d.calls) {
      if (c.index == static_cast<int>(total.calls.size())) {
        EXPECT_FALSE(c.id.empty());  // the first delta of an index opens the call
        EXPECT_FALSE(c.name.empty());
        total.calls.push_back({c.id, c.name, ""});
      } else {
        EXPECT_EQ(c.index + 1, static_cast<int>(total.calls.size())) << "deltas out of order";
        EXPECT_TRUE(c.id.empty() && c.name.empty());
      }
      total.calls.back().arguments += c.arguments_fragment;
    }
  };
  for (const std::string& c : chunks) add(p.push(c));
  add(p.finish());
  EXPECT_EQ(p.streamed_calls().size(), total.calls.size());
  return total;
}

struct Call {
  std::string name, arguments;
};

struct Case {
  const char* name;
  const char* parser;
  std::string text;
  std::string content;
  std::vector<Call> calls;
};

void expect_result(const ToolParseResult& r, const Case& c, const std::string& where) {
  EXPECT_EQ(r.content, c.content) << c.name << " " << where;
  ASSERT_EQ(r.calls.size(), c.calls.size()) << c.name << " " << where;
  for (size_t i = 0; i < c.calls.size(); ++i) {
    EXPECT_EQ(r.calls[i].id, "call_" + std::to_string(i)) << c.name << " " << where;
    EXPECT_EQ(r.calls[i].name, c.calls[i].name) << c.name << " " << where;
    EXPECT_EQ(r.calls[i].arguments, c.calls[i].arguments) << c.name << " " << where;
  }
}

const std::string kWeatherCoder =
    "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis, France\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
const std::string kCalcCoder =
    "<tool_call>\n<function=calc>\n<parameter=a>\n1.5\n</parameter>\n<parameter=b>\n2\n</parameter>\n"
    "<parameter=precise>\ntrue\n</parameter>\n</function>\n</tool_call>";
const std::string kWeatherHermes =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"days\": 3}}\n</tool_call>";
const std::string kCalcHermes = "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"a\": 1.5, \"b\": 2}}\n</tool_call>";

std::vector<Case> coder_cases() {
  return {
      {"single_call_with_preamble", "qwen3_coder", "I'll check the weather for you.\n\n" + kWeatherCoder,
       "I'll check the weather for you.\n\n", {{"get_weather", R"({"location":"Paris, France","days":3})"}}},
      {"two_calls_whitespace_between_dropped", "qwen3_coder", kWeatherCoder + "\n" + kCalcCoder + "\n", "",
       {{"get_weather", R"({"location":"Paris, France","days":3})"}, {"calc", R"({"a":1.5,"b":2,"precise":true})"}}},
      {"text_between_and_after_calls_kept", "qwen3_coder", "A" + kWeatherCoder + "\nand then\n" + kCalcCoder + " done",
       "A\nand then\n done",
       {{"get_weather", R"({"location":"Paris, France","days":3})"}, {"calc", R"({"a":1.5,"b":2,"precise":true})"}}},
      {"truncated_mid_parameter_is_content", "qwen3_coder",
       "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nPar",
       "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nPar", {}},
      {"truncated_before_close_tag_is_content", "qwen3_coder", kWeatherCoder.substr(0, kWeatherCoder.size() - 1),
       kWeatherCoder.substr(0, kWeatherCoder.size() - 1), {}},
      {"truncated_after_complete_call", "qwen3_coder", kWeatherCoder + "\n<tool_call>\n<function=calc>",
       "\n<tool_call>\n<function=calc>", {{"get_weather", R"({"location":"Paris, France","days":3})"}}},
      {"unknown_parameter_kept_as_string", "qwen3_coder",
       "<tool_call>\n<function=get_weather>\n<parameter=location>\nRome\n</parameter>\n<parameter=extra>\n123\n"
       "</parameter>\n</function>\n</tool_call>",
       "", {{"get_weather", R"({"location":"Rome","extra":"123"})"}}},
      {"wrong_types_fall_back_to_strings", "qwen3_coder",
       "<tool_call>\n<function=calc>\n<parameter=a>\nten\n</parameter>\n<parameter=precise>\nyes\n</parameter>\n"
       "</function>\n</tool_call>",
       "", {{"calc", R"({"a":"ten","precise":"yes"})"}}},
      {"value_containing_tool_call_tags", "qwen3_coder",
       "<tool_call>\n<function=write_file>\n<parameter=path>\nparse.py\n</parameter>\n<parameter=content>\n"
       "END = \"</tool_call>\"\nSTART = \"<tool_call>\"\n</parameter>\n</function>\n</tool_call>",
       "", {{"write_file", R"({"path":"parse.py","content":"END = \"</tool_call>\"\nSTART = \"<tool_call>\""})"}}},
      {"only_one_newline_stripped_each_side", "qwen3_coder",
       "<tool_call>\n<function=write_file>\n<parameter=content>\n\n  indented\n\n</parameter>\n</function>\n"
       "</tool_call>",
       "", {{"write_file", R"({"content":"\n  indented\n"})"}}},
      {"unknown_function_is_content", "qwen3_coder",
       "<tool_call>\n<function=delete_all>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
       "<tool_call>\n<function=delete_all>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>", {}},
      {"unicode_kept_as_utf8", "qwen3_coder",
       "天気を調べます。\n<tool_call>\n<function=get_weather>\n<parameter=location>\n東京 🗼\n</parameter>\n"
       "</function>\n</tool_call>",
       "天気を調べます。\n", {{"get_weather", R"({"location":"東京 🗼"})"}}},
      {"missing_parameter_close_is_tolerated", "qwen3_coder",
       "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n<parameter=days>\n2\n</function>\n"
       "</tool_call>",
       "", {{"get_weather", R"({"location":"Paris","days":2})"}}},
      {"garbage_block_is_content", "qwen3_coder", "x <tool_call>\nhello\n</tool_call> y",
       "x <tool_call>\nhello\n</tool_call> y", {}},
      {"prose_mentioning_tag", "qwen3_coder", "Wrap calls in <tool_call> tags, then </tool_call>.",
       "Wrap calls in <tool_call> tags, then </tool_call>.", {}},
      {"malformed_then_valid", "qwen3_coder", "<tool_call>oops " + kCalcCoder, "<tool_call>oops ",
       {{"calc", R"({"a":1.5,"b":2,"precise":true})"}}},
      {"object_and_array_parameters", "qwen3_coder",
       "<tool_call>\n<function=search>\n<parameter=query>\nllm\n</parameter>\n<parameter=filters>\n"
       "{\"lang\": \"en\", \"year\": 2024}\n</parameter>\n<parameter=tags>\n['a', 'b']\n</parameter>\n</function>\n"
       "</tool_call>",
       "", {{"search", R"({"query":"llm","filters":{"lang":"en","year":2024},"tags":["a","b"]})"}}},
      {"two_functions_in_one_block", "qwen3_coder",
       "<tool_call>\n<function=ping>\n</function>\n<function=get_weather>\n<parameter=location>\nOslo\n</parameter>\n"
       "</function>\n</tool_call>",
       "", {{"ping", "{}"}, {"get_weather", R"({"location":"Oslo"})"}}},
      {"key_order_and_escaping", "qwen3_coder",
       "<tool_call>\n<function=get_weather>\n<parameter=unit>\ncelsius\n</parameter>\n<parameter=location>\n"
       "a \"quoted\" \\ path\ttab\n</parameter>\n</function>\n</tool_call>",
       "", {{"get_weather", R"({"unit":"celsius","location":"a \"quoted\" \\ path\ttab"})"}}},
      {"null_value", "qwen3_coder",
       "<tool_call>\n<function=get_weather>\n<parameter=location>\nLima\n</parameter>\n<parameter=days>\nnull\n"
       "</parameter>\n</function>\n</tool_call>",
       "", {{"get_weather", R"({"location":"Lima","days":null})"}}},
      {"spaces_in_tag_names", "qwen3_coder",
       "<tool_call>\n<function= ping >\n</function>\n</tool_call>", "", {{"ping", "{}"}}},
      {"junk_between_parameters_is_content", "qwen3_coder",
       "<tool_call>\n<function=ping>\nhmm\n</function>\n</tool_call>",
       "<tool_call>\n<function=ping>\nhmm\n</function>\n</tool_call>", {}},
      {"whitespace_only_output", "qwen3_coder", "\n\n", "\n\n", {}},
      {"no_calls", "qwen3_coder", "Just an answer.\n", "Just an answer.\n", {}},
  };
}

std::vector<Case> hermes_cases() {
  return {
      {"single_call", "hermes", "Let me check.\n" + kWeatherHermes, "Let me check.\n",
       {{"get_weather", R"({"location":"Paris","days":3})"}}},
      {"two_calls_qwen25", "qwen25", kWeatherHermes + "\n" + kCalcHermes, "",
       {{"get_weather", R"({"location":"Paris","days":3})"}, {"calc", R"({"a":1.5,"b":2})"}}},
      {"strings_with_braces_and_tags", "hermes",
       "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"a}.txt\", \"content\": "
       "\"}{ </tool_call> <tool_call> \\\" \\\\\"}}\n</tool_call>",
       "", {{"write_file", R"({"path":"a}.txt","content":"}{ </tool_call> <tool_call> \" \\"})"}}},
      {"malformed_json_is_content", "hermes", "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"a\": 1,}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"a\": 1,}}\n</tool_call>", {}},
      {"truncated_json_is_content", "hermes", "ok " + kWeatherHermes.substr(0, 40), "ok " + kWeatherHermes.substr(0, 40),
       {}},
      {"parameters_key_and_string_arguments", "hermes",
       "<tool_call>\n{\"name\": \"calc\", \"parameters\": {\"a\": 1}}\n</tool_call><tool_call>{\"name\": \"calc\", "
       "\"arguments\": \"{\\\"b\\\": 2}\"}</tool_call>",
       "", {{"calc", R"({"a":1})"}, {"calc", R"({"b":2})"}}},
      {"missing_arguments_is_empty_object", "hermes", "<tool_call>\n{\"name\": \"ping\"}\n</tool_call>", "",
       {{"ping", "{}"}}},
      {"unknown_function_is_content", "hermes", "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>", {}},
      {"unicode_escapes_become_utf8", "hermes",
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"\\u6771\\u4eac\", \"unit\": \"°C\"}}"
       "\n</tool_call>",
       "", {{"get_weather", R"({"location":"東京","unit":"°C"})"}}},
      {"nested_arguments_compact_in_order", "hermes",
       "<tool_call>\n{ \"name\" : \"search\" , \"arguments\" : { \"query\" : \"x\" , \"filters\" : { \"z\" : [ 1 , "
       "2 ] , \"a\" : { } } } }\n</tool_call>",
       "", {{"search", R"({"query":"x","filters":{"z":[1,2],"a":{}}})"}}},
      {"junk_after_json_is_content", "hermes", "<tool_call>\n{\"name\": \"ping\"} and more\n</tool_call>",
       "<tool_call>\n{\"name\": \"ping\"} and more\n</tool_call>", {}},
      {"arguments_not_object_is_content", "hermes", "<tool_call>{\"name\": \"ping\", \"arguments\": [1]}</tool_call>",
       "<tool_call>{\"name\": \"ping\", \"arguments\": [1]}</tool_call>", {}},
      {"prose_with_tag_and_brace", "hermes", "Use <tool_call>{like this} or <tool_call> alone.",
       "Use <tool_call>{like this} or <tool_call> alone.", {}},
      {"raw_newline_in_string_is_content", "hermes", "<tool_call>{\"name\": \"ping\", \"x\": \"a\nb\"}</tool_call>",
       "<tool_call>{\"name\": \"ping\", \"x\": \"a\nb\"}</tool_call>", {}},
  };
}

TEST(ToolCallParser, NonStreaming) {
  for (const auto& cs : {coder_cases(), hermes_cases()}) {
    for (const Case& c : cs) {
      auto p = make(c.parser);
      expect_result(p->parse_full(c.text), c, "parse_full");
    }
  }
}

TEST(ToolCallParser, StreamingEqualsNonStreamingOverChunkings) {
  for (const auto& cs : {coder_cases(), hermes_cases()}) {
    for (const Case& c : cs) {
      for (const auto& chunks : chunkings(c.text, 30)) {
        auto p = make(c.parser);
        expect_result(stream(*p, chunks), c, describe(chunks));
        if (::testing::Test::HasFailure()) return;  // one readable failure, not thousands
      }
    }
  }
}

TEST(ToolCallParser, HoldsBackOnlyWhatCouldBeATag) {
  auto p = make("qwen3_coder");
  EXPECT_EQ(p->push("Hello").content, "Hello");
  EXPECT_EQ(p->push(" wor").content, " wor");
  EXPECT_EQ(p->push("ld <tool").content, "ld ");
  EXPECT_EQ(p->push("box>").content, "<toolbox>");
  EXPECT_EQ(p->push("\n<").content, "\n");
  ToolStreamDelta d = p->push(kWeatherCoder.substr(1, 30));
  EXPECT_TRUE(d.empty());  // inside a call: nothing is certain until it closes
  d = p->push(kWeatherCoder.substr(31));
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].index, 0);
  EXPECT_EQ(d.calls[0].id, "call_0");
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(d.calls[0].arguments_fragment, R"({"location":"Paris, France","days":3})");
  EXPECT_EQ(p->push("\n\n").content, "");  // whitespace after a call: dropped unless text follows
  EXPECT_EQ(p->push("Done.").content, "\n\nDone.");
  EXPECT_TRUE(p->finish().empty());
  ASSERT_EQ(p->streamed_calls().size(), 1u);
  EXPECT_EQ(p->streamed_calls()[0].name, "get_weather");
}

TEST(ToolCallParser, MalformedBlockIsReleasedWithoutWaitingForTheEnd) {
  auto p = make("hermes");
  EXPECT_EQ(p->push("See <tool_call> for details").content, "See <tool_call> for details");
  auto q = make("qwen3_coder");
  EXPECT_EQ(q->push("<tool_call>\nnot a function").content, "<tool_call>\nnot a function");
}

TEST(ToolCallParser, LongCallStreamsInLinearTime) {
  std::string body;
  for (int i = 0; i < 20000; ++i) body += "line " + std::to_string(i) + " </tool_call> <parameter x>\n";
  const std::string text = "<tool_call>\n<function=write_file>\n<parameter=content>\n" + body +
                           "</parameter>\n</function>\n</tool_call>";
  auto p = make("qwen3_coder");
  const auto t0 = std::chrono::steady_clock::now();
  ToolParseResult r;
  for (size_t i = 0; i < text.size(); i += 4) {
    ToolStreamDelta d = p->push(std::string_view(text).substr(i, 4));
    r.content += d.content;
    for (auto& c : d.calls) r.calls.push_back({c.id, c.name, c.arguments_fragment});
  }
  ToolStreamDelta d = p->finish();
  for (auto& c : d.calls) r.calls.push_back({c.id, c.name, c.arguments_fragment});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(ordered_json::parse(r.calls[0].arguments)["content"], body.substr(0, body.size() - 1));
  EXPECT_EQ(r.calls[0].arguments, make("qwen3_coder")->parse_full(text).calls[0].arguments);
  // ~1 MB in 250k chunks; a quadratic re-scan would take minutes. Generous bound for sanitizer builds.
  EXPECT_LT(secs, 20.0);
}

TEST(ToolCallParser, NoToolsMeansEveryCallIsContent) {
  auto p = make("qwen3_coder", nullptr);
  ToolParseResult r = p->parse_full(kWeatherCoder);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, kWeatherCoder);
}

TEST(ToolCallParser, RandomIds) {
  const std::string a = random_tool_call_id(), b = random_tool_call_id();
  EXPECT_NE(a, b);
  ASSERT_EQ(a.size(), 29u);
  EXPECT_EQ(a.substr(0, 5), "call_");
  for (char c : a.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << a;
  auto p = ToolCallParser::create("hermes", tools());  // default generator
  ToolParseResult r = p->parse_full(kCalcHermes);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].id.size(), 29u);
}

TEST(ToolCallParser, UnknownNameListsValidOnes) {
  try {
    ToolCallParser::create("qwen3", tools());
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("hermes, qwen25, qwen3_coder"), std::string::npos) << e.what();
  }
}

TEST(ToolSet, ValidatesAndIndexes) {
  ToolSet set(tools());
  EXPECT_EQ(set.names(), (std::vector<std::string>{"get_weather", "calc", "write_file", "search", "ping"}));
  EXPECT_TRUE(set.contains("calc"));
  EXPECT_FALSE(set.contains("nope"));
  ASSERT_NE(set.parameter_schema("calc", "a"), nullptr);
  EXPECT_EQ((*set.parameter_schema("calc", "a"))["type"], "number");
  EXPECT_EQ(set.parameter_schema("calc", "zzz"), nullptr);
  EXPECT_EQ(set.parameter_schema("ping", "x"), nullptr);
  EXPECT_TRUE(ToolSet(nullptr).empty());
  // A bare function object is accepted too.
  EXPECT_TRUE(ToolSet(ordered_json::parse(R"([{"name": "f", "parameters": {}}])")).contains("f"));
  for (const char* bad : {R"({"name": "f"})", R"([1])", R"([{"type": "function"}])",
                          R"([{"type": "function", "function": {"name": ""}}])",
                          R"([{"type": "retrieval", "function": {"name": "f"}}])",
                          R"([{"type": "function", "function": {"name": "f", "parameters": 3}}])"}) {
    EXPECT_THROW(ToolSet{ordered_json::parse(bad)}, UserError) << bad;
  }
}

TEST(ToolChoice, Parses) {
  ToolSet set(tools());
  ToolSet none;
  EXPECT_EQ(parse_tool_choice(nullptr, set).mode, ToolChoice::Mode::kAuto);
  EXPECT_EQ(parse_tool_choice(nullptr, none).mode, ToolChoice::Mode::kNone);
  EXPECT_EQ(parse_tool_choice("none", set).mode, ToolChoice::Mode::kNone);
  EXPECT_EQ(parse_tool_choice("auto", set).mode, ToolChoice::Mode::kAuto);
  EXPECT_EQ(parse_tool_choice("required", set).mode, ToolChoice::Mode::kRequired);
  ToolChoice named =
      parse_tool_choice(ordered_json::parse(R"({"type": "function", "function": {"name": "calc"}})"), set);
  EXPECT_EQ(named.mode, ToolChoice::Mode::kFunction);
  EXPECT_EQ(named.function, "calc");
  EXPECT_THROW(parse_tool_choice("required", none), UserError);
  EXPECT_THROW(parse_tool_choice("sometimes", set), UserError);
  EXPECT_THROW(parse_tool_choice(ordered_json::parse(R"({"type": "function"})"), set), UserError);
  try {
    parse_tool_choice(ordered_json::parse(R"({"type": "function", "function": {"name": "nope"}})"), set);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("get_weather, calc"), std::string::npos) << e.what();
  }
}

// Random texts built from the syntax's pieces, mostly near-valid calls with random damage, every parser:
// streaming over random chunkings must equal parse_full.
void fuzz(const std::string& parser, const std::vector<std::string>& valid, const std::vector<std::string>& pieces) {
  std::mt19937_64 rng(7);
  int with_calls = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    std::vector<std::string> parts;
    const int n = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < n; ++i) {
      if (rng() % 2) {
        parts.push_back(valid[rng() % valid.size()]);
      } else {
        parts.push_back(pieces[rng() % pieces.size()]);
      }
    }
    std::string text;
    for (const auto& s : parts) text += s;
    const int damage = static_cast<int>(rng() % 3);
    for (int i = 0; i < damage && !text.empty(); ++i) {
      const size_t at = rng() % text.size();
      if (rng() % 2) {
        text.erase(at, 1 + rng() % 3);
      } else {
        text.insert(at, pieces[rng() % pieces.size()]);
      }
    }
    const ToolParseResult expected = make(parser)->parse_full(text);
    if (!expected.calls.empty()) ++with_calls;
    for (const auto& chunks : chunkings(text, 2, rng())) {
      if (chunks.size() == 2 && rng() % 8 != 0) continue;  // sample the 2-splits: keeps the test fast
      auto p = make(parser);
      const ToolParseResult r = stream(*p, chunks);
      ASSERT_EQ(r.content, expected.content) << describe(chunks);
      ASSERT_EQ(r.calls.size(), expected.calls.size()) << describe(chunks);
      for (size_t i = 0; i < r.calls.size(); ++i) {
        ASSERT_EQ(r.calls[i].id, expected.calls[i].id);
        ASSERT_EQ(r.calls[i].name, expected.calls[i].name);
        ASSERT_EQ(r.calls[i].arguments, expected.calls[i].arguments) << describe(chunks);
      }
    }
  }
  EXPECT_GT(with_calls, 200) << "fuzz inputs should often contain valid calls";
}

TEST(ToolCallParser, FuzzQwen3CoderStreamingEqualsNonStreaming) {
  fuzz("qwen3_coder", {kWeatherCoder, kCalcCoder, "<tool_call>\n<function=ping>\n</function>\n</tool_call>"},
       {"<tool_call>", "</tool_call>", "<function=calc>", "<function=nope>", "<parameter=a>", "</parameter>",
        "</function>", "\n", " ", "abc", "42", "<", ">", "=", "東", "<parameter=", "</tool_"});
}

TEST(ToolCallParser, FuzzHermesStreamingEqualsNonStreaming) {
  fuzz("hermes", {kWeatherHermes, kCalcHermes, "<tool_call>{\"name\":\"ping\"}</tool_call>"},
       {"<tool_call>", "</tool_call>", "{", "}", "\"name\"", ":", "\"calc\"", ",", "\"arguments\"", "\"x\"", "1",
        "\n", " ", "\\", "\"", "[", "]", "<", "东"});
}

}  // namespace
}  // namespace moeserve::parsers

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

// Accumulates deltas as an OpenAI client would, checking their shape: the first delta of an index carries
// id and name and no argument text; later ones carry only (non-empty) argument text, for the newest index.
struct Collector {
  ToolParseResult total;
  void add(const ToolStreamDelta& d) {
    total.content += d.content;
    for (const ToolCallDelta& c : d.calls) {
      if (c.index == static_cast<int>(total.calls.size())) {
        EXPECT_FALSE(c.id.empty());  // the first delta of an index opens the call
        EXPECT_FALSE(c.name.empty());
        EXPECT_EQ(c.arguments_fragment, "") << "name first, arguments after";
        total.calls.push_back({c.id, c.name, ""});
      } else {
        EXPECT_EQ(c.index + 1, static_cast<int>(total.calls.size())) << "deltas out of order";
        EXPECT_TRUE(c.id.empty() && c.name.empty());
        EXPECT_FALSE(c.arguments_fragment.empty()) << "empty argument delta";
      }
      total.calls.back().arguments += c.arguments_fragment;
    }
  }
};

ToolParseResult stream(ToolCallParser& p, const testing::Chunks& chunks) {
  Collector col;
  for (const std::string& c : chunks) col.add(p.push(c));
  col.add(p.finish());
  EXPECT_EQ(p.streamed_calls().size(), col.total.calls.size());
  for (size_t i = 0; i < std::min(p.streamed_calls().size(), col.total.calls.size()); ++i) {
    EXPECT_EQ(p.streamed_calls()[i].arguments, col.total.calls[i].arguments);
  }
  return col.total;
}

// Streamed result == parse_full result, ids included (both draw from a fresh call_0, call_1, ...).
void expect_same(const ToolParseResult& got, const ToolParseResult& want, const std::string& where) {
  ASSERT_EQ(got.content, want.content) << where;
  ASSERT_EQ(got.calls.size(), want.calls.size()) << where;
  for (size_t i = 0; i < got.calls.size(); ++i) {
    ASSERT_EQ(got.calls[i].id, want.calls[i].id) << where;
    ASSERT_EQ(got.calls[i].name, want.calls[i].name) << where;
    ASSERT_EQ(got.calls[i].arguments, want.calls[i].arguments) << where;
  }
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
      // Committed at "<function=NAME>": a truncated call keeps the parameters whose values were complete.
      {"truncated_mid_value_is_call_without_it", "qwen3_coder",
       "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nPar", "Sure.\n",
       {{"get_weather", "{}"}}},
      {"truncated_after_a_parameter", "qwen3_coder",
       "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n<parameter=days>\n3\n</par",
       "", {{"get_weather", R"({"location":"Paris"})"}}},
      {"truncated_before_close_tag_is_call", "qwen3_coder", kWeatherCoder.substr(0, kWeatherCoder.size() - 1), "",
       {{"get_weather", R"({"location":"Paris, France","days":3})"}}},
      {"truncated_after_complete_call", "qwen3_coder", kWeatherCoder + "\n<tool_call>\n<function=calc>", "",
       {{"get_weather", R"({"location":"Paris, France","days":3})"}, {"calc", "{}"}}},
      {"truncated_inside_function_name_is_content", "qwen3_coder", "ok\n<tool_call>\n<function=get_weat",
       "ok\n<tool_call>\n<function=get_weat", {}},
      {"truncated_undeclared_function_is_content", "qwen3_coder",
       "<tool_call>\n<function=nope>\n<parameter=x>\n1\n</parameter>\n",
       "<tool_call>\n<function=nope>\n<parameter=x>\n1\n</parameter>\n", {}},
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
      // A committed block that breaks ends at its last complete element; its remains are dropped up to
      // the next </tool_call>, or are ordinary output when <tool_call> or the end comes first.
      {"junk_in_committed_call_breaks_it", "qwen3_coder",
       "<tool_call>\n<function=ping>\nhmm\n</function>\n</tool_call>", "", {{"ping", "{}"}}},
      {"junk_after_parameter_keeps_it_and_drops_remains", "qwen3_coder",
       "<tool_call>\n<function=get_weather>\n<parameter=location>\nRome\n</parameter>\nhmm\n<parameter=days>\n3\n"
       "</parameter>\n</function>\n</tool_call> after",
       " after", {{"get_weather", R"({"location":"Rome"})"}}},
      {"text_after_function_without_close_tag", "qwen3_coder",
       "<tool_call>\n<function=ping>\n</function>\nDone.", "\nDone.", {{"ping", "{}"}}},
      {"missing_close_tag_then_next_call", "qwen3_coder",
       kWeatherCoder.substr(0, kWeatherCoder.size() - 12) + "\n" + kCalcCoder,
       "", {{"get_weather", R"({"location":"Paris, France","days":3})"}, {"calc", R"({"a":1.5,"b":2,"precise":true})"}}},
      {"undeclared_second_function_breaks_block", "qwen3_coder",
       "<tool_call>\n<function=ping>\n</function>\n<function=nope>\n</function>\n</tool_call>tail", "tail",
       {{"ping", "{}"}}},
      {"bad_parameter_tag_breaks_block", "qwen3_coder",
       "<tool_call>\n<function=calc>\n<parameter=a>\n1\n</parameter>\n<parameter=b\n>2</function>\n</tool_call>", "",
       {{"calc", R"({"a":1})"}}},
      {"duplicate_parameter_keeps_first", "qwen3_coder",
       "<tool_call>\n<function=calc>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>\n"
       "</tool_call>",
       "", {{"calc", R"({"a":1})"}}},
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
      // Committed once the "name" string closes on a declared name.
      {"invalid_json_after_name_keeps_members", "hermes",
       "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"a\": 1,}}\n</tool_call>", "", {{"calc", R"({"a":1})"}}},
      {"invalid_json_before_name_is_content", "hermes",
       "<tool_call>\n{\"arguments\": {\"a\": 1,}, \"name\": \"calc\"}\n</tool_call>",
       "<tool_call>\n{\"arguments\": {\"a\": 1,}, \"name\": \"calc\"}\n</tool_call>", {}},
      {"truncated_after_name_is_call", "hermes", "ok " + kWeatherHermes.substr(0, 40), "ok ", {{"get_weather", "{}"}}},
      {"truncated_inside_name_is_content", "hermes", "ok " + kWeatherHermes.substr(0, 30),
       "ok " + kWeatherHermes.substr(0, 30), {}},
      {"truncated_mid_number_keeps_complete_members", "hermes",
       kWeatherHermes.substr(0, kWeatherHermes.find("3}}") + 1), "", {{"get_weather", R"({"location":"Paris"})"}}},
      {"truncated_undeclared_is_content", "hermes", "<tool_call>{\"name\": \"nope\", \"arguments\": {\"a\": 1",
       "<tool_call>{\"name\": \"nope\", \"arguments\": {\"a\": 1", {}},
      {"arguments_before_name", "hermes",
       "<tool_call>{\"arguments\": {\"a\": 1, \"b\": {\"c\": [2]}}, \"name\": \"calc\"}</tool_call>", "",
       {{"calc", R"({"a":1,"b":{"c":[2]}})"}}},
      {"duplicate_members_keep_first", "hermes",
       "<tool_call>{\"name\": \"calc\", \"arguments\": {\"a\": 1, \"a\": 2}, \"name\": \"ping\"}</tool_call>", "",
       {{"calc", R"({"a":1})"}}},
      {"null_arguments", "hermes", "<tool_call>{\"name\": \"ping\", \"arguments\": null}</tool_call>", "",
       {{"ping", "{}"}}},
      {"numbers_and_literals", "hermes",
       "<tool_call>{\"name\": \"calc\", \"arguments\": {\"a\": -0.5e+2, \"b\": 0, \"precise\": false, "
       "\"x\": [true, null, {}, [ ], -0, 1E2]}}</tool_call>",
       "", {{"calc", R"({"a":-50.0,"b":0,"precise":false,"x":[true,null,{},[],0,100.0]})"}}},
      {"bad_number_before_name_is_content", "hermes", "<tool_call>{\"arguments\": {\"a\": 01}, \"name\": \"calc\"}",
       "<tool_call>{\"arguments\": {\"a\": 01}, \"name\": \"calc\"}", {}},
      {"prose_after_json_without_close_tag", "hermes", "<tool_call>{\"name\": \"ping\"}\nDone.", "\nDone.",
       {{"ping", "{}"}}},
      {"broken_call_then_next_call", "hermes",
       "<tool_call>{\"name\": \"calc\", \"arguments\": {\"a\": 1}\n" + kCalcHermes + " end", " end",
       {{"calc", R"({"a":1})"}, {"calc", R"({"a":1.5,"b":2})"}}},
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
      {"junk_after_json_breaks_block", "hermes", "<tool_call>\n{\"name\": \"ping\"} and more\n</tool_call>x", "x",
       {{"ping", "{}"}}},
      {"arguments_not_object_breaks_call", "hermes",
       "<tool_call>{\"name\": \"ping\", \"arguments\": [1]}</tool_call>", "", {{"ping", "{}"}}},
      {"arguments_not_object_before_name_is_content", "hermes",
       "<tool_call>{\"arguments\": [1], \"name\": \"ping\"}</tool_call>",
       "<tool_call>{\"arguments\": [1], \"name\": \"ping\"}</tool_call>", {}},
      {"name_not_string_is_content", "hermes", "<tool_call>{\"name\": 3}</tool_call>",
       "<tool_call>{\"name\": 3}</tool_call>", {}},
      {"missing_name_is_content", "hermes", "<tool_call>{\"arguments\": {}}</tool_call>",
       "<tool_call>{\"arguments\": {}}</tool_call>", {}},
      {"prose_with_tag_and_brace", "hermes", "Use <tool_call>{like this} or <tool_call> alone.",
       "Use <tool_call>{like this} or <tool_call> alone.", {}},
      {"raw_newline_in_string_breaks_call", "hermes",
       "<tool_call>{\"name\": \"ping\", \"x\": \"a\nb\"}</tool_call>", "", {{"ping", "{}"}}},
      {"raw_newline_before_name_is_content", "hermes",
       "<tool_call>{\"x\": \"a\nb\", \"name\": \"ping\"}</tool_call>",
       "<tool_call>{\"x\": \"a\nb\", \"name\": \"ping\"}</tool_call>", {}},
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

// Every truncation of every case: a call whose name was complete is a call with what was parsed, in both
// modes; before that it is content in both modes.
TEST(ToolCallParser, EveryTruncationStreamsLikeParseFull) {
  std::mt19937_64 rng(3);
  for (const auto& cs : {coder_cases(), hermes_cases()}) {
    for (const Case& c : cs) {
      for (size_t n = 0; n <= c.text.size(); ++n) {
        const std::string prefix = c.text.substr(0, n);
        const ToolParseResult want = make(c.parser)->parse_full(prefix);
        std::vector<testing::Chunks> tries = {{prefix}, {}};
        for (char ch : prefix) tries[1].emplace_back(1, ch);
        for (int i = 0; i < 2; ++i) {
          auto all = chunkings(prefix, 1, rng());
          tries.push_back(all.back());                 // a random chunking
          tries.push_back(all[1 + rng() % (n + 1)]);  // a random 2-split
        }
        for (const auto& chunks : tries) {
          auto p = make(c.parser);
          expect_same(stream(*p, chunks), want, std::string(c.name) + " " + describe(chunks));
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

TEST(ToolCallParser, CallCommitsAtItsName) {
  const std::string weather = "<tool_call>\n<function=get_weather";
  ToolParseResult r = make("qwen3_coder")->parse_full(weather);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, weather);
  r = make("qwen3_coder")->parse_full(weather + ">");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, "{}");
  EXPECT_EQ(r.content, "");

  const std::string calc = "<tool_call>{\"name\": \"calc";
  r = make("hermes")->parse_full(calc);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, calc);
  r = make("hermes")->parse_full(calc + "\"");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
  EXPECT_EQ(r.content, "");
}

TEST(ToolCallParser, Qwen3CoderStreamsNameThenParameters) {
  auto p = make("qwen3_coder");
  EXPECT_EQ(p->push("Hello").content, "Hello");
  EXPECT_EQ(p->push(" wor").content, " wor");
  EXPECT_EQ(p->push("ld <tool").content, "ld ");
  EXPECT_EQ(p->push("box>").content, "<toolbox>");
  EXPECT_EQ(p->push("\n<").content, "\n");
  EXPECT_TRUE(p->push("tool_call>\n<function=get_weath").empty());  // the name may go on
  ToolStreamDelta d = p->push("er>");
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].index, 0);
  EXPECT_EQ(d.calls[0].id, "call_0");
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(d.calls[0].arguments_fragment, "");
  EXPECT_TRUE(p->push("\n<parameter=location>\nParis, France\n</parameter").empty());  // the value may go on
  d = p->push(">");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].index, 0);
  EXPECT_EQ(d.calls[0].id, "");
  EXPECT_EQ(d.calls[0].name, "");
  EXPECT_EQ(d.calls[0].arguments_fragment, R"({"location":"Paris, France")");
  d = p->push("\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>");
  ASSERT_EQ(d.calls.size(), 1u);  // fragments of one push are merged
  EXPECT_EQ(d.calls[0].arguments_fragment, R"(,"days":3})");
  EXPECT_EQ(p->push("\n\n").content, "");  // whitespace after a call: dropped unless text follows
  EXPECT_EQ(p->push("Done.").content, "\n\nDone.");
  EXPECT_TRUE(p->finish().empty());
  ASSERT_EQ(p->streamed_calls().size(), 1u);
  EXPECT_EQ(p->streamed_calls()[0].name, "get_weather");
  EXPECT_EQ(p->streamed_calls()[0].arguments, R"({"location":"Paris, France","days":3})");
}

TEST(ToolCallParser, Qwen3CoderTruncatedCallIsClosedAtFinish) {
  auto p = make("qwen3_coder");
  ToolStreamDelta d = p->push("<tool_call>\n<function=calc>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2");
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].name, "calc");
  EXPECT_EQ(d.calls[1].arguments_fragment, R"({"a":1)");
  d = p->finish();
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].arguments_fragment, "}");  // b was cut off: dropped
  EXPECT_EQ(d.content, "");
}

TEST(ToolCallParser, HermesStreamsNameThenMembers) {
  auto p = make("hermes");
  EXPECT_EQ(p->push("Let me see.\n<tool_call>\n{\"name\": \"cal").content, "Let me see.\n");
  ToolStreamDelta d = p->push("c\", \"arguments\": {\"a\": 1");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].id, "call_0");
  EXPECT_EQ(d.calls[0].name, "calc");
  EXPECT_EQ(d.calls[0].arguments_fragment, "");  // 1 may be the start of 12
  d = p->push(".5, \"b\": [1, {\"x\": \"}\"}");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].id, "");
  EXPECT_EQ(d.calls[0].arguments_fragment, R"({"a":1.5)");
  d = p->push("]  }");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].arguments_fragment, R"(,"b":[1,{"x":"}"}]})");
  EXPECT_TRUE(p->push("}\n</tool_call>").empty());
  EXPECT_TRUE(p->finish().empty());
  ASSERT_EQ(p->streamed_calls().size(), 1u);
  EXPECT_EQ(p->streamed_calls()[0].arguments, R"({"a":1.5,"b":[1,{"x":"}"}]})");
}

TEST(ToolCallParser, HermesArgumentsBeforeNameComeWithIt) {
  auto p = make("hermes");
  EXPECT_TRUE(p->push("<tool_call>{\"arguments\": {\"a\": 1}, ").empty());
  ToolStreamDelta d = p->push("\"name\": \"calc\"");
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].name, "calc");
  EXPECT_EQ(d.calls[0].arguments_fragment, "");
  EXPECT_EQ(d.calls[1].index, 0);
  EXPECT_EQ(d.calls[1].arguments_fragment, R"({"a":1})");
}

TEST(ToolCallParser, BrokenBlockRemainsWaitForTheirCloseTag) {
  auto p = make("hermes");
  ToolStreamDelta d = p->push("<tool_call>{\"name\": \"ping\"} oops");
  ASSERT_EQ(d.calls.size(), 2u);  // opened, then closed by the break
  EXPECT_EQ(d.calls[1].arguments_fragment, "{}");
  EXPECT_EQ(d.content, "");  // " oops" may be the remains of the block
  EXPECT_EQ(p->push(" more </tool_call>\nAfter.").content, "\nAfter.");
  EXPECT_TRUE(p->finish().empty());

  auto q = make("hermes");
  EXPECT_EQ(q->push("<tool_call>{\"name\": \"ping\"} oops").content, "");
  EXPECT_EQ(q->finish().content, " oops");  // no close tag came: ordinary output
}

TEST(ToolCallParser, MalformedBlockIsReleasedWithoutWaitingForTheEnd) {
  auto p = make("hermes");
  EXPECT_EQ(p->push("See <tool_call> for details").content, "See <tool_call> for details");
  auto q = make("qwen3_coder");
  EXPECT_EQ(q->push("<tool_call>\nnot a function").content, "<tool_call>\nnot a function");
}

// ~1 MB fed 4 bytes at a time, and parse_full on the whole of it (where a search running to the end of
// the text for every element would show); a quadratic re-scan would take minutes. Generous bound for
// sanitizer builds. Returns the streamed result after checking it equals parse_full's.
ToolParseResult stream_by_4(const std::string& parser, const std::string& text, double& secs) {
  auto p = make(parser);
  const auto t0 = std::chrono::steady_clock::now();
  Collector col;
  for (size_t i = 0; i < text.size(); i += 4) col.add(p->push(std::string_view(text).substr(i, 4)));
  col.add(p->finish());
  const ToolParseResult full = make(parser)->parse_full(text);
  secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  expect_same(col.total, full, "1 MB");
  return col.total;
}

TEST(ToolCallParser, LongCallStreamsInLinearTime) {
  std::string body;
  for (int i = 0; i < 20000; ++i) body += "line " + std::to_string(i) + " </tool_call> <parameter x>\n";
  const std::string text = "<tool_call>\n<function=write_file>\n<parameter=content>\n" + body +
                           "</parameter>\n</function>\n</tool_call>";
  double secs = 0;
  const ToolParseResult r = stream_by_4("qwen3_coder", text, secs);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(ordered_json::parse(r.calls[0].arguments)["content"], body.substr(0, body.size() - 1));
  EXPECT_EQ(r.calls[0].arguments, make("qwen3_coder")->parse_full(text).calls[0].arguments);
  EXPECT_LT(secs, 20.0);

  // Truncated: the one value is cut off; the call still closes.
  const ToolParseResult t = stream_by_4("qwen3_coder", text.substr(0, text.size() / 2), secs);
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.calls[0].arguments, "{}");
  EXPECT_LT(secs, 20.0);
}

TEST(ToolCallParser, ManyBrokenBlocksParseInLinearTime) {
  // Each block breaks; its remains run to a "<tool_call>" while the only "</tool_call>" is at the very end.
  std::string text;
  for (int i = 0; i < 30000; ++i) text += "<tool_call>{\"name\": \"ping\"} x ";
  text += "</tool_call>";
  double secs = 0;
  const ToolParseResult r = stream_by_4("hermes", text, secs);
  EXPECT_EQ(r.calls.size(), 30000u);
  // Each " x " is followed by a "<tool_call>": ordinary output; the last one goes with the "</tool_call>".
  std::string want;
  for (int i = 0; i < 29999; ++i) want += " x ";
  EXPECT_TRUE(r.content == want) << r.content.size();
  EXPECT_LT(secs, 20.0);
}

TEST(ToolCallParser, ManyParametersStreamInLinearTime) {
  std::string text = "<tool_call>\n<function=search>\n";
  std::string want;  // (ordered_json's operator[] is a linear search: too slow to build this)
  for (int i = 0; i < 40000; ++i) {
    const std::string n = std::to_string(i);
    text += "<parameter=p" + n + ">\nv" + n + (i % 2 ? "\n</parameter>\n" : "\n");  // some left unclosed
    want += (i ? ",\"p" : "{\"p") + n + "\":\"v" + n + "\"";
  }
  text += "</function>\n</tool_call>";
  double secs = 0;
  const ToolParseResult r = stream_by_4("qwen3_coder", text, secs);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, want + "}");
  EXPECT_LT(secs, 20.0);
}

TEST(ToolCallParser, LongHermesCallStreamsInLinearTime) {
  ordered_json args = ordered_json::object();
  std::string content;
  for (int i = 0; i < 25000; ++i) content += "line \"" + std::to_string(i) + "\" </tool_call> {[\\\n";
  args["path"] = "big.txt";
  args["content"] = content;
  for (int i = 0; i < 3000; ++i) args["k" + std::to_string(i)] = ordered_json::array({i, "x", nullptr});
  const std::string text =
      "<tool_call>\n{\"name\": \"write_file\", \"arguments\": " + args.dump(1) + "}\n</tool_call>";
  ASSERT_GT(text.size(), 900000u);
  double secs = 0;
  const ToolParseResult r = stream_by_4("hermes", text, secs);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(r.calls[0].arguments, args.dump());
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
  fuzz("qwen3_coder",
       {kWeatherCoder, kCalcCoder, "<tool_call>\n<function=ping>\n</function>\n</tool_call>",
        "<tool_call>\n<function=ping>\n</function>\n<function=calc>\n<parameter=a>\n1\n</function>\n</tool_call>"},
       {"<tool_call>", "</tool_call>", "<function=calc>", "<function=nope>", "<parameter=a>", "</parameter>",
        "</function>", "\n", " ", "abc", "42", "<", ">", "=", "東", "<parameter=", "</tool_", "</function>\n<function="});
}

TEST(ToolCallParser, FuzzHermesStreamingEqualsNonStreaming) {
  fuzz("hermes",
       {kWeatherHermes, kCalcHermes, "<tool_call>{\"name\":\"ping\"}</tool_call>",
        "<tool_call>{\"arguments\": \"{\\\"b\\\": 2}\", \"name\": \"calc\"}</tool_call>",
        "<tool_call>{\"name\": \"calc\", \"parameters\": {\"a\": -1.5e+3, \"b\": [true, false, null, 0.25E-1], "
        "\"c\": \"\\u00e9\\n\"}}</tool_call>",
        "<tool_call>{\"name\": \"ping\", \"arguments\": null}</tool_call>"},
       {"<tool_call>", "</tool_call>", "{", "}", "\"name\"", ":", "\"calc\"", ",", "\"arguments\"", "\"x\"", "1",
        "\n", " ", "\\", "\"", "[", "]", "<", "东", "true", "null", "-2.5e-1", "\\u00e9", "\"parameters\"", "e"});
}

}  // namespace
}  // namespace moeserve::parsers

namespace moeserve::parsers {
namespace {

// Model output nesting far past any real argument (here 100,000 levels) must not reach a recursive JSON copy; nothing
// crashes and streaming agrees with parse_full. qwen3_coder keeps the text as the parameter's string value; hermes,
// whose call was committed at its name, closes the call with the members before the nested one (a valid object).
TEST(ToolCallParser, DeeplyNestedArgumentsDoNotCrash) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string hermes = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"q\", \"tags\": " +
                             deep + "}}\n</tool_call>";
  const std::string coder = "<tool_call>\n<function=search>\n<parameter=tags>\n" + deep +
                            "\n</parameter>\n</function>\n</tool_call>";
  for (const auto& [parser, text] :
       {std::pair{std::string("hermes"), hermes}, std::pair{std::string("qwen3_coder"), coder}}) {
    const ToolParseResult full = make(parser)->parse_full(text);
    auto p = make(parser);
    Collector col;
    for (size_t i = 0; i < text.size(); i += 4096) col.add(p->push(std::string_view(text).substr(i, 4096)));
    col.add(p->finish());
    expect_same(col.total, full, parser);
    ASSERT_EQ(full.calls.size(), 1u) << parser;
    EXPECT_EQ(full.calls[0].name, "search");
    const ordered_json args = ordered_json::parse(full.calls[0].arguments, nullptr, false);
    ASSERT_TRUE(args.is_object()) << parser << ": " << full.calls[0].arguments.substr(0, 80);
    if (parser == "qwen3_coder") {
      EXPECT_EQ(args.value("tags", ""), deep);
    } else {
      EXPECT_EQ(args, ordered_json::parse(R"({"query": "q"})"));
    }
  }
}

}  // namespace
}  // namespace moeserve::parsers

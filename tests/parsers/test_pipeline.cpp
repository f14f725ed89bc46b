// The server's chain: reasoning parser first, its content into the tool-call parser. Streaming the chain over
// any chunking must give what the two non-streaming parsers give on the whole output.
#include <gtest/gtest.h>

#include "chunking.h"
#include "parsers/reasoning.h"
#include "parsers/tool_calls.h"

namespace moeserve::parsers {
namespace {

using nlohmann::ordered_json;

const ordered_json kTools = ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])");

ToolCallIdGenerator counter_ids() {
  auto n = std::make_shared<int>(0);
  return [n] { return "call_" + std::to_string((*n)++); };
}

struct Final {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};

Final non_streaming(const std::string& text, bool starts_in_reasoning) {
  auto reasoning = ReasoningParser::create("qwen3", starts_in_reasoning, true);
  auto tools = ToolCallParser::create("qwen3_coder", kTools, counter_ids());
  ReasoningResult r = reasoning->parse_full(text);
  ToolParseResult t = tools->parse_full(r.content);
  return {r.reasoning, t.content, t.calls};
}

Final streaming(const testing::Chunks& chunks, bool starts_in_reasoning) {
  auto reasoning = ReasoningParser::create("qwen3", starts_in_reasoning, true);
  auto tools = ToolCallParser::create("qwen3_coder", kTools, counter_ids());
  Final f;
  auto take = [&](const ToolStreamDelta& d) {
    f.content += d.content;
    for (const ToolCallDelta& c : d.calls) {
      if (c.index == static_cast<int>(f.calls.size())) f.calls.push_back({c.id, c.name, ""});
      f.calls.back().arguments += c.arguments_fragment;
    }
  };
  for (const std::string& chunk : chunks) {
    ReasoningResult r = reasoning->push(chunk);
    f.reasoning += r.reasoning;
    take(tools->push(r.content));
  }
  ReasoningResult r = reasoning->finish();
  f.reasoning += r.reasoning;
  take(tools->push(r.content));
  take(tools->finish());
  return f;
}

TEST(ParserPipeline, ThinkingThenToolCall) {
  const std::string text =
      "<think>\nThe user wants the weather in Berlin for 2 days. I'll call get_weather.\n</think>\n\n"
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nBerlin\n</parameter>\n<parameter=days>\n2\n"
      "</parameter>\n</function>\n</tool_call>";
  const Final expected = non_streaming(text, false);
  EXPECT_EQ(expected.reasoning, "The user wants the weather in Berlin for 2 days. I'll call get_weather.");
  EXPECT_EQ(expected.content, "");
  ASSERT_EQ(expected.calls.size(), 1u);
  EXPECT_EQ(expected.calls[0].arguments, R"({"city":"Berlin","days":2})");
  for (const auto& chunks : testing::chunkings(text)) {
    const Final got = streaming(chunks, false);
    EXPECT_EQ(got.reasoning, expected.reasoning) << testing::describe(chunks);
    EXPECT_EQ(got.content, expected.content) << testing::describe(chunks);
    ASSERT_EQ(got.calls.size(), 1u) << testing::describe(chunks);
    EXPECT_EQ(got.calls[0].id, "call_0");
    EXPECT_EQ(got.calls[0].arguments, expected.calls[0].arguments);
  }
}

TEST(ParserPipeline, ToolCallInsideUnclosedThought) {
  // Prompt opened <think>; the model calls the tool without closing it.
  const std::string text =
      "I need the forecast.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
      "</function>\n</tool_call>";
  const Final expected = non_streaming(text, true);
  EXPECT_EQ(expected.reasoning, "I need the forecast.");
  EXPECT_EQ(expected.content, "");
  ASSERT_EQ(expected.calls.size(), 1u);
  EXPECT_EQ(expected.calls[0].arguments, R"({"city":"Oslo"})");
  for (const auto& chunks : testing::chunkings(text)) {
    const Final got = streaming(chunks, true);
    EXPECT_EQ(got.reasoning, expected.reasoning) << testing::describe(chunks);
    EXPECT_EQ(got.content, expected.content) << testing::describe(chunks);
    ASSERT_EQ(got.calls.size(), 1u) << testing::describe(chunks);
    EXPECT_EQ(got.calls[0].arguments, expected.calls[0].arguments);
  }
}

}  // namespace
}  // namespace moeserve::parsers

#include <gtest/gtest.h>

#include <random>

#include "chunking.h"
#include "core/error.h"
#include "parsers/reasoning.h"

namespace moeserve::parsers {
namespace {

using testing::chunkings;
using testing::describe;

ReasoningResult stream(ReasoningParser& p, const testing::Chunks& chunks) {
  ReasoningResult total;
  bool content_started = false;
  auto add = [&](const ReasoningResult& d) {
    // Reasoning always precedes content: once content has been sent, no reasoning may follow.
    if (content_started) {
      EXPECT_TRUE(d.reasoning.empty()) << "reasoning after content: " << d.reasoning;
    }
    total.reasoning += d.reasoning;
    total.content += d.content;
    if (!d.content.empty()) content_started = true;
  };
  for (const std::string& c : chunks) add(p.push(c));
  add(p.finish());
  return total;
}

struct Case {
  const char* name;
  bool starts_in_reasoning;
  bool thinking;
  std::string text;
  std::string reasoning;
  std::string content;
  const char* parser = "qwen3";
};

std::vector<Case> cases() {
  return {
      {"sglang_example", false, true, "<think>\nabc\n</think>\n\nanswer", "abc", "answer"},
      {"prompt_opened_think", true, true, "abc\n</think>\n\nanswer", "abc", "answer"},
      {"prompt_opened_and_model_repeats_think", true, true, "<think>\nabc</think>answer", "abc", "answer"},
      {"no_tags", false, true, "Hello world", "", "Hello world"},
      {"no_tags_keeps_whitespace", false, true, "\n  Hello\n", "", "\n  Hello\n"},
      {"truncated_reasoning", true, true, "Let me think about this...\nStep 1", "Let me think about this...\nStep 1",
       ""},
      {"truncated_after_open", false, true, "<think>\nhalf a tho", "half a tho", ""},
      {"truncated_right_after_open", false, true, "<think>\n", "", ""},
      {"empty_reasoning", false, true, "<think>\n\n</think>\n\nanswer", "", "answer"},
      {"empty_reasoning_prompt_opened", true, true, "\n</think>\n\nanswer", "", "answer"},
      {"thinking_disabled", false, false, "<think>x</think>y", "", "<think>x</think>y"},
      {"thinking_disabled_wins_over_open", true, false, "abc</think>def", "", "abc</think>def"},
      {"tool_call_ends_reasoning", true, true,
       "I should look it up.\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
       "I should look it up.", "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"},
      {"tool_call_at_start", true, true, "<tool_call>\nx</tool_call>", "", "<tool_call>\nx</tool_call>"},
      {"tool_call_after_think_end_is_content", false, true, "<think>a</think>\n\n<tool_call>x", "a",
       "<tool_call>x"},
      {"nested_looking_think", false, true, "<think>a <think> b</think>c</think>d", "a <think> b", "c</think>d"},
      {"think_not_at_start_is_content", false, true, "Hello <think>x</think>", "", "Hello <think>x</think>"},
      {"close_without_open_is_content", false, true, "abc</think>def", "", "abc</think>def"},
      {"whitespace_before_open", false, true, "\n\n<think>x</think>y", "x", "y"},
      {"unicode", false, true, "<think>\n思考 🤔\n</think>\n\n答案 ✅", "思考 🤔", "答案 ✅"},
      {"partial_close_at_end_is_reasoning", true, true, "abc </thi", "abc </thi", ""},
      {"partial_open_at_end_is_content", false, true, " <thin", "", " <thin"},
      {"partial_open_prompt_opened", true, true, "\n<thi", "<thi", ""},
      {"thinking_tag_is_not_think", false, true, "<thinking>x</thinking>", "", "<thinking>x</thinking>"},
      {"content_trailing_whitespace_kept", false, true, "<think>a</think>\n\nb\n", "a", "b\n"},
      {"content_only_whitespace", false, true, "<think>a</think>\n\n", "a", ""},
      {"interior_whitespace_kept", false, true, "<think>a\n\n  b\n</think>c", "a\n\n  b", "c"},
      {"all_whitespace", false, true, "  \n", "", "  \n"},
      {"all_whitespace_prompt_opened", true, true, "  \n", "", ""},
      {"empty", false, true, "", "", ""},
      {"deepseek_r1_always_starts_in_reasoning", false, true, "abc</think>def", "abc", "def", "deepseek-r1"},
      {"deepseek_r1_with_explicit_open", false, true, "<think>\nabc\n</think>\n\ndef", "abc", "def",
       "deepseek-r1"},
      {"qwen3_thinking_forced", false, true, "abc\n</think>\n\ndef", "abc", "def", "qwen3-thinking"},
      {"qwen3_realistic", false, true,
       "<think>\nOkay, the user asks for 2+2. That's basic arithmetic.\n\nSo the answer is 4.\n</think>\n\n"
       "2 + 2 = **4**.",
       "Okay, the user asks for 2+2. That's basic arithmetic.\n\nSo the answer is 4.", "2 + 2 = **4**."},
  };
}

TEST(ReasoningParser, NonStreaming) {
  for (const Case& c : cases()) {
    auto p = ReasoningParser::create(c.parser, c.starts_in_reasoning, c.thinking);
    ReasoningResult r = p->parse_full(c.text);
    EXPECT_EQ(r.reasoning, c.reasoning) << c.name;
    EXPECT_EQ(r.content, c.content) << c.name;
  }
}

TEST(ReasoningParser, StreamingEqualsNonStreamingOverChunkings) {
  for (const Case& c : cases()) {
    for (const auto& chunks : chunkings(c.text)) {
      auto p = ReasoningParser::create(c.parser, c.starts_in_reasoning, c.thinking);
      ReasoningResult r = stream(*p, chunks);
      EXPECT_EQ(r.reasoning, c.reasoning) << c.name << " " << describe(chunks);
      EXPECT_EQ(r.content, c.content) << c.name << " " << describe(chunks);
    }
  }
}

TEST(ReasoningParser, StreamsReasoningBeforeTheEnd) {
  auto p = ReasoningParser::create("qwen3", false, true);
  EXPECT_EQ(p->push("<thi").reasoning, "");
  EXPECT_EQ(p->push("nk>\nStep one").reasoning, "Step one");
  // Trailing whitespace and a possible "</think>" are held until disambiguated.
  ReasoningResult d = p->push(" then\n</thi");
  EXPECT_EQ(d.reasoning, " then");
  EXPECT_FALSE(p->reasoning_done());
  d = p->push("nk>\n\nThe answer");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "The answer");
  EXPECT_TRUE(p->reasoning_done());
  EXPECT_EQ(p->push(" is 4.").content, " is 4.");
  d = p->finish();
  EXPECT_TRUE(d.reasoning.empty() && d.content.empty());
}

TEST(ReasoningParser, ContentIsNotHeldWithoutReasoning) {
  auto p = ReasoningParser::create("qwen3", false, true);
  EXPECT_EQ(p->push("Hi").content, "Hi");  // cannot be "<think>": passes straight through
  EXPECT_EQ(p->push(" <think>").content, " <think>");
}

TEST(ReasoningParser, UnknownNameListsValidOnes) {
  try {
    ReasoningParser::create("qwen2", false, true);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("qwen2"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("deepseek-r1, qwen3, qwen3-thinking"), std::string::npos) << e.what();
  }
  EXPECT_EQ(reasoning_parser_names(), (std::vector<std::string>{"deepseek-r1", "qwen3", "qwen3-thinking"}));
}

// Random texts made of the pieces that matter (tags, partial tags, whitespace, UTF-8), every parser mode,
// random chunkings: streaming must always equal non-streaming.
TEST(ReasoningParser, FuzzStreamingEqualsNonStreaming) {
  const std::vector<std::string> pieces = {"<think>", "</think>", "<tool_call>", "</thi", "<thi", "<", ">", "\n",
                                           " ",       "\n\n",     "a",           "bc",    "思",   "\t", "</"};
  std::mt19937_64 rng(42);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    const int n = static_cast<int>(rng() % 14);
    for (int i = 0; i < n; ++i) text += pieces[rng() % pieces.size()];
    const bool starts = rng() % 2;
    const bool thinking = rng() % 5 != 0;
    const ReasoningResult expected = ReasoningParser(starts, thinking).parse_full(text);
    for (const auto& chunks : chunkings(text, 3, rng())) {
      ReasoningParser p(starts, thinking);
      ReasoningResult r = stream(p, chunks);
      ASSERT_EQ(r.reasoning, expected.reasoning) << describe(chunks) << " starts=" << starts;
      ASSERT_EQ(r.content, expected.content) << describe(chunks) << " starts=" << starts;
    }
  }
}

}  // namespace
}  // namespace moeserve::parsers

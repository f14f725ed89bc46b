// Reasoning parsers: split model output into reasoning_content (inside <think>...</think>) and content.
//
// Behaviour (qwen3, qwen3-thinking, deepseek-r1; the same <think>...</think> syntax):
//  - Reasoning starts either because the prompt already opened it (the chat template ended the prompt with
//    "<think>\n": starts_in_reasoning) or because the output itself begins with "<think>" (after optional
//    whitespace). "<think>" anywhere else is ordinary content.
//  - Reasoning ends at "</think>", or at "<tool_call>" (a model that calls a tool before closing its thought;
//    the "<tool_call>..." text stays in content for the tool-call parser). Without either, the output was
//    truncated and everything is reasoning.
//  - Whitespace: reasoning is stripped on both sides and content is left-stripped after "</think>", as
//    SGLang's non-streaming detector does ("<think>\nabc\n</think>\n\nanswer" -> "abc" / "answer").
//    Streaming applies the same rule (it holds back trailing whitespace until it knows what follows), so the
//    concatenated streaming deltas always equal parse_full() of the concatenated text.
//  - thinking_enabled=false (enable_thinking=false in chat_template_kwargs): nothing is reasoning.
// Model output is never an error: every byte ends up in reasoning or content, or is one of the tags or
// the whitespace stripped around them.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::parsers {

struct ReasoningResult {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  // name: one of reasoning_parser_names(); otherwise UserError listing them.
  // starts_in_reasoning: the rendered prompt ends inside an open <think> block.
  // thinking_enabled: false turns the parser into a pass-through (all content).
  // "deepseek-r1" and "qwen3-thinking" always start in reasoning (their templates always open <think>;
  // SGLang forces reasoning for them too); "qwen3" follows starts_in_reasoning.
  static std::unique_ptr<ReasoningParser> create(const std::string& name, bool starts_in_reasoning,
                                                 bool thinking_enabled);

  ReasoningParser(bool starts_in_reasoning, bool thinking_enabled);

  // Whole output at once. Independent of the streaming state.
  ReasoningResult parse_full(std::string_view text) const;

  // Streaming: feed chunks in order (any split, even inside a tag); each call returns what became certain.
  ReasoningResult push(std::string_view chunk);
  // End of output: flushes what was held back (a partial tag is then plain text).
  ReasoningResult finish();

  // True while the output so far is inside reasoning (from the start when the prompt opened it).
  bool in_reasoning() const { return state_ == State::kReasoningOpen || state_ == State::kReasoning; }
  // True once reasoning has ended (or never started): later text is content only.
  bool reasoning_done() const { return state_ == State::kContent || state_ == State::kContentLead; }

 private:
  enum class State {
    kStart,          // not in reasoning yet; waiting to see whether the output opens with "<think>"
    kReasoningOpen,  // in reasoning, before any non-space byte; an explicit "<think>" here is dropped
    kReasoning,      // in reasoning
    kContentLead,    // after "</think>": leading whitespace of content is dropped
    kContent,        // plain content
  };

  void process(bool final, ReasoningResult& out);
  // Emits reasoning text with the strip rules; `final_piece` means the reasoning ends after it.
  void emit_reasoning(std::string_view text, bool final_piece, ReasoningResult& out);

  bool starts_in_reasoning_;
  bool thinking_enabled_;
  State state_;
  std::string pending_;            // bytes not yet classified
  bool reasoning_emitted_ = false;  // some non-space reasoning byte was emitted (no more left-stripping)
};

std::vector<std::string> reasoning_parser_names();

}  // namespace moeserve::parsers

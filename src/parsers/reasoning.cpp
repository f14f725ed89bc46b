#include "parsers/reasoning.h"

#include <algorithm>

#include "core/error.h"
#include "parsers/text_util.h"

namespace moeserve::parsers {

namespace {

constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
// A tool call inside an unclosed thought ends the thought: Qwen3 models sometimes skip "</think>".
constexpr std::string_view kToolCallStart = "<tool_call>";

struct Variant {
  const char* name;
  bool forces_reasoning;  // the template always opens <think>, whatever the caller detected
};

constexpr Variant kVariants[] = {
    {"deepseek-r1", true},
    {"qwen3", false},
    {"qwen3-thinking", true},
};

}  // namespace

std::vector<std::string> reasoning_parser_names() {
  std::vector<std::string> names;
  for (const Variant& v : kVariants) names.emplace_back(v.name);
  return names;
}

std::unique_ptr<ReasoningParser> ReasoningParser::create(const std::string& name, bool starts_in_reasoning,
                                                         bool thinking_enabled) {
  for (const Variant& v : kVariants) {
    if (name == v.name) {
      return std::make_unique<ReasoningParser>(starts_in_reasoning || v.forces_reasoning, thinking_enabled);
    }
  }
  std::string valid;
  for (const std::string& n : reasoning_parser_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw_user("unknown reasoning parser '{}'; valid reasoning parsers: {}", name, valid);
}

ReasoningParser::ReasoningParser(bool starts_in_reasoning, bool thinking_enabled)
    : starts_in_reasoning_(starts_in_reasoning),
      thinking_enabled_(thinking_enabled),
      state_(!thinking_enabled ? State::kContent
             : starts_in_reasoning ? State::kReasoningOpen
                                   : State::kStart) {}

ReasoningResult ReasoningParser::parse_full(std::string_view text) const {
  if (!thinking_enabled_) return {"", std::string(text)};
  const size_t first = text.size() - detail::lstrip(text).size();
  const bool explicit_open = text.substr(first).starts_with(kThinkStart);
  if (!starts_in_reasoning_ && !explicit_open) return {"", std::string(text)};
  const size_t body_begin = explicit_open ? first + kThinkStart.size() : first;

  const size_t end = text.find(kThinkEnd, body_begin);
  const size_t tool = text.find(kToolCallStart, body_begin);
  ReasoningResult r;
  if (end == std::string_view::npos && tool == std::string_view::npos) {
    r.reasoning = detail::strip(text.substr(body_begin));  // truncated inside the thought
  } else if (tool < end) {
    r.reasoning = detail::strip(text.substr(body_begin, tool - body_begin));
    r.content = text.substr(tool);
  } else {
    r.reasoning = detail::strip(text.substr(body_begin, end - body_begin));
    r.content = detail::lstrip(text.substr(end + kThinkEnd.size()));
  }
  return r;
}

ReasoningResult ReasoningParser::push(std::string_view chunk) {
  ReasoningResult out;
  pending_.append(chunk);
  process(false, out);
  return out;
}

ReasoningResult ReasoningParser::finish() {
  ReasoningResult out;
  process(true, out);
  MS_CHECK(pending_.empty(), "reasoning parser kept {} bytes after finish", pending_.size());
  return out;
}

void ReasoningParser::emit_reasoning(std::string_view text, bool final_piece, ReasoningResult& out) {
  if (!reasoning_emitted_) text = detail::lstrip(text);
  if (final_piece) text = detail::rstrip(text);
  if (text.empty()) return;
  out.reasoning.append(text);
  reasoning_emitted_ = true;
}

void ReasoningParser::process(bool final, ReasoningResult& out) {
  for (;;) {
    switch (state_) {
      case State::kStart: {
        const std::string_view body = detail::lstrip(pending_);
        if (body.starts_with(kThinkStart)) {
          pending_.erase(0, pending_.size() - body.size() + kThinkStart.size());
          state_ = State::kReasoning;
          continue;
        }
        // Only whitespace or a partial "<think>" so far: cannot tell reasoning from content yet.
        if (!final && (body.empty() || detail::is_proper_prefix(body, kThinkStart))) return;
        state_ = State::kContent;
        continue;
      }
      case State::kReasoningOpen: {
        const std::string_view body = detail::lstrip(pending_);
        if (body.starts_with(kThinkStart)) {  // the model repeated the <think> the prompt already opened
          pending_.erase(0, pending_.size() - body.size() + kThinkStart.size());
          state_ = State::kReasoning;
          continue;
        }
        if (!final && (body.empty() || detail::is_proper_prefix(body, kThinkStart))) {
          pending_.erase(0, pending_.size() - body.size());  // leading whitespace of reasoning is dropped
          return;
        }
        state_ = State::kReasoning;
        continue;
      }
      case State::kReasoning: {
        const size_t end = pending_.find(kThinkEnd);
        const size_t tool = pending_.find(kToolCallStart);
        if (end != std::string::npos || tool != std::string::npos) {
          const size_t stop = std::min(end, tool);
          emit_reasoning(std::string_view(pending_).substr(0, stop), true, out);
          if (tool < end) {
            pending_.erase(0, tool);  // "<tool_call>" stays: it belongs to the tool-call parser
            state_ = State::kContent;
          } else {
            pending_.erase(0, end + kThinkEnd.size());
            state_ = State::kContentLead;
          }
          continue;
        }
        if (final) {
          emit_reasoning(pending_, true, out);
          pending_.clear();
          return;
        }
        // Hold back a possible partial tag and the whitespace before it: that whitespace is stripped if
        // the tag completes.
        size_t safe = pending_.size() - detail::partial_tag_suffix(pending_, {kThinkEnd, kToolCallStart});
        while (safe > 0 && detail::is_space(pending_[safe - 1])) --safe;
        emit_reasoning(std::string_view(pending_).substr(0, safe), false, out);
        pending_.erase(0, safe);
        return;
      }
      case State::kContentLead: {
        const std::string_view body = detail::lstrip(pending_);
        if (body.empty()) {
          pending_.clear();
          return;
        }
        pending_.erase(0, pending_.size() - body.size());
        state_ = State::kContent;
        continue;
      }
      case State::kContent:
        out.content.append(pending_);
        pending_.clear();
        return;
    }
  }
}

}  // namespace moeserve::parsers

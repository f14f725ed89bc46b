// Tool-call parsers: find the tool calls a model wrote in its output and turn them into OpenAI tool_calls.
//
// Formats (tool_call_parser_names()):
//  - "qwen3_coder": <tool_call>\n<function=NAME>\n<parameter=ARG>\nvalue\n</parameter>\n...</function>\n</tool_call>
//    Values are raw text; one leading and one trailing newline are stripped and the text is converted by the
//    parameter's JSON-schema type (param_convert.h). A value ends at the first "</parameter>", or, when the
//    model forgot to close it, at the next "<parameter=" or "</function>" (as SGLang / vLLM do); a literal
//    "</tool_call>" inside a value does not end it.
//  - "hermes", "qwen25": <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>. The JSON object is
//    matched brace by brace (strings respected), so "</tool_call>" inside a JSON string is harmless.
//
// Rules common to all formats:
//  - Several calls per message. Text outside calls is content, kept verbatim, except that a run of text
//    that is only whitespace and sits next to a call (the newlines between calls) is dropped.
//  - A block that is malformed or truncated (the output ended inside it) is content, byte for byte; its
//    "<tool_call>" is treated as text and scanning goes on right after it.
//  - A call to a function that is not in the request's tools is content too (SGLang drops such calls by
//    default; we keep the text so nothing the model wrote is lost, and the client sees what happened).
//  - arguments is a JSON object serialized compactly, key order as written, non-ASCII kept as UTF-8.
//  - Streaming: content is emitted as soon as it cannot be the start of "<tool_call>"; a call is emitted
//    only once its closing tag has been seen and it parsed, as one ToolCallDelta carrying index, id, name
//    and the whole arguments string. Emitting a call earlier would mean sending deltas that a later
//    truncation or syntax error would have to take back, and OpenAI deltas cannot be taken back; waiting
//    makes streaming output equal parse_full() output for every chunking.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::parsers {

struct ToolCall {
  std::string id;         // "call_" + 24 alphanumerics
  std::string name;
  std::string arguments;  // JSON object text
};

// One OpenAI streaming tool_calls entry. The first delta of an index carries id and name; later ones (if
// any) carry only argument text. Concatenating arguments_fragment over an index gives ToolCall::arguments.
struct ToolCallDelta {
  int index = 0;
  std::string id;
  std::string name;
  std::string arguments_fragment;
};

struct ToolParseResult {
  std::string content;
  std::vector<ToolCall> calls;
};

struct ToolStreamDelta {
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

using ToolCallIdGenerator = std::function<std::string()>;

// The `tools` of a chat request, checked and indexed by function name. Accepts OpenAI's
// [{"type": "function", "function": {"name", "description", "parameters"}}] and, leniently, entries that
// are the function object itself. null means no tools. Malformed lists are a UserError (a 400).
class ToolSet {
 public:
  ToolSet() = default;
  explicit ToolSet(const nlohmann::ordered_json& tools);

  bool empty() const { return functions_.empty(); }
  bool contains(std::string_view function) const;
  // The declared function names, in request order.
  const std::vector<std::string>& names() const { return names_; }
  // The JSON schema of one parameter, or nullptr when the function or the parameter is not declared.
  const nlohmann::ordered_json* parameter_schema(std::string_view function, std::string_view parameter) const;

 private:
  std::vector<std::string> names_;
  // name -> the "properties" object of its parameters schema (an empty object when none was given).
  std::map<std::string, nlohmann::ordered_json, std::less<>> functions_;
};

// A request's tool_choice, checked against its tools.
struct ToolChoice {
  enum class Mode { kNone, kAuto, kRequired, kFunction };
  Mode mode = Mode::kAuto;
  std::string function;  // for kFunction
};

// tool_choice as OpenAI defines it: absent/null (auto with tools, none without), "none", "auto",
// "required", or {"type": "function", "function": {"name": NAME}}. UserError for anything else, for a
// named function that is not in tools, and for "required" or a named function without tools.
ToolChoice parse_tool_choice(const nlohmann::ordered_json& tool_choice, const ToolSet& tools);

// "call_" + 24 random alphanumerics, the shape OpenAI-compatible servers use.
std::string random_tool_call_id();

namespace detail {
class ToolFormat;
class BlockScanner;
}

class ToolCallParser {
 public:
  // name: one of tool_call_parser_names() (else UserError listing them). tools: the request's tools
  // (UserError when malformed). ids: call-id source; empty means random_tool_call_id().
  static std::unique_ptr<ToolCallParser> create(const std::string& name, const nlohmann::ordered_json& tools,
                                                ToolCallIdGenerator ids = {});

  ToolCallParser(std::unique_ptr<detail::ToolFormat> format, ToolSet tools, ToolCallIdGenerator ids);
  ~ToolCallParser();

  // Whole output at once. Independent of the streaming state (but draws ids from the same generator).
  ToolParseResult parse_full(std::string_view text);

  // Streaming: chunks in order, split anywhere. Each call returns what became certain.
  ToolStreamDelta push(std::string_view chunk);
  // End of output: held-back text is content, an unfinished call is content.
  ToolStreamDelta finish();

  // Calls emitted so far by push()/finish() (for finish_reason "tool_calls" and logging).
  const std::vector<ToolCall>& streamed_calls() const { return streamed_calls_; }
  const ToolSet& tools() const { return tools_; }

 private:
  void process(bool final, ToolStreamDelta& out);
  void emit_content(std::string_view text, ToolStreamDelta& out);

  std::unique_ptr<detail::ToolFormat> format_;
  ToolSet tools_;
  ToolCallIdGenerator ids_;

  // Streaming state.
  std::string pending_;                          // text not yet emitted
  std::unique_ptr<detail::BlockScanner> block_;  // open block (pending_ starts with "<tool_call>")
  std::string held_space_;                       // whitespace-only run, dropped if a call follows it
  bool run_has_text_ = false;                    // the current run between calls has emitted non-space text
  std::vector<ToolCall> streamed_calls_;
};

std::vector<std::string> tool_call_parser_names();

}  // namespace moeserve::parsers

// Tool-call parsers: find the tool calls a model wrote in its output and turn them into OpenAI tool_calls.
//
// Formats (tool_call_parser_names()):
//  - "qwen3_coder": <tool_call>\n<function=NAME>\n<parameter=ARG>\nvalue\n</parameter>\n...</function>\n</tool_call>
//    Values are raw text; one leading and one trailing newline are stripped and the text is converted by the
//    parameter's JSON-schema type (param_convert.h). A value ends at the first "</parameter>", or, when the
//    model forgot to close it, at the next "<parameter=" or "</function>" (as SGLang / vLLM do); a literal
//    "</tool_call>" inside a value does not end it.
//  - "hermes", "qwen25": <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>. The JSON object is
//    read by a strict incremental JSON reader, so "</tool_call>" inside a JSON string is harmless.
//    "parameters" is accepted for "arguments" (the first of the two counts), so is a JSON string holding
//    the object (OpenAI style), and null or absent arguments are {}.
//
// Rules common to all formats:
//  - Several calls per message. Text outside calls is content, kept verbatim, except that a run of text
//    that is only whitespace and sits next to a call (the newlines between calls) is dropped.
//  - A block is committed as soon as its (first) function name is complete and declared in the request's
//    tools: qwen3_coder at the ">" of "<function=NAME>", hermes when the string value of the top-level
//    "name" key closes. From then on it is a tool call whatever follows (as in SGLang); before that it can
//    still turn out to be text.
//  - A block that is malformed or truncated before it was committed is content, byte for byte; its
//    "<tool_call>" is treated as text and scanning goes on right after it.
//  - A committed call truncated by the end of the output is a call with the arguments parsed so far: the
//    parameters / members whose values were complete; a value cut off is dropped; the object is closed.
//    The whole rest of the output belongs to it.
//  - A committed block that stops following its syntax (junk between parameters, invalid JSON, a second
//    function that is not declared, text after "</function>" or after the JSON object where
//    "</tool_call>" belongs) ends where its last complete element ended; its calls keep the arguments
//    parsed so far. What follows is the block's remains: they are dropped up to and including the next
//    "</tool_call>"; when a "<tool_call>" or the end of the output comes first, nothing is dropped and the
//    remains are ordinary output (content, further calls).
//  - A block whose first function is not declared is content too, whole, once it is seen to be
//    well-formed (SGLang drops such calls by default; we keep the text so nothing the model wrote is
//    lost, and the client sees what happened).
//  - arguments is a JSON object serialized compactly, members in the order written, non-ASCII kept as
//    UTF-8. A key written twice keeps its first value (streamed text cannot be taken back).
//  - parse_full() is the streaming parser fed the whole text at once, so both modes agree on every case,
//    truncated and broken calls included.
//  - Streaming: content is emitted as soon as it cannot be the start of "<tool_call>". A call is emitted
//    as OpenAI tool-call deltas: once committed, one delta with index, id and name and empty arguments;
//    then argument fragments (id and name empty) as they become final: qwen3_coder one `"key":value`
//    member per completed parameter (the first one preceded by "{"), hermes one member per completed
//    member of the "arguments" object (the whole object at once when it is given as a JSON string), and
//    the closing "}" (or "{}") when the call ends. For every chunking, the fragments of an index concatenate
//    to exactly the arguments string parse_full() gives that call.
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

// One OpenAI streaming tool_calls entry. The first delta of an index carries id and name and no argument
// text; later ones carry only (non-empty) argument text. Concatenating arguments_fragment over an index
// gives ToolCall::arguments.
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
class ToolStream;
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
  // End of output: held-back text is content; an open committed call is closed with the arguments parsed
  // so far; an uncommitted block is content.
  ToolStreamDelta finish();

  // Calls emitted so far by push()/finish(), arguments as streamed so far (for finish_reason "tool_calls"
  // and logging).
  const std::vector<ToolCall>& streamed_calls() const { return streamed_calls_; }
  const ToolSet& tools() const { return tools_; }

 private:
  std::unique_ptr<detail::ToolFormat> format_;
  ToolSet tools_;
  ToolCallIdGenerator ids_;

  std::vector<ToolCall> streamed_calls_;
  std::unique_ptr<detail::ToolStream> stream_;  // push()/finish() state
};

std::vector<std::string> tool_call_parser_names();

// The text that starts a call in `parser`'s format, for tool_choice "required" (function empty: the model
// names the function) or a named function. The server appends it to the prompt so the model continues
// inside a call (no constrained decoding needed), and feeds it to the parser ahead of the output.
std::string forced_tool_call_prefix(const std::string& parser, const std::string& function);

}  // namespace moeserve::parsers

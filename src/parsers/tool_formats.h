// Tool-call block syntaxes (internal to src/parsers/). A ToolFormat parses one block that starts with
// "<tool_call>"; ToolCallParser does the rest (content, streaming, ids, tool-name checks).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::parsers {
class ToolSet;
}

namespace moeserve::parsers::detail {

inline constexpr std::string_view kToolCallStart = "<tool_call>";
inline constexpr std::string_view kToolCallEnd = "</tool_call>";

struct ParsedCall {
  std::string name;
  nlohmann::ordered_json arguments;  // always an object
};

struct BlockParse {
  enum class Status {
    kNeedMore,   // the text ends before the block could be decided
    kComplete,   // a well-formed block of `length` bytes, closing tag included
    kMalformed,  // not a tool call: the caller treats its "<tool_call>" as text
  };
  Status status = Status::kNeedMore;
  size_t length = 0;
  std::vector<ParsedCall> calls;
};

// Parses one block incrementally. scan() is called with successive prefixes of the same text (each
// extending the previous one), which starts with "<tool_call>", until it returns something other than
// kNeedMore; it resumes where it stopped, so a long block costs linear time however it is chunked.
// Contract (what makes streaming equal non-streaming): the verdict depends only on the bytes read so far,
// so a scanner fed the whole text at once and one fed it piecewise return the same verdict, length and calls.
class BlockScanner {
 public:
  virtual ~BlockScanner() = default;
  virtual BlockParse scan(std::string_view text) = 0;
};

class ToolFormat {
 public:
  virtual ~ToolFormat() = default;
  // `tools` gives parameter schemas (it must outlive the scanner); names are not checked here.
  virtual std::unique_ptr<BlockScanner> start_block(const ToolSet& tools) const = 0;
};

std::unique_ptr<ToolFormat> make_qwen3_coder_format();
std::unique_ptr<ToolFormat> make_hermes_format();

}  // namespace moeserve::parsers::detail

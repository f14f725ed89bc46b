// Tool-call block syntaxes (internal to src/parsers/). A ToolFormat parses one block that starts with
// "<tool_call>" and reports the calls in it as events, as early as they are certain; ToolCallParser does
// the rest (content, ids, deltas, what follows a broken block).
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

// What a scanner learned about the calls of its block. Calls come one after the other: a kOpen starts a
// call (the function name is complete and declared), the kArguments after it are pieces of that call's
// arguments text, in order; their concatenation is a compact JSON object, complete once the block's
// scan returned a status other than kNeedMore (or the next kOpen came).
struct CallEvent {
  enum class Kind { kOpen, kArguments };
  Kind kind;
  std::string text;  // kOpen: the function name; kArguments: the next piece of the arguments JSON
};

struct BlockParse {
  enum class Status {
    kNeedMore,   // the block goes on (events may still have been reported)
    kComplete,   // the block ended after `length` bytes (the whole text when it was truncated by the end
                 // of the output); every call in it is closed
    kBroken,     // a committed block stopped following its syntax at `length`: its calls are closed, what
                 // follows is the block's remains (ToolCallParser decides what to drop)
    kForeign,    // a well-formed block calling a function the request did not declare: its `length`
                 // bytes are content
    kMalformed,  // not a tool call, and nothing was committed: the caller treats "<tool_call>" as text
  };
  Status status = Status::kNeedMore;
  size_t length = 0;
  std::vector<CallEvent> events;  // reported by this scan() call
};

// Parses one block incrementally. scan() is called with successive prefixes of the same text (each
// extending the previous one), which starts with "<tool_call>", until it returns something other than
// kNeedMore; `final` says the text is the whole rest of the output (then kNeedMore is never returned). It
// resumes where it stopped, so a long block costs linear time however it is chunked.
// Contract (what makes streaming equal non-streaming): verdicts, lengths and event texts depend only on
// the bytes read so far, so a scanner fed the whole text at once and one fed it piecewise report the same
// verdict, the same length and the same concatenated event texts.
// Commitment: once the first call's name is complete and declared, the block is committed: it never
// becomes content again (kMalformed / kForeign are no longer possible); a truncation or a syntax error
// only ends it early with the arguments parsed so far.
class BlockScanner {
 public:
  virtual ~BlockScanner() = default;
  virtual BlockParse scan(std::string_view text, bool final) = 0;
};

class ToolFormat {
 public:
  virtual ~ToolFormat() = default;
  // `tools` gives the declared names and parameter schemas; it must outlive the scanner.
  virtual std::unique_ptr<BlockScanner> start_block(const ToolSet& tools) const = 0;
};

std::unique_ptr<ToolFormat> make_qwen3_coder_format();
std::unique_ptr<ToolFormat> make_hermes_format();

// Compact JSON, UTF-8 kept (ensure_ascii=false); invalid UTF-8 from the model is replaced, never thrown on.
std::string dump_compact(const nlohmann::ordered_json& value);

}  // namespace moeserve::parsers::detail

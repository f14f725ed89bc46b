#include "parsers/tool_formats.h"

#include <algorithm>
#include <cctype>

#include "parsers/param_convert.h"
#include "parsers/text_util.h"
#include "parsers/tool_calls.h"

namespace moeserve::parsers::detail {

namespace {

using nlohmann::ordered_json;
using Status = BlockParse::Status;

BlockParse need_more() { return {Status::kNeedMore, 0, {}}; }
BlockParse malformed() { return {Status::kMalformed, 0, {}}; }

size_t skip_space(std::string_view text, size_t pos) {
  while (pos < text.size() && is_space(text[pos])) ++pos;
  return pos;
}

enum class Match { kYes, kNo, kNeedMore };

// Whether `tag` is at `pos`; kNeedMore when the text ends inside what could still be the tag.
Match match_at(std::string_view text, size_t pos, std::string_view tag) {
  const std::string_view rest = text.substr(pos);
  if (rest.starts_with(tag)) return Match::kYes;
  return is_proper_prefix(rest, tag) ? Match::kNeedMore : Match::kNo;
}

// ---- qwen3_coder ----------------------------------------------------------------------------------

constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParameterOpen = "<parameter=";
constexpr std::string_view kParameterClose = "</parameter>";

// Reads NAME> of "<function=NAME>" / "<parameter=NAME>" starting at `begin`, looking at bytes from
// `from` on (earlier ones were already seen). A name never spans lines or contains '<': when it would,
// the tag is not what it looks like.
struct NameRead {
  Status status;
  std::string name;
  size_t next = 0;  // one past '>' when complete; where to resume when kNeedMore
};

NameRead read_tag_name(std::string_view text, size_t begin, size_t from) {
  for (size_t i = from; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '>') {
      const std::string_view name = strip(text.substr(begin, i - begin));
      if (name.empty()) return {Status::kMalformed};
      return {Status::kComplete, std::string(name), i + 1};
    }
    if (c == '\n' || c == '<') return {Status::kMalformed};
  }
  return {Status::kNeedMore, {}, text.size()};
}

class Qwen3CoderScanner final : public BlockScanner {
 public:
  explicit Qwen3CoderScanner(const ToolSet& tools) : tools_(tools) {}

  BlockParse scan(std::string_view text) override {
    for (;;) {
      switch (step_) {
        case Step::kFunctionOpen: {
          pos_ = skip_space(text, pos_);
          if (Match m = match_at(text, pos_, kFunctionOpen); m != Match::kYes) {
            return m == Match::kNeedMore ? need_more() : malformed();
          }
          pos_ += kFunctionOpen.size();
          search_ = pos_;
          step_ = Step::kFunctionName;
          break;
        }
        case Step::kFunctionName: {
          NameRead r = read_tag_name(text, pos_, search_);
          if (r.status != Status::kComplete) {
            search_ = r.next;
            return {r.status};
          }
          call_ = {std::move(r.name), ordered_json::object()};
          pos_ = r.next;
          step_ = Step::kBody;
          break;
        }
        case Step::kBody: {  // before a <parameter=...> or the </function>
          pos_ = skip_space(text, pos_);
          const Match param = match_at(text, pos_, kParameterOpen);
          if (param == Match::kYes) {
            pos_ += kParameterOpen.size();
            search_ = pos_;
            step_ = Step::kParameterName;
            break;
          }
          const Match end = match_at(text, pos_, kFunctionClose);
          if (end == Match::kYes) {
            pos_ += kFunctionClose.size();
            result_.calls.push_back(std::move(call_));
            step_ = Step::kAfterFunction;
            break;
          }
          return (param == Match::kNeedMore || end == Match::kNeedMore) ? need_more() : malformed();
        }
        case Step::kParameterName: {
          NameRead r = read_tag_name(text, pos_, search_);
          if (r.status != Status::kComplete) {
            search_ = r.next;
            return {r.status};
          }
          parameter_ = std::move(r.name);
          pos_ = r.next;
          search_ = pos_;
          step_ = Step::kValue;
          break;
        }
        case Step::kValue: {
          // The value ends at the first "</parameter>", or, leniently (as SGLang / vLLM accept), at the
          // next "<parameter=" or "</function>" when the model forgot to close it. None of the three
          // contains another, so the earliest complete one is final whatever bytes come later.
          const size_t close = text.find(kParameterClose, search_);
          const size_t next_param = text.find(kParameterOpen, search_);
          const size_t function_close = text.find(kFunctionClose, search_);
          const size_t value_end = std::min({close, next_param, function_close});
          if (value_end == std::string_view::npos) {
            // Resume where a marker split by the end of the text could start.
            search_ = std::max(pos_, text.size() - std::min(text.size(), kParameterClose.size() - 1));
            return need_more();
          }
          std::string_view value = text.substr(pos_, value_end - pos_);
          if (value.starts_with('\n')) value.remove_prefix(1);
          if (value.ends_with('\n')) value.remove_suffix(1);
          call_.arguments[parameter_] = convert_param_value(value, tools_.parameter_schema(call_.name, parameter_));
          pos_ = value_end == close ? close + kParameterClose.size() : value_end;
          step_ = Step::kBody;
          break;
        }
        case Step::kAfterFunction: {  // SGLang accepts several functions in one block
          pos_ = skip_space(text, pos_);
          const Match close = match_at(text, pos_, kToolCallEnd);
          if (close == Match::kYes) {
            result_.status = Status::kComplete;
            result_.length = pos_ + kToolCallEnd.size();
            return std::move(result_);
          }
          const Match another = match_at(text, pos_, kFunctionOpen);
          if (another == Match::kYes) {
            step_ = Step::kFunctionOpen;
            break;
          }
          return (close == Match::kNeedMore || another == Match::kNeedMore) ? need_more() : malformed();
        }
      }
    }
  }

 private:
  enum class Step { kFunctionOpen, kFunctionName, kBody, kParameterName, kValue, kAfterFunction };

  const ToolSet& tools_;
  Step step_ = Step::kFunctionOpen;
  size_t pos_ = kToolCallStart.size();  // start of the element being read
  size_t search_ = 0;                   // bytes before this were already searched for the element's end
  ParsedCall call_;
  std::string parameter_;
  BlockParse result_;
};

class Qwen3CoderFormat final : public ToolFormat {
 public:
  std::unique_ptr<BlockScanner> start_block(const ToolSet& tools) const override {
    return std::make_unique<Qwen3CoderScanner>(tools);
  }
};

// ---- hermes / qwen25 ------------------------------------------------------------------------------

// Matches the JSON object brace by brace, respecting strings. Bytes that cannot occur in JSON outside a
// string (such as '<') and raw control characters inside one settle the block as malformed at once, so
// prose after a stray "<tool_call>" is not held back waiting for a closing brace.
class HermesScanner final : public BlockScanner {
 public:
  BlockParse scan(std::string_view text) override {
    if (step_ == Step::kBeforeObject) {
      pos_ = skip_space(text, pos_);
      if (pos_ == text.size()) return need_more();
      if (text[pos_] != '{') return malformed();
      object_begin_ = pos_;
      step_ = Step::kObject;
    }
    if (step_ == Step::kObject) {
      const Status s = scan_object(text);
      if (s != Status::kComplete) return {s};
      step_ = Step::kAfterObject;
    }
    pos_ = skip_space(text, pos_);
    if (Match m = match_at(text, pos_, kToolCallEnd); m != Match::kYes) {
      return m == Match::kNeedMore ? need_more() : malformed();
    }
    return finish(text.substr(object_begin_, object_end_ - object_begin_), pos_ + kToolCallEnd.size());
  }

 private:
  enum class Step { kBeforeObject, kObject, kAfterObject };
  static constexpr int kMaxDepth = 256;

  Status scan_object(std::string_view text) {
    for (; pos_ < text.size(); ++pos_) {
      const unsigned char c = static_cast<unsigned char>(text[pos_]);
      if (in_string_) {
        if (escaped_) {
          escaped_ = false;
        } else if (c == '\\') {
          escaped_ = true;
        } else if (c == '"') {
          in_string_ = false;
        } else if (c < 0x20) {
          return Status::kMalformed;
        }
        continue;
      }
      switch (c) {
        case '"':
          in_string_ = true;
          break;
        case '{':
        case '[':
          if (++depth_ > kMaxDepth) return Status::kMalformed;
          break;
        case '}':
        case ']':
          if (--depth_ == 0) {
            object_end_ = ++pos_;
            return c == '}' ? Status::kComplete : Status::kMalformed;
          }
          break;
        default:
          if (!(is_space(static_cast<char>(c)) || std::isalnum(c) || c == ':' || c == ',' || c == '-' ||
                c == '+' || c == '.')) {
            return Status::kMalformed;
          }
      }
    }
    return Status::kNeedMore;
  }

  static BlockParse finish(std::string_view body, size_t length) {
    ordered_json obj = ordered_json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
    if (obj.is_discarded() || !obj.is_object()) return malformed();
    auto name = obj.find("name");
    if (name == obj.end() || !name->is_string() || strip(name->get_ref<const std::string&>()).empty()) {
      return malformed();
    }
    // "arguments" per the Hermes/Qwen2.5 template; "parameters" is what some models write (SGLang accepts it).
    auto args = obj.find("arguments");
    if (args == obj.end()) args = obj.find("parameters");
    ordered_json arguments = ordered_json::object();
    if (args != obj.end() && !args->is_null()) {
      arguments = *args;
      if (arguments.is_string()) {  // arguments given as a JSON string, OpenAI-style
        const std::string& s = args->get_ref<const std::string&>();
        arguments = ordered_json::parse(s.begin(), s.end(), nullptr, false);
      }
      if (!arguments.is_object()) return malformed();
    }
    BlockParse result;
    result.status = Status::kComplete;
    result.length = length;
    result.calls.push_back({std::string(strip(name->get_ref<const std::string&>())), std::move(arguments)});
    return result;
  }

  Step step_ = Step::kBeforeObject;
  size_t pos_ = kToolCallStart.size();
  size_t object_begin_ = 0;
  size_t object_end_ = 0;
  int depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
};

class HermesFormat final : public ToolFormat {
 public:
  std::unique_ptr<BlockScanner> start_block(const ToolSet&) const override {
    return std::make_unique<HermesScanner>();
  }
};

}  // namespace

std::unique_ptr<ToolFormat> make_qwen3_coder_format() { return std::make_unique<Qwen3CoderFormat>(); }
std::unique_ptr<ToolFormat> make_hermes_format() { return std::make_unique<HermesFormat>(); }

}  // namespace moeserve::parsers::detail

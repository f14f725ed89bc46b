#include "parsers/tool_calls.h"

#include <memory>
#include <random>

#include "core/error.h"
#include "parsers/text_util.h"
#include "parsers/tool_formats.h"

namespace moeserve::parsers {

using nlohmann::ordered_json;

// ---- tools and tool_choice --------------------------------------------------------------------------

ToolSet::ToolSet(const ordered_json& tools) {
  if (tools.is_null()) return;
  MS_USER_CHECK(tools.is_array(), "'tools' must be an array of tool objects, got {}", tools.type_name());
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& tool = tools[i];
    MS_USER_CHECK(tool.is_object(), "tools[{}] must be an object, got {}", i, tool.type_name());
    if (auto type = tool.find("type"); type != tool.end()) {
      MS_USER_CHECK(type->is_string() && *type == "function",
                    "tools[{}].type must be \"function\" (the only tool type supported)", i);
    }
    const ordered_json* function = &tool;
    if (auto f = tool.find("function"); f != tool.end()) function = &*f;
    MS_USER_CHECK(function->is_object(), "tools[{}].function must be an object", i);
    auto name = function->find("name");
    MS_USER_CHECK(name != function->end() && name->is_string() && !name->get_ref<const std::string&>().empty(),
                  "tools[{}].function.name must be a non-empty string", i);
    ordered_json properties = ordered_json::object();
    if (auto params = function->find("parameters"); params != function->end() && !params->is_null()) {
      MS_USER_CHECK(params->is_object(), "tools[{}].function.parameters must be a JSON schema object", i);
      if (auto props = params->find("properties"); props != params->end() && props->is_object()) {
        properties = *props;
      }
    }
    const std::string& n = name->get_ref<const std::string&>();
    // A repeated name keeps its first definition: the model cannot tell the two apart anyway.
    if (functions_.emplace(n, std::move(properties)).second) names_.push_back(n);
  }
}

bool ToolSet::contains(std::string_view function) const { return functions_.find(function) != functions_.end(); }

const ordered_json* ToolSet::parameter_schema(std::string_view function, std::string_view parameter) const {
  auto f = functions_.find(function);
  if (f == functions_.end()) return nullptr;
  auto p = f->second.find(parameter);
  return p == f->second.end() ? nullptr : &*p;
}

namespace {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

ToolChoice parse_tool_choice(const ordered_json& tool_choice, const ToolSet& tools) {
  ToolChoice choice;
  if (tool_choice.is_null()) {
    choice.mode = tools.empty() ? ToolChoice::Mode::kNone : ToolChoice::Mode::kAuto;
    return choice;
  }
  if (tool_choice.is_string()) {
    const std::string& s = tool_choice.get_ref<const std::string&>();
    if (s == "none") {
      choice.mode = ToolChoice::Mode::kNone;
    } else if (s == "auto") {
      choice.mode = tools.empty() ? ToolChoice::Mode::kNone : ToolChoice::Mode::kAuto;
    } else if (s == "required") {
      MS_USER_CHECK(!tools.empty(), "tool_choice \"required\" needs a non-empty 'tools' list");
      choice.mode = ToolChoice::Mode::kRequired;
    } else {
      throw_user("tool_choice must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", "
                 "\"function\": {{\"name\": ...}}}}, got \"{}\"", s);
    }
    return choice;
  }
  const ordered_json* name = nullptr;
  if (tool_choice.is_object()) {
    auto f = tool_choice.find("function");
    if (f != tool_choice.end() && f->is_object()) {
      auto n = f->find("name");
      if (n != f->end() && n->is_string()) name = &*n;
    }
  }
  MS_USER_CHECK(name != nullptr,
                "tool_choice object must be {{\"type\": \"function\", \"function\": {{\"name\": NAME}}}}");
  const std::string& fn = name->get_ref<const std::string&>();
  MS_USER_CHECK(tools.contains(fn), "tool_choice names function '{}', which is not in 'tools' (declared: {})", fn,
                tools.empty() ? std::string("none") : join(tools.names()));
  choice.mode = ToolChoice::Mode::kFunction;
  choice.function = fn;
  return choice;
}

std::string random_tool_call_id() {
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  // Seeded from the OS each time (one call per tool call: cheap), so ids never repeat across requests or
  // restarts and no generator state is shared between threads.
  std::random_device os_random;
  std::mt19937_64 rng((static_cast<uint64_t>(os_random()) << 32) ^ os_random());
  std::uniform_int_distribution<size_t> pick(0, kAlphabet.size() - 1);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

// ---- parser -----------------------------------------------------------------------------------------

namespace {

struct FormatEntry {
  const char* name;
  std::unique_ptr<detail::ToolFormat> (*make)();
};

constexpr FormatEntry kFormats[] = {
    {"hermes", detail::make_hermes_format},
    {"qwen25", detail::make_hermes_format},  // Qwen2.5 / Qwen3 (non-coder) use the Hermes syntax
    {"qwen3_coder", detail::make_qwen3_coder_format},
};

}  // namespace

std::string forced_tool_call_prefix(const std::string& parser, const std::string& function) {
  if (parser == "qwen3_coder")
    return function.empty() ? "<tool_call>\n<function=" : "<tool_call>\n<function=" + function + ">\n";
  if (parser == "hermes" || parser == "qwen25")
    return function.empty() ? "<tool_call>\n{\"name\": \""
                            : "<tool_call>\n{\"name\": " + nlohmann::ordered_json(function).dump() + ", \"arguments\": ";
  throw_user("unknown tool-call parser '{}'; valid tool-call parsers: {}", parser, join(tool_call_parser_names()));
}

std::vector<std::string> tool_call_parser_names() {
  std::vector<std::string> names;
  for (const FormatEntry& f : kFormats) names.emplace_back(f.name);
  return names;
}

std::unique_ptr<ToolCallParser> ToolCallParser::create(const std::string& name, const ordered_json& tools,
                                                       ToolCallIdGenerator ids) {
  for (const FormatEntry& f : kFormats) {
    if (name == f.name) return std::make_unique<ToolCallParser>(f.make(), ToolSet(tools), std::move(ids));
  }
  throw_user("unknown tool-call parser '{}'; valid tool-call parsers: {}", name, join(tool_call_parser_names()));
}

ToolCallParser::ToolCallParser(std::unique_ptr<detail::ToolFormat> format, ToolSet tools, ToolCallIdGenerator ids)
    : format_(std::move(format)), tools_(std::move(tools)), ids_(std::move(ids)) {
  MS_CHECK(format_ != nullptr, "tool-call parser without a format");
  if (!ids_) ids_ = random_tool_call_id;
  stream_ = std::make_unique<detail::ToolStream>(*format_, tools_, ids_, streamed_calls_);
}

ToolCallParser::~ToolCallParser() = default;

namespace detail {

// The streaming state: the text not yet emitted, the open block, the whitespace rule. parse_full() uses
// a fresh one for the whole text, push()/finish() the parser's own.
class ToolStream {
 public:
  ToolStream(const ToolFormat& format, const ToolSet& tools, const ToolCallIdGenerator& ids,
             std::vector<ToolCall>& calls)
      : format_(format), tools_(tools), ids_(ids), calls_(calls) {}

  void push(std::string_view chunk, ToolStreamDelta& out) {
    buffer_.append(chunk);
    process(false, out);
  }

  void finish(ToolStreamDelta& out) {
    process(true, out);
    MS_CHECK(pending().empty() && mode_ == Mode::kText, "tool-call parser kept {} bytes after finish",
             pending().size());
    // A whitespace-only run is dropped next to a call; with no call at all it is the whole (blank) content.
    if (calls_.empty()) out.content += held_space_;
    held_space_.clear();
  }

 private:
  enum class Mode {
    kText,     // between blocks
    kBlock,    // in a block: pending() starts with "<tool_call>"
    kRemains,  // after a broken block: pending() starts with its remains
  };

  // The text not yet emitted.
  std::string_view pending() const { return std::string_view(buffer_).substr(begin_); }
  // Drops the first n bytes of pending(). The buffer is compacted only once the dropped bytes are most of
  // it: erasing every block from the front would be quadratic when parse_full() holds a long text with
  // many blocks.
  void consume(size_t n) {
    begin_ += n;
    if (begin_ == buffer_.size()) {
      buffer_.clear();
      begin_ = 0;
    } else if (begin_ > 4096 && begin_ > buffer_.size() / 2) {
      buffer_.erase(0, begin_);
      begin_ = 0;
    }
  }

  void process(bool final, ToolStreamDelta& out);
  void emit_content(std::string_view text, ToolStreamDelta& out);
  void emit_events(std::vector<CallEvent>& events, ToolStreamDelta& out);

  const ToolFormat& format_;
  const ToolSet& tools_;
  const ToolCallIdGenerator& ids_;
  std::vector<ToolCall>& calls_;

  Mode mode_ = Mode::kText;
  std::string buffer_;                   // buffer_[begin_:] is pending()
  size_t begin_ = 0;
  std::unique_ptr<BlockScanner> block_;  // kBlock: the open block's scanner
  size_t search_ = 0;                    // kRemains: bytes before this hold no tag
  std::string held_space_;               // whitespace-only run, dropped if a call follows it
  bool run_has_text_ = false;            // the current run between calls has emitted non-space text
};

void ToolStream::emit_content(std::string_view text, ToolStreamDelta& out) {
  if (text.empty()) return;
  if (!run_has_text_) {
    if (all_space(text)) {
      held_space_.append(text);
      return;
    }
    out.content += held_space_;
    held_space_.clear();
    run_has_text_ = true;
  }
  out.content.append(text);
}

void ToolStream::emit_events(std::vector<CallEvent>& events, ToolStreamDelta& out) {
  for (CallEvent& e : events) {
    if (e.kind == CallEvent::Kind::kOpen) {
      held_space_.clear();  // whitespace between content and a call is dropped
      run_has_text_ = false;
      ToolCall call{ids_(), std::move(e.text), ""};
      out.calls.push_back({static_cast<int>(calls_.size()), call.id, call.name, ""});
      calls_.push_back(std::move(call));
      continue;
    }
    if (e.text.empty()) continue;
    MS_CHECK(!calls_.empty(), "tool-call arguments before any call");
    calls_.back().arguments += e.text;
    const int index = static_cast<int>(calls_.size()) - 1;
    if (!out.calls.empty() && out.calls.back().index == index && out.calls.back().id.empty()) {
      out.calls.back().arguments_fragment += e.text;  // one delta per call and push: the fragments merged
    } else {
      out.calls.push_back({index, "", "", std::move(e.text)});
    }
  }
}

void ToolStream::process(bool final, ToolStreamDelta& out) {
  for (;;) {
    const std::string_view text = pending();
    switch (mode_) {
      case Mode::kText: {
        const size_t start = text.find(kToolCallStart);
        if (start == std::string_view::npos) {
          const size_t emit = text.size() - (final ? 0 : partial_tag_suffix(text, kToolCallStart));
          emit_content(text.substr(0, emit), out);
          consume(emit);
          return;
        }
        emit_content(text.substr(0, start), out);
        consume(start);
        block_ = format_.start_block(tools_);
        mode_ = Mode::kBlock;
        break;
      }
      case Mode::kBlock: {
        BlockParse block = block_->scan(text, final);
        emit_events(block.events, out);
        if (block.status == BlockParse::Status::kNeedMore) {
          MS_CHECK(!final, "tool-call block undecided at the end of the output");
          return;
        }
        block_.reset();
        mode_ = Mode::kText;
        switch (block.status) {
          case BlockParse::Status::kComplete:
            consume(block.length);
            break;
          case BlockParse::Status::kBroken:
            consume(block.length);
            mode_ = Mode::kRemains;
            search_ = 0;
            break;
          case BlockParse::Status::kForeign:  // a function the request did not declare
            emit_content(text.substr(0, block.length), out);
            consume(block.length);
            break;
          default:  // malformed, or truncated before it was committed
            emit_content(kToolCallStart, out);
            consume(kToolCallStart.size());
        }
        break;
      }
      case Mode::kRemains: {
        // The first "</tool_call>" or "<tool_call>", in one pass (two find()s would each run to the end
        // of the text when only the other tag follows).
        size_t tag = text.find('<', search_);
        for (; tag != std::string_view::npos; tag = text.find('<', tag + 1)) {
          const std::string_view rest = text.substr(tag);
          if (rest.starts_with(kToolCallEnd) || rest.starts_with(kToolCallStart)) break;
          if (is_proper_prefix(rest, kToolCallEnd) || is_proper_prefix(rest, kToolCallStart)) {
            if (final) continue;
            search_ = tag;  // a tag may be starting
            return;
          }
        }
        if (tag != std::string_view::npos && text.substr(tag).starts_with(kToolCallEnd)) {
          consume(tag + kToolCallEnd.size());  // dropped with the tag
        } else if (tag == std::string_view::npos && !final) {
          search_ = text.size();
          return;
        }
        mode_ = Mode::kText;  // a "<tool_call>" (or the end of the output) came first: ordinary output
        break;
      }
    }
  }
}

}  // namespace detail

ToolParseResult ToolCallParser::parse_full(std::string_view text) {
  ToolParseResult result;
  ToolStreamDelta out;
  detail::ToolStream stream(*format_, tools_, ids_, result.calls);
  stream.push(text, out);
  stream.finish(out);
  result.content = std::move(out.content);
  return result;
}

ToolStreamDelta ToolCallParser::push(std::string_view chunk) {
  ToolStreamDelta out;
  stream_->push(chunk, out);
  return out;
}

ToolStreamDelta ToolCallParser::finish() {
  ToolStreamDelta out;
  stream_->finish(out);
  return out;
}

}  // namespace moeserve::parsers

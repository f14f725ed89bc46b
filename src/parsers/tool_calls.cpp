#include "parsers/tool_calls.h"

#include <memory>
#include <random>

#include "core/error.h"
#include "parsers/text_util.h"
#include "parsers/tool_formats.h"

namespace moeserve::parsers {

using nlohmann::ordered_json;
using detail::BlockParse;
using detail::kToolCallStart;

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

std::string serialize_arguments(const ordered_json& arguments) {
  // Compact, UTF-8 kept (ensure_ascii=false); invalid UTF-8 from the model is replaced, never thrown on.
  return arguments.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

bool all_known(const BlockParse& block, const ToolSet& tools) {
  for (const detail::ParsedCall& c : block.calls) {
    if (!tools.contains(c.name)) return false;
  }
  return true;
}

}  // namespace

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
}

ToolCallParser::~ToolCallParser() = default;

ToolParseResult ToolCallParser::parse_full(std::string_view text) {
  // Text runs between calls; runs.size() == calls + 1.
  std::vector<std::string> runs(1);
  ToolParseResult result;
  size_t cursor = 0;
  for (;;) {
    const size_t start = text.find(kToolCallStart, cursor);
    if (start == std::string_view::npos) {
      runs.back().append(text.substr(cursor));
      break;
    }
    runs.back().append(text.substr(cursor, start - cursor));
    BlockParse block = format_->start_block(tools_)->scan(text.substr(start));
    if (block.status == BlockParse::Status::kComplete) {
      if (all_known(block, tools_)) {
        for (detail::ParsedCall& c : block.calls) {
          result.calls.push_back({ids_(), std::move(c.name), serialize_arguments(c.arguments)});
        }
        runs.emplace_back();
      } else {
        runs.back().append(text.substr(start, block.length));
      }
      cursor = start + block.length;
    } else {  // malformed, or truncated by the end of the output
      runs.back().append(kToolCallStart);
      cursor = start + kToolCallStart.size();
    }
  }
  for (const std::string& run : runs) {
    if (!result.calls.empty() && detail::all_space(run)) continue;
    result.content += run;
  }
  return result;
}

ToolStreamDelta ToolCallParser::push(std::string_view chunk) {
  ToolStreamDelta out;
  pending_.append(chunk);
  process(false, out);
  return out;
}

ToolStreamDelta ToolCallParser::finish() {
  ToolStreamDelta out;
  process(true, out);
  MS_CHECK(pending_.empty() && !block_, "tool-call parser kept {} bytes after finish", pending_.size());
  // A whitespace-only run is dropped next to a call; with no call at all it is the whole (blank) content.
  if (streamed_calls_.empty()) out.content += held_space_;
  held_space_.clear();
  return out;
}

void ToolCallParser::emit_content(std::string_view text, ToolStreamDelta& out) {
  if (text.empty()) return;
  if (!run_has_text_) {
    if (detail::all_space(text)) {
      held_space_.append(text);
      return;
    }
    out.content += held_space_;
    held_space_.clear();
    run_has_text_ = true;
  }
  out.content.append(text);
}

void ToolCallParser::process(bool final, ToolStreamDelta& out) {
  for (;;) {
    if (!block_) {
      const size_t start = pending_.find(kToolCallStart);
      if (start == std::string::npos) {
        const size_t keep = final ? 0 : detail::partial_tag_suffix(pending_, kToolCallStart);
        emit_content(std::string_view(pending_).substr(0, pending_.size() - keep), out);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      emit_content(std::string_view(pending_).substr(0, start), out);
      pending_.erase(0, start);
      block_ = format_->start_block(tools_);
    }

    BlockParse block = block_->scan(pending_);
    if (block.status == BlockParse::Status::kNeedMore && !final) return;
    block_.reset();
    if (block.status == BlockParse::Status::kComplete && all_known(block, tools_)) {
      held_space_.clear();  // whitespace between content and a call is dropped
      run_has_text_ = false;
      for (detail::ParsedCall& c : block.calls) {
        ToolCall call{ids_(), std::move(c.name), serialize_arguments(c.arguments)};
        out.calls.push_back({static_cast<int>(streamed_calls_.size()), call.id, call.name, call.arguments});
        streamed_calls_.push_back(std::move(call));
      }
      pending_.erase(0, block.length);
    } else if (block.status == BlockParse::Status::kComplete) {  // a function the request did not declare
      emit_content(std::string_view(pending_).substr(0, block.length), out);
      pending_.erase(0, block.length);
    } else {  // malformed, or truncated by the end of the output
      emit_content(kToolCallStart, out);
      pending_.erase(0, kToolCallStart.size());
    }
  }
}

}  // namespace moeserve::parsers

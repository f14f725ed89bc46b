#include "parsers/tool_formats.h"

#include <algorithm>
#include <cctype>
#include <unordered_set>

#include "core/json_depth.h"
#include "parsers/param_convert.h"
#include "parsers/text_util.h"
#include "parsers/tool_calls.h"

namespace moeserve::parsers::detail {

namespace {

using nlohmann::ordered_json;
using Status = BlockParse::Status;

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

ordered_json parse_json(std::string_view text) {
  if (json_nesting_exceeds(text)) return ordered_json(ordered_json::value_t::discarded);  // (core/json_depth.h)
  return ordered_json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

// Prints one call's arguments object member by member, exactly as dump_compact() prints the object that
// holds those members in that order: "{" + first, "," + each next, then "}" ("{}" with no member). A key
// given twice keeps its first value: what was streamed cannot be taken back.
class ArgumentsWriter {
 public:
  std::string member(const std::string& key, const ordered_json& value) {
    if (closed_ || !keys_.insert(key).second) return {};
    std::string piece(open_ ? "," : "{");
    open_ = true;
    piece += dump_compact(ordered_json(key));
    piece += ':';
    piece += dump_compact(value);
    return piece;
  }
  // The whole object at once (Hermes arguments given as a JSON string).
  std::string whole(const ordered_json& object) {
    if (closed_ || open_) return {};
    closed_ = true;
    return dump_compact(object);
  }
  std::string close() {
    if (closed_) return {};
    closed_ = true;
    return open_ ? "}" : "{}";
  }

 private:
  std::unordered_set<std::string> keys_;
  bool open_ = false;
  bool closed_ = false;
};

// What both syntaxes share: the commitment rule, the events, how a block ends.
class CallScanner : public BlockScanner {
 public:
  BlockParse scan(std::string_view text, bool final) final {
    BlockParse out;
    out_ = &out;
    out.status = run(text, final);
    out_ = nullptr;
    return out;
  }

 protected:
  explicit CallScanner(const ToolSet& tools) : tools_(tools) {}

  virtual Status run(std::string_view text, bool final) = 0;

  // A function name is complete. The block's first name decides it: a declared one commits the block
  // and opens its call; an undeclared one makes the block foreign (content if it turns out well formed).
  // False when a later name is undeclared in a committed block: that breaks the block.
  bool function_name(std::string name) {
    if (unknown_) return true;
    if (!tools_.contains(name)) {
      if (committed_) return false;
      unknown_ = true;
      return true;
    }
    committed_ = true;
    call_open_ = true;
    out_->events.push_back({CallEvent::Kind::kOpen, std::move(name)});
    if (!buffered_.empty()) out_->events.push_back({CallEvent::Kind::kArguments, std::move(buffered_)});
    buffered_.clear();
    return true;
  }

  // The next piece of the current call's arguments: reported once the call is open, kept until then
  // (Hermes may give the arguments before the name), dropped in a foreign block.
  void arguments(std::string piece) {
    if (piece.empty() || unknown_) return;
    if (call_open_) {
      out_->events.push_back({CallEvent::Kind::kArguments, std::move(piece)});
    } else {
      buffered_ += piece;
    }
  }

  // Closes the open call's arguments with the members parsed so far.
  void close_call() {
    if (!call_open_) return;
    arguments(writer_.close());
    call_open_ = false;
  }

  // The block's closing tag ends at `length`.
  Status done(size_t length) {
    out_->length = length;
    return committed_ ? Status::kComplete : Status::kForeign;
  }

  // The text ends before the block could be decided. At the end of the output a committed block is
  // truncated: its calls end with what was parsed and it takes the whole rest of the text.
  Status undecided(std::string_view text, bool final) {
    if (!final) return Status::kNeedMore;
    if (!committed_) return Status::kMalformed;
    close_call();
    out_->length = text.size();
    return Status::kComplete;
  }

  // The syntax breaks; a committed block ends at `at` (the end of the last element it accepted).
  Status broken(size_t at) {
    if (!committed_) return Status::kMalformed;
    close_call();
    out_->length = at;
    return Status::kBroken;
  }

  const ToolSet& tools_;
  ArgumentsWriter writer_;  // the current call's arguments
  bool committed_ = false;  // the first name was declared: this block is a tool call whatever follows
  bool unknown_ = false;    // the first name was not declared: the block is content either way
  bool call_open_ = false;
  std::string buffered_;
  BlockParse* out_ = nullptr;
};

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

// Where a parameter value ends: the first "</parameter>", "<parameter=" or "</function>" at or after
// `from` (npos when none is complete yet; then `resume` is where one split by the end of the text could
// start). One pass over the text: searching for each marker separately would rescan to the end of the
// text for every value when one of them comes only much later (quadratic on a whole text).
size_t find_value_end(std::string_view text, size_t from, size_t& resume) {
  for (size_t i = text.find('<', from); i != std::string_view::npos; i = text.find('<', i + 1)) {
    const std::string_view rest = text.substr(i);
    if (rest.starts_with(kParameterClose) || rest.starts_with(kParameterOpen) || rest.starts_with(kFunctionClose)) {
      return i;
    }
    if (is_proper_prefix(rest, kParameterClose) || is_proper_prefix(rest, kParameterOpen) ||
        is_proper_prefix(rest, kFunctionClose)) {
      resume = i;
      return std::string_view::npos;
    }
  }
  resume = text.size();
  return std::string_view::npos;
}

// A call opens at its complete "<function=NAME>"; each parameter is reported when its value has ended;
// the object closes at "</function>". In a committed block, anything that does not fit ends the block
// where the last complete element ended.
class Qwen3CoderScanner final : public CallScanner {
 public:
  explicit Qwen3CoderScanner(const ToolSet& tools) : CallScanner(tools) {}

 private:
  Status run(std::string_view text, bool final) override {
    for (;;) {
      switch (step_) {
        case Step::kFunctionOpen: {  // the block's first function
          pos_ = skip_space(text, pos_);
          if (Match m = match_at(text, pos_, kFunctionOpen); m != Match::kYes) {
            return m == Match::kNeedMore ? undecided(text, final) : Status::kMalformed;
          }
          pos_ += kFunctionOpen.size();
          search_ = pos_;
          step_ = Step::kFunctionName;
          break;
        }
        case Step::kFunctionName: {
          NameRead r = read_tag_name(text, pos_, search_);
          if (r.status == Status::kMalformed) return broken(mark_);
          if (r.status == Status::kNeedMore) {
            search_ = r.next;
            return undecided(text, final);
          }
          writer_ = ArgumentsWriter();
          if (!function_name(r.name)) return broken(mark_);
          name_ = std::move(r.name);
          pos_ = mark_ = r.next;
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
            pos_ = mark_ = pos_ + kFunctionClose.size();
            close_call();
            step_ = Step::kAfterFunction;
            break;
          }
          if (param == Match::kNeedMore || end == Match::kNeedMore) return undecided(text, final);
          return broken(mark_);
        }
        case Step::kParameterName: {
          NameRead r = read_tag_name(text, pos_, search_);
          if (r.status == Status::kMalformed) return broken(mark_);
          if (r.status == Status::kNeedMore) {
            search_ = r.next;
            return undecided(text, final);
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
          const size_t value_end = find_value_end(text, search_, search_);
          if (value_end == std::string_view::npos) {
            return undecided(text, final);  // a value cut off by the end of the output is dropped
          }
          if (call_open_) {
            std::string_view value = text.substr(pos_, value_end - pos_);
            if (value.starts_with('\n')) value.remove_prefix(1);
            if (value.ends_with('\n')) value.remove_suffix(1);
            arguments(writer_.member(parameter_,
                                     convert_param_value(value, tools_.parameter_schema(name_, parameter_))));
          }
          const bool closed = text.substr(value_end).starts_with(kParameterClose);
          pos_ = mark_ = closed ? value_end + kParameterClose.size() : value_end;
          step_ = Step::kBody;
          break;
        }
        case Step::kAfterFunction: {  // SGLang accepts several functions in one block
          pos_ = skip_space(text, pos_);
          const Match close = match_at(text, pos_, kToolCallEnd);
          if (close == Match::kYes) return done(pos_ + kToolCallEnd.size());
          const Match another = match_at(text, pos_, kFunctionOpen);
          if (another == Match::kYes) {
            pos_ += kFunctionOpen.size();
            search_ = pos_;
            step_ = Step::kFunctionName;
            break;
          }
          if (close == Match::kNeedMore || another == Match::kNeedMore) return undecided(text, final);
          return broken(mark_);
        }
      }
    }
  }

  enum class Step { kFunctionOpen, kFunctionName, kBody, kParameterName, kValue, kAfterFunction };

  Step step_ = Step::kFunctionOpen;
  size_t pos_ = kToolCallStart.size();  // start of the element being read
  size_t search_ = 0;                   // bytes before this were already searched for the element's end
  size_t mark_ = 0;                     // end of the last complete element (where a committed block breaks)
  std::string name_;
  std::string parameter_;
};

class Qwen3CoderFormat final : public ToolFormat {
 public:
  std::unique_ptr<BlockScanner> start_block(const ToolSet& tools) const override {
    return std::make_unique<Qwen3CoderScanner>(tools);
  }
};

// ---- hermes / qwen25 ------------------------------------------------------------------------------

bool is_json_space(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// An incremental, strict JSON reader (RFC 8259 syntax; UTF-8 and number ranges are checked by
// nlohmann when a value is converted) that follows the members of the top-level object and of its
// "arguments" object:
//  - "name": when its string closes, the call opens (the block commits) if the name is declared;
//  - "arguments" (or "parameters", as SGLang accepts; the first of them counts): each member is reported
//    as soon as its value is complete, re-serialized compactly; a JSON string holding an object (OpenAI
//    style) is reported whole when it closes; null is {}. Arguments before the name are held until it.
// Any byte that cannot continue the JSON settles it at once, so prose after a stray "<tool_call>" is not
// held back waiting for a closing brace.
class HermesScanner final : public CallScanner {
 public:
  explicit HermesScanner(const ToolSet& tools) : CallScanner(tools) {}

 private:
  enum class Step { kBeforeObject, kObject, kAfterObject };
  enum class Lex { kValue, kValueOrEnd, kKeyOrEnd, kKey, kColon, kCommaOrEnd, kString, kEscape, kHex, kNumber,
                   kLiteral, kDone };
  enum class Num { kSign, kZero, kInt, kDot, kFrac, kE, kExpSign, kExp };
  enum class Role { kOther, kName, kArguments };
  enum class Lexed { kMore, kDone, kFailed };
  static constexpr size_t kMaxDepth = 256;

  Status run(std::string_view text, bool final) override {
    if (step_ == Step::kBeforeObject) {
      pos_ = skip_space(text, pos_);
      if (pos_ == text.size()) return undecided(text, final);
      if (text[pos_] != '{') return Status::kMalformed;
      step_ = Step::kObject;
    }
    if (step_ == Step::kObject) {
      const Lexed l = lex(text);
      if (l == Lexed::kFailed) return broken(fail_at_);
      if (l == Lexed::kMore) return undecided(text, final);
      if (!name_seen_) return Status::kMalformed;  // no name: not a call (never committed)
      close_call();  // no "arguments": {}
      step_ = Step::kAfterObject;
    }
    pos_ = skip_space(text, pos_);
    const Match m = match_at(text, pos_, kToolCallEnd);
    if (m == Match::kYes) return done(pos_ + kToolCallEnd.size());
    return m == Match::kNeedMore ? undecided(text, final) : broken(mark_);
  }

  bool fail(size_t at) {
    fail_at_ = at;
    return false;
  }
  Lexed failed(size_t at) {
    fail_at_ = at;
    return Lexed::kFailed;
  }

  Lexed lex(std::string_view text) {
    for (;;) {
      if (lex_ == Lex::kDone) return Lexed::kDone;
      if (pos_ >= text.size()) return Lexed::kMore;
      const unsigned char c = static_cast<unsigned char>(text[pos_]);
      switch (lex_) {
        case Lex::kString:
          if (c == '"') {
            ++pos_;
            if (!(string_is_key_ ? key_done(text) : value_done(text))) return Lexed::kFailed;
          } else if (c == '\\') {
            lex_ = Lex::kEscape;
            ++pos_;
          } else if (c < 0x20) {
            return failed(mark_);
          } else {
            ++pos_;
          }
          continue;
        case Lex::kEscape:
          if (c == 'u') {
            hex_left_ = 4;
            lex_ = Lex::kHex;
          } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
                     c == 't') {
            lex_ = Lex::kString;
          } else {
            return failed(mark_);
          }
          ++pos_;
          continue;
        case Lex::kHex:
          if (!std::isxdigit(c)) return failed(mark_);
          if (--hex_left_ == 0) lex_ = Lex::kString;
          ++pos_;
          continue;
        case Lex::kNumber:
          if (number_continues(c)) {
            ++pos_;
          } else if (!(num_ == Num::kZero || num_ == Num::kInt || num_ == Num::kFrac || num_ == Num::kExp)) {
            return failed(mark_);
          } else if (!value_done(text)) {  // the number ends before c, which is read again
            return Lexed::kFailed;
          }
          continue;
        case Lex::kLiteral:
          if (c != literal_[literal_pos_]) return failed(mark_);
          ++pos_;
          if (++literal_pos_ == literal_.size() && !value_done(text)) return Lexed::kFailed;
          continue;
        default:
          break;
      }
      if (is_json_space(c)) {
        ++pos_;
        continue;
      }
      bool ok = true;
      switch (lex_) {
        case Lex::kValueOrEnd:
          if (c == ']') {
            ok = close_container(text, c);
            break;
          }
          [[fallthrough]];
        case Lex::kValue:
          ok = begin_value(c);
          break;
        case Lex::kKeyOrEnd:
          if (c == '}') {
            ok = close_container(text, c);
            break;
          }
          [[fallthrough]];
        case Lex::kKey:
          if (c != '"') {
            ok = fail(mark_);
            break;
          }
          string_begin_ = pos_++;
          string_is_key_ = true;
          lex_ = Lex::kString;
          break;
        case Lex::kColon:
          if (c != ':') {
            ok = fail(mark_);
            break;
          }
          mark_ = ++pos_;
          lex_ = Lex::kValue;
          break;
        case Lex::kCommaOrEnd:
          if (c == ',') {
            mark_ = ++pos_;
            lex_ = stack_.back() == '{' ? Lex::kKey : Lex::kValue;
          } else if (c == '}' || c == ']') {
            ok = close_container(text, c);
          } else {
            ok = fail(mark_);
          }
          break;
        default:
          ok = fail(mark_);
      }
      if (!ok) return Lexed::kFailed;
    }
  }

  bool number_continues(unsigned char c) {
    const bool digit = c >= '0' && c <= '9';
    const bool exp = c == 'e' || c == 'E';
    switch (num_) {
      case Num::kSign:
        if (!digit) return false;
        num_ = c == '0' ? Num::kZero : Num::kInt;
        return true;
      case Num::kZero:
      case Num::kInt:
        if (digit && num_ == Num::kInt) return true;
        if (c == '.') num_ = Num::kDot;
        else if (exp) num_ = Num::kE;
        else return false;
        return true;
      case Num::kDot:
        if (!digit) return false;
        num_ = Num::kFrac;
        return true;
      case Num::kFrac:
        if (digit) return true;
        if (!exp) return false;
        num_ = Num::kE;
        return true;
      case Num::kE:
        if (c == '+' || c == '-') {
          num_ = Num::kExpSign;
          return true;
        }
        [[fallthrough]];
      case Num::kExpSign:
        if (!digit) return false;
        num_ = Num::kExp;
        return true;
      case Num::kExp:
        return digit;
    }
    return false;
  }

  // c starts a value at pos_.
  bool begin_value(unsigned char c) {
    const size_t depth = stack_.size();
    if (depth == 1) {  // a member of the top-level object
      value_begin_ = pos_;
      role_ = Role::kOther;
      if (key_ == "name" && !name_seen_) {
        role_ = Role::kName;
        name_seen_ = true;
      } else if ((key_ == "arguments" || key_ == "parameters") && !arguments_seen_) {
        arguments_seen_ = true;
        role_ = Role::kArguments;
        if (c == '{') {
          in_arguments_ = true;
        } else if (c != '"' && c != 'n') {
          return fail(pos_);  // arguments must be an object (or a string holding one, or null)
        }
      }
    } else if (depth == 2 && in_arguments_) {
      member_begin_ = pos_;
    }
    switch (c) {
      case '{':
      case '[':
        if (stack_.size() >= kMaxDepth) return fail(mark_);
        stack_.push_back(static_cast<char>(c));
        lex_ = c == '{' ? Lex::kKeyOrEnd : Lex::kValueOrEnd;
        mark_ = ++pos_;
        return true;
      case '"':
        string_begin_ = pos_++;
        string_is_key_ = false;
        lex_ = Lex::kString;
        return true;
      case 't':
      case 'f':
      case 'n':
        literal_ = c == 't' ? "true" : c == 'f' ? "false" : "null";
        literal_pos_ = 1;
        lex_ = Lex::kLiteral;
        ++pos_;
        return true;
      default:
        if (c == '-' || (c >= '0' && c <= '9')) {
          num_ = c == '-' ? Num::kSign : c == '0' ? Num::kZero : Num::kInt;
          lex_ = Lex::kNumber;
          ++pos_;
          return true;
        }
        return fail(mark_);
    }
  }

  bool close_container(std::string_view text, unsigned char c) {
    if ((c == '}') != (stack_.back() == '{')) return fail(mark_);
    stack_.pop_back();
    ++pos_;
    return value_done(text);
  }

  // A key's closing quote was read (pos_ is past it).
  bool key_done(std::string_view text) {
    mark_ = pos_;
    lex_ = Lex::kColon;
    const size_t depth = stack_.size();
    if (depth != 1 && !(depth == 2 && in_arguments_)) return true;
    ordered_json key = parse_json(text.substr(string_begin_, pos_ - string_begin_));
    if (!key.is_string()) return fail(string_begin_);  // invalid UTF-8
    (depth == 1 ? key_ : member_key_) = key.get<std::string>();
    return true;
  }

  // A value ended at pos_.
  bool value_done(std::string_view text) {
    mark_ = pos_;
    const size_t depth = stack_.size();
    if (depth == 0) {
      lex_ = Lex::kDone;
      return true;
    }
    lex_ = Lex::kCommaOrEnd;
    if (depth == 1) return member_done(text.substr(value_begin_, pos_ - value_begin_));
    if (depth == 2 && in_arguments_) {
      ordered_json value = parse_json(text.substr(member_begin_, pos_ - member_begin_));
      if (value.is_discarded()) return fail(member_begin_);
      arguments(writer_.member(member_key_, value));
    }
    return true;
  }

  // A member of the top-level object ended.
  bool member_done(std::string_view text) {
    if (role_ == Role::kArguments && in_arguments_) {  // its members were checked one by one
      in_arguments_ = false;
      arguments(writer_.close());
      return true;
    }
    ordered_json value = parse_json(text);
    if (value.is_discarded()) return fail(value_begin_);
    if (role_ == Role::kName) {
      if (!value.is_string()) return fail(value_begin_);
      const std::string_view name = strip(value.get_ref<const std::string&>());
      if (name.empty()) return fail(value_begin_);
      function_name(std::string(name));  // the first name: never refused
    } else if (role_ == Role::kArguments) {
      if (value.is_string()) {  // arguments given as a JSON string, OpenAI-style
        const std::string& s = value.get_ref<const std::string&>();
        value = parse_json(s);
        if (!value.is_object()) return fail(value_begin_);
        arguments(writer_.whole(value));
      } else if (value.is_null()) {
        arguments(writer_.close());
      } else {
        return fail(value_begin_);
      }
    }
    return true;
  }

  Step step_ = Step::kBeforeObject;
  size_t pos_ = kToolCallStart.size();
  size_t mark_ = 0;     // end of the last complete token (where a committed block breaks)
  size_t fail_at_ = 0;  // where the JSON broke
  Lex lex_ = Lex::kValue;
  std::string stack_;  // open '{' and '['
  size_t string_begin_ = 0;
  bool string_is_key_ = false;
  int hex_left_ = 0;
  Num num_ = Num::kInt;
  std::string_view literal_;
  size_t literal_pos_ = 0;

  std::string key_;  // the current top-level key
  Role role_ = Role::kOther;
  size_t value_begin_ = 0;  // of the current top-level value
  bool name_seen_ = false;
  bool arguments_seen_ = false;
  bool in_arguments_ = false;  // inside the arguments object
  std::string member_key_;
  size_t member_begin_ = 0;
};

class HermesFormat final : public ToolFormat {
 public:
  std::unique_ptr<BlockScanner> start_block(const ToolSet& tools) const override {
    return std::make_unique<HermesScanner>(tools);
  }
};

}  // namespace

std::string dump_compact(const ordered_json& value) {
  return value.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

std::unique_ptr<ToolFormat> make_qwen3_coder_format() { return std::make_unique<Qwen3CoderFormat>(); }
std::unique_ptr<ToolFormat> make_hermes_format() { return std::make_unique<HermesFormat>(); }

}  // namespace moeserve::parsers::detail

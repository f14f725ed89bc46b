#include "parsers/param_convert.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>

#include "core/json_depth.h"
#include "parsers/text_util.h"

namespace moeserve::parsers {

using nlohmann::ordered_json;

namespace {

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

bool starts_with_any(std::string_view s, std::initializer_list<std::string_view> prefixes) {
  for (std::string_view p : prefixes) {
    if (s.starts_with(p)) return true;
  }
  return false;
}

std::optional<ordered_json> parse_integer(std::string_view s) {
  s = detail::strip(s);
  const bool negative = !s.empty() && s[0] == '-';
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) s.remove_prefix(1);
  if (s.empty()) return std::nullopt;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  uint64_t magnitude = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), magnitude);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;  // too large for 64 bits
  if (!negative) {
    if (magnitude <= static_cast<uint64_t>(INT64_MAX)) return ordered_json(static_cast<int64_t>(magnitude));
    return ordered_json(magnitude);
  }
  if (magnitude <= static_cast<uint64_t>(INT64_MAX)) return ordered_json(-static_cast<int64_t>(magnitude));
  if (magnitude == static_cast<uint64_t>(INT64_MAX) + 1) return ordered_json(INT64_MIN);
  return std::nullopt;
}

// Python: float(v), returned as int when the text has no '.' or exponent (vLLM's rule). Infinity and NaN
// are refused: JSON cannot carry them.
std::optional<ordered_json> parse_number(std::string_view s) {
  s = detail::strip(s);
  std::string_view body = s;
  const bool negative = !body.empty() && body[0] == '-';
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body.remove_prefix(1);
  if (body.empty() || !(std::isdigit(static_cast<unsigned char>(body[0])) || body[0] == '.')) {
    return std::nullopt;
  }
  if (body.find_first_of(".eE") == std::string_view::npos) {
    if (auto i = parse_integer(s)) return i;  // else too large for 64 bits: a double, as Python's float
  }
  double value = 0;
  auto [end, ec] = std::from_chars(body.data(), body.data() + body.size(), value);
  if (ec != std::errc() || end != body.data() + body.size() || !std::isfinite(value)) return std::nullopt;
  return ordered_json(negative ? -value : value);
}

std::optional<ordered_json> parse_boolean(std::string_view s) {
  const std::string v = lower(detail::strip(s));
  if (v == "true") return ordered_json(true);
  if (v == "false") return ordered_json(false);
  return std::nullopt;
}

std::optional<ordered_json> parse_structured(std::string_view s, ordered_json::value_t want) {
  s = detail::strip(s);
  if (json_nesting_exceeds(s)) return std::nullopt;  // (core/json_depth.h)
  ordered_json v = ordered_json::parse(s.begin(), s.end(), nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) {
    auto lit = parse_python_literal(s);
    if (!lit) return std::nullopt;
    v = std::move(*lit);
  }
  if (v.type() != want) return std::nullopt;
  return v;
}

// One declared type; nullopt when the text does not convert to it.
std::optional<ordered_json> convert_as(const std::string& type, std::string_view raw) {
  if (type == "string" || type == "str" || type == "text" || type == "varchar" || type == "char" ||
      type == "enum") {
    return ordered_json(std::string(raw));
  }
  if (starts_with_any(type, {"int", "uint", "long", "short", "unsigned"})) return parse_integer(raw);
  if (starts_with_any(type, {"num", "float", "double"})) return parse_number(raw);
  if (type == "boolean" || type == "bool" || type == "binary") return parse_boolean(raw);
  if (type == "object" || type.starts_with("dict")) return parse_structured(raw, ordered_json::value_t::object);
  if (type == "array" || type == "arr" || type.starts_with("list")) {
    return parse_structured(raw, ordered_json::value_t::array);
  }
  if (type == "null") return std::nullopt;  // "null" itself was handled before; anything else is not null
  return ordered_json(std::string(raw));    // a type we do not know: leave the text alone
}

}  // namespace

std::vector<std::string> schema_types(const ordered_json& param_schema) {
  std::vector<std::string> types;
  if (!param_schema.is_object()) return types;
  auto add = [&](const ordered_json& t) {
    if (t.is_string()) {
      types.push_back(lower(t.get<std::string>()));
    } else if (t.is_array()) {
      for (const auto& e : t) {
        if (e.is_string()) types.push_back(lower(e.get<std::string>()));
      }
    }
  };
  if (auto it = param_schema.find("type"); it != param_schema.end()) {
    add(*it);
    return types;
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    auto it = param_schema.find(key);
    if (it == param_schema.end() || !it->is_array()) continue;
    for (const auto& member : *it) {
      if (member.is_object() && member.contains("type")) add(member["type"]);
    }
  }
  return types;
}

ordered_json convert_param_value(std::string_view raw, const ordered_json* param_schema) {
  if (lower(detail::strip(raw)) == "null") return nullptr;
  if (param_schema == nullptr) return std::string(raw);
  for (const std::string& type : schema_types(*param_schema)) {
    if (auto v = convert_as(type, raw)) return std::move(*v);
  }
  return std::string(raw);
}

// ---- Python literals -------------------------------------------------------------------------------

namespace {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;  // JSON cannot carry lone surrogates
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class LiteralReader {
 public:
  explicit LiteralReader(std::string_view s) : s_(s) {}

  std::optional<ordered_json> read_all() {
    auto v = value(0);
    skip_space();
    if (!v || pos_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  // Deep nesting is never a real argument; the limit keeps hostile output from exhausting the stack.
  static constexpr int kMaxDepth = 128;

  void skip_space() {
    while (pos_ < s_.size() && detail::is_space(s_[pos_])) ++pos_;
  }
  bool eat(char c) {
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool eat_word(std::string_view w) {
    if (s_.substr(pos_).starts_with(w)) {
      const size_t after = pos_ + w.size();
      if (after < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[after])) || s_[after] == '_')) {
        return false;
      }
      pos_ = after;
      return true;
    }
    return false;
  }

  std::optional<ordered_json> value(int depth) {
    if (depth > kMaxDepth) return std::nullopt;
    skip_space();
    if (pos_ >= s_.size()) return std::nullopt;
    const char c = s_[pos_];
    if (c == '{') return dict(depth);
    if (c == '[') return sequence(depth, ']');
    if (c == '(') return sequence(depth, ')');
    if (c == '\'' || c == '"') return string();
    if (eat_word("True")) return ordered_json(true);
    if (eat_word("False")) return ordered_json(false);
    if (eat_word("None")) return ordered_json(nullptr);
    return number();
  }

  std::optional<ordered_json> dict(int depth) {
    ++pos_;  // '{'
    ordered_json obj = ordered_json::object();
    if (eat('}')) return obj;
    for (;;) {
      auto key = value(depth + 1);
      if (!key || !eat(':')) return std::nullopt;
      auto val = value(depth + 1);
      if (!val) return std::nullopt;
      std::string name;
      if (key->is_string()) {
        name = key->get<std::string>();
      } else if (key->is_primitive()) {
        name = key->dump();  // json.dumps turns 1, 1.5, True, None keys into "1", "1.5", "true", "null"
      } else {
        return std::nullopt;  // unhashable key: not a valid Python literal
      }
      obj[name] = std::move(*val);
      if (eat('}')) return obj;
      if (!eat(',')) return std::nullopt;
      if (eat('}')) return obj;  // trailing comma
    }
  }

  std::optional<ordered_json> sequence(int depth, char close) {
    ++pos_;  // '[' or '('
    ordered_json arr = ordered_json::array();
    if (eat(close)) return arr;
    bool saw_comma = false;
    for (;;) {
      auto v = value(depth + 1);
      if (!v) return std::nullopt;
      arr.push_back(std::move(*v));
      if (eat(close)) break;
      if (!eat(',')) return std::nullopt;
      saw_comma = true;
      if (eat(close)) break;
    }
    if (close == ')' && !saw_comma && arr.size() == 1) return arr[0];  // "(x)" is x, not a tuple
    return arr;
  }

  std::optional<ordered_json> string() {
    const char quote = s_[pos_++];
    std::string out;
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == quote) return ordered_json(std::move(out));
      if (c == '\n') return std::nullopt;  // single-quoted Python strings cannot span lines
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) return std::nullopt;
      const char e = s_[pos_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '0': out += '\0'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;  // line continuation
        case 'x': case 'u': case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (pos_ + n > s_.size()) return std::nullopt;
          uint32_t cp = 0;
          auto [end, ec] = std::from_chars(s_.data() + pos_, s_.data() + pos_ + n, cp, 16);
          if (ec != std::errc() || end != s_.data() + pos_ + n) return std::nullopt;
          pos_ += n;
          append_utf8(out, cp);
          break;
        }
        default:  // Python keeps unknown escapes verbatim
          out += '\\';
          out += e;
      }
    }
    return std::nullopt;  // unterminated
  }

  std::optional<ordered_json> number() {
    const size_t begin = pos_;
    if (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) ++pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.' ||
                                ((s_[pos_] == '-' || s_[pos_] == '+') && (s_[pos_ - 1] == 'e' || s_[pos_ - 1] == 'E')))) {
      ++pos_;
    }
    if (pos_ == begin) return std::nullopt;
    return parse_number(s_.substr(begin, pos_ - begin));
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

std::optional<ordered_json> parse_python_literal(std::string_view text) { return LiteralReader(text).read_all(); }

}  // namespace moeserve::parsers

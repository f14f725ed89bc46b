#include "template/lexer.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "template/pystr.h"

namespace moeserve::tpl {
namespace {

[[noreturn]] void syntax_error(int line, const std::string& msg) {
  throw UserError(fmt::format("chat template syntax error at line {}: {}", line, msg));
}

// jinja2 normalises every newline sequence to "\n" and drops one trailing newline (keep_trailing_newline
// is False in Hugging Face's environment).
std::string normalize_newlines(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : s_(std::move(src)) {}

  std::vector<Token> run() {
    while (pos_ < s_.size()) root_step();
    push(TokType::Eof, "");
    return std::move(out_);
  }

 private:
  // Length of the run of (Unicode) whitespace at p, in bytes.
  size_t ws_run(size_t p) const {
    size_t q = p;
    while (q < s_.size()) {
      size_t next = q;
      char32_t c;
      if (static_cast<unsigned char>(s_[q]) < 0x80) {
        c = static_cast<unsigned char>(s_[q]);
        next = q + 1;
      } else {
        std::u32string one = py::decode(std::string_view(s_).substr(q, std::min<size_t>(4, s_.size() - q)));
        c = one.empty() ? 0 : one[0];
        std::string enc;
        py::append_utf8(enc, c);
        next = q + enc.size();
      }
      if (!py::is_space(c)) break;
      q = next;
    }
    return q - p;
  }

  bool at(size_t p, const char* lit) const { return p <= s_.size() && s_.compare(p, std::strlen(lit), lit) == 0; }

  void push(TokType t, std::string v, int line = -1) {
    Token tok;
    tok.type = t;
    tok.value = std::move(v);
    tok.line = line < 0 ? line_ : line;
    out_.push_back(std::move(tok));
  }

  void advance_to(size_t p) {
    for (size_t i = pos_; i < p; ++i)
      if (s_[i] == '\n') ++line_;
    line_starting_ = p > pos_ ? s_[p - 1] == '\n' : line_starting_;
    pos_ = p;
  }

  // jinja2's OptionalLStrip: the text before a tag loses trailing whitespace for "-", or its last line's
  // indentation under lstrip_blocks (not for {{ }}, not for "+").
  std::string strip_before_tag(std::string text, char sign, bool is_variable, bool line_starting) const {
    if (sign == '-') return py::strip(text, std::nullopt, false, true);
    if (sign != '+' && !is_variable) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
        bool all_ws = true;
        for (char32_t c : py::decode(std::string_view(text).substr(l_pos))) all_ws = all_ws && py::is_space(c);
        if (all_ws) text.resize(l_pos);
      }
    }
    return text;
  }

  // Where a "{% raw %}" opener at p ends, if it is one.
  std::optional<size_t> match_raw_begin(size_t p) const {
    size_t q = p + 2;
    if (q < s_.size() && (s_[q] == '-' || s_[q] == '+')) ++q;
    q += ws_run(q);
    if (!at(q, "raw")) return std::nullopt;
    q += 3;
    q += ws_run(q);
    if (at(q, "-%}")) return q + 3 + ws_run(q + 3);
    if (at(q, "%}")) return q + 2;
    return std::nullopt;
  }

  // The block-end alternatives shared by %} and #}: "+X}", "-X}\s*", "X}\n?".
  std::optional<size_t> match_close(size_t p, char mark) const {
    const char plus[4] = {'+', mark, '}', 0}, minus[4] = {'-', mark, '}', 0}, plain[3] = {mark, '}', 0};
    if (at(p, plus)) return p + 3;
    if (at(p, minus)) return p + 3 + ws_run(p + 3);
    if (at(p, plain)) return p + 2 + ((p + 2 < s_.size() && s_[p + 2] == '\n') ? 1 : 0);
    return std::nullopt;
  }

  void root_step() {
    size_t t = pos_;
    while (true) {
      t = s_.find('{', t);
      if (t == std::string::npos || t + 1 >= s_.size()) {
        push(TokType::Data, s_.substr(pos_));
        advance_to(s_.size());
        return;
      }
      const char k = s_[t + 1];
      if (k == '{' || k == '%' || k == '#') break;
      ++t;
    }
    const char kind = s_[t + 1];
    const char sign = (t + 2 < s_.size() && (s_[t + 2] == '-' || s_[t + 2] == '+')) ? s_[t + 2] : 0;
    std::string text = strip_before_tag(s_.substr(pos_, t - pos_), sign, kind == '{', line_starting_);
    if (!text.empty()) push(TokType::Data, std::move(text));

    if (kind == '%') {
      if (auto raw_end = match_raw_begin(t)) {
        advance_to(*raw_end);
        lex_raw();
        return;
      }
    }
    const size_t body = t + 2 + (sign ? 1 : 0);
    if (kind == '#') {
      advance_to(body);
      for (size_t i = body; i < s_.size(); ++i) {
        if (auto end = match_close(i, '#')) {
          advance_to(*end);
          return;
        }
      }
      syntax_error(line_, "Missing end of comment tag");
    }
    push(kind == '%' ? TokType::BlockBegin : TokType::VarBegin, kind == '%' ? "{%" : "{{");
    advance_to(body);
    lex_tag(kind == '%');
  }

  void lex_raw() {
    const bool starting = line_starting_;
    for (size_t i = pos_; i < s_.size(); ++i) {
      if (!at(i, "{%")) continue;
      size_t q = i + 2;
      char sign = 0;
      if (q < s_.size() && (s_[q] == '-' || s_[q] == '+')) sign = s_[q++];
      q += ws_run(q);
      if (!at(q, "endraw")) continue;
      q += 6;
      q += ws_run(q);
      auto end = match_close(q, '%');
      if (!end) continue;
      std::string text = strip_before_tag(s_.substr(pos_, i - pos_), sign, false, starting);
      if (!text.empty()) push(TokType::Data, std::move(text));
      advance_to(*end);
      return;
    }
    syntax_error(line_, "Missing end of raw directive");
  }

  void lex_tag(bool block) {
    std::vector<char> balance;
    const int start_line = line_;
    while (true) {
      if (pos_ >= s_.size())
        syntax_error(start_line, block ? "unexpected end of template: '%}' expected to close the block tag"
                                       : "unexpected end of template: '}}' expected to close the expression");
      if (balance.empty()) {
        if (block) {
          if (auto end = match_close(pos_, '%')) {
            push(TokType::BlockEnd, "%}");
            advance_to(*end);
            return;
          }
        } else if (at(pos_, "-}}")) {
          push(TokType::VarEnd, "}}");
          advance_to(pos_ + 3 + ws_run(pos_ + 3));
          return;
        } else if (at(pos_, "}}")) {
          push(TokType::VarEnd, "}}");
          advance_to(pos_ + 2);
          return;
        }
      }
      const char c = s_[pos_];
      if (size_t w = ws_run(pos_)) {
        advance_to(pos_ + w);
      } else if (is_digit(c)) {
        lex_number();
      } else if (is_name_start(c)) {
        size_t q = pos_;
        while (q < s_.size() && is_name_char(s_[q])) ++q;
        push(TokType::Name, s_.substr(pos_, q - pos_));
        advance_to(q);
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        lex_operator(balance);
      }
    }
  }

  void lex_number() {
    size_t q = pos_;
    auto digits = [&](size_t p) {  // (\d+_)*\d+
      size_t r = p;
      while (r < s_.size() && (is_digit(s_[r]) || (s_[r] == '_' && r + 1 < s_.size() && is_digit(s_[r + 1])))) ++r;
      return r;
    };
    std::string clean;
    auto keep = [&](size_t a, size_t b) {
      for (size_t i = a; i < b; ++i)
        if (s_[i] != '_') clean += s_[i];
    };
    if (s_[q] == '0' && q + 1 < s_.size() && std::strchr("xXoObB", s_[q + 1]) && s_[q + 1] != 0) {
      const char base_c = static_cast<char>(s_[q + 1] | 0x20);
      const int base = base_c == 'x' ? 16 : (base_c == 'o' ? 8 : 2);
      size_t r = q + 2;
      int64_t v = 0;
      while (r < s_.size() && (s_[r] == '_' || (hex_value(s_[r]) >= 0 && hex_value(s_[r]) < base))) {
        if (s_[r] != '_') {
          if (v > (INT64_MAX - 15) / base) syntax_error(line_, "integer literal too large");
          v = v * base + hex_value(s_[r]);
        }
        ++r;
      }
      Token tok;
      tok.type = TokType::Int;
      tok.ival = v;
      tok.line = line_;
      tok.value = s_.substr(q, r - q);
      out_.push_back(tok);
      advance_to(r);
      return;
    }
    size_t r = digits(q);
    keep(q, r);
    bool is_float = false;
    const bool after_dot = pos_ > 0 && s_[pos_ - 1] == '.';  // jinja2: a float never follows a '.'
    if (!after_dot) {
      size_t f = r;
      std::string frac;
      if (f + 1 < s_.size() && s_[f] == '.' && is_digit(s_[f + 1])) {
        size_t e = digits(f + 1);
        frac = s_.substr(f, e - f);
        f = e;
      }
      size_t x = f;
      if (x < s_.size() && (s_[x] == 'e' || s_[x] == 'E')) {
        size_t y = x + 1;
        if (y < s_.size() && (s_[y] == '+' || s_[y] == '-')) ++y;
        if (y < s_.size() && is_digit(s_[y])) {
          size_t z = digits(y);
          keep(r, f);
          keep(x, z);
          r = z;
          is_float = true;
        }
      }
      if (!is_float && !frac.empty()) {
        keep(r, f);
        r = f;
        is_float = true;
      }
    }
    Token tok;
    tok.line = line_;
    tok.value = s_.substr(q, r - q);
    if (is_float) {
      tok.type = TokType::Float;
      tok.fval = std::strtod(clean.c_str(), nullptr);
    } else {
      tok.type = TokType::Int;
      errno = 0;
      const long long v = std::strtoll(clean.c_str(), nullptr, 10);
      if (errno == ERANGE) syntax_error(line_, "integer literal too large");
      tok.ival = v;
    }
    out_.push_back(tok);
    advance_to(r);
  }

  void lex_string(char quote) {
    size_t q = pos_ + 1;
    while (q < s_.size() && s_[q] != quote) q += (s_[q] == '\\') ? 2 : 1;
    if (q >= s_.size()) syntax_error(line_, "unexpected end of string literal");
    push(TokType::String, unescape(s_.substr(pos_ + 1, q - pos_ - 1)));
    advance_to(q + 1);
  }

  // Python's "unicode-escape" decoding, which jinja2 applies to string literals.
  std::string unescape(const std::string& raw) const {
    std::string out;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '\\' || i + 1 >= raw.size()) {
        out += raw[i];
        continue;
      }
      const char e = raw[++i];
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const int n = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          uint32_t v = 0;
          for (int k = 0; k < n; ++k) {
            if (i + 1 >= raw.size() || hex_value(raw[i + 1]) < 0)
              syntax_error(line_, fmt::format("truncated \\{}{} escape", e, std::string(n, 'X')));
            v = v * 16 + static_cast<uint32_t>(hex_value(raw[++i]));
          }
          if (v > 0x10FFFF) syntax_error(line_, "illegal Unicode character");
          py::append_utf8(out, v);
          break;
        }
        case 'N': syntax_error(line_, "\\N{...} escapes are not supported in template strings");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i + 1 < raw.size() && raw[i + 1] >= '0' && raw[i + 1] <= '7'; ++k)
              v = v * 8 + static_cast<uint32_t>(raw[++i] - '0');
            py::append_utf8(out, v);
          } else {
            out += '\\';  // unknown escapes stay as written
            out += e;
          }
      }
    }
    return out;
  }

  void lex_operator(std::vector<char>& balance) {
    static const char* kTwo[] = {"**", "//", "==", "!=", ">=", "<="};
    for (const char* op : kTwo) {
      if (at(pos_, op)) {
        push(TokType::Op, op);
        advance_to(pos_ + 2);
        return;
      }
    }
    const char c = s_[pos_];
    if (!std::strchr("+-/*%~[](){}><=.:|,;", c) || c == 0) {
      std::string shown = s_.substr(pos_, 1);
      if (static_cast<unsigned char>(c) >= 0x80) {
        std::u32string u = py::decode(std::string_view(s_).substr(pos_, std::min<size_t>(4, s_.size() - pos_)));
        shown.clear();
        py::append_utf8(shown, u[0]);
      }
      syntax_error(line_, fmt::format("unexpected char '{}'", shown));
    }
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : (c == '[' ? ']' : '}'));
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) syntax_error(line_, fmt::format("unexpected '{}'", c));
      if (balance.back() != c) syntax_error(line_, fmt::format("unexpected '{}', expected '{}'", c, balance.back()));
      balance.pop_back();
    }
    push(TokType::Op, std::string(1, c));
    advance_to(pos_ + 1);
  }

  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(normalize_newlines(source)).run(); }

const char* describe(TokType t) {
  switch (t) {
    case TokType::Data: return "template data";
    case TokType::VarBegin: return "begin of print statement";
    case TokType::VarEnd: return "end of print statement";
    case TokType::BlockBegin: return "begin of statement block";
    case TokType::BlockEnd: return "end of statement block";
    case TokType::Name: return "name";
    case TokType::String: return "string";
    case TokType::Int: return "integer";
    case TokType::Float: return "float";
    case TokType::Op: return "operator";
    case TokType::Eof: return "end of template";
  }
  return "token";
}

}  // namespace moeserve::tpl

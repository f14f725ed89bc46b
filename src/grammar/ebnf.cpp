#include "grammar/ebnf.h"

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <vector>

#include "core/error.h"
#include "grammar/regex_internal.h"

namespace moeserve::grammar {

namespace {

constexpr size_t kMaxGrammarBytes = 65536;  // the expansion is bounded by the regex's kMaxRegexBytes anyway
constexpr size_t kMaxRuleDepth = 256;       // a chain of rule references (the expansion recurses along it)

// An expression of a rule: the parse, before the rules are expanded into each other.
struct Expr {
  enum Kind { kAlt, kSeq, kLiteral, kClass, kRef, kRepeat };
  Kind kind = kSeq;
  std::vector<Expr> kids;
  std::string text;  // kLiteral: the bytes; kClass: the regex class; kRef: the rule's name
  int lo = 0, hi = -1;  // kRepeat: {lo, hi}, hi -1 unbounded
  size_t at = 0;        // byte offset (errors)
};

class Parser {
 public:
  explicit Parser(std::string_view g) : g_(g) {}

  std::map<std::string, Expr> rules() {
    std::map<std::string, Expr> out;
    skip();
    if (pos_ == g_.size()) fail(pos_, "the grammar has no rules (it needs a `root ::= ...` rule)");
    while (pos_ < g_.size()) {
      const size_t at = pos_;
      const std::string name = ident();
      if (name.empty()) fail(pos_, "a rule name was expected (`name ::= ...`)");
      skip();
      if (g_.substr(pos_, 3) != "::=") fail(pos_, fmt::format("`::=` was expected after the rule name `{}`", name));
      pos_ += 3;
      Expr e = alternatives();
      if (!out.emplace(name, std::move(e)).second) fail(at, fmt::format("the rule `{}` is defined twice", name));
      skip();
    }
    return out;
  }

  [[noreturn]] void fail(size_t at, const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < g_.size(); ++i) {
      if (g_[i] == '\n') ++line, col = 1;
      else ++col;
    }
    throw_user("EBNF grammar, line {} column {}: {}", line, col, what);
  }

 private:
  static bool ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
  static bool ident_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  }

  void skip() {  // blanks, line breaks and comments
    while (pos_ < g_.size()) {
      const char c = g_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < g_.size() && g_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string ident() {
    if (pos_ >= g_.size() || !ident_start(g_[pos_])) return {};
    const size_t b = pos_;
    while (pos_ < g_.size() && ident_char(g_[pos_])) ++pos_;
    return std::string(g_.substr(b, pos_ - b));
  }

  // Whether a new rule starts here (`name ::=`): the end of the current rule's expression.
  bool rule_starts() const {
    size_t p = pos_;
    if (p >= g_.size() || !ident_start(g_[p])) return false;
    while (p < g_.size() && ident_char(g_[p])) ++p;
    while (p < g_.size() && (g_[p] == ' ' || g_[p] == '\t' || g_[p] == '\n' || g_[p] == '\r')) ++p;
    return g_.substr(p, 3) == "::=";
  }

  Expr alternatives() {
    Expr alt{Expr::kAlt};
    alt.at = pos_;
    alt.kids.push_back(sequence());
    skip();
    while (pos_ < g_.size() && g_[pos_] == '|') {
      ++pos_;
      alt.kids.push_back(sequence());
      skip();
    }
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
  }

  Expr sequence() {
    Expr seq{Expr::kSeq};
    seq.at = pos_;
    for (;;) {
      skip();
      if (pos_ >= g_.size() || g_[pos_] == '|' || g_[pos_] == ')' || rule_starts()) break;
      seq.kids.push_back(quantified(primary()));
    }
    return seq;
  }

  Expr primary() {
    const size_t at = pos_;
    const char c = g_[pos_];
    if (c == '"' || c == '\'') return literal(c);
    if (c == '[') return char_class();
    if (c == '(') {
      ++pos_;
      if (++depth_ > kMaxRegexNesting) fail(at, fmt::format("groups nest deeper than {}", kMaxRegexNesting));
      Expr e = alternatives();
      --depth_;
      if (pos_ >= g_.size() || g_[pos_] != ')') fail(at, "this `(` is not closed");
      ++pos_;
      return e;
    }
    const std::string name = ident();
    if (name.empty()) fail(at, fmt::format("unexpected `{}`", std::string(1, c)));
    Expr r{Expr::kRef};
    r.text = name;
    r.at = at;
    return r;
  }

  Expr quantified(Expr e) {
    for (;;) {
      if (pos_ >= g_.size()) return e;
      const char c = g_[pos_];
      int lo, hi;
      const size_t at = pos_;
      if (c == '*') lo = 0, hi = -1, ++pos_;
      else if (c == '+') lo = 1, hi = -1, ++pos_;
      else if (c == '?') lo = 0, hi = 1, ++pos_;
      else if (c == '{') repeat_bounds(lo, hi);
      else return e;
      Expr r{Expr::kRepeat};
      r.lo = lo, r.hi = hi, r.at = at;
      r.kids.push_back(std::move(e));
      e = std::move(r);
    }
  }

  void repeat_bounds(int& lo, int& hi) {
    const size_t at = pos_++;
    auto number = [&]() -> int {
      skip();
      if (pos_ >= g_.size() || !std::isdigit(static_cast<unsigned char>(g_[pos_]))) return -1;
      long v = 0;
      while (pos_ < g_.size() && std::isdigit(static_cast<unsigned char>(g_[pos_]))) {
        v = v * 10 + (g_[pos_++] - '0');
        if (v > kMaxRegexRepeat) fail(at, fmt::format("a repetition bound above {}", kMaxRegexRepeat));
      }
      skip();
      return int(v);
    };
    lo = number();
    if (lo < 0) fail(at, "`{` must start a repetition {m}, {m,} or {m,n}");
    hi = lo;
    if (pos_ < g_.size() && g_[pos_] == ',') {
      ++pos_;
      hi = number();  // -1: unbounded
    }
    if (pos_ >= g_.size() || g_[pos_] != '}') fail(at, "this repetition's `}` is missing");
    ++pos_;
    if (hi >= 0 && hi < lo) fail(at, fmt::format("the repetition {{{},{}}} has its bounds reversed", lo, hi));
  }

  // One code point of a literal or class at pos_ (its escapes decoded).
  uint32_t code_point(size_t at) {
    if (g_[pos_] != '\\') {
      uint32_t cp = 0;
      const int n = regex_detail::decode_utf8(g_, pos_, cp);
      if (n <= 0) fail(pos_, "invalid UTF-8");
      pos_ += size_t(n);
      return cp;
    }
    if (pos_ + 1 >= g_.size()) fail(at, "an escape at the end of the grammar");
    const char e = g_[pos_ + 1];
    pos_ += 2;
    auto hex = [&](int digits) {
      uint32_t v = 0;
      for (int i = 0; i < digits; ++i, ++pos_) {
        if (pos_ >= g_.size() || !std::isxdigit(static_cast<unsigned char>(g_[pos_])))
          fail(pos_, fmt::format("\\{} needs {} hex digits", e, digits));
        const char h = g_[pos_];
        v = v * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) fail(at, fmt::format("U+{:X} is not a code point", v));
      return v;
    };
    switch (e) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      case '\\': case '"': case '\'': case ']': case '[': case '-': case '^': return uint32_t(e);
      default: fail(at, fmt::format("the escape \\{} is not supported", e));
    }
  }

  Expr literal(char quote) {
    const size_t at = pos_++;
    Expr l{Expr::kLiteral};
    l.at = at;
    while (pos_ < g_.size() && g_[pos_] != quote) {
      if (g_[pos_] == '\n') fail(at, "a string literal runs past the end of its line");
      uint8_t buf[4];
      const int n = regex_detail::encode_utf8(code_point(at), buf);
      l.text.append(reinterpret_cast<const char*>(buf), size_t(n));
    }
    if (pos_ >= g_.size()) fail(at, "this string literal is not closed");
    ++pos_;
    return l;
  }

  Expr char_class() {
    const size_t at = pos_++;
    Expr c{Expr::kClass};
    c.at = at;
    c.text = "[";
    if (pos_ < g_.size() && g_[pos_] == '^') c.text += '^', ++pos_;
    bool any = false;
    while (pos_ < g_.size() && g_[pos_] != ']') {
      if (g_[pos_] == '\n') fail(at, "a character class runs past the end of its line");
      const uint32_t lo = code_point(at);
      uint32_t hi = lo;
      if (pos_ + 1 < g_.size() && g_[pos_] == '-' && g_[pos_ + 1] != ']') {
        ++pos_;
        hi = code_point(at);
        if (hi < lo) fail(at, fmt::format("the range U+{:X}-U+{:X} is reversed", lo, hi));
      }
      c.text += fmt::format("\\u{{{:X}}}", lo);
      if (hi != lo) c.text += fmt::format("-\\u{{{:X}}}", hi);
      any = true;
    }
    if (pos_ >= g_.size()) fail(at, "this character class is not closed");
    if (!any) fail(at, "an empty character class");
    ++pos_;
    c.text += "]";
    return c;
  }

  std::string_view g_;
  size_t pos_ = 0;
  int depth_ = 0;
};

// Expands rule `name` into a regular expression, every rule it refers to in place; a cycle is a UserError.
class Expander {
 public:
  Expander(const std::map<std::string, Expr>& rules, const Parser& p) : rules_(rules), p_(p) {}

  std::string rule(const std::string& name, size_t at) {
    const auto it = rules_.find(name);
    if (it == rules_.end()) p_.fail(at, fmt::format("the rule `{}` is not defined", name));
    if (const auto d = done_.find(name); d != done_.end()) return d->second;
    for (size_t i = 0; i < path_.size(); ++i)
      if (path_[i] == name) {
        std::string cycle;
        for (size_t k = i; k < path_.size(); ++k) cycle += path_[k] + " -> ";
        p_.fail(at, fmt::format("the rule `{}` refers to itself ({}{}): recursive grammars are not supported, only "
                                "grammars whose rules expand to a regular language",
                                name, cycle, name));
      }
    if (path_.size() >= kMaxRuleDepth)
      p_.fail(at, fmt::format("rules refer to rules more than {} deep (through `{}`)", kMaxRuleDepth, name));
    path_.push_back(name);
    std::string re = body(name, it->second);
    path_.pop_back();
    if (re.size() > size_t(kMaxRegexBytes))
      p_.fail(at, fmt::format("the rule `{}` expands to a regular expression of more than {} bytes", name,
                              kMaxRegexBytes));
    return done_[name] = std::move(re);
  }

 private:
  static bool mentions(const Expr& e, const std::string& name) {
    if (e.kind == Expr::kRef) return e.text == name;
    for (const Expr& k : e.kids)
      if (mentions(k, name)) return true;
    return false;
  }

  // A rule's alternatives as sequences of elements, an optional tail group (`x ("," A)?`) opened into the
  // alternatives with and without it, so that tail references show as the last element.
  // e's parts when it is of `kind` (an alternation's alternatives, a sequence's elements), else e alone.
  static std::vector<const Expr*> parts(const Expr& e, Expr::Kind kind) {
    std::vector<const Expr*> v;
    if (e.kind != kind) return {&e};
    for (const Expr& k : e.kids) v.push_back(&k);
    return v;
  }

  static std::vector<std::vector<const Expr*>> alternatives_of(const Expr& e) {
    std::vector<std::vector<const Expr*>> out;
    for (const Expr* a : parts(e, Expr::kAlt)) {
      std::vector<const Expr*> seq = parts(*a, Expr::kSeq);
      const Expr* last = seq.empty() ? nullptr : seq.back();
      if (!last || last->kind != Expr::kRepeat || last->lo != 0 || last->hi != 1) {
        out.push_back(std::move(seq));
        continue;
      }
      seq.pop_back();
      out.push_back(seq);  // without the optional tail
      for (const Expr* o : parts(last->kids[0], Expr::kAlt)) {  // with each of its alternatives
        std::vector<const Expr*> with = seq;
        for (const Expr* x : parts(*o, Expr::kSeq)) with.push_back(x);
        out.push_back(std::move(with));
      }
    }
    return out;
  }

  std::string expand_seq(const std::vector<const Expr*>& seq, size_t from, size_t to) {
    std::string s;
    for (size_t i = from; i < to; ++i) s += expand(*seq[i]);
    return s;
  }

  // A rule's regular expression. A rule may refer to itself directly as the last element of alternatives (right
  // recursion, A ::= x A | y: x*y) or as the first (left recursion, A ::= A x | y: yx*), not both and nowhere else.
  std::string body(const std::string& name, const Expr& e) {
    if (!mentions(e, name)) return expand(e);
    std::vector<std::string> base, right, left;
    for (const auto& seq : alternatives_of(e)) {
      size_t self = 0;
      for (const Expr* x : seq) self += mentions(*x, name) ? 1 : 0;
      if (self == 0) {
        base.push_back(expand_seq(seq, 0, seq.size()));
      } else if (self == 1 && seq.back()->kind == Expr::kRef && seq.back()->text == name) {
        if (seq.size() > 1) right.push_back(expand_seq(seq, 0, seq.size() - 1));
      } else if (self == 1 && seq.front()->kind == Expr::kRef && seq.front()->text == name) {
        if (seq.size() > 1) left.push_back(expand_seq(seq, 1, seq.size()));
      } else {
        p_.fail(e.at, fmt::format("the rule `{}` refers to itself inside an alternative ({} -> {}): recursive "
                                  "grammars are not supported, only grammars whose rules expand to a regular language "
                                  "(a rule may repeat itself at the end or the start of an alternative)",
                                  name, name, name));
      }
    }
    if (!right.empty() && !left.empty())
      p_.fail(e.at, fmt::format("the rule `{}` refers to itself both at the start and at the end of alternatives: "
                                "that grammar need not be regular, and is not supported", name));
    if (base.empty()) p_.fail(e.at, fmt::format("the rule `{}` never ends: every alternative refers to it", name));
    auto group = [](const std::vector<std::string>& v) {
      std::string s = "(?:";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? "|" : "") + v[i];
      return s + ")";
    };
    if (!right.empty()) return group(right) + "*" + group(base);
    if (!left.empty()) return group(base) + group(left) + "*";
    return group(base);  // (only `A ::= A | ...`: the self-reference adds nothing)
  }

  std::string expand(const Expr& e) {
    switch (e.kind) {
      case Expr::kLiteral: return regex_escape(e.text);
      case Expr::kClass: return e.text;
      case Expr::kRef: return "(?:" + rule(e.text, e.at) + ")";
      case Expr::kSeq: {
        std::string s;
        for (const Expr& k : e.kids) s += expand(k);
        return s;
      }
      case Expr::kAlt: {
        std::string s = "(?:";
        for (size_t i = 0; i < e.kids.size(); ++i) s += (i ? "|" : "") + expand(e.kids[i]);
        return s + ")";
      }
      case Expr::kRepeat: {
        const std::string q = e.lo == 0 && e.hi == -1 ? "*"
                              : e.lo == 1 && e.hi == -1 ? "+"
                              : e.lo == 0 && e.hi == 1  ? "?"
                              : e.hi == -1              ? fmt::format("{{{},}}", e.lo)
                                                        : fmt::format("{{{},{}}}", e.lo, e.hi);
        return "(?:" + expand(e.kids[0]) + ")" + q;
      }
    }
    return {};
  }

  const std::map<std::string, Expr>& rules_;
  const Parser& p_;
  std::map<std::string, std::string> done_;
  std::vector<std::string> path_;
};

}  // namespace

std::string ebnf_to_regex(std::string_view grammar) {
  if (grammar.size() > kMaxGrammarBytes) throw_user("EBNF grammar: longer than {} bytes", kMaxGrammarBytes);
  Parser p(grammar);
  const std::map<std::string, Expr> rules = p.rules();
  if (!rules.count("root")) throw_user("EBNF grammar: no `root` rule (the output must match `root ::= ...`)");
  return Expander(rules, p).rule("root", 0);
}

std::shared_ptr<const Regex> compile_ebnf(std::string_view grammar) {
  const std::string re = ebnf_to_regex(grammar);
  try {
    return Regex::compile(re);
  } catch (const UserError& e) {
    throw_user("EBNF grammar: its expansion into a regular expression: {}", e.what());
  }
}

}  // namespace moeserve::grammar

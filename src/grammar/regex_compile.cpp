// The regular-expression grammar's compiler (see regex_grammar.h): a recursive-descent parser to an AST of code
// point sets, concatenations, alternations and counted repetitions; a Thompson NFA over bytes, each code point set
// compiled to the UTF-8 byte-range sequences that encode exactly its code points (sequences sharing their suffixes,
// so the DFA does not tell apart lead bytes with the same continuations). regex_dfa.cpp makes the minimal DFA.
#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "grammar/regex_grammar.h"
#include "grammar/regex_internal.h"

namespace moeserve::grammar {
namespace regex_detail {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
bool is_surrogate(uint32_t cp) { return cp >= 0xD800 && cp <= 0xDFFF; }

int decode_utf8(std::string_view s, size_t i, uint32_t& cp) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  int n;
  uint32_t min;
  if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1Fu, min = 0x80;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0Fu, min = 0x800;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07u, min = 0x10000;
  else return 0;
  if (i + size_t(n) > s.size()) return 0;
  for (int k = 1; k < n; ++k) {
    if ((byte(i + size_t(k)) & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (byte(i + size_t(k)) & 0x3Fu);
  }
  return cp < min || cp > kMaxCodePoint || is_surrogate(cp) ? 0 : n;
}

int encode_utf8(uint32_t cp, uint8_t* out) {
  if (cp < 0x80) return out[0] = uint8_t(cp), 1;
  if (cp < 0x800) return out[0] = uint8_t(0xC0 | cp >> 6), out[1] = uint8_t(0x80 | (cp & 0x3F)), 2;
  if (cp < 0x10000) {
    out[0] = uint8_t(0xE0 | cp >> 12), out[1] = uint8_t(0x80 | (cp >> 6 & 0x3F)), out[2] = uint8_t(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = uint8_t(0xF0 | cp >> 18), out[1] = uint8_t(0x80 | (cp >> 12 & 0x3F));
  out[2] = uint8_t(0x80 | (cp >> 6 & 0x3F)), out[3] = uint8_t(0x80 | (cp & 0x3F));
  return 4;
}

}  // namespace regex_detail

namespace {

using regex_detail::decode_utf8;
using regex_detail::encode_utf8;
using regex_detail::is_surrogate;
using regex_detail::kMaxCodePoint;

using regex_detail::Nfa;
using regex_detail::NState;

using Range = std::pair<uint32_t, uint32_t>;  // code points, inclusive
using CpSet = std::vector<Range>;

// Sorted, overlaps and neighbours merged, surrogates removed (UTF-8 cannot encode them).
CpSet normalize(CpSet s) {
  std::sort(s.begin(), s.end());
  CpSet merged, out;
  for (const Range& r : s) {
    if (!merged.empty() && r.first <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, r.second);
    else merged.push_back(r);
  }
  for (const auto& [lo, hi] : merged) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      out.push_back({lo, hi});
      continue;
    }
    if (lo < 0xD800) out.push_back({lo, 0xD7FF});
    if (hi > 0xDFFF) out.push_back({0xE000, hi});
  }
  return out;
}

CpSet complement(const CpSet& s) {  // s normalized
  CpSet out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : s) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return normalize(std::move(out));
}

// Calls f(lo_bytes, hi_bytes, n) for byte-range sequences whose cross products are exactly the UTF-8 encodings of
// the code points lo..hi (no surrogates inside): the range is split at the encoding-length boundaries, then where a
// continuation byte's range would not cover its whole span, so that each piece is a product of byte ranges.
template <typename F>
void utf8_sequences(uint32_t lo, uint32_t hi, F&& f) {
  std::vector<Range> todo{{lo, hi}};
  while (!todo.empty()) {
    auto [a, b] = todo.back();
    todo.pop_back();
    bool split = false;
    for (uint32_t top : {0x7Fu, 0x7FFu, 0xFFFFu})
      if (a <= top && b > top) {
        todo.push_back({top + 1, b});
        todo.push_back({a, top});
        split = true;
        break;
      }
    for (int k = 1; k < 4 && !split; ++k) {
      const uint32_t m = (1u << (6 * k)) - 1;  // the low k continuation bytes' bits
      if ((a & ~m) == (b & ~m)) continue;
      if ((a & m) != 0) {
        todo.push_back({(a | m) + 1, b});
        todo.push_back({a, a | m});
        split = true;
      } else if ((b & m) != m) {
        todo.push_back({b & ~m, b});
        todo.push_back({a, (b & ~m) - 1});
        split = true;
      }
    }
    if (split) continue;
    uint8_t x[4], y[4];
    const int n = encode_utf8(a, x);
    encode_utf8(b, y);
    f(x, y, n);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The parser.

struct Node {
  enum Kind : uint8_t { kEmpty, kSet, kConcat, kAlt, kRepeat };
  Kind kind = kEmpty;
  int32_t min = 0, max = 0;  // kRepeat; max -1: unbounded
  CpSet set;                 // kSet, normalized
  std::vector<int32_t> kids;
};

struct ClassItem {  // one member of a class (or an escape outside one)
  CpSet set;
  bool single = false;  // one code point (may be a range endpoint)
};

ClassItem single(uint32_t cp) { return {{{cp, cp}}, true}; }

constexpr std::string_view kNotRegular =
    "is not supported: a grammar for constrained decoding must be a regular language";

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  int32_t parse() {
    const int32_t root = alternation();
    if (i_ < p_.size())  // only a ')' stops the top-level alternation
      fail(i_, "')'", "closes no group (unbalanced parentheses; write \\) for a literal one)");
    return root;
  }
  std::vector<Node> nodes;

 private:
  [[noreturn]] void fail(size_t at, std::string_view what, std::string_view problem) const {
    throw_user("the regular expression's {} at offset {} {}", what, at, problem);
  }
  std::string text(size_t from, size_t to) const { return std::string(p_.substr(from, to - from)); }
  bool at_end(size_t k = 0) const { return i_ + k >= p_.size(); }
  bool next_is(char c, size_t k = 0) const { return !at_end(k) && p_[i_ + k] == c; }
  bool next_is(std::string_view s) const { return p_.substr(i_, s.size()) == s; }

  int32_t add(Node n) {
    nodes.push_back(std::move(n));
    return int32_t(nodes.size() - 1);
  }
  int32_t set_node(CpSet s) {
    Node n;
    n.kind = Node::kSet;
    n.set = normalize(std::move(s));
    return add(std::move(n));
  }

  int32_t alternation() {
    std::vector<int32_t> alts{concatenation()};
    while (next_is('|')) {
      ++i_;
      alts.push_back(concatenation());
    }
    if (alts.size() == 1) return alts[0];
    Node n;
    n.kind = Node::kAlt;
    n.kids = std::move(alts);
    return add(std::move(n));
  }

  int32_t concatenation() {
    std::vector<int32_t> items;
    while (!at_end() && p_[i_] != '|' && p_[i_] != ')')
      if (const int32_t piece = quantified(); piece >= 0) items.push_back(piece);
    if (items.size() == 1) return items[0];
    Node n;
    if (!items.empty()) n.kind = Node::kConcat, n.kids = std::move(items);
    return add(std::move(n));
  }

  // A quantifier at i_ (*, +, ?, {n}, {n,}, {n,m}, {,m}, {,}): its length (0: none; a '{' that is not one is a
  // literal, as in Python) and bounds.
  size_t quantifier_at(size_t i, int32_t& min, int32_t& max) const {
    if (i >= p_.size()) return 0;
    switch (p_[i]) {
      case '*': return min = 0, max = -1, 1;
      case '+': return min = 1, max = -1, 1;
      case '?': return min = 0, max = 1, 1;
      case '{': break;
      default: return 0;
    }
    size_t j = i + 1;
    auto number = [&](bool& present) {
      int64_t v = 0;
      present = false;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9') {
        v = std::min<int64_t>(v * 10 + (p_[j++] - '0'), int64_t(1) << 40);
        present = true;
      }
      return v;
    };
    bool has_lo, has_hi;
    const int64_t lo = number(has_lo);
    int64_t hi = lo;
    has_hi = has_lo;
    if (j < p_.size() && p_[j] == ',') {
      ++j;
      hi = number(has_hi);
    }
    if (j >= p_.size() || p_[j] != '}' || j == i + 1) return 0;  // "{}" is a literal too
    ++j;
    const std::string q = text(i, j);
    for (int64_t v : {has_lo ? lo : 0, has_hi ? hi : 0})
      if (v > kMaxRegexRepeat)
        fail(i, "counted repetition " + q,
             fmt::format("exceeds the limit of {} repetitions; use * or + for an unbounded repetition, or a "
                         "smaller bound",
                         kMaxRegexRepeat));
    min = has_lo ? int32_t(lo) : 0;
    max = has_hi ? int32_t(hi) : -1;
    if (max >= 0 && min > max) fail(i, "counted repetition " + q, "has its minimum above its maximum");
    return j - i;
  }

  // An atom with its quantifiers; -1 for a no-op anchor (^ first, $ last).
  int32_t quantified() {
    const size_t at = i_;
    if (p_[i_] == '^' || p_[i_] == '$') {
      const bool start = p_[i_] == '^';
      if (start ? at == 0 : at + 1 == p_.size()) {
        ++i_;
        return -1;
      }
      fail(at, start ? "anchor ^" : "anchor $",
           start ? "is only supported as the pattern's first byte (the whole output must match anyway; write \\^ "
                   "for a literal ^)"
                 : "is only supported as the pattern's last byte (the whole output must match anyway; write \\$ "
                   "for a literal $)");
    }
    int32_t node = atom();
    int32_t min, max;
    const size_t qat = i_;
    const size_t len = quantifier_at(i_, min, max);
    if (len == 0) return node;
    i_ += len;
    if (next_is('?')) ++i_;  // lazy: the same language
    else if (next_is('+'))
      fail(qat, "possessive quantifier " + text(qat, i_ + 1), "is not supported (it can change the language)");
    int32_t min2, max2;
    if (const size_t len2 = quantifier_at(i_, min2, max2); len2 > 0)
      fail(i_, "quantifier " + text(i_, i_ + len2),
           "follows another quantifier (Python and ECMAScript refuse this too); wrap the repeated part in (?:...) "
           "to repeat it again");
    Node n;
    n.kind = Node::kRepeat;
    n.min = min;
    n.max = max;
    n.kids = {node};
    return add(std::move(n));
  }

  int32_t atom() {
    const size_t at = i_;
    int32_t min, max;
    switch (p_[i_]) {
      case '(': return group();
      case '[': return char_class();
      case '.': ++i_; return set_node(complement({{'\n', '\n'}}));
      case '\\': return set_node(escape(false).set);
      case '*':
      case '+':
      case '?': fail(at, fmt::format("quantifier {}", p_[i_]), "has nothing to repeat");
      case '{':
        if (const size_t len = quantifier_at(i_, min, max); len > 0)
          fail(at, "quantifier " + text(at, at + len), "has nothing to repeat");
        ++i_;
        return set_node({{'{', '{'}});
      default: {
        uint32_t cp;
        i_ += size_t(decode_utf8(p_, i_, cp));  // the pattern's UTF-8 was checked
        return set_node({{cp, cp}});
      }
    }
  }

  int32_t group() {
    const size_t at = i_++;
    if (next_is('?')) {
      if (next_is("?:")) {
        i_ += 2;
      } else if (next_is("?P<") || (next_is("?<") && !next_is("?<=") && !next_is("?<!"))) {
        i_ += next_is('P', 1) ? 3 : 2;
        const size_t name = i_;
        while (!at_end() && p_[i_] != '>' &&
               (std::isalnum(static_cast<unsigned char>(p_[i_])) || p_[i_] == '_' ||
                static_cast<unsigned char>(p_[i_]) >= 0x80))
          ++i_;
        if (!next_is('>') || i_ == name || (p_[name] >= '0' && p_[name] <= '9'))
          fail(at, "named group " + text(at, std::min(i_ + 1, p_.size())),
               "has an invalid name (letters, digits and _, not starting with a digit, then '>')");
        ++i_;
      } else {
        std::string_view what = "group syntax";
        size_t len = 3;  // "(?X"
        if (next_is("?P=")) what = "backreference", len = 4;
        else if (next_is("?P>")) what = "recursion", len = 4;
        else if (next_is("?R") || next_is("?&")) what = "recursion";
        else if (next_is("?=") || next_is("?!")) what = "lookahead";
        else if (next_is("?<=") || next_is("?<!")) what = "lookbehind", len = 4;
        else if (next_is("?>")) what = "atomic group";
        else if (next_is("?#")) what = "comment group";
        else if (next_is("?(")) what = "conditional group";
        else if (next_is("?|")) what = "branch reset group";
        else if (!at_end(1) && (std::isalpha(static_cast<unsigned char>(p_[i_ + 1])) || p_[i_ + 1] == '-')) {
          what = "inline flags";
          while (at + len < p_.size() && (std::isalpha(static_cast<unsigned char>(p_[at + len - 1])) ||
                                           p_[at + len - 1] == '-'))
            ++len;
        }
        fail(at, fmt::format("{} {}", what, text(at, std::min(p_.size(), at + len))),
             what == "inline flags" ? "are not supported (write the case variants out, e.g. [Aa])" : kNotRegular);
      }
    }
    if (++depth_ > kMaxRegexNesting)
      fail(at, "group", fmt::format("is nested more than {} groups deep", kMaxRegexNesting));
    const int32_t inner = alternation();
    if (at_end()) fail(at, "group '('", "is never closed (unbalanced parentheses; write \\( for a literal one)");
    ++i_;  // ')'
    --depth_;
    return inner;
  }

  int32_t char_class() {
    const size_t at = i_++;
    const bool negate = next_is('^');
    if (negate) ++i_;
    CpSet set;
    for (bool first = true;; first = false) {
      if (at_end())
        fail(at, "character class '['", "is never closed (unbalanced brackets; write \\[ for a literal one)");
      if (p_[i_] == ']' && !first) {
        ++i_;
        break;
      }
      const size_t item_at = i_;
      ClassItem lo = class_item();
      if (next_is('-') && !at_end(1) && p_[i_ + 1] != ']') {
        ++i_;
        ClassItem hi = class_item();
        if (!lo.single || !hi.single)
          fail(item_at, "range " + text(item_at, i_),
               "has a class escape as an endpoint (write a literal '-' first or last, or escape it as \\-)");
        if (lo.set[0].first > hi.set[0].first) fail(item_at, "range " + text(item_at, i_), "is reversed");
        set.push_back({lo.set[0].first, hi.set[0].first});
      } else {
        set.insert(set.end(), lo.set.begin(), lo.set.end());
      }
    }
    CpSet s = normalize(std::move(set));
    return set_node(negate ? complement(s) : std::move(s));
  }

  ClassItem class_item() {
    if (p_[i_] == '\\') return escape(true);
    if (p_[i_] == '[' && (next_is(':', 1) || next_is('=', 1) || next_is('.', 1)))
      fail(i_, "POSIX class " + text(i_, i_ + 2),
           "is not supported (use a range such as [a-zA-Z], or \\d \\w \\s; write \\[ for a literal '[')");
    uint32_t cp;
    i_ += size_t(decode_utf8(p_, i_, cp));
    return single(cp);
  }

  uint32_t hex(size_t at, size_t digits, std::string_view what) {
    uint32_t v = 0;
    for (size_t k = 0; k < digits; ++k, ++i_) {
      if (at_end() || !std::isxdigit(static_cast<unsigned char>(p_[i_])))
        fail(at, fmt::format("escape {}", text(at, std::min(i_ + 1, p_.size()))),
             fmt::format("needs {} hex digits ({})", digits, what));
      const char c = p_[i_];
      v = v * 16 + uint32_t(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
  }

  // A backslash escape at i_, inside a class or not.
  ClassItem escape(bool in_class) {
    const size_t at = i_++;
    if (at_end()) fail(at, "trailing backslash", "escapes nothing (write \\\\ for a literal backslash)");
    uint32_t cp;
    i_ += size_t(decode_utf8(p_, i_, cp));
    if (cp >= 0x80) return single(cp);
    const std::string esc = text(at, i_);
    auto code_point = [&](uint32_t v) {
      if (v > kMaxCodePoint) fail(at, "escape " + text(at, i_), "is above U+10FFFF");
      if (is_surrogate(v)) fail(at, "escape " + text(at, i_), "is a lone surrogate (not a code point UTF-8 can encode)");
      return single(v);
    };
    static const CpSet kDigit{{'0', '9'}}, kWord{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}},
        kSpace{{'\t', '\r'}, {' ', ' '}};
    switch (char(cp)) {
      case 'd': return {kDigit, false};
      case 'D': return {complement(kDigit), false};
      case 'w': return {kWord, false};
      case 'W': return {complement(kWord), false};
      case 's': return {kSpace, false};
      case 'S': return {complement(kSpace), false};
      case 'n': return single('\n');
      case 't': return single('\t');
      case 'r': return single('\r');
      case 'f': return single('\f');
      case 'v': return single('\v');
      case '0':
        if (!at_end() && p_[i_] >= '0' && p_[i_] <= '9')
          fail(at, "octal escape " + esc + p_[i_], "is not supported (write \\xHH)");
        return single(0);
      case 'x': return single(hex(at, 2, "\\xHH"));
      case 'U': return code_point(hex(at, 8, "\\UHHHHHHHH"));
      case 'u': {
        if (next_is('{')) {
          ++i_;
          uint32_t v = 0;
          size_t digits = 0;
          while (!at_end() && std::isxdigit(static_cast<unsigned char>(p_[i_])) && digits < 7) {
            const char c = p_[i_++];
            v = v * 16 + uint32_t(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
            ++digits;
          }
          if (!next_is('}') || digits == 0 || digits > 6)
            fail(at, "escape " + text(at, std::min(i_ + 1, p_.size())), "needs 1 to 6 hex digits and a '}'");
          ++i_;
          return code_point(v);
        }
        uint32_t v = hex(at, 4, "\\uHHHH");
        if (v >= 0xD800 && v <= 0xDBFF && next_is("\\u") && !next_is('{', 2)) {
          const size_t save = i_;
          i_ += 2;
          const uint32_t low = hex(i_ - 2, 4, "\\uHHHH");
          if (low >= 0xDC00 && low <= 0xDFFF) return single(0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00));
          i_ = save;
        }
        return code_point(v);
      }
      case 'b':
        if (in_class) return single('\b');
        fail(at, "word boundary \\b", "is not supported");
      case 'B': fail(at, "word boundary \\B", "is not supported");
      case 'A':
      case 'Z':
      case 'z':
      case 'G': fail(at, "anchor " + esc, "is not supported (the whole output is matched anyway)");
      case 'k': fail(at, "backreference \\k", kNotRegular);
      case 'p':
      case 'P': fail(at, "Unicode property class " + esc, "is not supported (use explicit code point ranges)");
      case 'N': fail(at, "named character " + esc, "is not supported (write the character or \\uHHHH)");
      case 'c': fail(at, "control escape " + esc, "is not supported (write \\xHH)");
      default: break;
    }
    const char c = char(cp);
    if (c >= '1' && c <= '9') {
      if (in_class) fail(at, "octal escape " + esc, "is not supported (write \\xHH)");
      size_t end = i_;
      while (end < p_.size() && p_[end] >= '0' && p_[end] <= '9') ++end;
      fail(at, "backreference " + text(at, end), kNotRegular);
    }
    if (std::isalnum(static_cast<unsigned char>(c)))
      fail(at, "escape " + esc, "is invalid (Python refuses it too; write the letter without a backslash)");
    return single(cp);  // escaped punctuation, space or control character: itself
  }

  std::string_view p_;
  size_t i_ = 0;
  int depth_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// The Thompson NFA over bytes.


class NfaBuilder : public Nfa {
 public:
  explicit NfaBuilder(const std::vector<Node>& nodes) : nodes_(nodes) {}

  void build(int32_t root) {
    const Frag f = emit(root);
    match = add({});
    st[size_t(match)].kind = NState::kMatch;
    link(f.end, match);
    start = f.start;
  }

 private:
  struct Frag {
    int32_t start, end;  // end: an epsilon state without edges yet
  };

  int32_t add(const NState& s) {
    if (st.size() >= size_t(kMaxRegexNfaStates))
      throw_user("the regular expression is too large: its counted repetitions expand to more than {} automaton "
                 "states (use smaller bounds, e.g. fewer nested {{n,m}})",
                 kMaxRegexNfaStates);
    st.push_back(s);
    return int32_t(st.size() - 1);
  }
  int32_t eps() { return add({}); }
  void link(int32_t from, int32_t to) { st[size_t(from)].out = to; }

  // An epsilon state with edges to every target (a chain of two-way splits).
  int32_t fan(const std::vector<int32_t>& targets) {
    const int32_t s = eps();
    int32_t cur = s;
    for (size_t k = 0; k < targets.size(); ++k) {
      st[size_t(cur)].out = targets[k];
      if (k + 2 == targets.size()) {
        st[size_t(cur)].out2 = targets[k + 1];
        break;
      }
      if (k + 1 < targets.size()) {
        const int32_t nxt = eps();
        st[size_t(cur)].out2 = nxt;
        cur = nxt;
      }
    }
    return s;
  }

  Frag set_frag(const CpSet& set) {
    const int32_t end = eps();
    std::map<std::tuple<uint8_t, uint8_t, int32_t>, int32_t> memo;  // (lo, hi, target): shared suffixes
    auto byte_state = [&](uint8_t lo, uint8_t hi, int32_t to) {
      auto [it, fresh] = memo.try_emplace({lo, hi, to}, -1);
      if (fresh) {
        NState s;
        s.kind = NState::kByte, s.lo = lo, s.hi = hi, s.out = to;
        it->second = add(s);
      }
      return it->second;
    };
    std::vector<int32_t> firsts;
    for (const auto& [lo, hi] : set)
      utf8_sequences(lo, hi, [&](const uint8_t* a, const uint8_t* b, int n) {
        int32_t to = end;
        for (int k = n - 1; k >= 0; --k) to = byte_state(a[k], b[k], to);
        firsts.push_back(to);
      });
    std::sort(firsts.begin(), firsts.end());
    firsts.erase(std::unique(firsts.begin(), firsts.end()), firsts.end());
    return {fan(firsts), end};
  }

  Frag emit(int32_t id) {
    const Node& n = nodes_[size_t(id)];
    switch (n.kind) {
      case Node::kEmpty: {
        const int32_t s = eps();
        return {s, s};
      }
      case Node::kSet: return set_frag(n.set);
      case Node::kConcat: {
        Frag f = emit(n.kids[0]);
        for (size_t k = 1; k < n.kids.size(); ++k) {
          const Frag g = emit(n.kids[k]);
          link(f.end, g.start);
          f.end = g.end;
        }
        return f;
      }
      case Node::kAlt: {
        std::vector<int32_t> starts;
        const int32_t end = eps();
        for (int32_t kid : n.kids) {
          const Frag g = emit(kid);
          link(g.end, end);
          starts.push_back(g.start);
        }
        return {fan(starts), end};
      }
      case Node::kRepeat: break;
    }
    // Counted repetition: min copies in a row; then either a loop on one more copy (unbounded; folded into the last
    // mandatory copy for +), or max - min nested optional copies X(X(X)?)? (nested, so the DFA states' subsets
    // stay small).
    const int32_t kid = n.kids[0];
    const int32_t s = eps();
    int32_t end = s;
    const int32_t mandatory = n.max < 0 ? std::max(n.min - 1, 0) : n.min;
    for (int32_t k = 0; k < mandatory; ++k) {
      const Frag g = emit(kid);
      link(end, g.start);
      end = g.end;
    }
    const int32_t exit = eps();
    if (n.max < 0) {
      // A loop state L: into a copy whose end returns to L, or out. For X+ the copy is the one that must come first.
      const Frag g = emit(kid);
      const int32_t loop = eps();
      st[size_t(loop)].out = g.start;
      st[size_t(loop)].out2 = exit;
      link(g.end, loop);
      link(end, n.min >= 1 ? g.start : loop);
    } else {
      for (int32_t k = n.min; k < n.max; ++k) {
        const Frag g = emit(kid);
        st[size_t(end)].out = g.start;
        st[size_t(end)].out2 = exit;
        end = g.end;
      }
      link(end, exit);
    }
    return {s, exit};
  }

  const std::vector<Node>& nodes_;
};

}  // namespace

std::shared_ptr<const Regex> Regex::compile(std::string_view pattern) {
  if (pattern.size() > size_t(kMaxRegexBytes))
    throw_user("the regular expression is {} bytes, more than the {} allowed; shorten it", pattern.size(),
               kMaxRegexBytes);
  for (size_t i = 0; i < pattern.size();) {
    uint32_t cp;
    const int len = decode_utf8(pattern, i, cp);
    if (len == 0)
      throw_user("the regular expression's byte 0x{:02X} at offset {} is not valid UTF-8 (the pattern must be UTF-8 "
                 "text; write \\xHH or \\uHHHH for a code point)",
                 static_cast<unsigned char>(pattern[i]), i);
    i += size_t(len);
  }
  Parser parser(pattern);
  const int32_t root = parser.parse();
  NfaBuilder nfa(parser.nodes);
  nfa.build(root);
  return std::shared_ptr<const Regex>(new Regex(std::string(pattern), regex_detail::build_dfa(nfa)));
}

}  // namespace moeserve::grammar

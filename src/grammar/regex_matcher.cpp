// The regular-expression grammar's compiled form, its matcher, and the literal helpers (see regex_grammar.h; the
// compiler is regex_compile.cpp).
#include <string>
#include <utility>

#include "core/error.h"
#include "grammar/regex_grammar.h"
#include "grammar/regex_internal.h"

namespace moeserve::grammar {
namespace {

// Whether s is valid UTF-8 (the pattern's rules); the offset of the first bad sequence in `bad`.
bool valid_utf8(std::string_view s, size_t& bad) {
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    const int n = regex_detail::decode_utf8(s, i, cp);
    if (n == 0) {
      bad = i;
      return false;
    }
    i += size_t(n);
  }
  return true;
}

}  // namespace

Regex::Regex(std::string pattern, Dfa dfa)
    : pattern_(std::move(pattern)),
      class_of_(dfa.class_of),
      classes_(dfa.classes),
      next_(std::move(dfa.next)),
      accept_(std::move(dfa.flags)) {
  MS_CHECK(!accept_.empty() && next_.size() == accept_.size() * size_t(classes_), "a regex DFA of {} states, {} "
           "classes and {} transitions",
           accept_.size(), classes_, next_.size());
}

std::shared_ptr<const Regex> Regex::choice(const std::vector<std::string>& literals) {
  if (literals.empty()) throw_user("a choice of strings (guided_choice) needs at least one string");
  std::string pattern;
  for (size_t k = 0; k < literals.size(); ++k) {
    size_t bad = 0;
    if (!valid_utf8(literals[k], bad))
      throw_user("choice {} is not valid UTF-8 (byte 0x{:02X} at offset {})", k,
                 static_cast<unsigned char>(literals[k][bad]), bad);
    if (k > 0) pattern += '|';
    pattern += regex_escape(literals[k]);
  }
  if (pattern.size() > size_t(kMaxRegexBytes))
    throw_user("the {} choices are {} bytes as a regular expression (escaped, joined by |), more than the {} "
               "allowed; offer fewer or shorter choices",
               literals.size(), pattern.size(), kMaxRegexBytes);
  return compile(pattern);
}

std::string regex_escape(std::string_view literal) {
  std::string out;
  out.reserve(literal.size() + literal.size() / 4);
  for (const char c : literal) {
    switch (c) {
      case '\\': case '.': case '^': case '$': case '|': case '?': case '*': case '+':
      case '(': case ')': case '[': case ']': case '{': case '}': case '-':
        out += '\\';
        out += c;
        break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\f': out += "\\f"; break;
      case '\v': out += "\\v"; break;
      case '\0': out += "\\x00"; break;
      default: out += c;
    }
  }
  return out;
}

RegexMatcher::RegexMatcher(std::shared_ptr<const Regex> re) : re_(std::move(re)) {
  MS_CHECK(re_ != nullptr, "a RegexMatcher needs a compiled Regex");
}

bool RegexMatcher::feed(std::string_view bytes) {
  int32_t s = state_;
  for (const char c : bytes) {
    s = re_->next(s, static_cast<unsigned char>(c));
    if (s < 0) return false;
  }
  state_ = s;
  return true;
}

}  // namespace moeserve::grammar

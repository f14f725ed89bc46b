// Constrained decoding's regular-expression grammar (vLLM's guided_regex / guided_choice, SGLang's regex): a
// pattern compiled once per request to a minimal DFA over UTF-8 bytes, and a byte-level matcher whose feed() is one
// table lookup (the token-mask walk calls it at every vocabulary trie node).
//
// Semantics: the WHOLE output must match (implicitly anchored at both ends, as vLLM / outlines / xgrammar do). The
// matcher is exact: feed() accepts a byte iff some string of the language has the bytes so far as a prefix (states
// from which no accepting state is reachable are the dead state). Matching is over UTF-8 bytes: a code point may be
// split across feed() calls, and only valid UTF-8 is ever accepted (no overlong forms, no surrogates D800-DFFF,
// nothing above U+10FFFF), also under `.` and negated classes.
//
// Supported syntax (the common subset of Python `re` and ECMAScript):
//  - literals: any UTF-8 code point except the metacharacters \ . [ ( ) | * + ? { ^ $  (a `}` or `]` on its own is
//    a literal, as is a `{` that does not start a valid quantifier, as in Python);
//  - `.`: any code point but \n (Python's meaning; ECMAScript also excludes \r, U+2028, U+2029);
//  - escapes: \d \D \w \W \s \S with ASCII meanings (\d = [0-9], \w = [A-Za-z0-9_], \s = [ \t\n\r\f\v]; \D \W \S:
//    any code point but those), \n \t \r \f \v, \0 (NUL, not followed by a digit), \xHH, \uHHHH (a surrogate pair
//    \uD83D\uDE00 is one code point; a lone surrogate is refused), \u{H...} (1 to 6 hex digits), \UHHHHHHHH, and
//    a backslash before any ASCII character that is not a letter or digit (\. \\ \/ \- \[ \] \" \  ...) or before
//    a non-ASCII code point: that character itself;
//  - classes [...] and [^...] (the negation is over all code points), code point ranges (multi-byte ones too, an
//    endpoint may be an escape such as \x41 or \u4E2D), the escapes above inside (\d etc. as members; \b there is
//    U+0008 as in both dialects), a literal `-` first or last (or right after a range), `]` first (`[]a]`, `[^]a]`)
//    or escaped, `[` as a literal unless it starts [: [= [. (POSIX classes, refused);
//  - groups (...), (?:...), named groups (?P<name>...) and (?<name>...) (plain groups: nothing is captured),
//    alternation | (empty alternatives allowed), at most kMaxRegexNesting groups deep;
//  - quantifiers * + ? {n} {n,} {n,m} and Python's {,m} (= {0,m}) and {,} (= *), each optionally followed by `?`
//    (lazy: the same language); a lone `^` as the pattern's first byte and `$` as its last byte (no-ops).
// Refused with a UserError that names the construct and its byte offset: backreferences (\1, \k<n>, (?P=n)),
// lookaround ((?= (?! (?<= (?<!), inline flags ((?i) (?i:...) ...), comments (?#...), conditionals, atomic groups
// (?>...) and possessive quantifiers (*+ ++ ?+ {n}+), \b \B \A \Z \z \G, \p{..} \P{..} \N{..} \cX, octal escapes
// (\0 followed by a digit, \1-\9 in a class), other escaped letters or digits (\q, \a, \e, ...), unbalanced
// parentheses or brackets, a quantifier with nothing to repeat or after another quantifier (a** , a{2}{3}: wrap it
// in (?:...)), {n,m} with n > m, a reversed range [z-a] or a range with a class endpoint [\d-z], ^ or $ anywhere but
// the first / last byte, invalid UTF-8 in the pattern, and a pattern that matches no string at all.
//
// Bounds (a UserError beyond them, saying which and what to simplify): the pattern's length (kMaxRegexBytes), a
// counted repetition's bound (kMaxRegexRepeat), group nesting (kMaxRegexNesting), the NFA that counted repetitions
// expand to (kMaxRegexNfaStates), the DFA's states during the subset construction, i.e. before minimization
// (kMaxRegexStates; e.g. (a|b)*a(a|b){14} needs 2^15), and the construction's work and memory (fixed budgets,
// reached only by huge NFAs behind many DFA states). The subset construction can exceed them where the minimal DFA
// is small: an ambiguous repeated group such as (\w+\s*){0,200} (its unambiguous (\w+\s+){0,200} compiles in a
// millisecond). Within the bounds a compile takes well under a second (.{0,1000}: 8001 states, ~6 ms).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::grammar {

constexpr int kMaxRegexBytes = 16384;
constexpr int kMaxRegexRepeat = 1000;
constexpr int kMaxRegexStates = 16384;  // fits the DFA's int16_t transition table
constexpr int kMaxRegexNesting = 200;   // groups inside groups (the parser and the NFA builder recurse on them)
constexpr int kMaxRegexNfaStates = 200000;
static_assert(kMaxRegexStates < 32767);

// An immutable compiled pattern: a minimal DFA over byte equivalence classes. Shared by many matchers across threads
// (no mutable state, no lazy caches).
class Regex {
 public:
  // UserError on bad or unsupported syntax and beyond the bounds above (see the top of this file).
  static std::shared_ptr<const Regex> compile(std::string_view pattern);
  // The language of exactly the given strings (vLLM's guided_choice): the compile of their escaped alternation. Each
  // must be valid UTF-8 (a UserError names the first that is not); at least one; an empty string is allowed. The
  // escaped alternation is subject to kMaxRegexBytes.
  static std::shared_ptr<const Regex> choice(const std::vector<std::string>& literals);

  const std::string& pattern() const { return pattern_; }
  // The live DFA states are 0 .. state_count() - 1, the start state is 0; -1 is the dead state.
  int32_t state_count() const { return int32_t(accept_.size()); }
  // Byte equivalence classes (bytes no state tells apart share one): the transition table's width.
  int32_t class_count() const { return classes_; }
  static constexpr int32_t start() { return 0; }
  // The state after `byte` from live state `state`; -1 if no string of the language continues that way.
  int32_t next(int32_t state, unsigned char byte) const {
    return next_[size_t(state) * size_t(classes_) + class_of_[byte]];
  }
  bool accepting(int32_t state) const { return state >= 0 && (accept_[size_t(state)] & 1); }
  // Accepting, and no byte leads anywhere from it.
  bool final_state(int32_t state) const { return state >= 0 && (accept_[size_t(state)] & 2); }

  struct Dfa {  // what the compiler produces (regex_dfa.cpp)
    std::array<uint8_t, 256> class_of{};
    int32_t classes = 0;
    std::vector<int16_t> next;   // state * classes + class -> state, -1 dead
    std::vector<uint8_t> flags;  // by state; bit 0: accepting, bit 1: final
  };

 private:
  Regex(std::string pattern, Dfa dfa);
  std::string pattern_;
  std::array<uint8_t, 256> class_of_;
  int32_t classes_;
  std::vector<int16_t> next_;
  std::vector<uint8_t> accept_;
};

// `literal` with every regex metacharacter (\ . ^ $ | ? * + ( ) [ ] { } -) escaped by a backslash and \n \t \r \f \v
// NUL written as escapes, so that Regex::compile(regex_escape(s)) matches exactly s (for valid UTF-8 s).
std::string regex_escape(std::string_view literal);

// The state of matching an output against a Regex, byte by byte. A value type: copy it to try a continuation. A copy
// is O(1) (the DFA state and a shared_ptr); assigning a matcher of the same Regex does not touch the shared_ptr's
// count, so the trie walk's `state[d] = state[d - 1]` costs two word copies.
class RegexMatcher {
 public:
  explicit RegexMatcher(std::shared_ptr<const Regex> re);
  RegexMatcher(const RegexMatcher&) = default;
  RegexMatcher(RegexMatcher&&) noexcept = default;
  RegexMatcher& operator=(RegexMatcher&&) noexcept = default;
  RegexMatcher& operator=(const RegexMatcher& o) {
    if (re_ != o.re_) re_ = o.re_;
    state_ = o.state_;
    return *this;
  }

  // Advances by one byte; false (and the state unchanged) if no string of the language has the bytes so far and
  // this one as a prefix.
  bool feed(unsigned char byte) {
    const int32_t n = re_->next(state_, byte);
    if (n < 0) return false;
    state_ = n;
    return true;
  }
  // Advances by every byte in order; false (and the state unchanged) if any is rejected.
  bool feed(std::string_view bytes);
  // The bytes so far are a whole match (the generation may end here).
  bool can_finish() const { return re_->accepting(state_); }
  // A whole match that no byte can extend (only the end may come).
  bool finished() const { return re_->final_state(state_); }

  int32_t state() const { return state_; }
  const Regex& regex() const { return *re_; }

 private:
  std::shared_ptr<const Regex> re_;
  int32_t state_ = Regex::start();
};

}  // namespace moeserve::grammar

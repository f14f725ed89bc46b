// The regular-expression grammar: std::regex (ECMAScript, regex_match) as the oracle for whole matches of random and
// near-miss ASCII strings over ~55 hand-picked patterns covering every construct and 300 random ones, with prefix
// exactness checked both ways (a rejected prefix has no completion among brute-force and random extensions; an
// accepted one has a completion, found through the matcher and confirmed by the oracle); UTF-8 (every code point
// against `.` and multi-byte classes, invalid sequences, code points split across feeds); choice() and
// regex_escape(); minimal DFA sizes worked out by hand; every refused construct and bound.
#include <gtest/gtest.h>

#include <cctype>
#include <deque>
#include <functional>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "grammar/grammar_test_util.h"
#include "grammar/regex_grammar.h"

using namespace moeserve::grammar;

namespace {

using test_util::kAll;

std::shared_ptr<const Regex> rx(std::string_view pattern) { return Regex::compile(pattern); }

using test_util::utf8;

using test_util::first_rejected;

bool matches(const std::shared_ptr<const Regex>& re, std::string_view text) {
  RegexMatcher m(re);
  return m.feed(text) && m.can_finish();
}

// The shortest bytes that complete the match from m (a breadth-first search through the matcher's own states).
std::optional<std::string> completion(const RegexMatcher& m, size_t max_states = 100000) {
  std::deque<std::pair<RegexMatcher, std::string>> queue{{m, ""}};
  std::set<int32_t> seen{m.state()};
  while (!queue.empty() && seen.size() < max_states) {
    auto [cur, path] = queue.front();
    queue.pop_front();
    if (cur.can_finish()) return path;
    for (int b = 0; b < 256; ++b) {
      RegexMatcher next = cur;
      if (next.feed(static_cast<unsigned char>(b)) && seen.insert(next.state()).second)
        queue.push_back({next, path + char(b)});
    }
  }
  return std::nullopt;
}

std::string error_of(std::string_view pattern) {
  try {
    Regex::compile(pattern);
  } catch (const moeserve::UserError& e) {
    return e.what();
  }
  return "<no error>";
}

std::string printable(std::string_view s) {
  std::string out;
  for (const char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b < 0x7F) out += c;
    else out += fmt::format("\\x{:02X}", b);
  }
  return out;
}

// libstdc++'s default matcher backtracks (exponential on nested quantifiers); __polynomial picks its breadth-first
// (Thompson) executor, which regex_match of a pattern without backreferences allows.
#ifdef __GLIBCXX__
constexpr auto kOracleSyntax = std::regex::ECMAScript | std::regex_constants::__polynomial;
#else
constexpr auto kOracleSyntax = std::regex::ECMAScript;
#endif

struct OracleCase {
  std::string_view ours;    // compiled by Regex
  std::string_view oracle;  // the same language for std::regex (ECMAScript)
  std::string_view alphabet;
};

const OracleCase kOracleCases[] = {
    {"abc", "abc", "abcx"},
    {"a|b|cd", "a|b|cd", "abcd"},
    {"a*b+c?", "a*b+c?", "abcx"},
    {"(ab|a)*b", "(ab|a)*b", "abx"},
    {"\\d{3}-\\d{4}", "\\d{3}-\\d{4}", "0159-a"},
    {"[A-Za-z ]{1,5}", "[A-Za-z ]{1,5}", "aZm 0-"},
    {"(yes|no|maybe)", "(yes|no|maybe)", "yesnomab"},
    {"[^abc]x", "[^abc]x", "abcxyz\n"},
    {"a{2,4}b{0,2}", "a{2,4}b{0,2}", "abc"},
    {"a{3,}", "a{3,}", "ab"},
    {"(a|b)*a(a|b){2}", "(a|b)*a(a|b){2}", "abc"},
    {"[a-c-]+", "[a-c-]+", "abcd-"},
    {"[-a]b", "[-a]b", "-abc"},
    {"x.y", "x.y", "xy.\n"},
    {"\\w+@\\w+\\.(com|org)", "\\w+@\\w+\\.(com|org)", "ab_1@.comrgx"},
    {"\\s*\\S+\\s*", "\\s*\\S+\\s*", " \tab\n"},
    {"\\D\\W", "\\D\\W", "a1 _-"},
    {"(?:ab)+|c", "(?:ab)+|c", "abc"},
    {"(?P<name>a)b", "(a)b", "abc"},
    {"(?<n1>a|b)+c", "(a|b)+c", "abc"},
    {"a*?b+?c??d{1,2}?", "a*b+c?d{1,2}", "abcd"},
    {"a{2}?b{1,}?", "a{2}b{1,}", "ab"},
    {"^ab$", "ab", "ab^$"},
    {"^$", "", "a^$"},
    {"a{", "a\\{", "a{}"},
    {"a{1,x}", "a\\{1,x\\}", "a{1,x}"},
    {"x{}", "x\\{\\}", "x{}"},
    {"a{,2}b", "a{0,2}b", "ab,"},
    {"a{,}", "a*", "ab"},
    {"[]a]+", "[\\]a]+", "a]b["},
    {"[^]a]", "[^\\]a]", "a]b"},
    {"}]", "\\}\\]", "}]a"},
    {"\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\\\\\^\\$", "\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\\\\\^\\$", ".*+?()[]{}|\\^$a"},
    {"\\/\\-\\\"\\ \\#\\'", "/-\" #'", "/-\" #'a"},
    {"(|a)(b|)", "(|a)(b|)", "abc"},
    {"a|", "a|", "ab"},
    {"((a|b)c)*d?", "((a|b)c)*d?", "abcd"},
    {"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){2}", "[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){2}", "0aF:g"},
    {"-?(0|[1-9]\\d*)(\\.\\d+)?([eE][+-]?\\d+)?", "-?(0|[1-9]\\d*)(\\.\\d+)?([eE][+-]?\\d+)?", "-0129.eE+"},
    {"\"([^\"\\\\]|\\\\.)*\"", "\"([^\"\\\\]|\\\\.)*\"", "\"\\ab"},
    {"\\x41\\u0042[\\x30-\\x32]\\u{43}", "AB[0-2]C", "AB0123C"},
    {"", "", "ab"},
    {"()", "", "ab"},
    {"(a*)*b", "(a*)*b", "ab"},
    {"(a|b?)+c", "(a|b?)+c", "abc"},
    {"a{0}b", "b", "ab"},
    {"[\\d\\s]+x", "[\\d\\s]+x", "1 \tx\na"},
    {"\\t\\n\\r\\f\\v\\0", "\\t\\n\\r\\f\\v\\x00", std::string_view("\t\n\r\f\v\0a", 7)},
    {"[a\\-z]+", "[a\\-z]+", "a-zb"},
    {"[\\w-]+", "[A-Za-z0-9_\\-]+", "a_-."},
    {"[\\b]x", "\\x08x", "\bxa"},
    {"(a|ab)(c|bcd)(d*)", "(a|ab)(c|bcd)(d*)", "abcd"},
    {"[a-b-d]", "[a-b\\-d]", "abcd-"},
    {"(?:(?:a|b){2}c){1,3}", "(?:(?:a|b){2}c){1,3}", "abc"},
    {"[[a]+", "[\\[a]+", "[a]"},
};

class Walker {
 public:
  Walker(std::shared_ptr<const Regex> re, std::string alphabet, uint32_t seed)
      : re_(std::move(re)), alphabet_(std::move(alphabet)), rng_(seed) {}

  std::string random_string(size_t max_len) {
    std::string s(rng_() % (max_len + 1), ' ');
    for (char& c : s) c = pick();
    return s;
  }
  // A random walk through the matcher over the alphabet (likely a prefix or a match), then maybe a mutation.
  std::string walk(size_t max_len) {
    RegexMatcher m(re_);
    std::string s;
    while (s.size() < max_len && rng_() % 12 != 0) {
      std::vector<char> ok;
      for (char c : alphabet_) {
        RegexMatcher t = m;
        if (t.feed(static_cast<unsigned char>(c))) ok.push_back(c);
      }
      if (ok.empty()) break;
      const char c = ok[rng_() % ok.size()];
      m.feed(static_cast<unsigned char>(c));
      s += c;
    }
    if (rng_() % 3 == 0) {
      const size_t at = s.empty() ? 0 : rng_() % (s.size() + 1);
      switch (rng_() % 3) {
        case 0: s.insert(s.begin() + long(at), pick()); break;
        case 1: if (at < s.size()) s[at] = pick(); break;
        default: if (at < s.size()) s.erase(at, 1);
      }
    }
    return s;
  }
  char pick() { return alphabet_[rng_() % alphabet_.size()]; }
  std::mt19937& rng() { return rng_; }

 private:
  std::shared_ptr<const Regex> re_;
  std::string alphabet_;
  std::mt19937 rng_;
};

// Random strings and near-misses of random walks: can_finish() agrees with std::regex_match; a string rejected at a
// byte has no completion (every extension by up to 2 more alphabet characters, and random longer ones, fails the
// oracle); an accepted one has a completion (the matcher's shortest, which the oracle must match); finished() means
// no byte is accepted. Returns the number of whole matches seen (to check the test is not vacuous).
int check_against_oracle(std::string_view ours, std::string_view oracle_pattern, const std::string& alphabet,
                         uint32_t seed, int iterations) {
  SCOPED_TRACE(std::string("pattern ") + printable(ours));
  const auto re = rx(ours);
  const std::regex oracle(std::string(oracle_pattern), kOracleSyntax);
  auto whole = [&](const std::string& s) { return std::regex_match(s, oracle); };
  Walker w(re, alphabet, seed);
  std::set<std::string> rejected_prefixes, accepted_seen;
  int positives = 0;
  for (int iter = 0; iter < iterations; ++iter) {
    const std::string s = iter % 2 ? w.random_string(8) : w.walk(20);
    RegexMatcher m(re);
    const size_t r = first_rejected(m, s);
    if (r == kAll) {
      const bool want = whole(s);
      positives += want;
      EXPECT_EQ(m.can_finish(), want) << printable(s);
      if (m.can_finish() != want) return positives;
      if (m.finished())
        for (int b = 0; b < 256; ++b) {
          RegexMatcher t = m;
          EXPECT_FALSE(t.feed(static_cast<unsigned char>(b))) << printable(s) << " finished, but takes " << b;
        }
      if (accepted_seen.insert(s).second && accepted_seen.size() <= 300) {
        const auto more = completion(m);
        EXPECT_TRUE(more.has_value()) << printable(s);
        if (!more || !whole(s + *more)) {
          ADD_FAILURE() << printable(s) << " + its completion " << printable(more.value_or("<none>"));
          return positives;
        }
      }
      continue;
    }
    const std::string prefix = s.substr(0, r + 1);
    std::vector<std::string> tries{s, prefix};
    if (rejected_prefixes.insert(prefix).second && rejected_prefixes.size() <= 30) {
      for (char a : alphabet) {
        tries.push_back(prefix + a);
        for (char b : alphabet) tries.push_back(prefix + a + b);
      }
      for (int k = 0; k < 40; ++k) tries.push_back(prefix + w.random_string(10));
    }
    for (const std::string& t : tries)
      if (whole(t)) {
        ADD_FAILURE() << printable(s) << " rejected at byte " << r << ", but " << printable(t) << " matches";
        return positives;
      }
  }
  return positives;
}

}  // namespace

TEST(RegexOracle, WholeMatchAndPrefixExactnessAgainstStdRegex) {
  uint32_t seed = 1;
  for (const OracleCase& c : kOracleCases) {
    const int positives = check_against_oracle(c.ours, c.oracle, std::string(c.alphabet), seed++, 1500);
    // The random walks reach whole matches for every pattern (the test would be weak otherwise).
    EXPECT_GT(positives, 20) << printable(c.ours);
  }
}

namespace {

// A random pattern in the syntax both dialects read the same way, over the letters a b c and the digit 1.
std::string random_pattern(std::mt19937& rng, int depth) {
  auto atom = [&]() -> std::string {
    switch (rng() % 12) {
      case 0: return ".";
      case 1: return "[ab]";
      case 2: return "[^a]";
      case 3: return "[a-c1]";
      case 4: return "\\d";
      case 5: return "\\w";
      case 6:
      case 7:
        if (depth < 3) return (rng() % 2 ? "(" : "(?:") + random_pattern(rng, depth + 1) + ")";
        return "b";
      default: return std::string(1, "abc1"[rng() % 4]);
    }
  };
  static const char* const kQuantifiers[] = {"*", "+", "?", "{2}", "{0,2}", "{1,3}", "{2,}", "*?", "{1,2}?"};
  std::string out;
  const int alternatives = rng() % 4 == 0 ? 2 + int(rng() % 2) : 1;
  for (int a = 0; a < alternatives; ++a) {
    if (a > 0) out += '|';
    const int pieces = int(rng() % 4);
    for (int k = 0; k < pieces; ++k) {
      out += atom();
      if (rng() % 3 == 0) out += kQuantifiers[rng() % std::size(kQuantifiers)];
    }
  }
  return out;
}

}  // namespace

TEST(RegexOracle, RandomPatternsAgainstStdRegex) {
  std::mt19937 rng(2024);
  int positives = 0;
  for (int k = 0; k < 300; ++k) {
    const std::string p = random_pattern(rng, 0);
    positives += check_against_oracle(p, p, "abc1\n", uint32_t(k), 200);
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(positives, 3000);
}

namespace {

// Every code point (surrogates skipped), fed whole: accepted and a whole match iff `member`; a non-member is
// rejected at some byte (no other code point's encoding shares all of its bytes). One byte at a time, so a code
// point is split across feeds.
void expect_single_code_points(std::string_view pattern, const std::function<bool(uint32_t)>& member) {
  SCOPED_TRACE(std::string("pattern ") + printable(pattern));
  const auto re = rx(pattern);
  int failures = 0;
  for (uint32_t cp = 0; cp <= 0x10FFFF && failures < 5; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    RegexMatcher m(re);
    const bool all = first_rejected(m, utf8(cp)) == kAll;
    const bool want = member(cp);
    if (want != (all && m.can_finish())) {
      ADD_FAILURE() << fmt::format("U+{:04X}: expected {}, got {}", cp, want ? "a match" : "no match",
                                   all ? (m.can_finish() ? "a match" : "a prefix") : "a rejection");
      ++failures;
    }
  }
}

}  // namespace

TEST(RegexUtf8, EveryCodePointAgainstDotAndClasses) {
  expect_single_code_points(".", [](uint32_t cp) { return cp != '\n'; });
  expect_single_code_points("[^\\n]", [](uint32_t cp) { return cp != '\n'; });
  expect_single_code_points("[é-中]", [](uint32_t cp) { return cp >= 0xE9 && cp <= 0x4E2D; });
  expect_single_code_points("[^a-z\\u4E2D]", [](uint32_t cp) { return !(cp >= 'a' && cp <= 'z') && cp != 0x4E2D; });
  expect_single_code_points("\\W", [](uint32_t cp) { return !(cp < 128 && (std::isalnum(int(cp)) || cp == '_')); });
  expect_single_code_points("\\S", [](uint32_t cp) { return !(cp == ' ' || (cp >= '\t' && cp <= '\r')); });
  expect_single_code_points("\\D", [](uint32_t cp) { return !(cp >= '0' && cp <= '9'); });
  expect_single_code_points("[😀-🙏]", [](uint32_t cp) { return cp >= 0x1F600 && cp <= 0x1F64F; });
  expect_single_code_points("[\\uD83D\\uDE00-\\uD83D\\uDE4F]", [](uint32_t cp) { return cp >= 0x1F600 && cp <= 0x1F64F; });
  expect_single_code_points("[\\x7F-\\u0800\\uD7FF-\\uE000\\uFFFF-\\U00010000]", [](uint32_t cp) {
    return (cp >= 0x7F && cp <= 0x800) || cp == 0xD7FF || cp == 0xE000 || cp == 0xFFFF || cp == 0x10000;
  });
  expect_single_code_points("[\\u07FF-\\u{10001}\\U0010FFFF]", [](uint32_t cp) {
    return (cp >= 0x7FF && cp <= 0x10001) || cp == 0x10FFFF;
  });
  expect_single_code_points("[\\u0100-\\u01FF\\u0800-\\u0FFF\\U00010000-\\U0001FFFF\\U00100000-\\U0010FFFF]",
                            [](uint32_t cp) {
                              return (cp >= 0x100 && cp <= 0x1FF) || (cp >= 0x800 && cp <= 0xFFF) ||
                                     (cp >= 0x10000 && cp <= 0x1FFFF) || cp >= 0x100000;
                            });
  expect_single_code_points("é|中|\\u{1F600}", [](uint32_t cp) { return cp == 0xE9 || cp == 0x4E2D || cp == 0x1F600; });
}

TEST(RegexUtf8, InvalidSequencesAreRejectedWhereTheyBreak) {
  const auto any = rx(".*");
  struct Bad {
    std::string bytes;
    size_t at;
  };
  const Bad bad[] = {
      {"\xC0\x80", 0},          // overlong NUL
      {"\xC1\xBF", 0},          // overlong
      {"\xE0\x80\x80", 1},      // overlong 3-byte
      {"\xE0\x9F\xBF", 1},      // overlong U+07FF
      {"\xF0\x8F\xBF\xBF", 1},  // overlong U+FFFF
      {"\xED\xA0\x80", 1},      // surrogate D800
      {"\xED\xBF\xBF", 1},      // surrogate DFFF
      {"\xF4\x90\x80\x80", 1},  // above U+10FFFF
      {"\xF5\x80\x80\x80", 0},
      {"\xFF", 0},
      {"\x80", 0},              // lone continuation byte
      {"a\xBF", 1},
      {"\xC3" "a", 1},          // truncated, then ASCII
      {"\xE4\xB8" "a", 2},
      {"\xC3\xA9\xA9", 2},      // one continuation too many
  };
  for (const Bad& b : bad) {
    RegexMatcher m(any);
    EXPECT_EQ(first_rejected(m, b.bytes), b.at) << printable(b.bytes);
  }
  // Complete sequences at the edges are fine; a partial one is a prefix, not a match.
  for (uint32_t cp : {0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xD7FFu, 0xE000u, 0xFFFFu, 0x10000u, 0x10FFFFu}) {
    RegexMatcher m(any);
    EXPECT_TRUE(m.feed(utf8(cp))) << cp;
    EXPECT_TRUE(m.can_finish()) << cp;
  }
  RegexMatcher m(any);
  ASSERT_TRUE(m.feed("\xF0\x9F"));
  EXPECT_FALSE(m.can_finish());
  ASSERT_TRUE(m.feed("\x98"));
  EXPECT_FALSE(m.can_finish());
  ASSERT_TRUE(m.feed("\x80"));
  EXPECT_TRUE(m.can_finish());
}

TEST(RegexUtf8, QuantifiersApplyToWholeCodePoints) {
  const auto re = rx("中文+|é{2}x");
  EXPECT_TRUE(matches(re, "中文"));
  EXPECT_TRUE(matches(re, "中文文文"));
  EXPECT_FALSE(matches(re, "中"));
  EXPECT_FALSE(matches(re, "中文\xE6\x96"));
  EXPECT_TRUE(matches(re, "ééx"));
  EXPECT_FALSE(matches(re, "é\xA9x"));
  RegexMatcher m(re);
  EXPECT_EQ(first_rejected(m, "中文\xE6\x96\x87\xE6\x96"), kAll);
  EXPECT_FALSE(m.can_finish());
  EXPECT_TRUE(m.feed(static_cast<unsigned char>(0x87)));
  EXPECT_TRUE(m.can_finish());
  // A literal emoji with a class of emoji after it, split at every byte.
  const auto emoji = rx("😀[😀-🙏]?");
  const std::string text = "😀🙂";
  RegexMatcher e(emoji);
  for (size_t i = 0; i < text.size(); ++i) {
    EXPECT_EQ(e.can_finish(), i == 4) << i;
    ASSERT_TRUE(e.feed(text.substr(i, 1))) << i;
  }
  EXPECT_TRUE(e.finished());
}

TEST(RegexChoice, ExactlyTheLiterals) {
  const std::vector<std::string> choices = {"a", "ab", "x.y", "(a|b)*", "[]", "\\", "中文", "", "-{2}^$"};
  const auto re = Regex::choice(choices);
  for (const std::string& c : choices) EXPECT_TRUE(matches(re, c)) << c;
  for (const char* other : {"b", "xzy", "aa", "abab", "(a|b)", "[", "\\\\", "中", "--", "-{2}^", "ab ", "a b"})
    EXPECT_FALSE(matches(re, other)) << other;
  RegexMatcher m(re);
  EXPECT_TRUE(m.can_finish());  // "" is a choice
  ASSERT_TRUE(m.feed("a"));
  EXPECT_TRUE(m.can_finish());
  EXPECT_FALSE(m.finished());
  ASSERT_TRUE(m.feed("b"));
  EXPECT_TRUE(m.finished());
  EXPECT_FALSE(m.feed("c"));
  EXPECT_TRUE(m.finished());

  const auto yn = Regex::choice({"yes", "no"});
  EXPECT_EQ(yn->state_count(), 5);  // start, y, ye, n, and one shared end
  EXPECT_THROW(Regex::choice({}), moeserve::UserError);
  EXPECT_THROW(Regex::choice({"ok", "bad\xFF"}), moeserve::UserError);
  EXPECT_THROW(Regex::choice({std::string(kMaxRegexBytes + 1, 'a')}), moeserve::UserError);
}

TEST(RegexChoice, EscapeRoundTrips) {
  std::mt19937 rng(7);
  const std::vector<std::string> extra = {"é", "中", "😀", "\x7F"};
  for (int iter = 0; iter < 500; ++iter) {
    std::string s;
    const size_t n = rng() % 12;
    for (size_t k = 0; k < n; ++k) {
      if (rng() % 5 == 0) s += extra[rng() % extra.size()];
      else s += char(rng() % 128);
    }
    SCOPED_TRACE(printable(s) + " escaped as " + printable(regex_escape(s)));
    const auto re = rx(regex_escape(s));
    RegexMatcher m(re);
    for (size_t i = 0; i < s.size(); ++i) {
      EXPECT_FALSE(m.can_finish());
      ASSERT_TRUE(m.feed(static_cast<unsigned char>(s[i])));
    }
    EXPECT_TRUE(m.finished());
    EXPECT_EQ(re->state_count(), int32_t(s.size() + 1));
    if (!s.empty()) {
      std::string t = s;
      t[rng() % t.size()] ^= 1;
      if (t != s) {
        EXPECT_FALSE(matches(re, t)) << printable(t);
      }
    }
  }
  for (char c : std::string(".^$|?*+()[]{}-\\")) EXPECT_EQ(regex_escape(std::string(1, c)), std::string("\\") + c);
}

TEST(RegexDfa, MinimalSizesWorkedOutByHand) {
  // (yes|no|maybe): start, y, ye, n, m, ma, may, mayb, and one shared accepting end.
  EXPECT_EQ(rx("(yes|no|maybe)")->state_count(), 9);
  EXPECT_EQ(rx("a{3}")->state_count(), 4);
  EXPECT_EQ(rx("[ab]*")->state_count(), 1);
  EXPECT_EQ(rx("(a|b)*a(a|b){3}")->state_count(), 16);  // the last 4 letters: 2^4 states
  EXPECT_EQ(rx("(a|b)*a(a|b){12}")->state_count(), 8192);
  // `.`: start, end, after a 2/3/4-byte lead needing 1, 2 or 3 more (80-BF), after E0 (A0-BF next), ED (80-9F),
  // F0 (90-BF), F4 (80-8F).
  EXPECT_EQ(rx(".")->state_count(), 9);
  EXPECT_EQ(rx("\\d{3}-\\d{4}")->state_count(), 9);
  const auto re = rx("[0-9]+");
  EXPECT_EQ(re->state_count(), 2);
  EXPECT_EQ(re->class_count(), 2);  // digits, and everything else
}

TEST(RegexMatcher, RejectionLeavesTheStateUnchanged) {
  const auto re = rx("ab(c|de)f");
  RegexMatcher m(re);
  ASSERT_TRUE(m.feed("ab"));
  const int32_t s = m.state();
  EXPECT_FALSE(m.feed(static_cast<unsigned char>('x')));
  EXPECT_EQ(m.state(), s);
  EXPECT_FALSE(m.feed("dx"));  // 'd' would be accepted, 'x' is not: all or nothing
  EXPECT_EQ(m.state(), s);
  EXPECT_FALSE(m.feed("cfz"));
  EXPECT_EQ(m.state(), s);
  RegexMatcher copy = m;
  ASSERT_TRUE(copy.feed("def"));
  EXPECT_TRUE(copy.finished());
  EXPECT_EQ(m.state(), s);  // the copy is independent
  ASSERT_TRUE(m.feed("cf"));
  EXPECT_TRUE(m.can_finish());
  EXPECT_TRUE(m.finished());
  m = RegexMatcher(rx("x*"));  // assignment across regexes
  EXPECT_TRUE(m.can_finish());
  EXPECT_FALSE(m.finished());
  EXPECT_TRUE(m.feed("xxx"));
}

TEST(RegexErrors, RefusedConstructsNameThemselvesAndTheirOffset) {
  struct Bad {
    const char* pattern;
    std::vector<const char*> words;
  };
  const Bad bad[] = {
      {"(a)\\1", {"backreference \\1", "offset 3"}},
      {"(a)(b)\\12x", {"backreference \\12", "offset 6"}},
      {"(?P<n>a)(?P=n)", {"backreference (?P=", "offset 8"}},
      {"(?<n>a)\\k<n>", {"backreference \\k", "offset 7"}},
      {"a(?=b)", {"lookahead (?=", "offset 1"}},
      {"a(?!b)", {"lookahead (?!"}},
      {"(?<=a)b", {"lookbehind (?<=", "offset 0"}},
      {"(?<!a)b", {"lookbehind (?<!"}},
      {"(?i)abc", {"inline flags (?i)", "offset 0"}},
      {"x(?im:a)", {"inline flags (?im:", "offset 1"}},
      {"(?-i:a)", {"inline flags"}},
      {"\\bfoo", {"word boundary \\b", "offset 0"}},
      {"a\\B", {"\\B", "offset 1"}},
      {"\\Aa", {"anchor \\A"}},
      {"a\\Z", {"anchor \\Z"}},
      {"a\\z", {"anchor \\z"}},
      {"a*+", {"possessive quantifier *+", "offset 1"}},
      {"a{2}+", {"possessive quantifier {2}+"}},
      {"(?>a)", {"atomic group"}},
      {"(?#note)a", {"comment group"}},
      {"(?(1)a|b)", {"conditional group"}},
      {"(?x)", {"inline flags"}},
      {"(?%)", {"group syntax (?%"}},
      {"(ab", {"never closed", "offset 0"}},
      {"a(b(c)", {"never closed", "offset 1"}},
      {"ab)", {"')'", "offset 2", "closes no group"}},
      {"[ab", {"character class", "never closed", "offset 0"}},
      {"x[]", {"never closed", "offset 1"}},
      {"*a", {"quantifier *", "nothing to repeat", "offset 0"}},
      {"a|+", {"quantifier +", "offset 2"}},
      {"(?:?)", {"quantifier ?", "offset 3"}},
      {"{2}", {"quantifier {2}", "nothing to repeat"}},
      {"^*", {"nothing to repeat", "offset 1"}},
      {"a**", {"quantifier *", "follows another quantifier", "offset 2"}},
      {"a{2}{3}", {"quantifier {3}", "follows another quantifier", "offset 4"}},
      {"a???", {"follows another quantifier"}},
      {"a{3,2}", {"{3,2}", "minimum above its maximum", "offset 1"}},
      {"\\q", {"escape \\q", "invalid", "offset 0"}},
      {"ab\\a", {"escape \\a", "offset 2"}},
      {"a\xFF", {"0xFF", "offset 1", "UTF-8"}},
      {"a\xC3", {"0xC3", "offset 1", "UTF-8"}},
      {"\xED\xA0\x80", {"0xED", "offset 0", "UTF-8"}},
      {"a^b", {"anchor ^", "offset 1"}},
      {"(^a)", {"anchor ^", "offset 1"}},
      {"a$b", {"anchor $", "offset 1"}},
      {"(a$)", {"anchor $", "offset 2"}},
      {"[z-a]", {"range z-a", "reversed", "offset 1"}},
      {"[\\d-z]", {"range \\d-z", "class escape", "offset 1"}},
      {"[a-\\w]", {"range a-\\w"}},
      {"\\x4", {"escape \\x4", "hex"}},
      {"\\xZZ", {"escape \\xZ", "hex"}},
      {"\\u12", {"\\uHHHH"}},
      {"\\uD800", {"lone surrogate", "offset 0"}},
      {"\\uDC00", {"lone surrogate"}},
      {"\\uD83Da", {"lone surrogate"}},
      {"\\u{110000}", {"above U+10FFFF"}},
      {"\\u{}", {"1 to 6 hex digits"}},
      {"\\U00110000", {"above U+10FFFF"}},
      {"\\p{L}", {"Unicode property class \\p", "offset 0"}},
      {"\\P{L}", {"Unicode property class \\P"}},
      {"\\N{DASH}", {"named character"}},
      {"\\cA", {"control escape"}},
      {"[[:alpha:]]", {"POSIX class [:", "offset 1"}},
      {"[\\1]", {"octal escape \\1"}},
      {"\\01", {"octal escape \\01"}},
      {"a\\", {"trailing backslash", "offset 1"}},
      {"(?P<1a>x)", {"named group", "invalid name"}},
      {"(?<>x)", {"named group"}},
      {"[^\\s\\S]", {"matches no string"}},
      {"a{1001}", {"{1001}", "1000"}},
      {"a{2,1001}", {"{2,1001}", "1000"}},
      {"a{99999999999999999999}", {"1000"}},
      {"(a|b)*a(a|b){14}", {"more than 16384", "states"}},
      {"((a{1000}){1000})", {"too large", "200000"}},
      {"(.{1000}){200}", {"too large"}},
  };
  for (const Bad& b : bad) {
    const std::string msg = error_of(b.pattern);
    for (const char* w : b.words)
      EXPECT_NE(msg.find(w), std::string::npos) << printable(b.pattern) << ": '" << w << "' not in: " << msg;
  }
  // An empty set inside an alternative only prunes that alternative.
  EXPECT_TRUE(matches(rx("a|b[^\\s\\S]"), "a"));
  EXPECT_FALSE(matches(rx("a|b[^\\s\\S]"), "b"));
  RegexMatcher m(rx("a|b[^\\s\\S]"));
  EXPECT_FALSE(m.feed("b"));  // exact: no string continues "b"
}

TEST(RegexErrors, Bounds) {
  EXPECT_NE(error_of(std::string(20000, 'a')).find("20000 bytes"), std::string::npos);
  EXPECT_EQ(rx(std::string(16000, 'a'))->state_count(), 16001);
  EXPECT_EQ(rx("a{1000}")->state_count(), 1001);
  EXPECT_EQ(rx("a{0,1000}")->state_count(), 1001);
  EXPECT_NO_THROW(rx("(a|b)*a(a|b){12}"));
  const std::string deep = std::string(kMaxRegexNesting, '(') + "a" + std::string(kMaxRegexNesting, ')');
  EXPECT_TRUE(matches(rx(deep), "a"));
  const std::string deeper = "(" + deep + ")";
  EXPECT_NE(error_of(deeper).find("nested more than"), std::string::npos) << error_of(deeper);
  // Every error is a UserError (the server answers 4xx), never an InternalError.
  EXPECT_THROW(rx("(?=a)"), moeserve::UserError);
  EXPECT_THROW(rx("(a|b)*a(a|b){14}"), moeserve::UserError);
}

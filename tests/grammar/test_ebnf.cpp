// EBNF grammars of regular languages (grammar/ebnf.h): each grammar against a hand-written regular expression of the
// same language on random strings (the expansion must accept exactly what the regex does), Unicode, and the refusals
// (recursion, undefined / repeated rules, syntax) with their positions.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "core/error.h"
#include "grammar/ebnf.h"
#include "grammar/regex_grammar.h"

namespace moeserve::grammar {
namespace {

std::string shown(const std::string& s) {  // printable, for failure messages
  std::string out;
  for (unsigned char c : s) out += c >= 0x20 && c < 0x7f ? std::string(1, char(c)) : "\\x" + std::to_string(int(c));
  return out;
}

bool whole(const std::shared_ptr<const Regex>& re, const std::string& s) {
  RegexMatcher m(re);
  return m.feed(s) && m.can_finish();
}

struct Case {
  const char* grammar;
  const char* regex;      // the same language
  const char* alphabet;   // the random strings' bytes
  std::vector<std::string> accepted;  // a few that must match
};

TEST(Ebnf, RegularGrammarsMatchTheirRegularExpressions) {
  const std::vector<Case> cases = {
      {R"(root ::= "yes" | "no")", "yes|no", "yesno", {"yes", "no"}},
      {"# a greeting\nroot ::= greeting \", \" name \"!\"\ngreeting ::= \"Hello\" | \"Hi\"\nname ::= [A-Z] [a-z]*  # one word\n",
       "(Hello|Hi), [A-Z][a-z]*!", "HeloiAbz, !", {"Hi, Bob!", "Hello, A!"}},
      {"root ::= item (\",\" item){0,3}\nitem ::= [0-9]+ | \"x\"", "([0-9]+|x)(,([0-9]+|x)){0,3}", "0129x,",
       {"1", "x,22,x,3"}},
      {R"(root ::= "\"" [^"\\\n]* "\"")", R"("[^"\\\n]*")", "\"\\\na b", {"\"\"", "\"a b\""}},
      {"root ::= (\"ab\"?)+ \"c\"", "(ab)*c", "abc", {"c", "ababc"}},
      {"root ::=\n  \"a\"\n  | \"b\" rest\nrest ::= [x-z]{2,}", "a|b[x-z]{2,}", "abxyzw", {"a", "bxy", "bzzzz"}},
      {R"(root ::= "\x41\u00e9" [\t\-a] 'q')", "A\u00e9[\\t\\-a]q", "A\xc3\xa9\t-aq", {"A\xc3\xa9-q"}},
      // Rules that repeat themselves at the end (right recursion, an optional tail group too) or at the start.
      {"root ::= list\nlist ::= item (\",\" list)?\nitem ::= [a-c]+", "[a-c]+(,[a-c]+)*", "abc,", {"a", "ab,c,cc"}},
      {"root ::= \"a\" root | \"b\" | \"c\" root", "[ac]*b", "abc", {"b", "acab"}},
      {"root ::= root \"x\" | \"y\" | root \"z\"", "y[xz]*", "xyz", {"y", "yxzx"}},
      {"root ::= digit root?\ndigit ::= [0-9]", "[0-9]+", "019a", {"7", "2024"}},
      {"root ::= root | \"q\"", "q", "qx", {"q"}},
  };
  std::mt19937 g(11);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.grammar);
    const auto ebnf = compile_ebnf(c.grammar);
    const auto re = Regex::compile(c.regex);
    for (const std::string& s : c.accepted) EXPECT_TRUE(whole(ebnf, s)) << s;
    const std::string alphabet = c.alphabet;
    int matched = 0;
    for (int i = 0; i < 5000; ++i) {
      std::string s;
      const int n = int(g() % 12);
      for (int k = 0; k < n; ++k) s += alphabet[g() % alphabet.size()];
      if (i % 4 == 0 && !c.accepted.empty()) s = c.accepted[g() % c.accepted.size()] + (i % 8 ? "" : s);
      const bool want = whole(re, s);
      ASSERT_EQ(whole(ebnf, s), want) << shown(s);
      matched += want;
    }
    EXPECT_GT(matched, 100);
  }
}

TEST(Ebnf, UnicodeLiteralsAndRanges) {
  const auto re = compile_ebnf("root ::= \"\xe4\xb8\xad\" [\\u4E00-\\u9FFF]+ [^\\u4E00-\\u9FFF]?");
  EXPECT_TRUE(whole(re, "\xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97"));       // 中文字
  EXPECT_TRUE(whole(re, "\xe4\xb8\xad\xe6\x96\x87!"));
  EXPECT_FALSE(whole(re, "\xe4\xb8\xad"));
  EXPECT_FALSE(whole(re, "\xe4\xb8\xad!"));
}

// Each refusal is a UserError whose message holds the words an author needs (and the line of the fault).
TEST(Ebnf, RefusalsNameTheFault) {
  std::vector<std::pair<const char*, std::vector<const char*>>> bad = {
      {"root ::= \"(\" root \")\" | \"x\"", {"refers to itself", "root -> root", "recursive"}},
      {"root ::= \"a\" root | root \"b\" | \"c\"", {"both at the start and at the end"}},
      {"root ::= \"a\" root", {"never ends"}},
      {"root ::= x\nx ::= \"a\" y | \"c\"\ny ::= \"b\" x", {"x -> y -> x"}},
      {"root ::= a\na ::= \"x\" b\nb ::= a", {"line 3", "a -> b -> a"}},
      {"root ::= missing", {"`missing` is not defined"}},
      {"root ::= \"a\"\nroot ::= \"b\"", {"defined twice", "line 2"}},
      {"item ::= \"a\"", {"no `root` rule"}},
      {"", {"no rules"}},
      {"root ::= \"abc", {"not closed"}},
      {"root ::= (\"a\" | \"b\"", {"not closed"}},
      {"root ::= [a-", {"not closed"}},
      {"root ::= [z-a]", {"reversed"}},
      {"root ::= \"a\"{3,2}", {"reversed"}},
      {"root ::= \"a\"{2000}", {"above 1000"}},
      {"root ::= \"\\q\"", {"\\q is not supported"}},
      {"root = \"a\"", {"`::=` was expected"}},
      {"root ::= \"a\" ) \"b\"", {"line 1"}},
      {"root ::= []", {"empty character class"}},
  };
  std::string chain = "root ::= r0\n";  // 300 rules, each the next one: deeper than the expansion goes
  for (int i = 0; i < 300; ++i) chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
  chain += "r300 ::= \"x\"\n";
  bad.push_back({chain.c_str(), {"more than 256 deep"}});
  for (const auto& [g, words] : bad) {
    try {
      compile_ebnf(g);
      ADD_FAILURE() << "accepted: " << g;
    } catch (const UserError& e) {
      for (const char* w : words)
        EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << g << " -> " << e.what() << " (wanted " << w << ")";
    }
  }
}

}  // namespace
}  // namespace moeserve::grammar

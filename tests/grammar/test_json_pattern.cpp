// JSON Schema `pattern` and `format` on strings: std::regex (ECMAScript, regex_search: JSON Schema's semantics) on
// the decoded value as the oracle for random values written with random escapes; prefix exactness both ways (random
// walks over the accepted bytes never dead-end and every completion satisfies the oracle; a rejected byte has no
// completion among brute-force extensions); escapes decided at the right hex digit; pattern with minLength /
// maxLength, enum, anyOf and objects; formats on hand-written values; the plain-string fast path turned off.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/grammar_test_util.h"
#include "grammar/json_grammar.h"

using namespace moeserve::grammar;
using json = nlohmann::ordered_json;

namespace {

using test_util::kAll;

#ifdef __GLIBCXX__
constexpr auto kOracleSyntax = std::regex::ECMAScript | std::regex_constants::__polynomial;
#else
constexpr auto kOracleSyntax = std::regex::ECMAScript;
#endif

std::shared_ptr<const JsonSchema> schema(std::string_view text) { return JsonSchema::compile(json::parse(text)); }

std::shared_ptr<const JsonSchema> string_schema(const std::string& pattern, int min_len = -1, int max_len = -1) {
  json s = {{"type", "string"}, {"pattern", pattern}};
  if (min_len >= 0) s["minLength"] = min_len;
  if (max_len >= 0) s["maxLength"] = max_len;
  return JsonSchema::compile(s);
}

using test_util::first_rejected;

bool accepts(const std::shared_ptr<const JsonSchema>& s, std::string_view text) {
  JsonMatcher m(s);
  return first_rejected(m, text) == kAll && m.can_finish();
}

::testing::AssertionResult valid(const std::shared_ptr<const JsonSchema>& s, std::string_view text) {
  JsonMatcher m(s);
  const size_t got = first_rejected(m, text);
  if (got != kAll) return ::testing::AssertionFailure() << text << ": byte " << got << " rejected";
  if (!m.can_finish()) return ::testing::AssertionFailure() << text << ": incomplete";
  return ::testing::AssertionSuccess();
}

using test_util::rejected_at;

// Rejected exactly at the last byte.
::testing::AssertionResult rejected_last(const std::shared_ptr<const JsonSchema>& s, std::string_view text) {
  return rejected_at(s, text, text.size() - 1);
}

JsonMatcher after(const std::shared_ptr<const JsonSchema>& s, std::string_view prefix) {
  JsonMatcher m(s);
  EXPECT_EQ(first_rejected(m, prefix), kAll) << prefix;
  return m;
}

size_t code_points(const std::string& utf8) {
  return size_t(std::count_if(utf8.begin(), utf8.end(), [](char c) { return (uint8_t(c) & 0xC0) != 0x80; }));
}

using test_util::utf8;

std::string hex4(uint32_t v, bool upper) {
  char buf[8];
  std::snprintf(buf, sizeof buf, upper ? "%04X" : "%04x", v);
  return buf;
}

// A JSON string literal for code points, each written raw, as a short escape or as \u (a pair above U+FFFF),
// picked at random among the ways JSON allows.
std::string encode(const std::vector<uint32_t>& cps, std::mt19937& rng) {
  std::string out = "\"";
  for (uint32_t cp : cps) {
    const char* short_esc = cp == '"' ? "\\\"" : cp == '\\' ? "\\\\" : cp == '/' ? "\\/" : cp == '\b' ? "\\b"
                          : cp == '\f' ? "\\f" : cp == '\n' ? "\\n" : cp == '\r' ? "\\r" : cp == '\t' ? "\\t" : nullptr;
    const bool raw_ok = cp >= 0x20 && cp != '"' && cp != '\\';
    const int way = int(rng() % 3);
    if (raw_ok && (way == 0 || (way == 1 && !short_esc))) {
      out += utf8(cp);
    } else if (short_esc && way != 2) {
      out += short_esc;
    } else if (cp < 0x10000) {
      out += "\\u" + hex4(cp, rng() % 2);
    } else {
      const uint32_t v = cp - 0x10000;
      out += "\\u" + hex4(0xD800 + (v >> 10), rng() % 2) + "\\u" + hex4(0xDC00 + (v & 0x3FF), rng() % 2);
    }
  }
  return out + "\"";
}

// UTF-8 (valid) to UTF-32: std::wregex then sees code points, as JSON Schema's pattern does (std::regex would see
// bytes: [\s\S]{2} would match one two-byte character).
std::wstring wide(std::string_view s) {
  std::wstring out;
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = uint8_t(s[i]);
    const int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1Fu : n == 3 ? c & 0x0Fu : c & 0x07u;
    for (int k = 1; k < n && i + size_t(k) < s.size(); ++k) cp = cp << 6 | (uint8_t(s[i + size_t(k)]) & 0x3Fu);
    out += wchar_t(cp);
    i += size_t(n);
  }
  return out;
}

std::wregex oracle_regex(const std::string& pattern) { return std::wregex(wide(pattern), kOracleSyntax); }

// The oracle: the document parses as a JSON string whose value the ECMAScript pattern finds (and within bounds).
struct Oracle {
  std::wregex re;
  int min_len = -1, max_len = -1;
  bool operator()(std::string_view doc) const {
    json v;
    try {
      v = json::parse(doc);
    } catch (const json::exception&) {
      return false;
    }
    if (!v.is_string()) return false;
    const std::string value = v.get<std::string>();
    const size_t n = code_points(value);
    if (min_len >= 0 && n < size_t(min_len)) return false;
    if (max_len >= 0 && n > size_t(max_len)) return false;
    return std::regex_search(wide(value), re);
  }
};

struct PatternCase {
  std::string pattern;  // both ours and ECMAScript's (no `.`, no multi-byte classes: std::regex works on bytes)
  std::vector<uint32_t> alphabet;
  int min_len = -1, max_len = -1;
};

std::vector<PatternCase> pattern_cases() {
  const std::vector<uint32_t> abc = {'a', 'b', 'c', 'x'};
  const std::vector<uint32_t> mixed = {'a', 'b', 'A', 'F', '1', '"', '\\', '\n', '/', 0xE9, 0x20AC, 0x1F600, 0x01};
  return {
      {"abc", abc},
      {"^a+", abc},
      {"b$", abc},
      {"x|^b|c$", abc},
      {"^(ab|ba)+c?$", abc},
      {"^[a-c]*$", {'a', 'c', 'x', 0xE9}},
      {"^\\d{2,4}$", {'1', '2', 'a'}},
      {"\\n", mixed},
      {"^[^\\n]*$", mixed},
      {"^[^\\n\"]+$", mixed},
      {"\\\\", mixed},
      {"^\"[a-b]+\"$", {'"', 'a', 'b'}},
      {"\xC3\xA9", mixed},
      {"^(?:\xF0\x9F\x98\x80|A)+$", mixed},
      {"^[A-F]{2}\\/?$", {'A', 'F', '/', '1'}},
      {"^\\w+@\\w+$", {'a', '1', '@', '_', '.'}},
      {"^\\s*$", {' ', '\t', '\n', '\r', 'a'}},
      {"", mixed},
      {"^$", mixed},
      {"(a|b)*c(a|b){2}$", abc},
      // With length bounds.
      {"[0-9]", {'a', '1', 0xE9}, -1, 3},
      {"^(ab)*$", {'a', 'b'}, 3, 5},
      {"^a*b*$", {'a', 'b', 0x1F600}, 2, 4},
      {"c", abc, 4, -1},
      {"^[\\s\\S]*a[\\s\\S]{2}$", {'a', 'b', 0xE9}, 1, 6},
  };
}

std::vector<uint32_t> random_value(const std::vector<uint32_t>& alphabet, std::mt19937& rng, size_t max_len = 8) {
  std::vector<uint32_t> v;
  for (size_t n = rng() % (max_len + 1); n > 0; --n) v.push_back(alphabet[rng() % alphabet.size()]);
  return v;
}

}  // namespace

TEST(JsonPattern, SearchSemanticsByHand) {
  auto s = string_schema("abc");  // contains abc
  EXPECT_TRUE(valid(s, R"("abc")"));
  EXPECT_TRUE(valid(s, R"("xxabcyy")"));
  EXPECT_TRUE(rejected_last(s, R"("ab")"));
  EXPECT_TRUE(rejected_last(s, R"("acb")"));
  s = string_schema("^a+");  // starts with a+
  EXPECT_TRUE(valid(s, R"("aaxyz")"));
  EXPECT_TRUE(rejected_last(s, R"("b)"));
  EXPECT_TRUE(rejected_last(s, R"("")"));
  s = string_schema("b$");  // ends with b
  EXPECT_TRUE(valid(s, R"("aab")"));
  EXPECT_TRUE(rejected_last(s, R"("aba")"));
  s = string_schema("^\\d+$");
  EXPECT_TRUE(valid(s, R"("0123")"));
  EXPECT_TRUE(rejected_last(s, R"("12a)"));
  s = string_schema("^a|b$");  // starts with a, or ends with b
  EXPECT_TRUE(valid(s, R"("axx")"));
  EXPECT_TRUE(valid(s, R"("xxb")"));
  EXPECT_TRUE(rejected_last(s, R"("xa")"));
  s = string_schema("");  // anything
  EXPECT_TRUE(valid(s, R"("")"));
  EXPECT_TRUE(valid(s, R"("any \n thing")"));
  s = string_schema("^$");  // only the empty string
  EXPECT_TRUE(valid(s, R"("")"));
  EXPECT_TRUE(rejected_last(s, R"("a)"));
  EXPECT_TRUE(rejected_last(s, R"("\)"));  // no code point can come: no escape either
  s = string_schema("a\\$");  // an escaped $ is a literal: contains "a$"
  EXPECT_TRUE(valid(s, R"("xa$y")"));
  EXPECT_TRUE(rejected_last(s, R"("xa")"));
  s = string_schema("\\\\$");  // ends with a backslash (the $ is an anchor)
  EXPECT_TRUE(valid(s, R"("x\\")"));
  EXPECT_TRUE(rejected_last(s, R"("\\x")"));
  s = string_schema("^[^\\n]*$");
  EXPECT_TRUE(valid(s, "\"caf\xC3\xA9 \\t\""));
}

// The value is what the pattern sees: escapes decoded, each refused at the first byte after which no completion of
// the escape can give a code point the pattern takes.
TEST(JsonPattern, EscapesDecodeToTheValue) {
  auto s = string_schema("^A+$");
  EXPECT_TRUE(valid(s, R"("\u0041A\u0041")"));
  EXPECT_TRUE(rejected_last(s, R"("\u0042)"));
  EXPECT_TRUE(rejected_last(s, R"("\u1)"));   // U+1000..U+1FFF: none is A
  EXPECT_TRUE(rejected_last(s, R"("\n)"));
  EXPECT_TRUE(rejected_last(s, R"("\uD)"));  // D000-D7FF and the supplementary planes: no A there
  s = string_schema("^[^\\n]*$");
  EXPECT_TRUE(valid(s, R"("a\tb\"c\u000A")") == false);
  EXPECT_TRUE(rejected_last(s, R"("a\n)"));
  EXPECT_TRUE(rejected_last(s, R"("a\u000a)"));
  EXPECT_TRUE(rejected_last(s, R"("a\u000A)"));
  EXPECT_TRUE(valid(s, R"("a\u000b\r\"")"));
  s = string_schema("^\xC3\xA9+$");  // é
  EXPECT_TRUE(valid(s, "\"\\u00e9\xC3\xA9\\u00E9\""));
  EXPECT_TRUE(rejected_last(s, R"("\u00e8)"));
  EXPECT_TRUE(rejected_last(s, "\"\xC3\xA8"));
  s = string_schema("^\xF0\x9F\x98\x80$");  // U+1F600, a surrogate pair when escaped
  EXPECT_TRUE(valid(s, R"("\ud83d\ude00")"));
  EXPECT_TRUE(valid(s, R"("\uD83D\uDE00")"));
  EXPECT_TRUE(valid(s, "\"\xF0\x9F\x98\x80\""));
  EXPECT_TRUE(rejected_last(s, R"("\ud83e)"));         // a high half of other planes
  EXPECT_TRUE(rejected_last(s, R"("\ud83d\ude01)"));   // the wrong low half
  EXPECT_TRUE(rejected_last(s, R"("\ud83d\ude1)"));
  EXPECT_TRUE(rejected_last(s, R"("\u0)"));             // no BMP code point, no pair
  EXPECT_TRUE(rejected_last(s, "\"\xF0\x9F\x98\x81"));
  s = string_schema("^[0-9]*$");
  EXPECT_TRUE(valid(s, R"("1\u00330")"));
  EXPECT_TRUE(rejected_last(s, R"("\u004)"));
  EXPECT_TRUE(rejected_last(s, R"("\")"));  // \" is a quote in the value
  s = string_schema("^\"\\\\/$");  // the value "\/ : a quote, a backslash, a slash
  EXPECT_TRUE(valid(s, R"("\"\\\/")"));
  EXPECT_TRUE(valid(s, R"("\u0022\u005c/")"));
  EXPECT_TRUE(rejected_last(s, R"("\\)"));
}

// Random values from small alphabets, each code point written raw or escaped at random: the whole document is
// accepted iff the oracle says so, and both verdicts occur.
TEST(JsonPattern, RandomValuesAgreeWithStdRegex) {
  std::mt19937 rng(7);
  int yes = 0, no = 0;
  for (const PatternCase& pc : pattern_cases()) {
    const auto s = string_schema(pc.pattern, pc.min_len, pc.max_len);
    const Oracle oracle{oracle_regex(pc.pattern), pc.min_len, pc.max_len};
    int case_yes = 0;
    for (int iter = 0; iter < 400; ++iter) {
      const std::string doc = encode(random_value(pc.alphabet, rng), rng);
      const bool want = oracle(doc);
      ASSERT_EQ(accepts(s, doc), want) << pc.pattern << " on " << doc;
      (want ? case_yes : no) += 1;
      // nlohmann's own serialization (escapes only where needed, or every non-ASCII code point escaped).
      const std::string value = json::parse(doc).get<std::string>();
      for (bool ascii : {false, true}) {
        const std::string text = json(value).dump(-1, ' ', ascii);
        ASSERT_EQ(accepts(s, text), want) << pc.pattern << " on " << text;
      }
    }
    yes += case_yes;
    if (pc.pattern != "^$") {
      EXPECT_GT(case_yes, 0) << pc.pattern;
    }
  }
  EXPECT_GT(yes, 2000);
  EXPECT_GT(no, 2000);
}

// Exactness from the inside: random walks over the accepted bytes never reach a state that is neither complete nor
// continuable, and every completed document satisfies the oracle. From the outside: a byte the matcher rejects
// after an accepted prefix is followed by no completion among the extensions of up to 3 bytes over the bytes that
// matter here (the brute force cannot see longer ones: a partial check, but one that fails on over-eager refusals).
TEST(JsonPattern, PrefixExactness) {
  std::mt19937 rng(11);
  int completed = 0, refusals = 0;
  for (const PatternCase& pc : pattern_cases()) {
    const auto s = string_schema(pc.pattern, pc.min_len, pc.max_len);
    const Oracle oracle{oracle_regex(pc.pattern), pc.min_len, pc.max_len};
    // Walks.
    for (int walk = 0; walk < 20; ++walk) {
      JsonMatcher m(s);
      std::string doc;
      for (int step = 0; step < 60; ++step) {
        const std::vector<unsigned char> ok = test_util::accepted_bytes(m);
        ASSERT_TRUE(!ok.empty() || m.can_finish()) << pc.pattern << ": dead end after " << doc;
        if (m.can_finish()) {
          ASSERT_TRUE(oracle(doc)) << pc.pattern << ": complete but invalid: " << doc;
          ++completed;
          break;
        }
        // Prefer the closing quote late in the walk, so that walks end.
        unsigned char c = ok[rng() % ok.size()];
        if (step > 10 && std::find(ok.begin(), ok.end(), '"') != ok.end() && doc.size() > 0 && rng() % 3 == 0) c = '"';
        ASSERT_TRUE(m.feed(c));
        doc += char(c);
      }
    }
    // Refusals after prefixes of random documents: a sample of them checked against the brute force, over the
    // bytes that can matter here (JSON's escape bytes and the alphabet's).
    std::string ext = "\"\\u0D";
    for (uint32_t cp : pc.alphabet)
      for (char b : utf8(cp))
        if (ext.find(b) == std::string::npos) ext += b;
    std::vector<std::string> refused;
    for (int iter = 0; iter < 12; ++iter) {
      const std::string doc = encode(random_value(pc.alphabet, rng, 5), rng);
      JsonMatcher m(s);
      for (size_t i = 0; i < doc.size(); ++i) {
        for (char c : ext) {
          JsonMatcher x = m;
          if (!x.feed(static_cast<unsigned char>(c))) refused.push_back(doc.substr(0, i) + c);
        }
        if (!m.feed(static_cast<unsigned char>(doc[i]))) break;
      }
    }
    std::shuffle(refused.begin(), refused.end(), rng);
    refused.resize(std::min<size_t>(refused.size(), 12));
    std::vector<std::string> exts = {""};
    for (size_t len = 0; len < 3; ++len) {
      const size_t from = exts.size();
      for (size_t k = 0; k < from; ++k)
        if (exts[k].size() == len)
          for (char e : ext) exts.push_back(exts[k] + e);
    }
    for (const std::string& base : refused) {
      ++refusals;
      for (const std::string& e : exts)
        ASSERT_FALSE(oracle(base + e)) << pc.pattern << ": refused the last byte of " << base << ", but " << base + e
                                       << " is valid";
    }
  }
  EXPECT_GT(completed, 300);  // 354 of 500 walks with this seed
  EXPECT_GT(refusals, 200);
}

TEST(JsonPattern, PatternAndLengths) {
  // At most 3 code points and some digit: after two non-digits, only a digit.
  auto s = string_schema("[0-9]", -1, 3);
  EXPECT_TRUE(valid(s, R"("ab7")"));
  EXPECT_TRUE(rejected_last(s, R"("abc)"));
  EXPECT_TRUE(rejected_last(s, R"("ab\n)"));
  EXPECT_TRUE(rejected_at(s, R"("ab\u0061)", 7));  // U+0060-U+006F: no digit among them
  EXPECT_TRUE(valid(s, R"("ab\u0037")"));
  EXPECT_TRUE(rejected_last(s, R"("ab\u0037x)"));
  // An even count of code points (ab)*, 3 to 5 of them: exactly "abab".
  s = string_schema("^(ab)*$", 3, 5);
  EXPECT_TRUE(valid(s, R"("abab")"));
  EXPECT_TRUE(rejected_last(s, R"("ab")"));
  EXPECT_TRUE(rejected_last(s, R"("ababa)"));
  // A minimum the pattern must reach: "c" somewhere, 4 code points at least.
  s = string_schema("c", 4);
  EXPECT_TRUE(rejected_last(s, R"("abc")"));
  EXPECT_TRUE(valid(s, R"("abcd")"));
  // No string satisfies both: a UserError at the root; an optional property or anyOf branch is pruned.
  EXPECT_THROW(string_schema("^a{5}$", -1, 3), moeserve::UserError);
  EXPECT_THROW(string_schema("^(ab)+$", 3, 3), moeserve::UserError);
  auto obj = schema(R"({"type": "object", "properties": {"x": {"type": "string", "pattern": "^a{5}$",
                        "maxLength": 3}, "y": {"type": "integer"}}})");
  EXPECT_TRUE(valid(obj, R"({"y":1})"));
  EXPECT_TRUE(rejected_at(obj, R"({"x":"a"})", 2));
  auto any = schema(R"({"anyOf": [{"type": "string", "pattern": "^a{5}$", "maxLength": 3}, {"type": "null"}]})");
  EXPECT_TRUE(valid(any, "null"));
  EXPECT_TRUE(rejected_at(any, R"("a")", 0));
  // Code points, not bytes: maxLength 2 with emoji.
  s = string_schema("^\xF0\x9F\x98\x80+$", -1, 2);
  EXPECT_TRUE(valid(s, "\"\xF0\x9F\x98\x80\\ud83d\\ude00\""));
  EXPECT_TRUE(rejected_last(s, "\"\xF0\x9F\x98\x80\\ud83d\\ude00\xF0"));
  EXPECT_TRUE(rejected_last(s, "\"\xF0\x9F\x98\x80\\ud83d\\ude00\\"));
}

TEST(JsonPattern, EnumAndConstFilteredByPattern) {
  auto s = schema(R"({"type": "string", "pattern": "^[a-z]+$", "enum": ["abc", "ABC", "x1", "zz", 3]})");
  EXPECT_TRUE(valid(s, R"("abc")"));
  EXPECT_TRUE(valid(s, R"("zz")"));
  EXPECT_TRUE(rejected_at(s, R"("ABC")", 1));
  EXPECT_TRUE(rejected_at(s, R"("x1")", 1));
  EXPECT_TRUE(rejected_at(s, "3", 0));
  EXPECT_THROW(schema(R"({"type": "string", "pattern": "^a", "const": "ba"})"), moeserve::UserError);
  s = schema(R"({"type": "string", "format": "date", "enum": ["2024-02-30", "2024-13-01", "nope"]})");
  EXPECT_TRUE(valid(s, R"("2024-02-30")"));  // the date pattern does not check days per month
  EXPECT_TRUE(rejected_at(s, R"("2024-13-01")", 6));
}

// Strings with patterns inside objects and anyOf: each alternative carries its own DFA state.
TEST(JsonPattern, ObjectsAndAlternatives) {
  auto s = schema(R"({"type": "object", "properties": {
      "id": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
      "tag": {"pattern": "x"},
      "when": {"type": "string", "format": "date-time"}}, "required": ["id"]})");
  EXPECT_TRUE(valid(s, R"({"id":"AB-123","tag":"axb","when":"2024-05-01T12:30:00.5+02:00"})"));
  EXPECT_TRUE(valid(s, R"({"id": "ZZ-000"})"));
  EXPECT_TRUE(rejected_at(s, R"({"id":"A1)", 8));
  EXPECT_TRUE(rejected_at(s, R"({"id":"AB-123","tag":"ab")", 24));
  EXPECT_TRUE(rejected_at(s, R"({"id":"AB-123","tag":1})", 21));  // pattern implies a string
  auto alt = schema(R"({"anyOf": [{"type": "string", "pattern": "^a+b$"}, {"type": "string", "pattern": "^a+c$"},
                        {"type": "string", "pattern": "^\\d+$"}]})");
  EXPECT_TRUE(valid(alt, R"("aab")"));
  EXPECT_TRUE(valid(alt, R"("aaac")"));
  EXPECT_TRUE(valid(alt, R"("42")"));
  EXPECT_TRUE(rejected_last(alt, R"("aa")"));
  EXPECT_TRUE(rejected_last(alt, R"("aad)"));
  EXPECT_TRUE(rejected_last(alt, R"("4a)"));
  EXPECT_TRUE(rejected_last(alt, R"("abc)"));
  // A pattern under a type list, beside other types.
  auto list = schema(R"({"type": ["string", "integer"], "pattern": "^ok"})");
  EXPECT_TRUE(valid(list, R"("okay")"));
  EXPECT_TRUE(valid(list, "17"));
  EXPECT_TRUE(rejected_at(list, R"("no)", 1));
  // Arrays of patterned strings.
  auto arr = schema(R"({"type": "array", "items": {"type": "string", "pattern": "^v\\d$"}, "maxItems": 2})");
  EXPECT_TRUE(valid(arr, R"(["v1","v2"])"));
  EXPECT_TRUE(rejected_at(arr, R"(["v1","x"])", 7));
}

TEST(JsonPattern, Formats) {
  const std::vector<std::tuple<std::string, std::vector<std::string>, std::vector<std::string>>> cases = {
      {"date", {"2024-01-31", "1999-12-01", "0000-10-10"}, {"2024-1-31", "2024-00-10", "2024-13-01", "2024-01-32",
                                                            "2024-01-00", "24-01-01", "2024-01-01T", "2024/01/01"}},
      {"time", {"23:59:60Z", "00:00:00z", "12:30:45.123+05:30", "01:02:03-00:00"},
       {"24:00:00Z", "12:60:00Z", "12:30:45", "12:30:45.Z", "12:30:45+5:30", "12:30Z"}},
      {"date-time", {"2024-05-01T12:30:00Z", "2024-05-01t12:30:00.000001-08:00"},
       {"2024-05-01 12:30:00Z", "2024-05-01T12:30:00", "2024-05-01", "2024-05-32T00:00:00Z"}},
      {"uuid", {"123e4567-e89b-12d3-a456-426614174000", "ABCDEF00-0000-0000-0000-000000000000"},
       {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400", "g23e4567-e89b-12d3-a456-426614174000"}},
      {"email", {"a@b.co", "first.last+tag@sub.example.org"}, {"ab.co", "a@b", "a b@c.d", "a@@b.c", "@b.c"}},
      {"ipv4", {"0.0.0.0", "255.255.255.255", "192.168.1.10"}, {"256.1.1.1", "1.2.3", "01.2.3.4", "1.2.3.4.5", "a.b.c.d"}},
      {"hostname", {"example.com", "a", "x-1.y", std::string(63, 'a') + ".b"},
       {"-a.com", "a-.com", "a..b", "a_b", std::string(64, 'a'), ""}},
  };
  for (const auto& [format, good, bad] : cases) {
    const auto s = JsonSchema::compile({{"type", "string"}, {"format", format}});
    for (const std::string& v : good) EXPECT_TRUE(valid(s, json(v).dump())) << format;
    for (const std::string& v : bad) EXPECT_FALSE(accepts(s, json(v).dump())) << format << ": " << v;
  }
  // A pattern of its own wins over the format; unknown formats and formats on other types are ignored.
  EXPECT_TRUE(accepts(schema(R"({"type": "string", "format": "date", "pattern": "^x$"})"), R"("x")"));
  EXPECT_TRUE(accepts(schema(R"({"type": "string", "format": "ipv6"})"), R"("anything")"));
  EXPECT_TRUE(accepts(schema(R"({"type": "string", "format": "made-up"})"), R"("anything")"));
  EXPECT_TRUE(accepts(schema(R"({"type": "integer", "format": "int64"})"), "12"));
  EXPECT_TRUE(accepts(schema(R"({"format": "date"})"), "12"));  // no type: an annotation
  // A format with a length bound: both.
  const auto bounded = schema(R"({"type": "string", "format": "ipv4", "maxLength": 9})");
  EXPECT_TRUE(valid(bounded, R"("10.0.0.1")"));
  EXPECT_TRUE(valid(bounded, R"("10.0.0.12")"));
  EXPECT_TRUE(valid(bounded, R"("10.10.1.1")"));
  EXPECT_TRUE(rejected_last(bounded, R"("10.10.10)"));  // 8 code points: no room for ".d"
  EXPECT_TRUE(rejected_at(bounded, R"("100.100.)", 6));  // "100.10" leaves no room for ".d.d"
}

// The plain-string fast path assumes any plain content is accepted: never inside a string with a pattern.
TEST(JsonPattern, PlainStringFastPathOff) {
  const auto s = schema(R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"},
                            "b": {"type": "string"}}})");
  const JsonMatcher in_a = after(s, R"({"a":"x)");
  EXPECT_FALSE(in_a.in_plain_string(1));
  EXPECT_EQ(in_a.plain_string_room(), -1);
  const JsonMatcher in_b = after(s, R"({"a":"x","b":"y)");
  EXPECT_TRUE(in_b.in_plain_string(8));
  EXPECT_EQ(in_b.plain_string_room(), INT32_MAX);
  // Mixed alternatives: one with a pattern makes the state not plain.
  const auto mix = schema(R"({"anyOf": [{"type": "string"}, {"type": "string", "pattern": "z"}]})");
  EXPECT_FALSE(after(mix, "\"ab").in_plain_string(1));
  EXPECT_EQ(after(mix, "\"ab").plain_string_room(), -1);
}

TEST(JsonPattern, RejectionLeavesStateUnchanged) {
  const auto s = string_schema("^\xF0\x9F\x98\x80*[a-c]{1,3}$", -1, 4);
  for (const std::string prefix : {"\"", "\"\\ud83d", "\"\\ud83d\\ude00a", "\"\xF0\x9F", "\"\\u00", "\"ab"}) {
    JsonMatcher m = after(s, prefix);
    const JsonMatcher before = m;
    for (int c = 0; c < 256; ++c) {
      JsonMatcher x = m;
      if (x.feed(static_cast<unsigned char>(c))) continue;
      for (int d = 0; d < 256; ++d) {
        JsonMatcher y = m, z = before;
        ASSERT_EQ(y.feed(static_cast<unsigned char>(d)), z.feed(static_cast<unsigned char>(d))) << prefix << " " << c;
      }
      ASSERT_EQ(x.can_finish(), before.can_finish());
      break;
    }
  }
}

TEST(JsonPattern, SchemaErrors) {
  auto message = test_util::schema_error;
  auto has = [](const std::string& msg, std::string_view part) { return msg.find(part) != std::string::npos; };
  std::string m = message(R"({"type": "string", "pattern": 3})");
  EXPECT_TRUE(has(m, "\"pattern\"") && has(m, "must be a string")) << m;
  m = message(R"({"properties": {"p": {"type": "string", "pattern": "(a"}}})");
  EXPECT_TRUE(has(m, "\"pattern\"") && has(m, "#/properties/p")) << m;
  m = message(R"j({"type": "string", "pattern": "(^a)"})j");
  EXPECT_TRUE(has(m, "anchor")) << m;
  m = message(R"({"type": "string", "pattern": "(a)\\1"})");
  EXPECT_TRUE(has(m, "\"pattern\"")) << m;
  m = message(R"({"type": "string", "pattern": "^a{5}$", "maxLength": 3})");
  EXPECT_TRUE(has(m, "no JSON value") && has(m, "pattern")) << m;
  m = message(R"({"anyOf": [{"type": "string"}], "pattern": "a"})");
  EXPECT_TRUE(has(m, "anyOf") && has(m, "pattern")) << m;
  // A length table too large to build.
  m = message(R"({"type": "string", "pattern": "^[\\s\\S]{0,1000}$", "minLength": 100000})");
  EXPECT_TRUE(has(m, "too large")) << m;
  EXPECT_EQ(message(R"({"type": "string", "pattern": "a$|^b"})"), "no UserError");
}

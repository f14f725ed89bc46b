// The tokenizer's parts on their own: split patterns, pre-tokenizer behaviours, Unicode helpers. Expectations
// come from the semantics of Hugging Face tokenizers / Oniguruma (and, where noted, from their documentation).
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/pattern.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace moeserve::tok {
namespace {

std::vector<std::string> split_with(const Pattern& p, const std::string& s) {
  std::vector<Span> spans;
  p.find_all(s, spans);
  std::vector<std::string> out;
  for (auto [b, e] : spans) out.push_back(s.substr(b, e - b));
  return out;
}

using Strings = std::vector<std::string>;

TEST(SplitPattern, Qwen2RegexPiecesFollowOniguruma) {
  auto p = make_gpt4_split_pattern(1);
  EXPECT_EQ(split_with(*p, "Hello world"), (Strings{"Hello", " world"}));
  EXPECT_EQ(split_with(*p, "I'm THEY'RE it's"), (Strings{"I", "'m", " THEY", "'RE", " it", "'s"}));
  // A contraction wins over letters that follow it ('s|'t... come first in the alternation).
  EXPECT_EQ(split_with(*p, "'sound"), (Strings{"'s", "ound"}));
  // Case-insensitive 's also matches U+017F LONG S, which case-folds to 's'.
  EXPECT_EQ(split_with(*p, "'\u017ftuff"), (Strings{"'\u017f", "tuff"}));
  EXPECT_EQ(split_with(*p, "12345"), (Strings{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(split_with(*p, "a  b"), (Strings{"a", " ", " b"}));
  EXPECT_EQ(split_with(*p, "a   \n\n  b"), (Strings{"a", "   \n\n", " ", " b"}));
  EXPECT_EQ(split_with(*p, "x   "), (Strings{"x", "   "}));
  EXPECT_EQ(split_with(*p, "...!!\n\nx"), (Strings{"...!!\n\n", "x"}));
  EXPECT_EQ(split_with(*p, " ...x"), (Strings{" ...", "x"}));
  EXPECT_EQ(split_with(*p, "$hello (world"), (Strings{"$hello", " (", "world"}));
  EXPECT_EQ(split_with(*p, "\thi\nthere"), (Strings{"\thi", "\n", "there"}));
  // U+0085 and U+3000 are White_Space; U+FEFF and U+200B are not.
  EXPECT_EQ(split_with(*p, "a\u0085\u0085b"), (Strings{"a", "\u0085", "\u0085b"}));
  EXPECT_EQ(split_with(*p, "a\u3000\u3000\u3000"), (Strings{"a", "\u3000\u3000\u3000"}));
  EXPECT_EQ(split_with(*p, "\ufeff\ufeffx"), (Strings{"\ufeff\ufeff", "x"}));
  EXPECT_EQ(split_with(*p, "a\u200b\u200bb"), (Strings{"a", "\u200b\u200b", "b"}));
  EXPECT_EQ(split_with(*p, "zero\u200bwidth"), (Strings{"zero", "\u200bwidth"}));
  // Combining marks are not letters: they break a letter run.
  EXPECT_EQ(split_with(*p, "e\u0301te"), (Strings{"e", "\u0301te"}));
  auto p3 = make_gpt4_split_pattern(3);
  EXPECT_EQ(split_with(*p3, "1234567"), (Strings{"123", "456", "7"}));
}

TEST(SplitPattern, RecognisesTheFastPathOnlyForExactRegexes) {
  const std::string qwen =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  // The fast matcher splits digits one by one for the Qwen pattern, in threes for the GPT-4 one: same as PCRE2.
  auto fast = make_regex_pattern(qwen, "test");
  auto slow = make_pcre2_pattern(qwen, "test");
  EXPECT_EQ(split_with(*fast, "abc 123"), split_with(*slow, "abc 123"));
  EXPECT_THROW(make_regex_pattern("(unclosed", "test.json: pre_tokenizer Split"), UserError);
  try {
    make_regex_pattern("(unclosed", "test.json: pre_tokenizer Split");
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("test.json: pre_tokenizer Split"), std::string::npos) << e.what();
  }
}

// The hand-written matcher against PCRE2 running the same regex, on random strings over characters that sit on
// every class boundary the regex cares about.
TEST(SplitPattern, FastMatcherAgreesWithPcre2OnRandomText) {
  const char* alphabet[] = {"a", "Z", "s", "S", "t", "r", "e", "v", "m", "l", "L", "d", "D", "'", "'", "1", "9",
                            "\u0663", "\u2160", "\u00bd", " ", " ", " ", "\t", "\n", "\r", "\u3000", "\u00a0",
                            "\u0085", "\ufeff", "\u200b", "\u180e", "!", ".", "_", "(", "\U0001F600", "\u4e2d",
                            "\u0301", "\u017f", "\u00e9", "\U0001D400", "\u2028", "\x0b", "\x0c"};
  constexpr size_t kAlpha = sizeof(alphabet) / sizeof(alphabet[0]);
  const std::string regexes[] = {
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
  std::mt19937 rng(7);
  for (int r = 0; r < 2; ++r) {
    auto fast = make_gpt4_split_pattern(r == 0 ? 1 : 3);
    auto slow = make_pcre2_pattern(regexes[r], "test");
    for (int iter = 0; iter < 3000; ++iter) {
      std::string s;
      const int len = 1 + int(rng() % 24);
      for (int i = 0; i < len; ++i) s += alphabet[rng() % kAlpha];
      ASSERT_EQ(split_with(*fast, s), split_with(*slow, s)) << "regex " << r << " on " << nlohmann::json(s).dump();
    }
  }
}

TEST(SplitPattern, Pcre2FollowsOnigurumaWhitespaceAndEmptyMatches) {
  // \s means White_Space: U+180E is not, U+0085 is.
  auto ws = make_pcre2_pattern(R"(\s+)", "test");
  EXPECT_EQ(split_with(*ws, "a\u180e\u0085 b"), (Strings{"\u0085 "}));
  auto not_ws = make_pcre2_pattern(R"([^\s]+)", "test");
  EXPECT_EQ(split_with(*not_ws, "ab\u180e c"), (Strings{"ab\u180e", "c"}));
  auto upper = make_pcre2_pattern(R"(\S+)", "test");
  EXPECT_EQ(split_with(*upper, "x\u2028y"), (Strings{"x", "y"}));
  // Empty matches: one per position, none right after a match.
  auto star = make_pcre2_pattern("a*", "test");
  EXPECT_EQ(split_with(*star, "baac"), (Strings{"", "aa", ""}));
  EXPECT_EQ(onig_to_pcre2(R"([^\s\p{L}]\\s[\]\s])"),
            std::string(R"([^\t-\r\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})") +
                R"(\p{L}]\\s[\]\t-\r\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}])");
}

// --- pre-tokenizers -------------------------------------------------------------------------------------------

Strings pre_tokenize(const nlohmann::json& config, const std::string& text, bool at_origin = true) {
  bool byte_level = false;
  auto chain = make_pre_tokenizers(config, "test.json", byte_level);
  Pieces pieces;
  pieces.reset(text, at_origin);
  for (const auto& pt : chain) pt->apply(pieces);
  Strings out;
  for (const Piece& p : pieces.list) out.emplace_back(pieces.view(p));
  return out;
}

nlohmann::json split_config(const std::string& behavior, bool invert = false) {
  return {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
}

TEST(PreTokenizer, SplitBehavioursMatchTheTokenizersDocumentation) {
  // The examples of tokenizers' SplitDelimiterBehavior documentation.
  const std::string s = "the-final--countdown";
  EXPECT_EQ(pre_tokenize(split_config("Removed"), s), (Strings{"the", "final", "countdown"}));
  EXPECT_EQ(pre_tokenize(split_config("Isolated"), s), (Strings{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pre_tokenize(split_config("MergedWithPrevious"), s), (Strings{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pre_tokenize(split_config("MergedWithNext"), s), (Strings{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pre_tokenize(split_config("Contiguous"), s), (Strings{"the", "-", "final", "--", "countdown"}));
  // Inverted, the words are the matches and the dashes the gaps.
  EXPECT_EQ(pre_tokenize(split_config("MergedWithPrevious", true), s), (Strings{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pre_tokenize(split_config("Removed", true), s), (Strings{"-", "-", "-"}));
  EXPECT_THROW(pre_tokenize(split_config("Sideways"), s), UserError);
}

TEST(PreTokenizer, MetaspaceReplacesPrependsAndSplits) {
  const nlohmann::json always = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"},
                                 {"split", true}};
  EXPECT_EQ(pre_tokenize(always, "Hey friend!"), (Strings{"\u2581Hey", "\u2581friend!"}));
  // With split, every replacement character starts a piece.
  EXPECT_EQ(pre_tokenize(always, "a  b"), (Strings{"\u2581a", "\u2581", "\u2581b"}));
  // Spaces are replaced before the prefix is decided: a leading space is not doubled.
  EXPECT_EQ(pre_tokenize(always, " a"), (Strings{"\u2581a"}));
  nlohmann::json first = always;
  first["prepend_scheme"] = "first";
  EXPECT_EQ(pre_tokenize(first, "a b", true), (Strings{"\u2581a", "\u2581b"}));
  EXPECT_EQ(pre_tokenize(first, "a b", false), (Strings{"a", "\u2581b"}));
  nlohmann::json no_split = first;
  no_split["split"] = false;
  EXPECT_EQ(pre_tokenize(no_split, "a  b"), (Strings{"\u2581a\u2581\u2581b"}));
  // The legacy form: add_prefix_space instead of prepend_scheme.
  const nlohmann::json legacy = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"add_prefix_space", false}};
  EXPECT_EQ(pre_tokenize(legacy, "a b"), (Strings{"a", "\u2581b"}));
}

TEST(PreTokenizer, DigitsWhitespaceSplitAndByteLevel) {
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", true}}, "ab123c"),
            (Strings{"ab", "1", "2", "3", "c"}));
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", false}}, "ab123c4"),
            (Strings{"ab", "123", "c", "4"}));
  EXPECT_EQ(pre_tokenize({{"type", "WhitespaceSplit"}}, "  a b\u3000\tc  "), (Strings{"a", "b", "c"}));
  // ByteLevel with its own regex (GPT-2) and a prefix space; the byte mapping is left to the model.
  EXPECT_EQ(pre_tokenize({{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}}, "Hello there's 42"),
            (Strings{" Hello", " there", "'s", " 42"}));
  const nlohmann::json after = {{"type", "Sequence"},
                                {"pretokenizers", {{{"type", "ByteLevel"}}, {{"type", "Digits"}}}}};
  EXPECT_THROW(pre_tokenize(after, "x"), UserError);
  try {
    pre_tokenize({{"type", "BertPreTokenizer"}}, "x");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("BertPreTokenizer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test.json"), std::string::npos) << e.what();
  }
}

// --- Unicode helpers ------------------------------------------------------------------------------------------

TEST(Unicode, LossyUtf8ReplacesMaximalSubparts) {
  auto lossy = [](const std::string& s) {
    std::string out;
    unicode::append_lossy(out, s, false);
    return out;
  };
  const std::string r(unicode::kReplacementChar);
  EXPECT_EQ(lossy("ok"), "ok");
  EXPECT_EQ(lossy("\xE4\xB8\xAD"), "\u4e2d");
  EXPECT_EQ(lossy("a\xE4\xB8"), "a" + r);                 // truncated: one replacement
  EXPECT_EQ(lossy("\xE4\xB8x"), r + "x");                 // cut short by an ASCII byte: one replacement
  EXPECT_EQ(lossy("\x80\x80"), r + r);                    // stray continuation bytes: one each
  EXPECT_EQ(lossy("\xC0\xAF"), r + r);                    // overlong lead: invalid on its own
  EXPECT_EQ(lossy("\xED\xA0\x80"), r + r + r);            // a surrogate is not a maximal subpart
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), r + r + r + r);    // above U+10FFFF
  EXPECT_EQ(lossy("\xF0\x9F\x98"), r);                    // truncated 4-byte sequence
  EXPECT_EQ(lossy("\xF0\x9F\x98\x80"), "\U0001F600");
  std::string held;
  EXPECT_EQ(unicode::append_lossy(held, "ab\xF0\x9F", true), 2u);
  EXPECT_EQ(held, "ab");
}

TEST(Unicode, ClassesAndNormalization) {
  EXPECT_TRUE(unicode::classes(U'a') & unicode::kLetter);
  EXPECT_TRUE(unicode::classes(U'\u4e2d') & unicode::kLetter);
  EXPECT_TRUE(unicode::classes(U'\U0001D400') & unicode::kLetter);
  EXPECT_TRUE(unicode::classes(U'\u2160') & unicode::kNumber);
  EXPECT_TRUE(unicode::classes(U'\u00bd') & unicode::kNumber);
  EXPECT_TRUE(unicode::classes(U'\u0301') & unicode::kMark);
  EXPECT_FALSE(unicode::classes(U'\u0301') & unicode::kLetter);
  EXPECT_TRUE(unicode::is_white_space(U'\u0085'));
  EXPECT_TRUE(unicode::is_white_space(U'\u3000'));
  EXPECT_FALSE(unicode::is_white_space(U'\ufeff'));
  EXPECT_FALSE(unicode::is_white_space(U'\u180e'));
  EXPECT_FALSE(unicode::is_white_space(U'\u200b'));
  EXPECT_EQ(unicode::normalize("e\u0301", unicode::NormalForm::kNFC), "\u00e9");
  EXPECT_EQ(unicode::normalize("\u212b", unicode::NormalForm::kNFC), "\u00c5");
  EXPECT_EQ(unicode::normalize("\u1100\u1161\u11a8", unicode::NormalForm::kNFC), "\uac01");
  EXPECT_EQ(unicode::normalize("\ufb01", unicode::NormalForm::kNFC), "\ufb01");
  EXPECT_EQ(unicode::normalize("\ufb01", unicode::NormalForm::kNFKC), "fi");
  EXPECT_EQ(unicode::normalize("\u00e9", unicode::NormalForm::kNFD), "e\u0301");
  const auto& bl = unicode::byte_level_table();
  EXPECT_EQ(bl.byte_to_utf8[' '], "\u0120");
  EXPECT_EQ(bl.byte_to_utf8['\n'], "\u010a");
  EXPECT_EQ(bl.byte_to_utf8['A'], "A");
  for (int b = 0; b < 256; ++b) {
    int len;
    char32_t cp = unicode::decode_valid(bl.byte_to_utf8[b].data(), 0, len);
    EXPECT_EQ(bl.cp_to_byte[cp], b);
  }
}

}  // namespace
}  // namespace moeserve::tok

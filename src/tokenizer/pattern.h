// Patterns of the Split pre-tokenizer and the Replace normalizer/decoder. Hugging Face compiles them with
// Oniguruma; here the common GPT-4 / Qwen2 / Llama 3 split regex runs on a hand-written matcher and any other
// regex on PCRE2 (JIT), after rewriting the few constructs whose meaning differs between the two engines.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moeserve::tok {

using Span = std::pair<uint32_t, uint32_t>;  // [begin, end) byte offsets

class Pattern {
 public:
  virtual ~Pattern() = default;
  // Appends every match in s (valid UTF-8), non-overlapping, left to right, with Oniguruma's find_iter rules
  // for empty matches.
  virtual void find_all(std::string_view s, std::vector<Span>& out) const = 0;
};

// A literal string; an empty literal matches nothing.
std::unique_ptr<Pattern> make_literal_pattern(std::string literal);

// A regex in Oniguruma syntax. Recognises the GPT-4-family split regexes and answers them with the fast
// matcher; everything else goes to PCRE2. Throws UserError (naming `where`) if PCRE2 rejects the regex.
std::unique_ptr<Pattern> make_regex_pattern(const std::string& regex, const std::string& where);

// The general engine only, bypassing the fast matcher (tests compare the two).
std::unique_ptr<Pattern> make_pcre2_pattern(const std::string& regex, const std::string& where);

// The fast matcher for `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
std::unique_ptr<Pattern> make_gpt4_split_pattern(int max_digits);

// Oniguruma's \s and \S are Unicode White_Space; PCRE2's (with UCP) also match U+180E. Rewrites them into
// explicit classes. Exposed for tests.
std::string onig_to_pcre2(const std::string& regex);

}  // namespace moeserve::tok

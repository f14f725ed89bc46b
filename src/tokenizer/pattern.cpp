#define PCRE2_CODE_UNIT_WIDTH 8

#include "tokenizer/pattern.h"

#include <array>

#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace moeserve::tok {
namespace {

// The split regexes of Qwen2/Qwen3 (one digit per piece) and of GPT-4 cl100k / Llama 3 (up to three digits).
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt4Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

class LiteralPattern final : public Pattern {
 public:
  explicit LiteralPattern(std::string lit) : lit_(std::move(lit)) {}
  void find_all(std::string_view s, std::vector<Span>& out) const override {
    if (lit_.empty()) return;
    size_t pos = 0;
    while ((pos = s.find(lit_, pos)) != std::string_view::npos) {
      out.emplace_back(uint32_t(pos), uint32_t(pos + lit_.size()));
      pos += lit_.size();
    }
  }

 private:
  std::string lit_;
};

// --- the hand-written GPT-4-family matcher -------------------------------------------------------------------

struct Cls {
  uint16_t bits;
  int len;
  char32_t cp;
};

constexpr std::array<uint16_t, 128> kAsciiClasses = [] {
  std::array<uint16_t, 128> t{};
  for (int b = 0; b < 128; ++b) {
    if ((b | 0x20) >= 'a' && (b | 0x20) <= 'z') t[b] = unicode::kLetter;
    else if (b >= '0' && b <= '9') t[b] = unicode::kNumber;
    else if (b == ' ' || (b >= 0x09 && b <= 0x0D)) t[b] = unicode::kSpace;
  }
  return t;
}();

// ASCII from a small table (prose is mostly ASCII); the rest from the Unicode table.
inline __attribute__((always_inline)) Cls class_at(std::string_view s, size_t i) {
  unsigned char b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return {kAsciiClasses[b], 1, b};
  int len;
  char32_t cp = unicode::decode_valid(s.data(), i, len);
  return {unicode::classes(cp), len, cp};
}

class Gpt4SplitPattern final : public Pattern {
 public:
  explicit Gpt4SplitPattern(int max_digits) : max_digits_(max_digits) {}

  void find_all(std::string_view s, std::vector<Span>& out) const override {
    size_t i = 0;
    while (i < s.size()) {
      size_t end = match_at(s, i);
      out.emplace_back(uint32_t(i), uint32_t(end));
      i = end;
    }
  }

 private:
  static bool ascii_ci(std::string_view s, size_t i, char lower) {
    return i < s.size() && (static_cast<unsigned char>(s[i]) | 0x20) == static_cast<unsigned char>(lower);
  }

  // Length of the (?i:'s|'t|'re|'ve|'m|'ll|'d) match at i (s[i] == '\''), or 0. Case-insensitive matching
  // in Oniguruma also lets 's match U+017F LATIN SMALL LETTER LONG S (it case-folds to 's').
  static size_t contraction(std::string_view s, size_t i) {
    size_t j = i + 1;
    if (j >= s.size()) return 0;
    if (ascii_ci(s, j, 's') || ascii_ci(s, j, 't') || ascii_ci(s, j, 'm') || ascii_ci(s, j, 'd')) return 2;
    if (s.compare(j, 2, "\xC5\xBF") == 0) return 3;
    if (ascii_ci(s, j, 'r') && ascii_ci(s, j + 1, 'e')) return 3;
    if (ascii_ci(s, j, 'v') && ascii_ci(s, j + 1, 'e')) return 3;
    if (ascii_ci(s, j, 'l') && ascii_ci(s, j + 1, 'l')) return 3;
    return 0;
  }

  static size_t skip_while(std::string_view s, size_t i, uint16_t any_of) {
    while (i < s.size()) {
      Cls c = class_at(s, i);
      if (!(c.bits & any_of)) break;
      i += c.len;
    }
    return i;
  }

  // [^\s\p{L}\p{N}]+ then [\r\n]*
  static size_t punct_run(std::string_view s, size_t i) {
    while (i < s.size()) {
      Cls c = class_at(s, i);
      if (c.bits & (unicode::kSpace | unicode::kLetter | unicode::kNumber)) break;
      i += c.len;
    }
    while (i < s.size() && (s[i] == '\r' || s[i] == '\n')) ++i;
    return i;
  }

  // The alternatives are tried in order, exactly as the backtracking engines do; every character is covered
  // by one of them, so a match always starts at i.
  size_t match_at(std::string_view s, size_t i) const {
    const size_t n = s.size();
    const Cls c = class_at(s, i);
    if (c.cp == '\'') {
      if (size_t len = contraction(s, i)) return i + len;
    }
    constexpr uint16_t kLN = unicode::kLetter | unicode::kNumber;
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c.bits & unicode::kLetter) return skip_while(s, i + c.len, unicode::kLetter);
    if (!(c.bits & kLN) && c.cp != '\r' && c.cp != '\n' && i + c.len < n) {
      Cls next = class_at(s, i + c.len);
      if (next.bits & unicode::kLetter) return skip_while(s, i + c.len + next.len, unicode::kLetter);
    }
    // \p{N}{1,max}
    if (c.bits & unicode::kNumber) {
      size_t j = i + c.len;
      for (int k = 1; k < max_digits_ && j < n; ++k) {
        Cls d = class_at(s, j);
        if (!(d.bits & unicode::kNumber)) break;
        j += d.len;
      }
      return j;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    if (c.cp == ' ' && i + 1 < n) {
      Cls next = class_at(s, i + 1);
      if (!(next.bits & (unicode::kSpace | kLN))) return punct_run(s, i + 1);
    }
    if (!(c.bits & unicode::kSpace)) return punct_run(s, i);
    // Whitespace: find the run [i, j) and the start of its last character.
    size_t j = i, last_start = i, last_newline = SIZE_MAX;
    while (j < n) {
      Cls w = class_at(s, j);
      if (!(w.bits & unicode::kSpace)) break;
      if (w.cp == '\r' || w.cp == '\n') last_newline = j;
      last_start = j;
      j += w.len;
    }
    // \s*[\r\n]+ : \s* backtracks to the last newline of the run, [\r\n]+ takes it (nothing follows it).
    if (last_newline != SIZE_MAX) return last_newline + 1;
    // \s+(?!\S) : the whole run at the end of the text, else the run minus its last character.
    if (j == n) return j;
    if (last_start > i) return last_start;
    // \s+
    return j;
  }

  int max_digits_;
};

// --- PCRE2 ---------------------------------------------------------------------------------------------------

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* m) const { pcre2_match_context_free(m); }
};
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* s) const { pcre2_jit_stack_free(s); }
};

class Pcre2Pattern final : public Pattern {
 public:
  Pcre2Pattern(const std::string& regex, const std::string& where) {
    const std::string translated = onig_to_pcre2(regex);
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                              PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr));
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      throw_user("{}: cannot compile regex '{}' (at offset {}: {}); moeserve runs tokenizer regexes with PCRE2",
                 where, regex, err_offset, reinterpret_cast<const char*>(msg));
    }
    // Without JIT (unsupported CPU) pcre2_match falls back to the interpreter by itself.
    jit_ = pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE) == 0;
  }

  void find_all(std::string_view s, std::vector<Span>& out) const override {
    std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create_from_pattern(code_.get(), nullptr));
    MS_CHECK(md != nullptr, "out of memory");
    std::unique_ptr<pcre2_match_context, MatchContextDeleter> mctx;
    std::unique_ptr<pcre2_jit_stack, JitStackDeleter> jit_stack;
    const size_t n = s.size();
    size_t pos = 0, last_match_end = SIZE_MAX;
    while (pos <= n) {
      int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(s.data()), n, pos, PCRE2_NO_UTF_CHECK,
                           md.get(), mctx.get());
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_ && !jit_stack) {
        // Long inputs can outgrow the default 32 KiB JIT stack; retry this search with a large one.
        mctx.reset(pcre2_match_context_create(nullptr));
        jit_stack.reset(pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr));
        MS_CHECK(mctx && jit_stack, "out of memory");
        pcre2_jit_stack_assign(mctx.get(), nullptr, jit_stack.get());
        continue;
      }
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        throw_user("tokenizer regex failed on the input ({}); the text is too pathological for this pattern",
                   reinterpret_cast<const char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      size_t b = ov[0], e = ov[1];
      if (b == e && last_match_end == e) {
        // No empty match right after the previous match: step one character, as Oniguruma's find_iter does.
        pos += pos < n ? size_t(unicode::utf8_len(static_cast<unsigned char>(s[pos]))) : 1;
        continue;
      }
      out.emplace_back(uint32_t(b), uint32_t(e));
      pos = e;
      last_match_end = e;
    }
  }

 private:
  std::unique_ptr<pcre2_code, CodeDeleter> code_;
  bool jit_ = false;
};

constexpr std::string_view kWhiteSpaceRanges =
    R"(\t-\r\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})";

}  // namespace

std::string onig_to_pcre2(const std::string& regex) {
  std::string out;
  out.reserve(regex.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < regex.size(); ++i) {
    char c = regex[i];
    if (c == '\\' && i + 1 < regex.size()) {
      char d = regex[i + 1];
      if (d == 's') {
        if (in_class) out.append(kWhiteSpaceRanges);
        else out.append("[").append(kWhiteSpaceRanges).append("]");
      } else if (d == 'S' && !in_class) {
        out.append("[^").append(kWhiteSpaceRanges).append("]");
      } else {
        out.push_back(c);
        out.push_back(d);
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < regex.size() && regex[i + 1] == '^') out.push_back(regex[++i]);
      if (i + 1 < regex.size() && regex[i + 1] == ']') out.push_back(regex[++i]);
      continue;
    }
    if (in_class && c == '[' && i + 1 < regex.size() && regex[i + 1] == ':') {
      size_t close = regex.find(":]", i + 2);
      if (close != std::string::npos) {
        out.append(regex, i, close + 2 - i);
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

std::unique_ptr<Pattern> make_literal_pattern(std::string literal) {
  return std::make_unique<LiteralPattern>(std::move(literal));
}

std::unique_ptr<Pattern> make_gpt4_split_pattern(int max_digits) {
  return std::make_unique<Gpt4SplitPattern>(max_digits);
}

std::unique_ptr<Pattern> make_pcre2_pattern(const std::string& regex, const std::string& where) {
  return std::make_unique<Pcre2Pattern>(regex, where);
}

std::unique_ptr<Pattern> make_regex_pattern(const std::string& regex, const std::string& where) {
  if (regex == kQwen2Regex) return make_gpt4_split_pattern(1);
  if (regex == kGpt4Regex) return make_gpt4_split_pattern(3);
  return make_pcre2_pattern(regex, where);
}

}  // namespace moeserve::tok

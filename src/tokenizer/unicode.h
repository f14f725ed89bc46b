// Unicode helpers shared by the tokenizer stages: UTF-8 stepping, the character classes the split regexes
// need (\p{L}, \p{N}, \s ...), Unicode normalization forms, the lossy UTF-8 repair Hugging Face applies when
// decoding, and GPT-2's byte <-> printable-character table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moeserve::tok::unicode {

// Character class bits. kSpace is Unicode White_Space (what Oniguruma's and Rust regex's \s match);
// kWord approximates Rust regex's \w (Alphabetic, marks, decimal digits, connector punctuation).
enum CharClass : uint16_t {
  kLetter = 1u << 0,  // \p{L}
  kNumber = 1u << 1,  // \p{N}
  kSpace = 1u << 2,   // White_Space
  kMark = 1u << 3,    // \p{M}
  kPunct = 1u << 4,   // \p{P}
  kSymbol = 1u << 5,  // \p{S}
  kWord = 1u << 6,    // \w
  kUpper = 1u << 7,   // \p{Lu}
  kLower = 1u << 8,   // \p{Ll}
};

// Class bits of a code point; cp must be < 0x110000.
uint16_t classes(char32_t cp);

inline bool is_white_space(char32_t cp) { return (classes(cp) & kSpace) != 0; }

// Length of the UTF-8 sequence that starts with lead byte b (1 for bytes that cannot start one).
inline int utf8_len(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xF0) return 4;
  if (b >= 0xE0) return 3;
  if (b >= 0xC0) return 2;
  return 1;
}

// Decodes the code point at s[i] of VALID UTF-8 and sets len to its byte length.
inline char32_t decode_valid(const char* s, size_t i, int& len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s) + i;
  unsigned char b = p[0];
  if (b < 0x80) { len = 1; return b; }
  if (b < 0xE0) { len = 2; return (char32_t(b & 0x1F) << 6) | (p[1] & 0x3F); }
  if (b < 0xF0) {
    len = 3;
    return (char32_t(b & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  len = 4;
  return (char32_t(b & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) | (char32_t(p[2] & 0x3F) << 6) |
         (p[3] & 0x3F);
}

void append_utf8(std::string& out, char32_t cp);

// What starts at a position of a byte string, by the rules of Rust's String::from_utf8_lossy (the
// "maximal subpart" practice): a valid character, an invalid sequence that becomes one U+FFFD, or a
// sequence that is valid so far but cut off by the end of the buffer.
enum class Utf8Step { kValid, kInvalid, kTruncated };
Utf8Step utf8_step(std::string_view s, size_t i, size_t& len);

bool is_valid_utf8(std::string_view s);

// Appends s to out, each invalid sequence replaced by U+FFFD. With hold_truncated, a truncated sequence at the
// end is not consumed and its start offset is returned (so a stream can wait for more bytes); otherwise it also
// becomes U+FFFD and s.size() is returned.
size_t append_lossy(std::string& out, std::string_view s, bool hold_truncated);

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };
std::string normalize(std::string_view s, NormalForm form);

// GPT-2's reversible mapping from bytes to printable characters (the ByteLevel pre-tokenizer and decoder).
struct ByteLevelTable {
  std::string byte_to_utf8[256];  // the printable character standing for each byte, UTF-8 encoded
  int16_t cp_to_byte[512];        // inverse for code points < 512, -1 where a code point stands for no byte
};
const ByteLevelTable& byte_level_table();

}  // namespace moeserve::tok::unicode

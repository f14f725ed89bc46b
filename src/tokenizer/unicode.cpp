#include "tokenizer/unicode.h"

#include <cstdlib>
#include <memory>
#include <vector>

#include <utf8proc.h>

#include "core/error.h"

namespace moeserve::tok::unicode {
namespace {

constexpr char32_t kMaxCodePoint = 0x110000;
constexpr int kBlockBits = 8;
constexpr int kBlockSize = 1 << kBlockBits;

bool white_space_property(char32_t cp) {
  // Unicode White_Space (PropList.txt); utf8proc has no accessor for it.
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

uint16_t compute_classes(char32_t cp) {
  uint16_t c = 0;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: c = kLetter | kWord | kUpper; break;
    case UTF8PROC_CATEGORY_LL: c = kLetter | kWord | kLower; break;
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: c = kLetter | kWord; break;
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME: c = kMark | kWord; break;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: c = kNumber | kWord; break;
    case UTF8PROC_CATEGORY_NO: c = kNumber; break;
    case UTF8PROC_CATEGORY_PC: c = kPunct | kWord; break;
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO: c = kPunct; break;
    case UTF8PROC_CATEGORY_SM:
    case UTF8PROC_CATEGORY_SC:
    case UTF8PROC_CATEGORY_SK:
    case UTF8PROC_CATEGORY_SO: c = kSymbol; break;
    default: break;
  }
  if (white_space_property(cp)) c |= kSpace;
  // Join controls and the circled letters (Other_Alphabetic, category So) are word characters for \w.
  if (cp == 0x200C || cp == 0x200D || (cp >= 0x24B6 && cp <= 0x24E9)) c |= kWord;
  return c;
}

// Two-level table: 4352 blocks of 256 code points, identical blocks shared. Built once, read-only after.
struct ClassTable {
  std::vector<uint16_t> block_index;
  std::vector<uint16_t> blocks;

  ClassTable() {
    const size_t nblocks = kMaxCodePoint >> kBlockBits;
    block_index.resize(nblocks);
    std::vector<uint16_t> block(kBlockSize);
    for (size_t b = 0; b < nblocks; ++b) {
      for (int i = 0; i < kBlockSize; ++i) block[i] = compute_classes(static_cast<char32_t>((b << kBlockBits) + i));
      // Most blocks repeat one of the last few (unassigned planes, CJK), so a short look-back dedups well.
      size_t found = SIZE_MAX;
      const size_t have = blocks.size() / kBlockSize;
      for (size_t k = have; k > 0 && have - k < 8; --k) {
        if (std::equal(block.begin(), block.end(), blocks.begin() + (k - 1) * kBlockSize)) {
          found = k - 1;
          break;
        }
      }
      if (found == SIZE_MAX) {
        found = have;
        blocks.insert(blocks.end(), block.begin(), block.end());
      }
      block_index[b] = static_cast<uint16_t>(found);
    }
  }
};

const ClassTable& class_table() {
  static const ClassTable table;
  return table;
}

}  // namespace

uint16_t classes(char32_t cp) {
  if (cp >= kMaxCodePoint) return 0;
  const ClassTable& t = class_table();
  return t.blocks[(size_t(t.block_index[cp >> kBlockBits]) << kBlockBits) | (cp & (kBlockSize - 1))];
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

Utf8Step utf8_step(std::string_view s, size_t i, size_t& len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  unsigned char b = p[i];
  if (b < 0x80) { len = 1; return Utf8Step::kValid; }
  int need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;   // overlong
    if (b == 0xED) hi = 0x9F;   // surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;   // overlong
    if (b == 0xF4) hi = 0x8F;   // above U+10FFFF
  } else {
    len = 1;
    return Utf8Step::kInvalid;
  }
  size_t k = 1;
  for (int j = 0; j < need; ++j, ++k) {
    if (i + k >= n) { len = k; return Utf8Step::kTruncated; }
    unsigned char c = p[i + k];
    unsigned char l = j == 0 ? lo : 0x80, h = j == 0 ? hi : 0xBF;
    if (c < l || c > h) { len = k; return Utf8Step::kInvalid; }
  }
  len = k;
  return Utf8Step::kValid;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII runs dominate; skip them eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (static_cast<unsigned char>(s[i]) < 0x80) { ++i; continue; }
    size_t len;
    if (utf8_step(s, i, len) != Utf8Step::kValid) return false;
    i += len;
  }
  return true;
}

size_t append_lossy(std::string& out, std::string_view s, bool hold_truncated) {
  size_t i = 0;
  const size_t n = s.size();
  size_t run = 0;  // start of the pending valid run, appended in one go
  while (i < n) {
    size_t len;
    Utf8Step st = utf8_step(s, i, len);
    if (st == Utf8Step::kValid) { i += len; continue; }
    out.append(s.data() + run, i - run);
    if (st == Utf8Step::kTruncated && hold_truncated) return i;
    out.append(kReplacementChar);
    i += len;
    run = i;
  }
  out.append(s.data() + run, n - run);
  return n;
}

std::string normalize(std::string_view s, NormalForm form) {
  // Below U+0300 every character is NFC-stable and composes with nothing before it; ASCII is stable under
  // all four forms. These checks keep prose from paying for utf8proc.
  bool ascii = true, below_0300 = true;
  for (unsigned char c : s) {
    if (c >= 0x80) ascii = false;
    if (c >= 0xCC) { below_0300 = false; break; }
  }
  if (ascii || (form == NormalForm::kNFC && below_0300)) return std::string(s);
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNFC: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* dst = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                    static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, void (*)(void*)> owned(dst, std::free);
  // The encoder only passes valid UTF-8 here, so a failure is a bug (or out of memory).
  MS_CHECK(n >= 0, "utf8proc_map failed: {}", utf8proc_errmsg(n));
  return std::string(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
}

const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable table = [] {
    ByteLevelTable t;
    for (auto& v : t.cp_to_byte) v = -1;
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? char32_t(b) : char32_t(next++);
      append_utf8(t.byte_to_utf8[b], cp);
      t.cp_to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return table;
}

}  // namespace moeserve::tok::unicode

#include "benchclient/event_skim.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "tokenizer/unicode.h"

namespace moeserve::bench {

namespace {

class Skimmer {
 public:
  explicit Skimmer(std::string_view s) : p_(s.data()), end_(s.data() + s.size()) {}

  // A key this reads given twice declines: which one counts is the full parser's to decide (nlohmann::json keeps
  // the last; the sglang_event fuzz target found a second meta_info read as the first).
  bool event(SglangEventFields& out) {
    ws();
    bool text = false, meta = false, error = false;
    if (!object([&](std::string_view key) {
          if (key == "text") return once(text) && string_value(&out.text_bytes);
          if (key == "meta_info") return once(meta) && meta_info(out);
          if (key == "error") return once(error) && null_or_decline();
          return skip_value();
        }))
      return false;
    ws();
    return p_ == end_;
  }

 private:
  bool meta_info(SglangEventFields& out) {
    if (peek() == 'n') return skip_value();  // null
    bool completion = false, prompt = false, finish = false;
    return object([&](std::string_view key) {
      if (key == "completion_tokens") return once(completion) && integer(&out.completion_tokens);
      if (key == "prompt_tokens") return once(prompt) && integer(&out.prompt_tokens);
      if (key == "finish_reason") return once(finish) && null_or_decline();
      return skip_value();
    });
  }

  // The first sight of a key (true), or a repeat (false: decline).
  static bool once(bool& seen) { return !std::exchange(seen, true); }

  // { "key": value, ... } with on_member(key) consuming the value.
  template <typename F>
  bool object(F&& on_member) {
    if (!eat('{')) return false;
    ws();
    if (eat('}')) return true;
    while (true) {
      ws();
      std::string_view key;
      if (!key_string(&key)) return false;
      ws();
      if (!eat(':')) return false;
      ws();
      if (!on_member(key)) return false;
      ws();
      if (eat('}')) return true;
      if (!eat(',')) return false;
    }
  }

  // Keys are compared raw, so a key with an escape declines (its unescaped form could be one of our names).
  bool key_string(std::string_view* key) {
    const char* start = p_ + 1;
    int64_t ignored;
    if (!string_value(&ignored)) return false;
    *key = std::string_view(start, size_t(p_ - 1 - start));
    return key->find('\\') == std::string_view::npos;
  }

  // Four hex digits of a \u escape.
  bool hex4(unsigned* cp) {
    if (end_ - p_ < 4) return false;
    *cp = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = *p_++;
      const int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
      if (d < 0) return false;
      *cp = *cp << 4 | unsigned(d);
    }
    return true;
  }

  // A string as RFC 8259 has it (what the full parser accepts: no raw control characters, valid escapes, paired
  // surrogates, well-formed UTF-8); *decoded gets its UTF-8 length after unescaping. ASCII costs one compare a byte.
  bool string_value(int64_t* decoded) {
    if (!eat('"')) return false;
    int64_t n = 0;
    while (p_ < end_) {
      const auto c = static_cast<unsigned char>(*p_++);
      if (c == '"') {
        *decoded = n;
        return true;
      }
      if (c < 0x20) return false;
      if (c >= 0x80) {  // a whole, well-formed UTF-8 sequence (the tokenizer's stepper: overlongs, surrogates refused)
        size_t len = 0;
        if (tok::unicode::utf8_step(std::string_view(p_ - 1, size_t(end_ - p_) + 1), 0, len) !=
            tok::unicode::Utf8Step::kValid)
          return false;
        p_ += len - 1;
        n += int64_t(len);
        continue;
      }
      if (c != '\\') {
        ++n;
        continue;
      }
      if (p_ >= end_) return false;
      const char e = *p_++;
      if (e != 'u') {
        if (e != '"' && e != '\\' && e != '/' && e != 'b' && e != 'f' && e != 'n' && e != 'r' && e != 't') return false;
        ++n;
        continue;
      }
      unsigned cp;
      if (!hex4(&cp)) return false;
      if (cp >= 0xDC00 && cp < 0xE000) return false;  // a low surrogate without its high half
      if (cp >= 0xD800 && cp < 0xDC00) {             // a high surrogate: its low half must follow
        unsigned lo;
        if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return false;
        p_ += 2;
        if (!hex4(&lo) || lo < 0xDC00 || lo >= 0xE000) return false;
        n += 4;
        continue;
      }
      n += cp < 0x80 ? 1 : cp < 0x800 ? 2 : 3;
    }
    return false;
  }

  bool integer(int64_t* v) {
    bool neg = eat('-');
    if (p_ >= end_ || *p_ < '0' || *p_ > '9') return false;
    if (*p_ == '0' && p_ + 1 < end_ && p_[1] >= '0' && p_[1] <= '9') return false;  // a leading zero: not JSON
    int64_t r = 0;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
      if (r > (INT64_MAX - 9) / 10) return false;
      r = r * 10 + (*p_++ - '0');
    }
    if (p_ < end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E')) return false;  // not an integer: decline
    *v = neg ? -r : r;
    return true;
  }

  bool null_or_decline() { return literal("null"); }

  bool literal(std::string_view word) {
    if (size_t(end_ - p_) < word.size() || std::string_view(p_, word.size()) != word) return false;
    p_ += word.size();
    return true;
  }

  bool skip_value(int depth = 0) {
    if (depth > 64 || p_ >= end_) return false;
    char c = *p_;
    if (c == '"') {
      int64_t ignored;
      return string_value(&ignored);
    }
    if (c == '{') return object([&](std::string_view) { return skip_value(depth + 1); });
    if (c == '[') {
      ++p_;
      ws();
      if (eat(']')) return true;
      while (true) {
        ws();
        if (!skip_value(depth + 1)) return false;
        ws();
        if (eat(']')) return true;
        if (!eat(',')) return false;
      }
    }
    if (c == 't') return literal("true");
    if (c == 'f') return literal("false");
    if (c == 'n') return literal("null");
    return number();
  }

  // A number as RFC 8259 writes it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  // and within a double's range (the full parser refuses 1e400 and a 400-digit integer as overflows).
  bool number() {
    const char* start = p_;
    eat('-');
    if (eat('0')) {
    } else if (!digits()) {
      return false;
    }
    if (eat('.') && !digits()) return false;
    bool exponent = false;
    if (eat('e') || eat('E')) {
      if (!eat('+')) eat('-');
      if (!digits()) return false;
      exponent = true;
    }
    const size_t len = size_t(p_ - start);
    if (!exponent && len <= 300) return true;  // |x| < 10^300 whatever its digits
    char buf[512];
    if (len >= sizeof(buf)) return false;
    std::memcpy(buf, start, len);
    buf[len] = '\0';
    return std::isfinite(std::strtod(buf, nullptr));
  }
  bool digits() {  // one or more
    const char* start = p_;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    return p_ > start;
  }

  void ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  char peek() const { return p_ < end_ ? *p_ : '\0'; }
  bool eat(char c) {
    if (p_ < end_ && *p_ == c) {
      ++p_;
      return true;
    }
    return false;
  }

  const char* p_;
  const char* end_;
};

}  // namespace

bool skim_sglang_event(std::string_view json, SglangEventFields& out) {
  out = SglangEventFields{};
  return Skimmer(json).event(out);
}

}  // namespace moeserve::bench

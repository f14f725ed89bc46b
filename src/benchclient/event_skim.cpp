#include "benchclient/event_skim.h"

namespace moeserve::bench {

namespace {

class Skimmer {
 public:
  explicit Skimmer(std::string_view s) : p_(s.data()), end_(s.data() + s.size()) {}

  bool event(SglangEventFields& out) {
    ws();
    if (!object([&](std::string_view key) {
          if (key == "text") return string_value(&out.text_bytes);
          if (key == "meta_info") return meta_info(out);
          if (key == "error") return null_or_decline();
          return skip_value();
        }))
      return false;
    ws();
    return p_ == end_;
  }

 private:
  bool meta_info(SglangEventFields& out) {
    if (peek() == 'n') return skip_value();  // null
    return object([&](std::string_view key) {
      if (key == "completion_tokens") return integer(&out.completion_tokens);
      if (key == "prompt_tokens") return integer(&out.prompt_tokens);
      if (key == "finish_reason") return null_or_decline();
      return skip_value();
    });
  }

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

  // Keys are compared raw: a key with escapes never matches the plain names we look for, which is fine.
  bool key_string(std::string_view* key) {
    const char* start = p_ + 1;
    int64_t ignored;
    if (!string_value(&ignored)) return false;
    *key = std::string_view(start, size_t(p_ - 1 - start));
    return true;
  }

  // A string; *decoded gets its UTF-8 length after unescaping.
  bool string_value(int64_t* decoded) {
    if (!eat('"')) return false;
    int64_t n = 0;
    while (p_ < end_) {
      char c = *p_++;
      if (c == '"') {
        *decoded = n;
        return true;
      }
      if (c != '\\') {
        ++n;
        continue;
      }
      if (p_ >= end_) return false;
      char e = *p_++;
      if (e != 'u') {
        ++n;
        continue;
      }
      if (end_ - p_ < 4) return false;
      unsigned cp = 0;
      for (int i = 0; i < 4; ++i) {
        char h = *p_++;
        int d = h >= '0' && h <= '9'   ? h - '0'
                : h >= 'a' && h <= 'f' ? h - 'a' + 10
                : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                       : -1;
        if (d < 0) return false;
        cp = cp << 4 | unsigned(d);
      }
      // A surrogate pair is 4 bytes in UTF-8: count them on the high half.
      n += cp < 0x80 ? 1 : cp < 0x800 ? 2 : (cp >= 0xD800 && cp < 0xDC00) ? 4 : (cp >= 0xDC00 && cp < 0xE000) ? 0 : 3;
    }
    return false;
  }

  bool integer(int64_t* v) {
    bool neg = eat('-');
    if (p_ >= end_ || *p_ < '0' || *p_ > '9') return false;
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
    // A number: sign, digits, fraction, exponent.
    const char* start = p_;
    eat('-');
    while (p_ < end_ && ((*p_ >= '0' && *p_ <= '9') || *p_ == '.' || *p_ == 'e' || *p_ == 'E' || *p_ == '+' ||
                         *p_ == '-'))
      ++p_;
    return p_ > start && (p_[-1] >= '0' && p_[-1] <= '9');
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

// A guard for JSON from outside the process (request bodies, tool-call arguments, model output, checkpoint files):
// nlohmann::json parses iteratively but copies, compares, prints and destroys values recursively, so a few hundred
// kilobytes of '[' would exhaust a thread's stack. Every parse of such text checks its nesting first.
#pragma once

#include <cstddef>
#include <string_view>

namespace moeserve {

// The deepest nesting of arrays and objects accepted (JSON schemas of tools nest a few dozen levels).
constexpr int kMaxJsonDepth = 256;

// Whether `text` nests arrays / objects more than `limit` levels deep. Strings (with their escapes) are skipped;
// nothing else is validated (the parser does that); stops at the first level past the limit. Header-only: the
// libraries that parse such text (http, parsers, template, benchclient) do not link the core library.
inline bool json_nesting_exceeds(std::string_view text, int limit = kMaxJsonDepth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // the escaped character (\" included) cannot end the string
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    }
  }
  return false;
}

}  // namespace moeserve

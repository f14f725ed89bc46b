// Small string helpers shared by the parsers (internal to src/parsers/).
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string_view>

namespace moeserve::parsers::detail {

// ASCII whitespace as Python's str.strip() sees it for ASCII text: what chat templates put around tags.
inline bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

inline std::string_view lstrip(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  return s.substr(i);
}

inline std::string_view rstrip(std::string_view s) {
  size_t n = s.size();
  while (n > 0 && is_space(s[n - 1])) --n;
  return s.substr(0, n);
}

inline std::string_view strip(std::string_view s) { return rstrip(lstrip(s)); }

inline bool all_space(std::string_view s) { return lstrip(s).empty(); }

// Length of the longest suffix of `s` that is a proper prefix of `tag`: those bytes may become the tag
// once more text arrives, so a streaming parser must hold them back.
inline size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  size_t max_len = std::min(s.size(), tag.size() - 1);
  for (size_t len = max_len; len > 0; --len) {
    if (s.substr(s.size() - len) == tag.substr(0, len)) return len;
  }
  return 0;
}

inline size_t partial_tag_suffix(std::string_view s, std::initializer_list<std::string_view> tags) {
  size_t best = 0;
  for (std::string_view t : tags) best = std::max(best, partial_tag_suffix(s, t));
  return best;
}

// True when `s` is a proper prefix of `tag` (more bytes could complete it).
inline bool is_proper_prefix(std::string_view s, std::string_view tag) {
  return s.size() < tag.size() && tag.substr(0, s.size()) == s;
}

}  // namespace moeserve::parsers::detail

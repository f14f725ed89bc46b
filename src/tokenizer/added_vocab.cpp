#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace moeserve::tok {
namespace {

size_t prev_char_start(std::string_view s, size_t i) {
  do { --i; } while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80);
  return i;
}

char32_t char_at(std::string_view s, size_t i, int& len) { return unicode::decode_valid(s.data(), i, len); }

// Rust regex `\w$` on s[..i] and `^\w` on s[i..]: the single_word boundary checks.
bool ends_with_word(std::string_view s, size_t i) {
  if (i == 0) return false;
  int len;
  return unicode::classes(char_at(s, prev_char_start(s, i), len)) & unicode::kWord;
}
bool starts_with_word(std::string_view s, size_t i) {
  if (i >= s.size()) return false;
  int len;
  return unicode::classes(char_at(s, i, len)) & unicode::kWord;
}

// Start of the whitespace run that ends at i (Rust regex `\s*$` on s[..i]).
size_t space_leftmost_at_end(std::string_view s, size_t i) {
  while (i > 0) {
    size_t p = prev_char_start(s, i);
    int len;
    if (!unicode::is_white_space(char_at(s, p, len))) break;
    i = p;
  }
  return i;
}

// Length of the whitespace run that starts at i (Rust regex `^\s*` on s[i..]).
size_t space_rightmost_at_start(std::string_view s, size_t i) {
  size_t j = i;
  while (j < s.size()) {
    int len;
    if (!unicode::is_white_space(char_at(s, j, len))) break;
    j += len;
  }
  return j - i;
}

}  // namespace

uint32_t AddedTokenMatcher::child(uint32_t node, unsigned char b) const {
  const auto& ch = nodes_[node].children;
  auto it = std::lower_bound(ch.begin(), ch.end(), b,
                             [](const std::pair<unsigned char, uint32_t>& e, unsigned char v) { return e.first < v; });
  return (it != ch.end() && it->first == b) ? it->second : 0;
}

void AddedTokenMatcher::add(std::string_view pattern, uint32_t token_index) {
  if (pattern.empty()) return;
  uint32_t node = 0;
  for (unsigned char b : pattern) {
    uint32_t next = child(node, b);
    if (next == 0) {
      next = static_cast<uint32_t>(nodes_.size());
      nodes_.emplace_back();
      auto& ch = nodes_[node].children;
      auto it = std::lower_bound(ch.begin(), ch.end(), b, [](const std::pair<unsigned char, uint32_t>& e,
                                                              unsigned char v) { return e.first < v; });
      ch.insert(it, {b, next});
    }
    node = next;
  }
  if (nodes_[node].token < 0) nodes_[node].token = token_index;
  first_byte_[static_cast<unsigned char>(pattern[0])] = true;
}

bool AddedTokenMatcher::find(std::string_view s, size_t from, size_t& begin, size_t& end,
                             uint32_t& token_index) const {
  if (empty()) return false;
  const size_t n = s.size();
  for (size_t p = from; p < n; ++p) {
    if (!first_byte_[static_cast<unsigned char>(s[p])]) continue;
    uint32_t node = 0;
    int64_t best = -1;
    size_t best_end = 0;
    for (size_t q = p; q < n; ++q) {
      node = child(node, static_cast<unsigned char>(s[q]));
      if (node == 0) break;
      if (nodes_[node].token >= 0) {
        best = nodes_[node].token;
        best_end = q + 1;
      }
    }
    if (best >= 0) {
      begin = p;
      end = best_end;
      token_index = static_cast<uint32_t>(best);
      return true;
    }
  }
  return false;
}

void AddedVocabulary::split(std::string_view s, bool normalized_pass, std::vector<Segment>& out) const {
  const AddedTokenMatcher& m = normalized_pass ? normalized_ : raw_;
  const size_t n = s.size();
  if (n == 0) return;
  size_t start_offset = 0, pos = 0, b, e;
  uint32_t ti;
  // Mirrors tokenizers' AddedVocabulary::find_matches, including its quirks: the search resumes at the end of
  // the raw match even when rstrip took more, and a discarded single_word match still consumes its text.
  while (m.find(s, pos, b, e, ti)) {
    pos = e;
    const AddedToken& t = tokens_[ti];
    size_t start = b, stop = e;
    if (t.single_word) {
      bool start_space = start == 0 || !ends_with_word(s, start);
      bool stop_space = stop == n || !starts_with_word(s, stop);
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) start = std::max(space_leftmost_at_end(s, start), start_offset);
    if (t.rstrip) stop += space_rightmost_at_start(s, stop);
    if (start_offset < start) out.push_back({uint32_t(start_offset), uint32_t(start), -1});
    out.push_back({uint32_t(start), uint32_t(stop), t.id});
    start_offset = stop;
  }
  if (start_offset != n) out.push_back({uint32_t(start_offset), uint32_t(n), -1});
}

}  // namespace moeserve::tok

// Added tokens (tokenizer.json "added_tokens"): split out of the text before the model sees it, as Hugging Face's
// AddedVocabulary does: leftmost-longest matching, then the single_word / lstrip / rstrip rules. Tokens with
// normalized=false match the raw text; tokens with normalized=true match the normalized text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// A piece of the input: either an added token (id >= 0) or text [begin, end) still to be tokenized.
struct Segment {
  uint32_t begin;
  uint32_t end;
  int32_t id;
};

// Finds a set of strings with leftmost-longest semantics (what the aho-corasick crate's LeftmostLongest
// gives Hugging Face). A byte trie is enough: added tokens are few and short.
class AddedTokenMatcher {
 public:
  // pattern_of[i] is the string to find for tokens[i] (its content, or its normalized content).
  void add(std::string_view pattern, uint32_t token_index);
  bool empty() const { return nodes_.size() <= 1; }
  // Leftmost-longest match at or after `from`; false if none. A pattern added twice keeps its first token.
  bool find(std::string_view s, size_t from, size_t& begin, size_t& end, uint32_t& token_index) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, uint32_t>> children;  // sorted by byte
    int64_t token = -1;
  };
  uint32_t child(uint32_t node, unsigned char b) const;
  std::vector<Node> nodes_{1};
  bool first_byte_[256] = {};
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // `normalize` maps a normalized=true token's content to the form it takes in normalized text.
  template <typename NormalizeFn>
  void build(std::vector<AddedToken> tokens, NormalizeFn&& normalize) {
    tokens_ = std::move(tokens);
    for (uint32_t i = 0; i < tokens_.size(); ++i) {
      const AddedToken& t = tokens_[i];
      if (t.content.empty()) continue;
      if (t.normalized) normalized_.add(normalize(t.content), i);
      else raw_.add(t.content, i);
    }
  }

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool has_normalized_tokens() const { return !normalized_.empty(); }

  // Splits s into segments covering it. `normalized_pass` picks the normalized=true tokens.
  void split(std::string_view s, bool normalized_pass, std::vector<Segment>& out) const;

 private:
  std::vector<AddedToken> tokens_;
  AddedTokenMatcher raw_;
  AddedTokenMatcher normalized_;
};

}  // namespace moeserve::tok

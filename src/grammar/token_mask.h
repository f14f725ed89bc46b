// Constrained decoding over a vocabulary: which tokens a grammar (a JSON schema or a regular expression) allows next, and a request's constraint
// state as its tokens are generated (optionally after a reasoning section the grammar does not touch).
//
// The allowed set is computed by walking a byte trie of the vocabulary with the matcher, a subtree dropped at the
// first byte the grammar rejects. Inside a string whose content is free (JsonMatcher::in_plain_string) every
// "plain" token (no quote, backslash, control byte; valid UTF-8) is allowed at once and only the others are
// walked, so a string step costs a walk of ~the vocabulary's non-plain tokens, not all of it (under a maxLength:
// the plain tokens of at most the room's code points).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "grammar/json_grammar.h"
#include "grammar/regex_grammar.h"

namespace moeserve::grammar {

class TokenVocabulary {
 public:
  // bytes[id]: the raw bytes token id adds to the text; nullopt (or empty) for a token never allowed inside a
  // constrained text (special and added tokens, unassigned ids, ids the tokenizer does not have).
  explicit TokenVocabulary(const std::vector<std::optional<std::string>>& bytes);
  int32_t size() const { return size_; }
  // Sets allowed[id] = 1 (allowed has size() entries) for every token whose bytes `m` accepts; leaves the others.
  void mark_allowed(const JsonMatcher& m, std::vector<uint8_t>& allowed) const;
  // The same for a regular expression (a walk of the whole trie: a DFA step is one table lookup).
  void mark_allowed(const RegexMatcher& m, std::vector<uint8_t>& allowed) const;
  // The token's bytes; nullptr for a token never allowed (or outside the vocabulary).
  const std::string* bytes_of(int32_t id) const {
    return id >= 0 && id < size_ && !bytes_[size_t(id)].empty() ? &bytes_[size_t(id)] : nullptr;
  }
  // The longest token, in bytes.
  int max_token_bytes() const { return max_bytes_; }

 private:
  struct Trie {
    // The nodes in preorder (the walks are a forward scan that skips refused subtrees): node 0 is the root, a node's
    // subtree is [its index, end), the tokens whose bytes end at node i are tokens[nodes[i].token_begin,
    // nodes[i + 1].token_begin) (a sentinel node closes the list).
    struct Node {
      int32_t end = 0, token_begin = 0;
      uint16_t depth = 0;
      uint8_t byte = 0;
    };
    std::vector<Node> nodes;
    std::vector<int32_t> tokens;
    int max_depth = 0;
    void build(std::vector<std::pair<std::string, int32_t>> entries);
    // The walks: a forward scan in which a node's state is step(its parent's state, its byte, out) - false refuses
    // the node and its subtree - and the tokens of every node reached are marked allowed.
    template <class State, class Step>
    void scan(const State& root, Step step, std::vector<uint8_t>& allowed) const;
  };
  int32_t size_ = 0;
  int max_bytes_ = 0;
  std::vector<std::string> bytes_;  // by id; empty: never allowed
  Trie all_, non_plain_, plain_trie_;  // plain_trie_: the plain tokens (the pattern strings' fast path)
  // Tokens any free string content accepts, fewest code points first; plain_cp_[i]: the code points of plain_[i].
  std::vector<int32_t> plain_, plain_cp_;
};

// What a request's output must be: shared by its choices (each keeps its own Constraint). The grammar is a JSON schema
// or a regular expression (exactly one of the two).
struct ConstraintSpec {
  std::shared_ptr<const JsonSchema> schema;
  std::shared_ptr<const Regex> regex;
  std::shared_ptr<const TokenVocabulary> vocab;
  // Reasoning before the document (a reasoning parser separates it): the grammar starts after think_close.
  // kMaybeReasoning: the output may open with think_open (then reasoning) or start the document directly.
  enum class Start { kDocument, kMaybeReasoning, kReasoning };
  Start start = Start::kDocument;
  int32_t think_open = -1, think_close = -1;
};

class Constraint {
 public:
  // end_tokens: the tokens that end the output (eos, stop token ids), allowed once the document is complete.
  Constraint(std::shared_ptr<const ConstraintSpec> spec, std::vector<int32_t> end_tokens);
  // Whether the next token is constrained at all (false inside the reasoning section).
  bool constraining() const { return phase_ != Phase::kReasoning; }
  // The tokens that may come next as a bitmask over the vocabulary: `words` gets (size + 31) / 32 words, bit t % 32
  // of word t / 32 set where token t is allowed (the samplers take it as SampleSpec::allowed); `words` is left empty
  // when !constraining(). Where the grammar allows no token at all (stuck()), only the end tokens: the one sampled
  // then is refused by accept(), and the request ends.
  void allowed_tokens(std::vector<uint32_t>& words) const;
  bool stuck() const { return stuck_; }
  // Advances by the token generated; false if the grammar did not allow it (the state is then unchanged).
  bool accept(int32_t token);
  // Whether the document is complete.
  bool complete() const { return phase_ == Phase::kDocument && can_finish(); }

 private:
  enum class Phase { kMaybeReasoning, kReasoning, kDocument };
  bool can_finish() const;  // the grammar's text so far is whole (whatever the phase)
  std::shared_ptr<const ConstraintSpec> spec_;
  std::vector<int32_t> end_tokens_;
  Phase phase_;
  std::variant<JsonMatcher, RegexMatcher> matcher_;
  mutable std::vector<uint8_t> allowed_;  // allowed_tokens' scratch
  // A regex's masks by DFA state (the document phase's; at most kMaskCacheEntries of ~19 KB at Qwen3's vocabulary).
  struct CachedMask {
    std::vector<uint32_t> words;
    bool stuck;
  };
  static constexpr size_t kMaskCacheEntries = 64;
  mutable std::unordered_map<int32_t, CachedMask> mask_cache_;
  mutable bool stuck_ = false;
};

}  // namespace moeserve::grammar

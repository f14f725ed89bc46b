// The BPE model of tokenizer.json: vocabulary, ranked merges, byte_fallback / unk handling, ignore_merges,
// and a per-word cache. Merges are applied lowest rank first, leftmost first among equal ranks, which is the
// order tokenizers' Word::merge_all produces.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/json_loader.h"

namespace moeserve::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// (left id, right id) -> (rank, merged id), open addressing: the lookup is the inner loop of BPE.
class MergeTable {
 public:
  void reserve(size_t n);
  // A pair listed twice keeps its last rank, like the HashMap tokenizers collects the merges into.
  void insert(int32_t a, int32_t b, uint32_t rank, int32_t merged);
  bool find(int32_t a, int32_t b, uint32_t& rank, int32_t& merged) const {
    const uint64_t key = pack(a, b);
    for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) {
        rank = s.rank;
        merged = s.merged;
        return true;
      }
      if (s.key == kEmpty) return false;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  struct Slot {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    int32_t merged = 0;
  };
  static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  static uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
  }
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  size_t size_ = 0;
};

// Words already tokenized, shared by all threads: sharded so that encode_batch threads rarely contend.
class BpeCache {
 public:
  bool lookup(std::string_view word, size_t hash, std::vector<int32_t>& out) const;
  void insert(std::string_view word, size_t hash, const int32_t* ids, size_t n) const;

 private:
  static constexpr size_t kShards = 32;
  static constexpr size_t kMaxPerShard = 8192;  // a full shard is cleared: cheap, and adapts to new text
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  mutable std::array<Shard, kShards> shards_;
};

class BpeModel {
 public:
  // Builds the model from tokenizer.json's "model" options and the vocabulary and merges the loader set aside
  // (consumed). Throws UserError naming `where`.
  static std::unique_ptr<BpeModel> from_json(const nlohmann::json& j, TokenizerJson& data, const std::string& where);

  // Pieces arrive as raw bytes that the ByteLevel pre-tokenizer maps to printable characters.
  void set_byte_level(bool on);

  void tokenize(std::string_view piece, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr for an id not in the vocabulary
  size_t vocab_len() const { return vocab_.size(); }
  int32_t max_id() const { return static_cast<int32_t>(tokens_.size()) - 1; }

 private:
  BpeModel() = default;
  void tokenize_word(std::string_view word, std::vector<int32_t>& out) const;
  void initial_symbols(std::string_view piece, std::vector<int32_t>& syms) const;
  void merge(std::vector<int32_t>& syms) const;
  void merge_small(std::vector<int32_t>& syms) const;
  void merge_heap(std::vector<int32_t>& syms) const;

  TokenMap vocab_;
  std::vector<const std::string*> tokens_;  // by id: the vocab_ keys (node-based, so stable); nullptr if none
  MergeTable merges_;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string prefix_;  // continuing_subword_prefix
  std::string suffix_;  // end_of_word_suffix
  std::array<int32_t, 256> byte_fallback_ids_{};  // <0xNN> tokens, -1 if absent
  // SentencePiece vocabularies: when no token has a U+2581 right after another character, no merge can join
  // across such a point, so a long word (a whole sentence, without pre-tokenizer) is tokenized in chunks that
  // start there, each through the cache. Same result, far faster.
  bool split_at_metaspace_ = false;
  bool byte_level_ = false;
  std::array<int32_t, 256> byte_char_ids_{};  // byte-level: the token of each byte's character, -1 if absent
  BpeCache cache_;
};

}  // namespace moeserve::tok

#include "tokenizer/bpe.h"

#include <limits>
#include <queue>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/unicode.h"

namespace moeserve::tok {
namespace {

constexpr uint32_t kNoMerge = std::numeric_limits<uint32_t>::max();
constexpr size_t kMaxCachedWord = 256;  // bytes; longer words are rare and would crowd the cache
constexpr size_t kSmallWord = 48;        // up to this many symbols a linear scan beats a heap

}  // namespace

// --- MergeTable ------------------------------------------------------------------------------------------------

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  size_ = 0;
}

void MergeTable::insert(int32_t a, int32_t b, uint32_t rank, int32_t merged) {
  MS_CHECK(size_ * 2 < slots_.size(), "merge table over capacity");
  const uint64_t key = pack(a, b);
  for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key || s.key == kEmpty) {
      if (s.key == kEmpty) ++size_;
      s = Slot{key, rank, merged};
      return;
    }
  }
}

// --- BpeCache --------------------------------------------------------------------------------------------------

bool BpeCache::lookup(std::string_view word, size_t hash, std::vector<int32_t>& out) const {
  Shard& sh = shards_[hash % kShards];
  std::lock_guard<std::mutex> lock(sh.mu);
  auto it = sh.map.find(word);
  if (it == sh.map.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void BpeCache::insert(std::string_view word, size_t hash, const int32_t* ids, size_t n) const {
  Shard& sh = shards_[hash % kShards];
  std::lock_guard<std::mutex> lock(sh.mu);
  if (sh.map.size() >= kMaxPerShard) sh.map.clear();
  sh.map.emplace(std::string(word), std::vector<int32_t>(ids, ids + n));
}

// --- BpeModel: loading -----------------------------------------------------------------------------------------

std::unique_ptr<BpeModel> BpeModel::from_json(const nlohmann::json& j, TokenizerJson& data,
                                              const std::string& where) {
  const std::string w = where + ": model";
  if (!j.is_object()) throw_user("{}: expected a JSON object", w);
  const std::string type = json_util::get_or<std::string>(j, "type", "", w);
  if (type.empty() ? !data.has_merges : type != "BPE") {
    throw_user("{}: unsupported model type '{}': moeserve supports BPE tokenizers only (not Unigram, WordPiece "
               "or WordLevel)",
               w, type.empty() ? "(none)" : type);
  }
  if (!data.has_vocab) throw_user("{}: missing field 'vocab' (an object of token -> id)", w);
  if (!data.has_merges) throw_user("{}: missing field 'merges'", w);
  std::unique_ptr<BpeModel> m(new BpeModel());

  m->vocab_.reserve(data.vocab.size());
  int64_t max_id = -1;
  for (auto& [tok, id] : data.vocab) {
    // Real vocabularies are dense; an id far past the number of entries is a corrupt file, and would make
    // the id table absurdly large (found by fuzzing).
    if (id < 0 || id >= int64_t(data.vocab.size()) * 2 + 65536) {
      throw_user("{}: vocab entry '{}' has id {} out of range for a vocabulary of {} entries", w, tok, id,
                 data.vocab.size());
    }
    m->vocab_[std::move(tok)] = static_cast<int32_t>(id);
    max_id = std::max(max_id, id);
  }
  data.vocab = {};
  m->tokens_.assign(size_t(max_id + 1), nullptr);
  for (const auto& [tok, id] : m->vocab_) m->tokens_[id] = &tok;

  const nlohmann::json& dropout = j.contains("dropout") ? j["dropout"] : nlohmann::json();
  if (!dropout.is_null() && !(dropout.is_number() && dropout.get<double>() == 0.0)) {
    throw_user("{}: BPE dropout is set ({}); it makes tokenization random and is only meant for training", w,
               dropout.dump());
  }
  m->fuse_unk_ = json_util::get_or<bool>(j, "fuse_unk", false, w);
  m->byte_fallback_ = json_util::get_or<bool>(j, "byte_fallback", false, w);
  m->ignore_merges_ = json_util::get_or<bool>(j, "ignore_merges", false, w);
  m->prefix_ = json_util::get_or<std::string>(j, "continuing_subword_prefix", "", w);
  m->suffix_ = json_util::get_or<std::string>(j, "end_of_word_suffix", "", w);
  const std::string unk = json_util::get_or<std::string>(j, "unk_token", "", w);
  if (!unk.empty()) {
    auto it = m->vocab_.find(unk);
    if (it == m->vocab_.end()) throw_user("{}: unk_token '{}' is not in the vocabulary", w, unk);
    m->unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = m->vocab_.find(fmt::format("<0x{:02X}>", b));
    m->byte_fallback_ids_[b] = it == m->vocab_.end() ? -1 : it->second;
  }

  m->merges_.reserve(data.merges.size());
  auto id_of = [&](std::string_view tok, size_t rank) {
    auto it = m->vocab_.find(tok);
    if (it == m->vocab_.end()) throw_user("{}: merge #{} uses '{}', which is not in the vocabulary", w, rank, tok);
    return it->second;
  };
  std::string merged;
  for (size_t rank = 0; rank < data.merges.size(); ++rank) {
    const auto& [a, b] = data.merges[rank];
    merged.assign(a);
    if (b.size() >= m->prefix_.size()) merged.append(b, m->prefix_.size(), std::string::npos);
    // Checked in this order so that the error names the first missing token, as tokenizers does.
    const int32_t a_id = id_of(a, rank), b_id = id_of(b, rank), merged_id = id_of(merged, rank);
    m->merges_.insert(a_id, b_id, static_cast<uint32_t>(rank), merged_id);
  }
  data.merges = {};
  m->set_byte_level(false);

  constexpr std::string_view kMeta = "\xE2\x96\x81";  // U+2581
  m->split_at_metaspace_ = m->vocab_.count(kMeta) && m->prefix_.empty() && m->suffix_.empty() && !m->ignore_merges_;
  for (auto it = m->vocab_.begin(); m->split_at_metaspace_ && it != m->vocab_.end(); ++it) {
    const std::string& t = it->first;
    for (size_t p = t.find(kMeta, 1); p != std::string::npos; p = t.find(kMeta, p + 1)) {
      if (p < kMeta.size() || t.compare(p - kMeta.size(), kMeta.size(), kMeta) != 0) {
        m->split_at_metaspace_ = false;
        break;
      }
    }
  }
  return m;
}

void BpeModel::set_byte_level(bool on) {
  byte_level_ = on;
  const auto& table = unicode::byte_level_table();
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(table.byte_to_utf8[b]);
    byte_char_ids_[b] = (on && it != vocab_.end()) ? it->second : -1;
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= tokens_.size()) return nullptr;
  return tokens_[id];
}

// --- BpeModel: tokenization ------------------------------------------------------------------------------------

void BpeModel::initial_symbols(std::string_view piece, std::vector<int32_t>& syms) const {
  const auto& table = unicode::byte_level_table();
  const bool affixes = !prefix_.empty() || !suffix_.empty();
  bool unk_pending = false;
  std::string key;
  size_t i = 0;
  const size_t n = piece.size();
  while (i < n) {
    const unsigned char lead = static_cast<unsigned char>(piece[i]);
    std::string_view ch;
    size_t next;
    if (byte_level_) {
      if (!affixes && byte_char_ids_[lead] >= 0) {
        if (unk_pending) { syms.push_back(unk_id_); unk_pending = false; }
        syms.push_back(byte_char_ids_[lead]);
        ++i;
        continue;
      }
      ch = table.byte_to_utf8[lead];
      next = i + 1;
    } else {
      next = std::min(n, i + size_t(unicode::utf8_len(lead)));
      ch = piece.substr(i, next - i);
    }
    std::string_view k = ch;
    if (affixes) {
      key.clear();
      if (i > 0) key += prefix_;
      key += ch;
      if (next >= n) key += suffix_;
      k = key;
    }
    auto it = vocab_.find(k);
    if (it != vocab_.end()) {
      if (unk_pending) { syms.push_back(unk_id_); unk_pending = false; }
      syms.push_back(it->second);
    } else {
      bool done = false;
      if (byte_fallback_) {
        done = true;
        for (unsigned char c : k) done = done && byte_fallback_ids_[c] >= 0;
        // Like tokenizers, a pending unk is not flushed before byte tokens (it cannot happen when the
        // vocabulary has all 256 byte tokens, which byte_fallback vocabularies do).
        if (done) {
          for (unsigned char c : k) syms.push_back(byte_fallback_ids_[c]);
        }
      }
      if (!done && unk_id_ >= 0) {
        if (unk_pending && !fuse_unk_) syms.push_back(unk_id_);
        unk_pending = true;
      }
      // Without an unk token an unknown character is dropped, as tokenizers does.
    }
    i = next;
  }
  if (unk_pending) syms.push_back(unk_id_);
}

void BpeModel::merge_small(std::vector<int32_t>& syms) const {
  size_t n = syms.size();
  uint32_t rank[kSmallWord];
  int32_t merged[kSmallWord];
  auto compute = [&](size_t i) {
    if (!merges_.find(syms[i], syms[i + 1], rank[i], merged[i])) rank[i] = kNoMerge;
  };
  for (size_t i = 0; i + 1 < n; ++i) compute(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (rank[i] < rank[best]) best = i;
    }
    if (rank[best] == kNoMerge) break;
    syms[best] = merged[best];
    for (size_t i = best + 1; i + 1 < n; ++i) syms[i] = syms[i + 1];
    for (size_t i = best; i + 2 < n; ++i) {
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) compute(best - 1);
    if (best + 1 < n) compute(best);
  }
  syms.resize(n);
}

void BpeModel::merge_heap(std::vector<int32_t>& syms) const {
  // A doubly linked list over the symbols and a min-heap of candidate merges by (rank, position); stale
  // candidates are recognised when popped. O(n log n) however long the word.
  const size_t n = syms.size();
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = int32_t(i) - 1;
    next[i] = i + 1 < n ? int32_t(i + 1) : -1;
  }
  struct Cand {
    uint32_t rank;
    uint32_t pos;
    int32_t merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    uint32_t r;
    int32_t m;
    if (merges_.find(syms[pos], syms[next[pos]], r, m)) heap.push({r, uint32_t(pos), m});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(int32_t(i));
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    const int32_t right = next[c.pos];
    uint32_t r;
    int32_t m;
    if (!merges_.find(syms[c.pos], syms[right], r, m) || m != c.merged) continue;
    syms[c.pos] = m;
    alive[right] = false;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = int32_t(c.pos);
    push(prev[c.pos]);
    push(int32_t(c.pos));
  }
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    if (alive[i]) syms[k++] = syms[i];
  }
  syms.resize(k);
}

void BpeModel::merge(std::vector<int32_t>& syms) const {
  if (syms.size() < 2) return;
  if (syms.size() <= kSmallWord) merge_small(syms);
  else merge_heap(syms);
}

void BpeModel::tokenize(std::string_view piece, std::vector<int32_t>& out) const {
  if (split_at_metaspace_ && !byte_level_) {
    constexpr std::string_view kMeta = "\xE2\x96\x81";
    size_t start = 0;
    for (size_t p = piece.find(kMeta, 1); p != std::string_view::npos; p = piece.find(kMeta, p + kMeta.size())) {
      if (p >= start + kMeta.size() && piece.compare(p - kMeta.size(), kMeta.size(), kMeta) != 0) {
        tokenize_word(piece.substr(start, p - start), out);
        start = p;
      }
    }
    tokenize_word(piece.substr(start), out);
    return;
  }
  tokenize_word(piece, out);
}

void BpeModel::tokenize_word(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  const bool affixes = !prefix_.empty() || !suffix_.empty();
  if (byte_level_ && !affixes && piece.size() == 1 && byte_char_ids_[static_cast<unsigned char>(piece[0])] >= 0) {
    out.push_back(byte_char_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  const bool cacheable = piece.size() <= kMaxCachedWord;
  const size_t hash = cacheable ? StringHash{}(piece) : 0;
  if (cacheable && cache_.lookup(piece, hash, out)) return;

  if (ignore_merges_) {
    std::optional<int32_t> whole;
    if (byte_level_) {
      const auto& table = unicode::byte_level_table();
      std::string mapped;
      mapped.reserve(piece.size() * 2);
      for (unsigned char c : piece) mapped += table.byte_to_utf8[c];
      whole = token_to_id(mapped);
    } else {
      whole = token_to_id(piece);
    }
    if (whole) {
      out.push_back(*whole);
      return;
    }
  }
  std::vector<int32_t> syms;
  syms.reserve(piece.size());
  initial_symbols(piece, syms);
  merge(syms);
  if (cacheable) cache_.insert(piece, hash, syms.data(), syms.size());
  out.insert(out.end(), syms.begin(), syms.end());
}

}  // namespace moeserve::tok

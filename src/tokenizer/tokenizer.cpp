#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/json_loader.h"
#include "tokenizer/json_util.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace moeserve::tok {

struct Tokenizer::Impl {
  std::string source;
  std::unique_ptr<Normalizer> normalizer;
  std::vector<std::unique_ptr<PreTokenizer>> pre_tokenizers;
  std::unique_ptr<BpeModel> model;
  AddedVocabulary added;
  TokenMap added_by_content;
  SpecialTokenWrap wrap;
  std::unique_ptr<Decoder> decoder;
  int32_t vocab_size = 0;
  std::vector<const std::string*> token_of_id;  // what decoding sees for each id; nullptr where none
  std::vector<uint8_t> special;
  std::vector<uint8_t> added_id;  // an added token's id (special or not)

  void load(TokenizerJson& data);
  void load_added_tokens(const nlohmann::json& list);
  void encode_into(std::string_view text, std::vector<int32_t>& out) const;
  void encode_text(std::string_view s, bool at_origin, Pieces& pieces, std::vector<int32_t>& out) const;

  // nullptr for an unassigned id; UserError outside the vocabulary.
  const std::string* token_for_decode(int32_t id) const {
    if (id < 0 || id >= vocab_size) {
      throw_user("token id {} is out of range: the vocabulary has ids 0..{}", id, vocab_size - 1);
    }
    return token_of_id[id];
  }
};

// --- loading ---------------------------------------------------------------------------------------------------

void Tokenizer::Impl::load_added_tokens(const nlohmann::json& list) {
  const std::string w = source + ": added_tokens";
  if (list.is_null()) return;
  if (!list.is_array()) throw_user("{}: expected a list", w);
  std::vector<AddedToken> tokens;
  int64_t max_added = -1;
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& j = list[i];
    const std::string wi = fmt::format("{} #{}", w, i);
    AddedToken t;
    t.content = json_util::get<std::string>(j, "content", wi);
    t.special = json_util::get_or<bool>(j, "special", false, wi);
    t.lstrip = json_util::get_or<bool>(j, "lstrip", false, wi);
    t.rstrip = json_util::get_or<bool>(j, "rstrip", false, wi);
    t.single_word = json_util::get_or<bool>(j, "single_word", false, wi);
    t.normalized = json_util::get_or<bool>(j, "normalized", !t.special, wi);
    if (t.content.empty()) continue;
    if (!unicode::is_valid_utf8(t.content)) throw_user("{}: content is not valid UTF-8", wi);
    // tokenizers ignores the ids written in the file: a token keeps the id it already has (an earlier added
    // token, or the model vocabulary), otherwise it gets the next id after the vocabulary and earlier added
    // tokens. For well-formed files this reproduces the file's ids.
    int64_t id;
    if (auto it = added_by_content.find(t.content); it != added_by_content.end()) {
      id = it->second;
    } else if (auto mid = model->token_to_id(t.content)) {
      id = *mid;
    } else {
      const int64_t vocab_len = int64_t(model->vocab_len());
      id = (max_added < 0) ? vocab_len : (max_added >= vocab_len || vocab_len == 0 ? max_added + 1 : vocab_len);
    }
    t.id = static_cast<int32_t>(id);
    max_added = std::max(max_added, id);
    added_by_content[t.content] = t.id;
    auto same = std::find_if(tokens.begin(), tokens.end(), [&](const AddedToken& o) { return o.content == t.content; });
    if (same != tokens.end()) *same = t;
    else tokens.push_back(std::move(t));
  }
  // The matchers see special tokens first, then the others, as tokenizers builds them (this only matters when
  // two tokens have the same pattern).
  std::stable_partition(tokens.begin(), tokens.end(), [](const AddedToken& t) { return t.special; });
  added.build(std::move(tokens), [&](const std::string& content) {
    std::string s = content;
    if (normalizer) normalizer->normalize(s);
    return s;
  });
}

void Tokenizer::Impl::load(TokenizerJson& data) {
  const nlohmann::json& root = data.root;
  if (!root.is_object()) throw_user("{}: not a tokenizer.json (expected a JSON object at the top)", source);
  auto get = [&](const char* key) -> const nlohmann::json& {
    static const nlohmann::json null_json;
    auto it = root.find(key);
    return it == root.end() ? null_json : *it;
  };
  if (!root.contains("model")) throw_user("{}: not a tokenizer.json (no 'model')", source);
  model = BpeModel::from_json(root["model"], data, source);
  normalizer = make_normalizer(get("normalizer"), source);
  bool byte_level = false;
  pre_tokenizers = make_pre_tokenizers(get("pre_tokenizer"), source, byte_level);
  model->set_byte_level(byte_level);
  load_added_tokens(get("added_tokens"));
  wrap = make_special_token_wrap(get("post_processor"), source);
  decoder = Decoder::make(get("decoder"), source);
  // truncation and padding are batch-shaping options for training; the server never wants them.

  int32_t max_id = model->max_id();
  for (const AddedToken& t : added.tokens()) max_id = std::max(max_id, t.id);
  vocab_size = max_id + 1;
  // Ids the post-processor inserts must exist, or encode() would return ids no decoder knows (found by fuzzing).
  for (const auto* ids : {&wrap.prefix, &wrap.suffix})
    for (int32_t id : *ids)
      if (id < 0 || id >= vocab_size)
        throw_user("{}: post_processor inserts token id {}, outside the vocabulary [0, {})", source, id, vocab_size);
  token_of_id.assign(size_t(vocab_size), nullptr);
  special.assign(size_t(vocab_size), 0);
  added_id.assign(size_t(vocab_size), 0);
  for (int32_t id = 0; id <= model->max_id(); ++id) token_of_id[id] = model->id_to_token(id);
  for (const AddedToken& t : added.tokens()) {
    token_of_id[t.id] = &t.content;
    added_id[t.id] = 1;
    if (t.special) special[t.id] = 1;
  }
}

std::unique_ptr<Tokenizer> Tokenizer::from_json_string(const std::string& json) {
  auto impl = std::make_unique<Impl>();
  impl->source = "tokenizer.json";
  TokenizerJson data = parse_tokenizer_json(json, impl->source);
  impl->load(data);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

std::unique_ptr<Tokenizer> Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_user("cannot open tokenizer file '{}': {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw_user("cannot read tokenizer file '{}'", path);
  auto impl = std::make_unique<Impl>();
  impl->source = path;
  const std::string text = std::move(ss).str();
  TokenizerJson data = parse_tokenizer_json(text, path);
  impl->load(data);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

// --- encoding --------------------------------------------------------------------------------------------------

void Tokenizer::Impl::encode_text(std::string_view s, bool at_origin, Pieces& pieces, std::vector<int32_t>& out) const {
  pieces.reset(s, at_origin);
  for (const auto& pt : pre_tokenizers) pt->apply(pieces);
  for (const Piece& p : pieces.list) model->tokenize(pieces.view(p), out);
}

void Tokenizer::Impl::encode_into(std::string_view text, std::vector<int32_t>& out) const {
  std::string repaired;
  if (!unicode::is_valid_utf8(text)) {
    unicode::append_lossy(repaired, text, false);
    text = repaired;
  }
  std::vector<Segment> segments;
  added.split(text, /*normalized_pass=*/false, segments);
  Pieces pieces;
  std::string normalized;
  std::vector<Segment> inner;
  for (const Segment& seg : segments) {
    if (seg.id >= 0) {
      out.push_back(seg.id);
      continue;
    }
    std::string_view s = text.substr(seg.begin, seg.end - seg.begin);
    if (normalizer) {
      normalized.assign(s);
      normalizer->normalize(normalized);
      s = normalized;
    }
    const bool at_origin = seg.begin == 0;
    if (!added.has_normalized_tokens()) {
      encode_text(s, at_origin, pieces, out);
      continue;
    }
    inner.clear();
    added.split(s, /*normalized_pass=*/true, inner);
    for (const Segment& sub : inner) {
      if (sub.id >= 0) out.push_back(sub.id);
      else encode_text(s.substr(sub.begin, sub.end - sub.begin), at_origin && sub.begin == 0, pieces, out);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  if (add_special_tokens) out.insert(out.end(), impl_->wrap.prefix.begin(), impl_->wrap.prefix.end());
  impl_->encode_into(text, out);
  if (add_special_tokens) out.insert(out.end(), impl_->wrap.suffix.begin(), impl_->wrap.suffix.end());
  return out;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(const std::vector<std::string>& texts,
                                                          bool add_special_tokens) const {
  std::vector<std::vector<int32_t>> results(texts.size());
  size_t total = 0;
  for (const auto& t : texts) total += t.size();
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t nthreads = std::min(hw, texts.size());
  // Threads only pay off when there is real work to share.
  if (nthreads <= 1 || total < 16 * 1024) {
    for (size_t i = 0; i < texts.size(); ++i) results[i] = encode(texts[i], add_special_tokens);
    return results;
  }
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < texts.size() && !failed.load();) {
      try {
        results[i] = encode(texts[i], add_special_tokens);
      } catch (...) {
        if (!failed.exchange(true)) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < nthreads; ++t) threads.emplace_back(worker);
  worker();
  for (auto& th : threads) th.join();
  if (error) std::rethrow_exception(error);
  return results;
}

// --- decoding and lookups --------------------------------------------------------------------------------------

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string_view> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* t = impl_->token_for_decode(id);
    if (!t || (skip_special_tokens && impl_->special[id])) continue;
    tokens.push_back(*t);
  }
  return impl_->decoder->decode(tokens);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end()) return it->second;
  return impl_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  const std::string* t = impl_->token_for_decode(id);
  return t ? *t : std::string();
}

std::optional<std::string> Tokenizer::token_bytes(int32_t id) const {
  const std::string* t = impl_->token_for_decode(id);
  if (!t) return std::nullopt;
  return impl_->decoder->token_bytes(*t);
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::vector<std::optional<std::string>> constrained_token_bytes(const Tokenizer& t, int64_t model_vocab) {
  std::vector<std::optional<std::string>> bytes(static_cast<size_t>(std::max<int64_t>(model_vocab, 0)));
  const int32_t n = int32_t(std::min<int64_t>(model_vocab, t.vocab_size()));
  for (int32_t id = 0; id < n; ++id) {
    if (t.is_special(id)) continue;
    if (!t.is_added(id)) {
      bytes[size_t(id)] = t.token_bytes(id);
    } else if (std::string s = t.decode(std::span<const int32_t>(&id, 1)); !s.empty()) {
      bytes[size_t(id)] = std::move(s);
    }
  }
  return bytes;
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->added_id[id] != 0;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->special[id] != 0;
}

// --- streaming -------------------------------------------------------------------------------------------------

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(&tok), skip_special_tokens_(skip_special_tokens), stream_(tok.impl_->decoder->stream()) {}
StreamingDetokenizer::~StreamingDetokenizer() = default;
StreamingDetokenizer::StreamingDetokenizer(StreamingDetokenizer&&) noexcept = default;
StreamingDetokenizer& StreamingDetokenizer::operator=(StreamingDetokenizer&&) noexcept = default;

std::string StreamingDetokenizer::push(int32_t id) {
  MS_CHECK(!finished_, "StreamingDetokenizer::push after finish");
  const std::string* t = tok_->impl_->token_for_decode(id);
  if (!t || (skip_special_tokens_ && tok_->impl_->special[id])) return {};
  stream_->token(*t);
  return stream_->take();
}

std::string StreamingDetokenizer::finish() {
  if (finished_) return {};
  finished_ = true;
  stream_->finish();
  return stream_->take();
}

}  // namespace moeserve::tok

// A Hugging Face tokenizer.json tokenizer (BPE models: byte-level ones such as Qwen, Llama 3, DeepSeek and
// gpt-oss, and SentencePiece-style ones such as Llama 2 and Mistral) that produces exactly the ids of the
// `tokenizers` library, and a streaming detokenizer for generated tokens.
//
// The pipeline follows tokenizers: added tokens split out -> normalizer -> pre-tokenizer -> BPE model ->
// post-processor; decoding runs the decoder chain. Input that is not valid UTF-8 is first repaired (each invalid
// sequence becomes U+FFFD), since Hugging Face only ever sees Unicode strings.
//
// Thread safety: a Tokenizer is immutable after loading except for its internal word cache, which is
// synchronised; encode/decode may be called from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::tok {

class DecodeStream;

class Tokenizer {
 public:
  // UserError for an unreadable or malformed file, or a component moeserve does not support (named).
  static std::unique_ptr<Tokenizer> from_file(const std::string& tokenizer_json_path);
  static std::unique_ptr<Tokenizer> from_json_string(const std::string& json);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Encodes on several threads; the result is the same as calling encode on each text.
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string>& texts,
                                                 bool add_special_tokens = true) const;
  // UserError for an id outside [0, vocab_size()); an id inside the range with no token is skipped, as
  // tokenizers does.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token's string ("" for an unassigned id); UserError outside [0, vocab_size()).
  std::string id_to_token(int32_t id) const;
  // The raw bytes the token adds to a text (Decoder::token_bytes); nullopt for an unassigned id. UserError outside
  // [0, vocab_size()).
  std::optional<std::string> token_bytes(int32_t id) const;
  int32_t vocab_size() const;  // max id + 1 over vocab and added tokens
  bool is_special(int32_t id) const;
  bool is_added(int32_t id) const;  // one of tokenizer.json's added_tokens (special or not)

 private:
  friend class StreamingDetokenizer;
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What each id of a model's vocabulary (model_vocab ids, the tokenizer's and any padding past it) adds to a
// constrained text (grammar::TokenVocabulary): a vocabulary token its raw bytes, an added token that is not special
// its content as decode() writes it (Qwen3's <tool_call>, </tool_call>, <think>: the model's own spelling of those
// tags stays available under a grammar), nothing for special tokens (<|im_end|>, ...) and ids without a token.
std::vector<std::optional<std::string>> constrained_token_bytes(const Tokenizer& t, int64_t model_vocab);

// Incremental detokenizer for one request: never emits an incomplete UTF-8 sequence; the concatenation of
// everything emitted equals decode(all ids) (same skip_special_tokens). The Tokenizer must outlive it.
class StreamingDetokenizer {
 public:
  StreamingDetokenizer(const Tokenizer& tok, bool skip_special_tokens);
  ~StreamingDetokenizer();
  StreamingDetokenizer(StreamingDetokenizer&&) noexcept;
  StreamingDetokenizer& operator=(StreamingDetokenizer&&) noexcept;

  std::string push(int32_t id);  // text that became final with this token (may be empty); UserError as decode
  std::string finish();          // whatever is left (an incomplete UTF-8 tail becomes U+FFFD like decode)

 private:
  const Tokenizer* tok_;
  bool skip_special_tokens_;
  bool finished_ = false;
  std::unique_ptr<DecodeStream> stream_;
};

}  // namespace moeserve::tok

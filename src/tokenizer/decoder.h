// tokenizer.json "decoder": turns token strings back into text. Supported steps: ByteLevel, Replace,
// ByteFallback, Fuse, Strip, Metaspace, and Sequence of those; no decoder joins tokens with spaces.
//
// Two implementations of the same chain:
//  - decode(): a direct transcription of tokenizers' decode_chain functions over the whole token list, the
//    reference;
//  - DecodeStream: the same steps as incremental stages. Each stage holds back only what a later token could
//    still change (an incomplete UTF-8 sequence, a run of <0xNN> byte tokens, trailing characters a Strip may
//    remove), so every token costs O(1) amortised and the streamed text equals decode() exactly.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/pattern.h"

namespace moeserve::tok {

struct DecoderStep {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind;
  std::shared_ptr<const Pattern> pattern;  // kReplace
  std::string content;                     // kReplace: replacement text
  char32_t ch = 0;                         // kStrip: the stripped character; kMetaspace: the replacement
  size_t start = 0, stop = 0;              // kStrip
  bool drop_first = false;                 // kMetaspace: prepend_scheme is not "never"
};

class DecodeStream {
 public:
  virtual ~DecodeStream() = default;
  virtual void token(std::string_view t) = 0;
  virtual void finish() = 0;
  // Text that became final since the last call.
  virtual std::string take() = 0;
};

class Decoder {
 public:
  // A JSON null gives the "no decoder" behaviour. Throws UserError naming `where`.
  static std::unique_ptr<Decoder> make(const nlohmann::json& j, const std::string& where);

  std::string decode(const std::vector<std::string_view>& tokens) const;
  // The raw bytes one token stands for in the middle of a text (constrained decoding's vocabulary): the chain
  // without its UTF-8 repair (a ByteLevel token may be part of a character) and without the steps that depend on
  // the token's place (Strip; Metaspace's dropped first space).
  std::string token_bytes(std::string_view token) const;
  std::unique_ptr<DecodeStream> stream() const;

 private:
  std::vector<DecoderStep> steps_;
  bool join_with_spaces_ = false;
};

}  // namespace moeserve::tok

// tokenizer.json "pre_tokenizer": cuts normalized text into the pieces the model tokenizes one by one.
// Supported: Split, ByteLevel, Metaspace, Digits, WhitespaceSplit, CharDelimiterSplit and Sequence.
//
// ByteLevel's byte -> printable-character mapping is not applied here: it must be the last pre-tokenizer,
// and the BPE model then reads the raw bytes of each piece through the mapping table, which saves building a
// second copy of the text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/pattern.h"

namespace moeserve::tok {

struct Piece {
  uint32_t begin;
  uint32_t end;
  bool at_origin;  // starts at byte 0 of the original input (Metaspace's prepend_scheme "first")
};

// Pieces of `buf`, plus scratch space that stages reuse so that encoding a text allocates little.
struct Pieces {
  std::string buf;
  std::vector<Piece> list;
  std::string tmp_buf;
  std::vector<Piece> tmp_list;
  std::vector<Span> matches;

  void reset(std::string_view text, bool at_origin) {
    buf.assign(text);
    list.clear();
    if (!buf.empty()) list.push_back({0, uint32_t(buf.size()), at_origin});
  }
  std::string_view view(const Piece& p) const { return std::string_view(buf).substr(p.begin, p.end - p.begin); }
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void apply(Pieces& pieces) const = 0;
};

// Builds the pre-tokenizer chain, flattening Sequences. Sets byte_level when the chain ends with ByteLevel.
// Throws UserError naming `where` for unsupported types (or a pre-tokenizer placed after ByteLevel).
std::vector<std::unique_ptr<PreTokenizer>> make_pre_tokenizers(const nlohmann::json& j, const std::string& where,
                                                               bool& byte_level);

}  // namespace moeserve::tok

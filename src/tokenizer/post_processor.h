// tokenizer.json "post_processor" for a single sequence: the special tokens wrapped around the ids when
// add_special_tokens is true (e.g. Llama's BOS). ByteLevel only trims offsets, which ids do not carry.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>


namespace moeserve::tok {

struct SpecialTokenWrap {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

// Supports TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel and Sequence. Throws UserError
// naming `where` otherwise.
SpecialTokenWrap make_special_token_wrap(const nlohmann::json& j, const std::string& where);

}  // namespace moeserve::tok

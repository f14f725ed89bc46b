// Reads tokenizer.json. The vocabulary and merges (hundreds of thousands of entries) are taken straight from
// the SAX events into flat vectors; only the small rest becomes a JSON DOM. Building a DOM for the whole file
// took most of the load time (a std::map insert per vocabulary entry).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::tok {

struct TokenizerJson {
  nlohmann::json root;  // the whole file, with model.vocab and model.merges replaced by null
  bool has_vocab = false;
  bool has_merges = false;
  std::vector<std::pair<std::string, int64_t>> vocab;  // model.vocab in file order
  std::vector<std::pair<std::string, std::string>> merges;  // model.merges, either spelling, in file order
};

// Throws UserError naming `where` for invalid JSON or a malformed vocab / merges entry.
TokenizerJson parse_tokenizer_json(std::string_view text, const std::string& where);

}  // namespace moeserve::tok

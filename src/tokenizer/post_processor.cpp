#include "tokenizer/post_processor.h"

#include <sstream>

#include "tokenizer/json_util.h"

namespace moeserve::tok {
namespace {

// Template items: the sequence ("$A", "$0", {"Sequence": ...}) or a special token by name.
struct Item {
  bool is_sequence;
  std::string name;
};

std::vector<Item> template_items(const nlohmann::json& single, const std::string& w) {
  std::vector<Item> items;
  if (single.is_string()) {
    // The compact form "<s> $A:0": words separated by spaces, an optional ":type_id" suffix.
    std::istringstream words(single.get<std::string>());
    for (std::string word; words >> word;) {
      if (!word.empty() && word[0] == '$') {
        items.push_back({true, word});
        continue;
      }
      size_t colon = word.rfind(':');
      if (colon != std::string::npos && colon > 0) word.resize(colon);
      items.push_back({false, word});
    }
    return items;
  }
  if (!single.is_array()) throw_user("{}: 'single' must be a list or a string", w);
  for (const auto& it : single) {
    if (it.is_object() && it.contains("Sequence")) {
      items.push_back({true, "$A"});
    } else if (it.is_object() && it.contains("SpecialToken")) {
      items.push_back({false, json_util::get<std::string>(it["SpecialToken"], "id", w)});
    } else {
      throw_user("{}: unknown template item {}", w, it.dump());
    }
  }
  return items;
}

void apply(const nlohmann::json& j, const std::string& where, SpecialTokenWrap& wrap) {
  if (j.is_null()) return;
  const std::string type = json_util::type_of(j, where + ": post_processor");
  const std::string w = where + ": post_processor " + type;
  SpecialTokenWrap own;
  if (type == "ByteLevel") {
    return;
  } else if (type == "Sequence") {
    const nlohmann::json& list = json_util::field(j, "processors", w);
    if (!list.is_array()) throw_user("{}: 'processors' must be a list", w);
    for (const auto& p : list) apply(p, where, wrap);
    return;
  } else if (type == "TemplateProcessing") {
    const nlohmann::json& specials = json_util::get_or<nlohmann::json>(j, "special_tokens", nlohmann::json::object(), w);
    bool after = false;
    for (const Item& item : template_items(json_util::field(j, "single", w), w)) {
      if (item.is_sequence) {
        after = true;
        continue;
      }
      if (!specials.is_object() || !specials.contains(item.name)) {
        throw_user("{}: template uses special token '{}' that is not in 'special_tokens'", w, item.name);
      }
      auto ids = json_util::get<std::vector<int32_t>>(specials[item.name], "ids", w);
      auto& dst = after ? own.suffix : own.prefix;
      dst.insert(dst.end(), ids.begin(), ids.end());
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto id_of = [&](const char* key) {
      const nlohmann::json& pair = json_util::field(j, key, w);
      if (!pair.is_array() || pair.size() != 2 || !pair[1].is_number_integer()) {
        throw_user("{}: '{}' must be [token, id]", w, key);
      }
      return pair[1].get<int32_t>();
    };
    own.prefix.push_back(id_of("cls"));
    own.suffix.push_back(id_of("sep"));
  } else {
    throw_user("{}: unsupported post_processor type '{}' (moeserve supports TemplateProcessing, "
               "RobertaProcessing, BertProcessing, ByteLevel and Sequence)",
               where, type);
  }
  // A later processor wraps what the earlier ones produced.
  own.prefix.insert(own.prefix.end(), wrap.prefix.begin(), wrap.prefix.end());
  wrap.suffix.insert(wrap.suffix.end(), own.suffix.begin(), own.suffix.end());
  wrap.prefix = std::move(own.prefix);
}

}  // namespace

SpecialTokenWrap make_special_token_wrap(const nlohmann::json& j, const std::string& where) {
  SpecialTokenWrap wrap;
  apply(j, where, wrap);
  return wrap;
}

}  // namespace moeserve::tok

#include "server/text.h"

#include <filesystem>

#include "core/error.h"
#include "core/fs_lookup.h"
#include "core/log.h"

namespace moeserve::server {

namespace fs = std::filesystem;

namespace {
// Whether a template's source compares a role with 'developer' (then it decides what such a message means).
bool names_developer_role(const std::string& src) {
  return src.find("'developer'") != std::string::npos || src.find("\"developer\"") != std::string::npos;
}
}  // namespace

TextLayer::TextLayer(const std::string& model_dir, const std::string& tokenizer_dir,
                     const std::string& chat_template_file, bool skip)
    : model_dir_(model_dir), override_file_(chat_template_file) {
  if (skip) return;
  std::string dir = tokenizer_dir.empty() ? model_dir : tokenizer_dir;
  fs::path tj = fs::path(dir) / "tokenizer.json";
  if (!path_exists(tj, "tokenizer folder"))
    throw_user("no tokenizer.json in {}: pass --tokenizer-path DIR, or --skip-tokenizer-init to serve token ids only",
               dir);
  tok_ = tok::Tokenizer::from_file(tj.string());
  special_tokens_ = tpl::special_tokens_from_tokenizer_config(dir);
  // The template is parsed at startup so a broken one is reported before serving, not on the first request.
  for (bool tools : {false, true}) {
    try {
      std::string src = tpl::load_chat_template(dir, override_file_, tools);
      if (src.empty()) continue;
      (tools ? tool_template_ : template_) = ChatTemplate{tpl::Template::parse(src), names_developer_role(src)};
    } catch (const UserError& e) {
      if (!override_file_.empty()) throw;  // an explicit --chat-template must work
      template_error_ = e.what();
    }
  }
  if (!template_) log_warn("no usable chat template in {}: /v1/chat/completions will answer 400 ({})", dir,
                           template_error_.empty() ? "none found" : template_error_);
}

const tok::Tokenizer& TextLayer::tokenizer() const {
  if (!tok_) throw_user("this server runs with --skip-tokenizer-init: send token ids (input_ids), not text");
  return *tok_;
}

std::vector<int32_t> TextLayer::encode(const std::string& text, bool add_special_tokens) const {
  return tokenizer().encode(text, add_special_tokens);
}

std::string TextLayer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return tokenizer().decode(ids, skip_special_tokens);
}

const TextLayer::ChatTemplate& TextLayer::chat_template(bool has_tools) const {
  tokenizer();
  if (has_tools && tool_template_) return *tool_template_;
  if (!template_)
    throw_user("the model has no chat template{}; pass --chat-template FILE",
               template_error_.empty() ? "" : " that works (" + template_error_ + ")");
  return *template_;
}

std::string TextLayer::render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                   bool add_generation_prompt, const nlohmann::ordered_json& template_kwargs) const {
  const ChatTemplate& t = chat_template(tools.is_array() && !tools.empty());
  tpl::ChatTemplateInputs in;
  in.messages = messages;
  if (!t.names_developer && in.messages.is_array()) {
    for (auto& m : in.messages)
      if (m.is_object() && m.contains("role") && m["role"] == "developer") m["role"] = "system";
  }
  in.tools = tools;
  in.add_generation_prompt = add_generation_prompt;
  in.extra_kwargs = template_kwargs.is_object() ? template_kwargs : nlohmann::ordered_json::object();
  in.special_tokens = special_tokens_;
  return tpl::render_chat(t.program, in);
}

std::shared_ptr<const grammar::TokenVocabulary> TextLayer::grammar_vocabulary(int64_t model_vocab) const {
  const tok::Tokenizer& t = tokenizer();
  std::call_once(grammar_once_, [&] {
    grammar_vocab_ = std::make_shared<const grammar::TokenVocabulary>(tok::constrained_token_bytes(t, model_vocab));
  });
  return grammar_vocab_;
}

std::optional<int32_t> TextLayer::token_id(const std::string& content) const {
  if (!tok_) return std::nullopt;
  return tok_->token_to_id(content);
}

}  // namespace moeserve::server

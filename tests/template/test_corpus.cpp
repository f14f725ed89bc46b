// Byte-for-byte comparison with Python jinja2 under Hugging Face's settings.
// expected.json is produced by tools/reference/render_templates.py; every case is one test.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "template/jinja.h"
#include "test_util.h"

namespace moeserve::tpl {
namespace {

using nlohmann::ordered_json;
using testing::data_dir;
using testing::read_text;

struct CorpusCase {
  std::string id;
  ordered_json spec;
};

// gtest prints parameters on failure; the id says which case it was.
void PrintTo(const CorpusCase& c, std::ostream* os) { *os << c.id; }

const ordered_json& conversations() {
  static const ordered_json c = ordered_json::parse(read_text(data_dir() + "/conversations.json"));
  return c;
}

std::vector<CorpusCase> load_cases() {
  std::vector<CorpusCase> out;
  const std::string text = read_text(data_dir() + "/expected.json");
  if (text.empty()) return out;
  const ordered_json doc = ordered_json::parse(text);
  for (const auto& c : doc["cases"]) out.push_back({c["id"].get<std::string>(), c});
  return out;
}

std::string show(const std::string& s, size_t at) {
  const size_t b = at > 60 ? at - 60 : 0;
  ordered_json j = s.substr(b, 120);
  return j.dump();
}

// "first difference at byte N" with context from both sides.
std::string describe_mismatch(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  return "first difference at byte " + std::to_string(i) + " (expected " + std::to_string(want.size()) +
         " bytes, got " + std::to_string(got.size()) + ")\n  expected: " + show(want, i) +
         "\n  actual:   " + show(got, i);
}

class Corpus : public ::testing::TestWithParam<CorpusCase> {};

TEST_P(Corpus, MatchesPythonJinja2) {
  const ordered_json& c = GetParam().spec;
  const std::string source = c.contains("source") ? c["source"].get<std::string>()
                                                  : read_text(data_dir() + "/" + c["template_file"].get<std::string>());
  std::string output;
  std::string error;
  bool raised_by_template = false;
  try {
    const Template t = Template::parse(source);
    if (c["kind"] == "chat") {
      const ordered_json& conv = conversations()[c["conversation"].get<std::string>()];
      ChatTemplateInputs in;
      in.messages = conv["messages"];
      in.tools = conv.contains("tools") ? conv["tools"] : ordered_json();
      in.add_generation_prompt = c["add_generation_prompt"].get<bool>();
      in.extra_kwargs = c["extra_kwargs"];
      in.special_tokens = c["special_tokens"];
      output = render_chat(t, in, testing::fixed_clock());
    } else {
      output = t.render(c["context"], testing::fixed_clock());
    }
  } catch (const TemplateRaisedError& e) {
    error = e.what();
    raised_by_template = true;
  } catch (const UserError& e) {
    error = e.what();
  }

  if (c.contains("output")) {
    ASSERT_TRUE(error.empty()) << "unexpected error: " << error;
    const std::string want = c["output"].get<std::string>();
    EXPECT_TRUE(output == want) << describe_mismatch(want, output);
    return;
  }
  const std::string want_error = c["error"].get<std::string>();
  const std::string type = c["error_type"].get<std::string>();
  ASSERT_FALSE(error.empty()) << "expected " << type << " (" << want_error << "), got output: "
                              << ordered_json(output).dump();
  if (type == "TemplateError") {  // raise_exception: the message must arrive unchanged
    EXPECT_TRUE(raised_by_template) << error;
    EXPECT_EQ(error, want_error);
  } else if (c["error_phase"] == "render") {
    // Runtime errors read "chat template error at line N: <Python's message>".
    const std::string suffix = ": " + want_error;
    EXPECT_TRUE(error.size() >= suffix.size() && error.compare(error.size() - suffix.size(), suffix.size(), suffix) == 0)
        << "python: " << type << ": " << want_error << "\nmoeserve: " << error;
  }
}

std::string case_name(const ::testing::TestParamInfo<CorpusCase>& info) {
  std::string n = info.param.id;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Templates, Corpus, ::testing::ValuesIn(load_cases()), case_name);

TEST(CorpusData, HasEnoughCases) {
  const auto cases = load_cases();
  EXPECT_GE(cases.size(), 500u) << "regenerate with tools/reference/render_templates.py";
  std::map<std::string, int> per_template;
  for (const auto& c : cases)
    if (c.spec.contains("template_file")) ++per_template[c.spec["template_file"].get<std::string>()];
  for (const char* real : {"qwen3.jinja", "deepseek_v3.jinja", "qwen3_coder.jinja", "qwen3_5.jinja",
                           "llama3_1_tools.jinja", "mistral_v3.jinja", "gpt_oss.jinja"})
    EXPECT_GT(per_template[real], 0) << real;
}

}  // namespace
}  // namespace moeserve::tpl

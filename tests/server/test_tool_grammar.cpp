// tool_choice 'required' / named as a grammar (server/tool_grammar.h): qwen3_coder's value text against a brute-force
// marker search, the calls each parser's grammar accepts and refuses, and what the tool-call parser reads from an
// accepted call.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "grammar/json_grammar.h"
#include "grammar/regex_grammar.h"
#include "parsers/tool_calls.h"
#include "server/tool_grammar.h"

namespace moeserve::server {
namespace {

using json = nlohmann::ordered_json;

bool whole_match(const std::shared_ptr<const grammar::Regex>& re, const std::string& text) {
  grammar::RegexMatcher m(re);
  return m.feed(text) && m.can_finish();
}

bool json_match(const std::shared_ptr<const grammar::JsonSchema>& s, const std::string& text) {
  grammar::JsonMatcher m(s);
  return m.feed(text) && m.can_finish();
}

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
   "parameters": {"type": "object", "properties": {
     "city": {"type": "string", "description": "the city"},
     "days": {"type": "integer", "minimum": 1, "maximum": 14},
     "unit": {"type": "string", "enum": ["C", "F"]},
     "detailed": {"type": "boolean"}},
   "required": ["city"]}}},
  {"type": "function", "function": {"name": "search", "parameters": {"type": "object",
   "properties": {"query": {"type": "string"}, "limit": {"type": "number"}}, "required": ["query", "limit"]}}},
  {"type": "function", "function": {"name": "ping"}}
])");

// Every string over bytes that spell the markers (and a few others) is a value iff it contains none of them.
TEST(ToolGrammar, Qwen3CoderValuesAreTextsWithoutTheMarkers) {
  const auto re = grammar::Regex::compile(qwen3_coder_free_value_regex());
  const std::string alphabet = "</>=parmetfuncio x\n";
  std::mt19937 g(7);
  int values = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    const int n = int(g() % 24);
    for (int k = 0; k < n; ++k) s += alphabet[g() % alphabet.size()];
    // Seed the markers and their prefixes in so that the search meets them.
    if (i % 3 == 0) s.insert(g() % (s.size() + 1), std::string("</parameter>").substr(0, 1 + g() % 12));
    if (i % 5 == 0) s.insert(g() % (s.size() + 1), std::string("<parameter=").substr(0, 1 + g() % 11));
    if (i % 7 == 0) s.insert(g() % (s.size() + 1), std::string("</function>").substr(0, 1 + g() % 11));
    const bool clean = s.find("</parameter>") == std::string::npos && s.find("<parameter=") == std::string::npos &&
                       s.find("</function>") == std::string::npos;
    ASSERT_EQ(whole_match(re, s), clean) << nlohmann::json(s).dump();
    values += clean;
  }
  EXPECT_GT(values, 2000);
  for (const char* ok : {"", "Paris", "a < b", "<<x", "line 1\nline 2", "</para", "a<", "x</p>", "<function=f>"})
    EXPECT_TRUE(whole_match(re, ok)) << ok;
}

// A named qwen3_coder call: the opening with the name is forced; the declared parameters in order, the required one
// present, each value by its type; the parser reads the typed arguments back.
TEST(ToolGrammar, Qwen3CoderNamedCallFollowsTheParameters) {
  const ToolCallGrammar g = tool_call_grammar("qwen3_coder", kTools, "get_weather");
  ASSERT_TRUE(g.spec && g.spec->regex);
  EXPECT_EQ(g.prefix, "<tool_call>\n<function=get_weather>\n");
  const std::string call =
      "<parameter=city>\nSan Francisco, CA\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
      "<parameter=unit>\nF\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(whole_match(g.spec->regex, call));
  EXPECT_TRUE(whole_match(g.spec->regex, "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"));
  for (const char* bad : {
           "</function>\n</tool_call>",                                                          // city missing
           "<parameter=days>\n3\n</parameter>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",  // order
           "<parameter=city>\nParis\n</parameter>\n<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>",
           "<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nK\n</parameter>\n</function>\n</tool_call>",
           "<parameter=city>\nParis\n</parameter>\n<parameter=zip>\n1\n</parameter>\n</function>\n</tool_call>",
           "<parameter=city>\nParis</parameter>\n</function>\n</tool_call>",
           "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\nmore"}) {
    EXPECT_FALSE(whole_match(g.spec->regex, bad)) << bad;
  }
  auto p = parsers::ToolCallParser::create("qwen3_coder", kTools);
  const parsers::ToolParseResult r = p->parse_full(g.prefix + call);
  ASSERT_EQ(r.calls.size(), 1u) << r.content;
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(r.calls[0].arguments), json::parse(R"({"city": "San Francisco, CA", "days": 3, "unit": "F"})"));
}

// 'required': any declared function, each with its own parameters; a function without parameters takes any.
TEST(ToolGrammar, Qwen3CoderRequiredCallNamesADeclaredFunction) {
  const ToolCallGrammar g = tool_call_grammar("qwen3_coder", kTools, "");
  ASSERT_TRUE(g.spec && g.spec->regex);
  EXPECT_EQ(g.prefix, "<tool_call>\n<function=");
  EXPECT_TRUE(whole_match(g.spec->regex, "search>\n<parameter=query>\nmoe\n</parameter>\n<parameter=limit>\n2.5e1\n"
                                         "</parameter>\n</function>\n</tool_call>"));
  EXPECT_TRUE(whole_match(g.spec->regex, "ping>\n</function>\n</tool_call>"));
  EXPECT_TRUE(whole_match(g.spec->regex, "ping>\n<parameter=any>\nthing\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(whole_match(g.spec->regex, "nope>\n</function>\n</tool_call>"));
  // Parallel calls (the default): more blocks, each opened as the template opens one; without, one call.
  const std::string two = "ping>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n<parameter=query>\nq\n"
                          "</parameter>\n<parameter=limit>\n1\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(whole_match(g.spec->regex, two));
  EXPECT_FALSE(whole_match(g.spec->regex, "ping>\n</function>\n</tool_call>\n<tool_call>\n<function=nope>\n"
                                          "</function>\n</tool_call>"));
  const ToolCallGrammar single = tool_call_grammar("qwen3_coder", kTools, "", /*parallel=*/false);
  ASSERT_TRUE(single.spec && single.spec->regex);
  EXPECT_FALSE(whole_match(single.spec->regex, two));
  EXPECT_TRUE(whole_match(single.spec->regex, "ping>\n</function>\n</tool_call>"));
  auto p = parsers::ToolCallParser::create("qwen3_coder", kTools);
  const parsers::ToolParseResult r = p->parse_full(g.prefix + two);
  ASSERT_EQ(r.calls.size(), 2u) << r.content;
  EXPECT_EQ(r.calls[0].name, "ping");
  EXPECT_EQ(r.calls[1].name, "search");
  EXPECT_EQ(json::parse(r.calls[1].arguments), json::parse(R"({"query": "q", "limit": 1})"));
  EXPECT_FALSE(whole_match(g.spec->regex, "search>\n<parameter=query>\nmoe\n</parameter>\n</function>\n</tool_call>"));
}

// hermes / qwen25: the call's JSON object, its name a declared function's and its arguments that function's
// parameters (a keyword the grammar lacks, such as minimum, skipped).
TEST(ToolGrammar, HermesCallIsTheCallObjectOfTheParameters) {
  for (const char* parser : {"hermes", "qwen25"}) {
    const ToolCallGrammar named = tool_call_grammar(parser, kTools, "get_weather");
    ASSERT_TRUE(named.spec && named.spec->schema) << parser;
    EXPECT_EQ(named.prefix, "<tool_call>\n");
    const std::string call = R"({"name": "get_weather", "arguments": {"city": "Paris", "days": 30, "detailed": true}})";
    EXPECT_TRUE(json_match(named.spec->schema, call));
    EXPECT_FALSE(json_match(named.spec->schema, R"({"name": "search", "arguments": {"query": "x", "limit": 1}})"));
    EXPECT_FALSE(json_match(named.spec->schema, R"({"name": "get_weather", "arguments": {"days": 3}})"));
    EXPECT_FALSE(json_match(named.spec->schema, R"({"name": "get_weather", "arguments": {"city": 3}})"));
    const ToolCallGrammar any = tool_call_grammar(parser, kTools, "");
    ASSERT_TRUE(any.spec && any.spec->schema);
    EXPECT_TRUE(json_match(any.spec->schema, R"({"name": "search", "arguments": {"query": "x", "limit": 1}})"));
    EXPECT_TRUE(json_match(any.spec->schema, R"({"name": "ping", "arguments": {"anything": [1]}})"));
    EXPECT_FALSE(json_match(any.spec->schema, R"({"name": "nope", "arguments": {}})"));
    auto p = parsers::ToolCallParser::create(parser, kTools);
    const parsers::ToolParseResult r = p->parse_full(named.prefix + call);  // (the output ends at the object)
    ASSERT_EQ(r.calls.size(), 1u) << r.content;
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(r.calls[0].arguments), json::parse(R"({"city": "Paris", "days": 30, "detailed": true})"));
  }
}

// No grammar (the call left to the model, as before): a parser without one, more functions than the alternatives a
// grammar keeps apart.
TEST(ToolGrammar, NoGrammarWhereNoneFits) {
  EXPECT_FALSE(tool_call_grammar("mistral", kTools, "").spec);
  json many = json::array();
  for (size_t i = 0; i <= kMaxToolAlternatives; ++i)
    many.push_back({{"type", "function"}, {"function", {{"name", "f" + std::to_string(i)}}}});
  EXPECT_FALSE(tool_call_grammar("hermes", many, "").spec);
  EXPECT_FALSE(tool_call_grammar("qwen3_coder", many, "").spec);
  EXPECT_TRUE(tool_call_grammar("qwen3_coder", many, "f3").spec);  // one of them, named
}

}  // namespace
}  // namespace moeserve::server

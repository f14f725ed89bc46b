// Hostile and malformed templates: every one must end in a UserError, quickly, never in a crash or a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "template/jinja.h"
#include "test_util.h"

namespace moeserve::tpl {
namespace {

using nlohmann::ordered_json;
using testing::render_src;

// Parses and renders; returns the UserError message, failing the test if anything else happens.
std::string expect_user_error(const std::string& src, const ordered_json& ctx = ordered_json::object()) {
  const auto start = std::chrono::steady_clock::now();
  std::string msg;
  try {
    render_src(src, ctx);
    ADD_FAILURE() << "no error for: " << src.substr(0, 200);
  } catch (const UserError& e) {
    msg = e.what();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, 10.0) << "too slow to fail: " << src.substr(0, 200);
  return msg;
}

TEST(TemplateErrors, SyntaxErrorsNameTheLine) {
  EXPECT_NE(expect_user_error("line1\nline2\n{% if x %}\nno end").find("line 4"), std::string::npos);
  EXPECT_NE(expect_user_error("{% for x in y %}").find("endfor"), std::string::npos);
  EXPECT_NE(expect_user_error("a\n{{ x|nosuchfilter }}").find("line 2"), std::string::npos);
  EXPECT_NE(expect_user_error("{{ x|nosuchfilter }}").find("No filter named 'nosuchfilter'"), std::string::npos);
  EXPECT_NE(expect_user_error("{{ x is nosuchtest }}").find("No test named 'nosuchtest'"), std::string::npos);
  EXPECT_NE(expect_user_error("{% blah %}").find("unknown tag 'blah'"), std::string::npos);
  expect_user_error("{% endif %}");
  expect_user_error("{% if true %}{% endfor %}");
  expect_user_error("{% macro m( %}{% endmacro %}");
  expect_user_error("{{ 'unterminated }}");
  expect_user_error("{# unterminated comment");
  expect_user_error("{% raw %} no endraw");
  expect_user_error("{{ (1, 2 }}");
  expect_user_error("{{ [1, 2) }}");
  expect_user_error("{{ }}");
  expect_user_error("{% set %}");
  expect_user_error("{% continue %}");
  expect_user_error("{% for x in y recursive %}{% endfor %}");
  expect_user_error("{% include 'other.jinja' %}");
  expect_user_error("{% extends 'base.jinja' %}");
  expect_user_error("{{ '\\x4' }}");
}

TEST(TemplateErrors, RuntimeErrorsNameTheLine) {
  const std::string msg = expect_user_error("ok\n{{ 1 }}\n{{ x.y }}", {{"z", 1}});
  EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'x' is undefined"), std::string::npos) << msg;
}

TEST(TemplateErrors, RaiseExceptionCarriesMessageExactly) {
  try {
    render_src("{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}");
    FAIL();
  } catch (const TemplateRaisedError& e) {
    EXPECT_STREQ(e.what(), "Conversation roles must alternate user/assistant/user/assistant/...");
  }
}

TEST(TemplateErrors, InfiniteRecursionIsCaught) {
  const std::string msg = expect_user_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_NE(msg.find("recursion"), std::string::npos) << msg;
  expect_user_error("{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}");
  // Recursion through a call block's caller.
  expect_user_error("{% macro f() %}{% call f() %}x{% endcall %}{% endmacro %}{{ f() }}");
}

TEST(TemplateErrors, DeepNestingIsRefusedAtParse) {
  expect_user_error("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}");
  expect_user_error("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}");
  expect_user_error("{{ " + std::string(20000, '-') + "1 }}");
  expect_user_error("{{ " + std::string(20000, '!') + " }}");
  std::string nested_ifs;
  for (int i = 0; i < 3000; ++i) nested_ifs += "{% if true %}";
  expect_user_error(nested_ifs);
  std::string nots = "{{ ";
  for (int i = 0; i < 5000; ++i) nots += "not ";
  expect_user_error(nots + "x }}");
}

TEST(TemplateErrors, HugeRangesAndLoopsAreBounded) {
  EXPECT_NE(expect_user_error("{{ range(1000000)|length }}").find("Range too big"), std::string::npos);
  EXPECT_NE(expect_user_error("{{ range(0, 10**12, 1)|length }}").find("Range too big"), std::string::npos);
  // Each range is allowed, but together they would run for hours.
  const std::string msg = expect_user_error(
      "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}");
  EXPECT_NE(msg.find("budget"), std::string::npos) << msg;
}

TEST(TemplateErrors, MemoryBlowupsAreBounded) {
  expect_user_error("{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}");
  expect_user_error("{{ 'x' * 10**12 }}");
  expect_user_error("{{ [0] * 10**12 }}");
  expect_user_error("{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}");
  // Deeply nested values built at runtime cannot overflow the stack when printed or serialised.
  expect_user_error("{% set ns = namespace(v=[]) %}{% for i in range(50000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}");
  expect_user_error("{% set ns = namespace(v=[]) %}{% for i in range(50000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v|tojson }}");
  expect_user_error("{% set ns = namespace(v=[]) %}{% for i in range(50000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v == ns.v }}");
  expect_user_error("{% set ns = namespace(v=[]) %}{% for i in range(50000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v < ns.v }}");
  expect_user_error("{% set ns = namespace(v=1) %}{% for i in range(50000) %}{% set ns.v = (ns.v,) %}{% endfor %}{{ {ns.v: 1} }}");
  // A namespace that contains itself: printing it must stop (Python prints "{...}"; we refuse).
  expect_user_error("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}");
}

TEST(TemplateErrors, SelfReferencesDoNotLeakOrCrash) {
  // Cycles through namespaces and macro closures are released at the end of each render; run many renders
  // so that a leak would show up under a leak checker.
  const Template t = Template::parse(
      "{% set ns = namespace(items=[]) %}{% set ns.me = ns %}{% macro m() %}{{ ns.items|length }}{% endmacro %}"
      "{% set ns.m = m %}{% for i in range(3) %}{% set ns.items = ns.items + [ns] %}{% endfor %}{{ ns.m() }}");
  for (int i = 0; i < 100; ++i) EXPECT_EQ(t.render(ordered_json::object()), "3");
}

TEST(TemplateErrors, IntegerOverflowIsAnError) {
  expect_user_error("{{ 2 ** 64 }}");
  expect_user_error("{{ 9223372036854775807 + 1 }}");
  expect_user_error("{{ 99999999999999999999 }}");
}

TEST(TemplateErrors, SandboxRefusesMutationAndPrivateAttributes) {
  EXPECT_NE(expect_user_error("{{ [1].append(2) }}").find("unsafe"), std::string::npos);
  EXPECT_NE(expect_user_error("{{ {}.update({}) }}").find("unsafe"), std::string::npos);
  EXPECT_EQ(render_src("[{{ x.__class__ }}][{{ ''.__class__ }}][{{ x._private }}]", {{"x", {{"a", 1}}}}), "[][][]");
  expect_user_error("{{ ''.__class__.__mro__ }}");
}

TEST(TemplateErrors, ContextMustBeAnObject) {
  EXPECT_THROW(Template::parse("x").render(ordered_json::array()), UserError);
  EXPECT_EQ(Template::parse("x").render(ordered_json()), "x");
}

// Random templates assembled from template fragments: parse/render may fail, but only with UserError.
TEST(TemplateErrors, FuzzedTemplatesNeverCrash) {
  const std::vector<std::string> pieces = {
      "{{", "}}", "{%", "%}", "{#", "#}", "-", "+", " if ", " for ", " in ", " endif ", " endfor ", " else ",
      " set ", " = ", "x", "y", "(", ")", "[", "]", "{", "}", "'s'", "\"t\"", "1", "2.5", " | ", "upper",
      "length", " is ", "defined", ".", ",", ":", " not ", " and ", " or ", "~", "*", "**", "//", "%", "\n",
      "  ", "loop.index", "macro", "m()", "endmacro", "raw", "endraw", "range(3)", "ns.a", "namespace(a=1)",
      "items()", "[::-1]", "tojson", "x.y", "call", "endcall", "break", "continue", "é", "\xff", "\x00"};
  std::mt19937 rng(12345);
  const ordered_json ctx = {{"x", {1, 2, 3}}, {"y", {{"a", "b"}}}, {"s", "str"}};
  int rendered = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string src;
    const int n = 1 + static_cast<int>(rng() % 24);
    for (int k = 0; k < n; ++k) src += pieces[rng() % pieces.size()];
    try {
      render_src(src, ctx);
      ++rendered;
    } catch (const UserError&) {
    }
  }
  EXPECT_GT(rendered, 0);
}

}  // namespace
}  // namespace moeserve::tpl

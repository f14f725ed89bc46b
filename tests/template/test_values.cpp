// Python value semantics the corpus relies on, checked directly.
#include <gtest/gtest.h>

#include "template/pystr.h"
#include "template/value.h"
#include "test_util.h"

namespace moeserve::tpl {
namespace {

TEST(PyStr, FloatRepr) {
  EXPECT_EQ(py::float_repr(1.0), "1.0");
  EXPECT_EQ(py::float_repr(0.1), "0.1");
  EXPECT_EQ(py::float_repr(1e-05), "1e-05");
  EXPECT_EQ(py::float_repr(0.0001), "0.0001");
  EXPECT_EQ(py::float_repr(1e16), "1e+16");
  EXPECT_EQ(py::float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(py::float_repr(1.5e300), "1.5e+300");
  EXPECT_EQ(py::float_repr(-0.0), "-0.0");
  EXPECT_EQ(py::float_repr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(py::float_repr(123456789.125), "123456789.125");
  EXPECT_EQ(py::float_repr(5e-324), "5e-324");
}

TEST(PyStr, Repr) {
  EXPECT_EQ(py::repr("abc"), "'abc'");
  EXPECT_EQ(py::repr("it's"), "\"it's\"");
  EXPECT_EQ(py::repr("a'b\"c"), "'a\\'b\"c'");
  EXPECT_EQ(py::repr("tab\tnl\n\x01"), "'tab\\tnl\\n\\x01'");
  EXPECT_EQ(py::repr("é日本"), "'é日本'");
  EXPECT_EQ(py::repr("\xc2\xa0"), "'\\xa0'");
  EXPECT_EQ(py::repr("\xff"), "'\\udcff'");  // an invalid byte, as Python's surrogateescape shows it
}

TEST(PyStr, JsonQuote) {
  EXPECT_EQ(py::json_quote("a\"b\\c\n\x01é", false), "\"a\\\"b\\\\c\\n\\u0001é\"");
  EXPECT_EQ(py::json_quote("é😀", true), "\"\\u00e9\\ud83d\\ude00\"");
}

TEST(PyStr, InvalidUtf8SurvivesRoundTrip) {
  const std::string bad = "ok\xff\xc3(";
  EXPECT_EQ(py::encode(py::decode(bad)), bad);
  EXPECT_EQ(py::length(bad), 5u);
}

TEST(PyStr, SplitAndStrip) {
  using V = std::vector<std::string>;
  EXPECT_EQ(py::split("  a b  c ", std::nullopt, -1), (V{"a", "b", "c"}));
  EXPECT_EQ(py::split("a  b c ", std::nullopt, 1), (V{"a", "b c "}));
  EXPECT_EQ(py::rsplit("  a b c", std::nullopt, 1), (V{"  a b", "c"}));
  EXPECT_EQ(py::split("a,,b", std::string(","), -1), (V{"a", "", "b"}));
  EXPECT_EQ(py::rsplit("a,b,c", std::string(","), 1), (V{"a,b", "c"}));
  EXPECT_EQ(py::strip("\u3000 x \n", std::nullopt, true, true), "x");
  EXPECT_EQ(py::strip("xyhixy", std::string("yx"), true, true), "hi");
}

TEST(Values, PythonEquality) {
  EXPECT_TRUE(equals(Value(1), Value(1.0)));
  EXPECT_TRUE(equals(Value(true), Value(1)));
  EXPECT_FALSE(equals(Value(1), Value("1")));
  EXPECT_FALSE(equals(Value::seq({Value(1)}), Value::tuple({Value(1)})));
  EXPECT_TRUE(equals(Value(), Value()));
  EXPECT_FALSE(equals(Value(), Value::none()));
}

TEST(Values, DictLookupIsPythonLike) {
  DictData d;
  for (int i = 0; i < 20; ++i) d.set(Value(std::to_string(i)), Value(i));  // large enough to be indexed
  d.set(Value(1), Value("int"));
  ASSERT_NE(d.find(Value(1.0)), nullptr);
  EXPECT_EQ(d.find(Value(true))->str(), "int");
  EXPECT_EQ(d.find(Value("7"))->as_int(), 7);
  EXPECT_EQ(d.size(), 21u);
  EXPECT_THROW(d.find(Value::seq({})), EvalError);
}

TEST(Values, JsonRoundTrip) {
  const auto j = nlohmann::ordered_json::parse(R"({"z": [1, 2.5, "s", null, true], "a": {"b": -3}})");
  JsonOptions o;
  EXPECT_EQ(to_json(Value::from_json(j), o), R"({"z": [1, 2.5, "s", null, true], "a": {"b": -3}})");
}

}  // namespace
}  // namespace moeserve::tpl

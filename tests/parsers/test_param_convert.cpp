#include <gtest/gtest.h>

#include "parsers/param_convert.h"

namespace moeserve::parsers {
namespace {

using nlohmann::ordered_json;

ordered_json conv(std::string_view raw, const char* schema_json) {
  const ordered_json schema = ordered_json::parse(schema_json);
  return convert_param_value(raw, &schema);
}

TEST(ParamConvert, SchemaTypes) {
  EXPECT_EQ(schema_types(ordered_json::parse(R"({"type": "String"})")), (std::vector<std::string>{"string"}));
  EXPECT_EQ(schema_types(ordered_json::parse(R"({"type": ["integer", "null"]})")),
            (std::vector<std::string>{"integer", "null"}));
  EXPECT_EQ(schema_types(ordered_json::parse(R"({"anyOf": [{"type": "number"}, {"type": "string"}]})")),
            (std::vector<std::string>{"number", "string"}));
  EXPECT_TRUE(schema_types(ordered_json::parse(R"({"enum": ["a", "b"]})")).empty());
  EXPECT_TRUE(schema_types(ordered_json("not a schema")).empty());
}

TEST(ParamConvert, StringStaysString) {
  EXPECT_EQ(conv("42", R"({"type": "string"})"), ordered_json("42"));
  EXPECT_EQ(conv(" padded \n", R"({"type": "string"})"), ordered_json(" padded \n"));
  EXPECT_EQ(conv("{\"a\": 1}", R"({"type": "string"})"), ordered_json("{\"a\": 1}"));
  EXPECT_EQ(conv("true", R"({"enum": ["true", "false"]})"), ordered_json("true"));  // no type: string
}

TEST(ParamConvert, Integer) {
  EXPECT_EQ(conv("42", R"({"type": "integer"})"), ordered_json(42));
  EXPECT_EQ(conv(" -7 ", R"({"type": "integer"})"), ordered_json(-7));
  EXPECT_EQ(conv("+3", R"({"type": "int"})"), ordered_json(3));
  EXPECT_EQ(conv("-9223372036854775808", R"({"type": "integer"})"), ordered_json(INT64_MIN));
  EXPECT_EQ(conv("18446744073709551615", R"({"type": "integer"})"), ordered_json(UINT64_MAX));
  // Failures keep the raw text (Python int() would refuse these too).
  EXPECT_EQ(conv("4.0", R"({"type": "integer"})"), ordered_json("4.0"));
  EXPECT_EQ(conv("three", R"({"type": "integer"})"), ordered_json("three"));
  EXPECT_EQ(conv("99999999999999999999999", R"({"type": "integer"})"), ordered_json("99999999999999999999999"));
  EXPECT_EQ(conv("", R"({"type": "integer"})"), ordered_json(""));
  EXPECT_EQ(conv("-", R"({"type": "integer"})"), ordered_json("-"));
}

TEST(ParamConvert, Number) {
  EXPECT_EQ(conv("3.14", R"({"type": "number"})"), ordered_json(3.14));
  EXPECT_EQ(conv("5", R"({"type": "number"})"), ordered_json(5));  // no '.' or exponent: an int
  EXPECT_TRUE(conv("5", R"({"type": "number"})").is_number_integer());
  EXPECT_TRUE(conv("1e3", R"({"type": "number"})").is_number_float());
  EXPECT_EQ(conv("1e3", R"({"type": "number"})").dump(), "1000.0");
  EXPECT_EQ(conv("-0.5", R"({"type": "float"})"), ordered_json(-0.5));
  EXPECT_EQ(conv(".5", R"({"type": "number"})"), ordered_json(0.5));
  EXPECT_EQ(conv("+2.5", R"({"type": "number"})"), ordered_json(2.5));
  EXPECT_EQ(conv("inf", R"({"type": "number"})"), ordered_json("inf"));  // JSON has no infinity
  EXPECT_EQ(conv("nan", R"({"type": "number"})"), ordered_json("nan"));
  EXPECT_EQ(conv("1e999", R"({"type": "number"})"), ordered_json("1e999"));
  EXPECT_EQ(conv("12abc", R"({"type": "number"})"), ordered_json("12abc"));
  EXPECT_EQ(conv("--1", R"({"type": "number"})"), ordered_json("--1"));
}

TEST(ParamConvert, Boolean) {
  EXPECT_EQ(conv("true", R"({"type": "boolean"})"), ordered_json(true));
  EXPECT_EQ(conv("False", R"({"type": "boolean"})"), ordered_json(false));
  EXPECT_EQ(conv(" TRUE ", R"({"type": "bool"})"), ordered_json(true));
  EXPECT_EQ(conv("yes", R"({"type": "boolean"})"), ordered_json("yes"));
  EXPECT_EQ(conv("1", R"({"type": "boolean"})"), ordered_json("1"));
}

TEST(ParamConvert, ObjectAndArray) {
  EXPECT_EQ(conv(R"({"b": 1, "a": [true, null]})", R"({"type": "object"})").dump(), R"({"b":1,"a":[true,null]})");
  EXPECT_EQ(conv("{'a': True, 'b': None, 'c': (1, 2.5)}", R"({"type": "object"})").dump(),
            R"({"a":true,"b":null,"c":[1,2.5]})");
  EXPECT_EQ(conv("[1, 2, 3]", R"({"type": "array"})"), ordered_json::parse("[1,2,3]"));
  EXPECT_EQ(conv("['x', \"y\"]", R"({"type": "array"})"), ordered_json::parse(R"(["x","y"])"));
  EXPECT_EQ(conv("(1, 2)", R"({"type": "array"})"), ordered_json::parse("[1,2]"));
  // Valid JSON of the wrong kind, or not JSON at all: the raw text.
  EXPECT_EQ(conv("[1, 2]", R"({"type": "object"})"), ordered_json("[1, 2]"));
  EXPECT_EQ(conv("5", R"({"type": "array"})"), ordered_json("5"));
  EXPECT_EQ(conv("not a list", R"({"type": "array"})"), ordered_json("not a list"));
  EXPECT_EQ(conv("{\"a\": 1", R"({"type": "object"})"), ordered_json("{\"a\": 1"));
}

TEST(ParamConvert, Null) {
  EXPECT_TRUE(conv("null", R"({"type": "integer"})").is_null());
  EXPECT_TRUE(conv("NULL", R"({"type": "object"})").is_null());
  // Like vLLM/SGLang: "null" is null for any declared type, strings included.
  EXPECT_TRUE(conv("null", R"({"type": "string"})").is_null());
  EXPECT_TRUE(convert_param_value("null", nullptr).is_null());
}

TEST(ParamConvert, TypeListsAndUnions) {
  EXPECT_EQ(conv("5", R"({"type": ["integer", "null"]})"), ordered_json(5));
  EXPECT_TRUE(conv("null", R"({"type": ["integer", "null"]})").is_null());
  EXPECT_EQ(conv("x", R"({"type": ["integer", "null"]})"), ordered_json("x"));
  EXPECT_EQ(conv("2.5", R"({"anyOf": [{"type": "integer"}, {"type": "number"}]})"), ordered_json(2.5));
  EXPECT_EQ(conv("[1]", R"({"anyOf": [{"type": "string"}, {"type": "array"}]})"), ordered_json("[1]"));
}

TEST(ParamConvert, UnknownParameterAndTypeStayStrings) {
  EXPECT_EQ(convert_param_value("123", nullptr), ordered_json("123"));
  EXPECT_EQ(conv("2024-01-01", R"({"type": "date"})"), ordered_json("2024-01-01"));
}

TEST(PythonLiteral, Parses) {
  EXPECT_EQ(parse_python_literal("{'k': 'it\\'s', \"u\": '\\u00e9\\x41', 'n': -1.5e2}")->dump(),
            R"({"k":"it's","u":"éA","n":-150.0})");
  EXPECT_EQ(parse_python_literal("[1, [2, (3,)], {},]")->dump(), "[1,[2,[3]],{}]");
  EXPECT_EQ(parse_python_literal("(1)")->dump(), "1");
  EXPECT_EQ(parse_python_literal("()")->dump(), "[]");
  EXPECT_EQ(parse_python_literal("{1: 'a', True: 'b', None: 'c'}")->dump(), R"({"1":"a","true":"b","null":"c"})");
  EXPECT_EQ(parse_python_literal("'\\d'")->dump(), R"("\\d")");  // unknown escapes are kept
  EXPECT_EQ(parse_python_literal("'東京'")->dump(), "\"東京\"");
}

TEST(PythonLiteral, Rejects) {
  for (const char* bad : {"", "{", "[1,", "{'a' 1}", "'unterminated", "Truex", "[1 2]", "{[1]: 2}", "x", "'a'b",
                          "'line\nbreak'", "0x10", "{'a': 1}}"}) {
    EXPECT_FALSE(parse_python_literal(bad).has_value()) << bad;
  }
  EXPECT_FALSE(parse_python_literal(std::string(10000, '[')).has_value());  // depth limit, no stack overflow
}

}  // namespace
}  // namespace moeserve::parsers

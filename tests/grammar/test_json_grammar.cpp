// The JSON grammar: hand-written documents (valid ones accepted byte by byte, invalid ones rejected at the byte
// where they stop being a prefix of any valid document), nlohmann's parser as the oracle for random texts and
// their mutations, the state's immutability on rejection, in_plain_string's promise, and schema errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/grammar_test_util.h"
#include "grammar/json_grammar.h"

using namespace moeserve::grammar;
using json = nlohmann::ordered_json;

namespace {

using test_util::kAll;

std::shared_ptr<const JsonSchema> schema(std::string_view text) { return JsonSchema::compile(json::parse(text)); }

using test_util::first_rejected;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// A valid document: every byte accepted, complete at the end, and (for an object, array or string root) at no
// earlier byte.
::testing::AssertionResult valid(const std::shared_ptr<const JsonSchema>& s, std::string_view text) {
  JsonMatcher m(s);
  const size_t first = std::find_if_not(text.begin(), text.end(), is_space) - text.begin();
  const bool closed_root = first < text.size() && (text[first] == '{' || text[first] == '[' || text[first] == '"');
  for (size_t i = 0; i < text.size(); ++i) {
    if (closed_root && m.can_finish())
      return ::testing::AssertionFailure() << "complete after " << i << " bytes of " << text;
    if (!m.feed(static_cast<unsigned char>(text[i])))
      return ::testing::AssertionFailure() << "byte " << i << " ('" << text[i] << "') rejected in " << text;
  }
  if (!m.can_finish()) return ::testing::AssertionFailure() << "incomplete at the end of " << text;
  return ::testing::AssertionSuccess();
}

using test_util::rejected_at;

// Rejected at the first occurrence of `marker` (given as the text from the rejected byte on).
::testing::AssertionResult rejected_at(const std::shared_ptr<const JsonSchema>& s, std::string_view text,
                                       std::string_view marker) {
  const size_t at = text.find(marker);
  if (at == std::string_view::npos) return ::testing::AssertionFailure() << "no '" << marker << "' in " << text;
  return rejected_at(s, text, at);
}

// A prefix that is accepted but not a complete document.
::testing::AssertionResult incomplete(const std::shared_ptr<const JsonSchema>& s, std::string_view text) {
  JsonMatcher m(s);
  const size_t got = first_rejected(m, text);
  if (got != kAll) return ::testing::AssertionFailure() << text << ": byte " << got << " rejected";
  if (m.can_finish()) return ::testing::AssertionFailure() << text << ": complete";
  return ::testing::AssertionSuccess();
}

JsonMatcher after(const std::shared_ptr<const JsonSchema>& s, std::string_view prefix) {
  JsonMatcher m(s);
  EXPECT_EQ(first_rejected(m, prefix), kAll) << prefix;
  return m;
}

const char* kPerson = R"({"type": "object", "properties": {
    "active": {"type": "boolean"}, "age": {"type": "integer"}, "name": {"type": "string"},
    "nick": {"type": "string"}, "nothing": {"type": "null"}, "score": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string"}}},
  "required": ["name", "age", "active"], "title": "Person", "description": "ignored annotations"})";

}  // namespace

// The properties come in the schema's order: active, age, name, nick, nothing, score, tags (active, age, name
// required).
TEST(JsonGrammar, ObjectOfEveryTypeAcceptsValidDocuments) {
  const auto s = schema(kPerson);
  EXPECT_TRUE(valid(s, R"({"active":true,"age":30,"name":"Ann"})"));
  EXPECT_TRUE(valid(s, R"({"active":false,"age":-7,"name":"B","nick":"b","nothing":null,"score":-1.5e+3,)"
                       R"("tags":["x","y"]})"));
  EXPECT_TRUE(valid(s, R"({"active":true,"age":0,"name":"","score":0.25,"tags":[]})"));
  EXPECT_TRUE(valid(s, "{\n  \"active\": true,\n  \"age\": 30,\n  \"name\": \"Ann\",\n"
                       "  \"tags\": [\n    \"a\"\n  ]\n}"));
  EXPECT_TRUE(valid(s, "\r\n\t{ \"active\" :\ttrue , \"age\" : 1 ,\"name\":\"x\" }"));
  // nlohmann's own pretty printing of a valid document.
  const json doc = {{"active", true}, {"age", 41}, {"name", "Zoë"}, {"score", 2.5}, {"tags", {"a", "b"}}};
  EXPECT_TRUE(valid(s, doc.dump(2)));
  EXPECT_TRUE(valid(s, doc.dump(4)));
  EXPECT_TRUE(valid(s, doc.dump()));
}

TEST(JsonGrammar, ObjectRejectsAtTheRightByte) {
  const auto s = schema(kPerson);
  // A required property missing: the closing brace.
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"age":3})", "}"));
  EXPECT_TRUE(rejected_at(s, R"({})", "}"));
  // The next key must be "age" (required, next in order): "n" cannot start it.
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"name":"x"})", "name"));
  // Out of order: "age" before "active".
  EXPECT_TRUE(rejected_at(s, R"({"age":3,"active":true})", 3));
  // An unknown key, and a repeated one.
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"age":3,"name":"x","zzz":1})", "zzz"));
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"age":3,"name":"x","e":1})", "e\":1"));
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"active":true})", 17));
  EXPECT_TRUE(rejected_at(s, R"({"activ":true})", 7));
  // Values of the wrong type / syntax.
  EXPECT_TRUE(rejected_at(s, R"({"active":1})", "1"));
  EXPECT_TRUE(rejected_at(s, R"({"active":tru})", "}"));
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"age":3.5})", "."));
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"age":3e2})", "e2"));
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"age":01})", "1}"));
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"age":-})", "}"));
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"age":"3"})", "\"3"));
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"age":1,"name":"x","score":1.})", "}"));
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"age":1,"name":"x","score":.5})", ".5"));
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"age":1,"name":"x","tags":[1]})", "1]"));
  // Syntax between members.
  EXPECT_TRUE(rejected_at(s, R"({"active":true,,)", 15));
  EXPECT_TRUE(rejected_at(s, R"({"active" true})", "true"));
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"age":1,"name":"x",})", "}"));
  // "tags" is the last property: no ',' after it.
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"age":1,"name":"x","tags":[],"nick":"a"})", ",\"nick"));
  // Strings: raw control characters and invalid UTF-8.
  EXPECT_TRUE(rejected_at(s, "{\"active\":true,\"age\":1,\"name\":\"a\x01\"}", "\x01"));
  EXPECT_TRUE(rejected_at(s, "{\"active\":true,\"age\":1,\"name\":\"a\nb\"}", "\n"));
  EXPECT_TRUE(rejected_at(s, "{\"active\":true,\"age\":1,\"name\":\"a\xFF\"}", "\xFF"));
  EXPECT_TRUE(rejected_at(s, "{\"active\":true,\"age\":1,\"name\":\"\xC0\x80\"}", "\xC0"));  // overlong
  EXPECT_TRUE(rejected_at(s, "{\"active\":true,\"age\":1,\"name\":\"\xE0\x80\x80\"}", "\x80"));
  EXPECT_TRUE(rejected_at(s, "{\"active\":true,\"age\":1,\"name\":\"\xED\xA0\x80\"}", "\xA0"));  // surrogate
  EXPECT_TRUE(rejected_at(s, "{\"active\":true,\"age\":1,\"name\":\"\xF4\x90\x80\x80\"}", "\x90"));  // > U+10FFFF
  EXPECT_TRUE(rejected_at(s, "{\"active\":true,\"age\":1,\"name\":\"\xC3\"}", "\"}"));  // cut short
  EXPECT_TRUE(rejected_at(s, "{\"active\":true,\"age\":1,\"name\":\"\x80\"}", "\x80"));  // lone continuation
  // Nothing after the root value, not even whitespace.
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"age":1,"name":"x"} )", " "));
  EXPECT_TRUE(rejected_at(s, R"({"active":true,"age":1,"name":"x"}{)", 34));
}

// The schema's own property order, not the alphabet's (the schema arrives as an ordered_json, as the server parses it).
TEST(JsonGrammar, PropertiesInTheSchemasOrder) {
  const auto s = schema(R"({"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "integer"},
      "mid": {"type": "integer"}}, "required": ["zeta", "mid"]})");
  EXPECT_TRUE(valid(s, R"({"zeta":1,"alpha":2,"mid":3})"));
  EXPECT_TRUE(valid(s, R"({"zeta":1,"mid":3})"));
  EXPECT_TRUE(rejected_at(s, R"({"alpha":2,"zeta":1,"mid":3})", "a"));
  EXPECT_TRUE(rejected_at(s, R"({"zeta":1,"mid":3,"alpha":2})", ",\"alpha"));
}

// One line break in a whitespace run: pretty printing passes, blank lines do not.
TEST(JsonGrammar, OneLineBreakAWhitespaceRun) {
  const auto s = JsonSchema::any_object();
  EXPECT_TRUE(valid(s, "{\n  \"a\": [\n    1,\n    2\n  ],\r\n\t\"b\" :\n null\n}"));
  EXPECT_TRUE(valid(s, "\n{\"a\":\r1}"));
  EXPECT_TRUE(rejected_at(s, "{\n\n\"a\":1}", 2));
  EXPECT_TRUE(rejected_at(s, "{\"a\":1,\n  \n\"b\":2}", 10));
  EXPECT_TRUE(rejected_at(s, "{\"a\":1 \r \n}", 9));
  EXPECT_TRUE(rejected_at(s, "{\"a\":1\r\r}", 7));
  EXPECT_TRUE(rejected_at(s, "\n\n{}", 1));
}

TEST(JsonGrammar, NestedObjectsAndArrayBounds) {
  const auto s = schema(R"({"type": "object", "required": ["list", "point"], "properties": {
      "grid": {"type": "array", "items": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
      "list": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
      "point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                "required": ["x", "y"]}}})");
  EXPECT_TRUE(valid(s, R"({"list":[1],"point":{"x":1,"y":2}})"));
  EXPECT_TRUE(valid(s, R"({"grid":[[],[true,false]],"list":[1,2,3],"point":{"x":-0.5,"y":1E-7}})"));
  EXPECT_TRUE(valid(s, "{\n  \"list\": [\n    1,\n    2\n  ],\n  \"point\": {\n    \"x\": 1,\n    \"y\": 2\n  }\n}"));
  EXPECT_TRUE(rejected_at(s, R"({"list":[],"point":{"x":1,"y":2}})", "]"));
  EXPECT_TRUE(rejected_at(s, R"({"list":[1,2,3,4],"point":{"x":1,"y":2}})", ",4"));
  EXPECT_TRUE(rejected_at(s, R"({"list":[1],"point":{"x":1}})", "}}"));
  EXPECT_TRUE(rejected_at(s, R"({"list":[1],"point":{"y":1}})", "y"));
  EXPECT_TRUE(rejected_at(s, R"({"grid":[[true,true,true]]})", ",true]"));
  EXPECT_TRUE(rejected_at(s, R"({"list":[1,],"point":{"x":1,"y":2}})", "]"));
  EXPECT_TRUE(incomplete(s, R"({"list":[1],"point":{"x":1,"y":2)"));
}

TEST(JsonGrammar, EnumsAndConst) {
  const auto colors = schema(R"({"enum": ["red", "green", "blue"]})");
  EXPECT_TRUE(valid(colors, R"("red")"));
  EXPECT_TRUE(valid(colors, R"("green")"));
  EXPECT_TRUE(rejected_at(colors, R"("gray")", 3));
  EXPECT_TRUE(rejected_at(colors, R"("re")", 3));
  EXPECT_TRUE(valid(colors, R"( "blue")"));
  EXPECT_TRUE(after(colors, R"("red")").finished());

  // 1 is a prefix of 12: after "1" the document may end or continue.
  const auto nums = schema(R"({"enum": [1, 12, -3.5]})");
  JsonMatcher one = after(nums, "1");
  EXPECT_TRUE(one.can_finish());
  EXPECT_FALSE(one.finished());
  EXPECT_TRUE(after(nums, "12").finished());
  EXPECT_TRUE(valid(nums, "-3.5"));
  EXPECT_TRUE(rejected_at(nums, "13", 1));
  EXPECT_TRUE(rejected_at(nums, "1.", 1));
  EXPECT_TRUE(rejected_at(nums, "-3", kAll));
  EXPECT_FALSE(after(nums, "-3").can_finish());
  const auto items = schema(R"({"type": "array", "items": {"enum": [1, 12]}})");
  EXPECT_TRUE(valid(items, "[1,12,1]"));
  EXPECT_TRUE(valid(items, "[12, 1 ]"));
  EXPECT_TRUE(rejected_at(items, "[123]", 3));
  EXPECT_TRUE(rejected_at(items, "[2]", 1));

  // Mixed values: literals in their compact text.
  const auto mixed = schema(R"({"enum": ["a", 1, null, true, {"k": [1, 2]}, [], "a\"b"]})");
  for (const char* v : {R"("a")", "1", "null", "true", R"({"k":[1,2]})", "[]", R"("a\"b")"})
    EXPECT_TRUE(valid(mixed, v));
  EXPECT_TRUE(rejected_at(mixed, R"({"k": [1,2]})", " "));
  EXPECT_TRUE(rejected_at(mixed, "false", 0));
  EXPECT_TRUE(rejected_at(mixed, R"("b")", 1));

  // With a type, only the values of that type.
  const auto typed = schema(R"({"type": "string", "enum": ["a", 1, "b", null]})");
  EXPECT_TRUE(valid(typed, R"("b")"));
  EXPECT_TRUE(rejected_at(typed, "1", 0));
  EXPECT_TRUE(rejected_at(typed, "null", 0));
  const auto nullable = schema(R"({"type": ["string", "null"], "enum": ["a", 1, null]})");
  EXPECT_TRUE(valid(nullable, "null"));
  EXPECT_TRUE(rejected_at(nullable, "1", 0));
  // The rest of the schema filters too (maxLength here).
  EXPECT_TRUE(rejected_at(schema(R"({"type": "string", "maxLength": 2, "enum": ["ab", "abc"]})"), R"("abc")", 3));

  const auto fixed = schema(R"({"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
                                "required": ["kind", "r"]})");
  EXPECT_TRUE(valid(fixed, R"({"kind":"circle","r":2})"));
  EXPECT_TRUE(rejected_at(fixed, R"({"kind":"square","r":2})", 9));
  EXPECT_TRUE(valid(schema(R"({"const": 5, "enum": [5, 6]})"), "5"));
  EXPECT_TRUE(rejected_at(schema(R"({"const": 5, "enum": [5, 6]})"), "6", 0));
  EXPECT_TRUE(valid(schema(R"({"type": "boolean"})"), "false"));
  EXPECT_TRUE(rejected_at(schema(R"({"type": "boolean"})"), "null", 0));
}

TEST(JsonGrammar, AnyOfAndTypeLists) {
  const auto s = schema(R"({"anyOf": [
      {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
      {"type": "string", "maxLength": 3}, {"type": "null"}]})");
  EXPECT_TRUE(valid(s, R"({"a":1})"));
  EXPECT_TRUE(valid(s, R"("abc")"));
  EXPECT_TRUE(valid(s, "null"));
  EXPECT_TRUE(rejected_at(s, R"("abcd")", 4));
  EXPECT_TRUE(rejected_at(s, R"({})", 1));
  EXPECT_TRUE(rejected_at(s, "nul1", 3));
  EXPECT_TRUE(rejected_at(s, "1", 0));
  EXPECT_TRUE(rejected_at(s, "true", 0));

  // Two object branches that differ only in a value's type: both live until the value.
  const auto two = schema(R"({"oneOf": [
      {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
      {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "null"}}, "required": ["a"]}]})");
  EXPECT_TRUE(valid(two, R"({"a":1})"));
  EXPECT_TRUE(valid(two, R"({"a":"x","b":null})"));
  EXPECT_TRUE(rejected_at(two, R"({"a":1,"b":null})", 6));
  EXPECT_TRUE(rejected_at(two, R"({"a":true})", 5));

  const auto list = schema(R"({"type": ["integer", "boolean", "null"]})");
  for (const char* v : {"0", "-12", "true", "false", "null"}) EXPECT_TRUE(valid(list, v));
  EXPECT_TRUE(rejected_at(list, "1.5", 1));
  EXPECT_TRUE(rejected_at(list, R"("x")", 0));
  const auto numeric = schema(R"({"type": ["number", "integer"]})");
  EXPECT_TRUE(valid(numeric, "1.5e3"));
  // Each item forks two alternatives that meet again after it: without merging identical ones, 2^300 of them.
  const auto forks = schema(R"({"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "number"}]}})");
  std::string many = "[1";
  for (int i = 0; i < 300; ++i) many += ",1";
  EXPECT_TRUE(valid(forks, many + "]"));
  // Optional in the Pydantic style: anyOf [T, null] with a default.
  const auto opt = schema(R"({"type": "object", "properties": {
      "x": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "title": "X"}}})");
  EXPECT_TRUE(valid(opt, R"({"x":null})"));
  EXPECT_TRUE(valid(opt, R"({"x":"s"})"));
  EXPECT_TRUE(valid(opt, R"({})"));
}

TEST(JsonGrammar, RefsAndRecursion) {
  const auto tree = schema(R"({"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object",
      "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}, "value": {"type": "integer"}},
      "required": ["value"]}}})");
  EXPECT_TRUE(valid(tree, R"({"value":1})"));
  EXPECT_TRUE(valid(tree, R"({"children":[{"value":2},{"children":[{"children":[],"value":4}],"value":3}],)"
                          R"("value":1})"));
  EXPECT_TRUE(rejected_at(tree, R"({"children":[{}],"value":1})", 14));
  EXPECT_TRUE(rejected_at(tree, R"({"children":[{"value":"x"}],"value":1})", 22));

  // "#" (the root), "definitions", a $ref to a $ref, allOf of one schema.
  const auto list = schema(R"({"type": "object", "properties": {"head": {"type": "integer"},
      "tail": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["head", "tail"]})");
  EXPECT_TRUE(valid(list, R"({"head":1,"tail":{"head":2,"tail":null}})"));
  EXPECT_TRUE(rejected_at(list, R"({"head":1,"tail":{"head":2}})", 26));
  const auto defs = schema(R"({"definitions": {"A": {"$ref": "#/definitions/B"}, "B": {"type": "integer"}},
      "type": "array", "items": {"allOf": [{"$ref": "#/definitions/A"}], "description": "an A"}})");
  EXPECT_TRUE(valid(defs, "[1,2]"));
  EXPECT_TRUE(rejected_at(defs, R"([1,"2"])", 3));

  // What no finite value satisfies is never offered: a `false` property, an impossible branch.
  // ("c" recurses through a required property: no finite value. With "a" and "c" gone, no ',' after "b".)
  const auto pruned = schema(R"({"type": "object", "properties": {"a": false, "b": {"type": "integer"},
      "c": {"$ref": "#/$defs/Loop"}}, "$defs": {"Loop": {"type": "object",
      "properties": {"next": {"$ref": "#/$defs/Loop"}}, "required": ["next"]}}})");
  EXPECT_TRUE(valid(pruned, R"({"b":1})"));
  EXPECT_TRUE(rejected_at(pruned, R"({"a":1})", 2));
  EXPECT_TRUE(rejected_at(pruned, R"({"b":1,"c":{}})", 6));
}

TEST(JsonGrammar, FreeFormObjects) {
  const auto ints = schema(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(valid(ints, R"({"x":1,"y":-2,"x":3})"));
  EXPECT_TRUE(valid(ints, R"({})"));
  EXPECT_TRUE(valid(ints, R"({"k\u00e9y\n":1})"));
  EXPECT_TRUE(rejected_at(ints, R"({"x":"s"})", 5));
  EXPECT_TRUE(rejected_at(ints, R"({x:1})", 1));
  const auto empty = schema(R"({"type": "object", "additionalProperties": false})");
  EXPECT_TRUE(valid(empty, "{}"));
  EXPECT_TRUE(rejected_at(empty, R"({"a":1})", 1));
  const auto none = schema(R"({"type": "object", "properties": {}})");
  EXPECT_TRUE(valid(none, "{ }"));
  EXPECT_TRUE(rejected_at(none, R"({"a":1})", 1));
  // With "properties", additionalProperties true still admits no other key (strict mode).
  const auto strict = schema(R"({"type": "object", "properties": {"a": {}}, "additionalProperties": true})");
  EXPECT_TRUE(valid(strict, R"({"a":[1,{"b":null}]})"));
  EXPECT_TRUE(rejected_at(strict, R"({"b":1})", 2));
  // No "type": the keywords imply it.
  const auto implied = schema(R"({"properties": {"a": {"type": "null"}}, "required": ["a"]})");
  EXPECT_TRUE(valid(implied, R"({"a":null})"));
  EXPECT_TRUE(rejected_at(implied, "1", 0));

  const auto obj = JsonSchema::any_object();
  EXPECT_TRUE(valid(obj, R"({})"));
  EXPECT_TRUE(valid(obj, R"({"a":[1,{"b":null}],"c":"\ud83d\ude00","d":-0.0e-0})"));
  EXPECT_TRUE(rejected_at(obj, "[]", 0));
  EXPECT_TRUE(rejected_at(obj, R"("x")", 0));
  EXPECT_TRUE(rejected_at(obj, R"({"a":})", 5));
  EXPECT_TRUE(rejected_at(obj, R"({"a" 1})", 5));
  EXPECT_TRUE(after(obj, "{}").finished());
  EXPECT_FALSE(after(obj, "{").finished());
}

TEST(JsonGrammar, StringLengthsUtf8AndEscapes) {
  const auto s = schema(R"({"type": "string", "minLength": 2, "maxLength": 4})");
  EXPECT_TRUE(valid(s, R"("ab")"));
  EXPECT_TRUE(valid(s, R"("abcd")"));
  EXPECT_TRUE(rejected_at(s, R"("a")", 2));
  EXPECT_TRUE(rejected_at(s, R"("")", 1));
  EXPECT_TRUE(rejected_at(s, R"("abcde")", 5));
  // Code points, not bytes: é is 2 bytes, 😀 is 4, an escape is one code point, a surrogate pair one.
  EXPECT_TRUE(valid(s, "\"\xC3\xA9\xC3\xA9\""));
  EXPECT_TRUE(valid(s, "\"\xF0\x9F\x98\x80\xF0\x9F\x98\x80\xF0\x9F\x98\x80\xF0\x9F\x98\x80\""));
  EXPECT_TRUE(rejected_at(s, "\"\xF0\x9F\x98\x80\xF0\x9F\x98\x80\xF0\x9F\x98\x80\xF0\x9F\x98\x80\xF0\"", 17));
  EXPECT_TRUE(valid(s, R"("\u00e9\n")"));
  EXPECT_TRUE(valid(s, R"("\ud83d\ude00\"\\\/")"));
  EXPECT_TRUE(rejected_at(s, R"("\ud83d\ude00\"\\\/\b")", 19));
  EXPECT_TRUE(incomplete(s, R"("ab\")"));  // an escaped quote does not close

  const auto any = schema(R"({"type": "string"})");
  EXPECT_TRUE(valid(any, R"("\u00E9\u0000\uFFFF\uD800\uDC00\uDBFF\uDFFF")"));
  EXPECT_TRUE(rejected_at(any, R"("\x")", 2));
  EXPECT_TRUE(rejected_at(any, R"("\u00g0")", 5));
  EXPECT_TRUE(rejected_at(any, R"("\ude00")", 4));          // a lone low surrogate
  EXPECT_TRUE(rejected_at(any, R"("\ud83d")", 7));          // a high one not followed by a low one
  EXPECT_TRUE(rejected_at(any, R"("\ud83d\u0041")", 9));
  EXPECT_TRUE(rejected_at(any, R"("\ud83d\ud83d")", 10));
  EXPECT_TRUE(rejected_at(any, R"("\ud83dx")", 7));
  EXPECT_TRUE(valid(any, "\"\x7F tab-less \xE2\x82\xAC \xEF\xBF\xBF \xF4\x8F\xBF\xBF\""));
  EXPECT_TRUE(rejected_at(any, "\"\t\"", 1));
  EXPECT_TRUE(after(any, R"("a")").finished());
}

TEST(JsonGrammar, NumbersAndWhitespaceBounds) {
  const auto num = schema(R"({"type": "number"})");
  const std::string d24(kMaxNumberDigits, '7');
  EXPECT_TRUE(valid(num, "-" + d24 + "." + d24 + "e-" + d24));
  EXPECT_TRUE(rejected_at(num, d24 + "7", 24));
  EXPECT_TRUE(rejected_at(num, "1." + d24 + "7", 26));
  EXPECT_TRUE(rejected_at(num, "1e+" + d24 + "7", 27));
  for (const char* v : {"0", "-0", "0.0", "1E5", "1e+5", "1e-5", "10.01"}) EXPECT_TRUE(valid(num, v));
  for (const char* v : {"+1", ".5", "-", "1.", "1e", "1e+", "00", "-01", "1.e5", "0x1", "Infinity", "NaN"}) {
    JsonMatcher m(num);
    const bool all = first_rejected(m, v) == kAll;
    EXPECT_FALSE(all && m.can_finish()) << v;
  }
  EXPECT_FALSE(after(num, "5").finished());
  const auto integer = schema(R"({"type": "integer"})");
  EXPECT_TRUE(after(integer, d24).finished());  // no further digit, and no fraction or exponent for an integer
  EXPECT_FALSE(after(integer, "1").finished());

  const std::string ws(kMaxWhitespaceRun, ' ');
  const auto any = schema("{}");
  EXPECT_TRUE(valid(any, ws + "[" + ws + "1" + ws + "," + ws + "{" + ws + "\"a\"" + ws + ":" + ws + "2" + ws + "}" +
                             ws + "]"));
  EXPECT_TRUE(rejected_at(any, ws + " 1", kMaxWhitespaceRun));
  EXPECT_TRUE(rejected_at(any, "[" + ws + "\n1]", kMaxWhitespaceRun + 1));
  EXPECT_TRUE(valid(any, "[\"" + ws + ws + "\"]"));  // spaces in a string are content, not whitespace
  EXPECT_TRUE(rejected_at(any, "1 ", 1));
  EXPECT_TRUE(rejected_at(any, "tru e", 3));
}

// Deeper than the state's inline room (32 frames): copies stay independent, in both directions of assignment.
TEST(JsonGrammar, DeepNestingAndCopies) {
  const auto any = schema("{}");
  const std::string open(100, '['), close(100, ']');
  EXPECT_TRUE(valid(any, open + close));
  JsonMatcher deep = after(any, open);
  JsonMatcher copy = deep, shallow = after(any, "[");
  EXPECT_TRUE(copy.feed(std::string_view(close)));
  EXPECT_TRUE(copy.finished());
  EXPECT_FALSE(deep.can_finish());
  shallow = deep;  // a deep state assigned over a shallow one
  EXPECT_TRUE(rejected_at(any, open + close + "]", 200));
  EXPECT_TRUE(shallow.feed(std::string_view(close)));
  EXPECT_TRUE(shallow.can_finish());
  deep = after(any, "[");  // and a shallow one over a deep one
  EXPECT_TRUE(deep.feed(std::string_view("]")));
  EXPECT_TRUE(deep.finished());

  const auto list = schema(R"({"type": "object", "properties": {"head": {"type": "integer"},
      "tail": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["head", "tail"]})");
  std::string text;
  for (int i = 0; i < 60; ++i) text += R"({"head":)" + std::to_string(i) + R"(,"tail":)";
  text += "null" + std::string(60, '}');
  EXPECT_TRUE(valid(list, text));
  EXPECT_TRUE(rejected_at(list, text.substr(0, text.size() - 1) + "]", text.size() - 1));
}

TEST(JsonGrammar, RejectionLeavesStateUnchanged) {
  const auto s = schema(kPerson);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"active":true,"age":1)", "x.}"},  {R"({"active":true,"age":1,"name":"ab\)", "xq"},
      {R"({"active":true,"age":12)", ".a"}, {"{\"active\":true,\"age\":1,\"name\":\"\xE2\x82", "\"a"},
      {R"({"act)", "x}"},                      {"", "x]"}};
  for (const auto& [prefix, bad] : cases) {
    JsonMatcher m = after(s, prefix);
    const JsonMatcher before = m;
    for (char b : bad) EXPECT_FALSE(m.feed(static_cast<unsigned char>(b))) << prefix << " + " << b;
    EXPECT_FALSE(m.feed(std::string_view(bad)));
    EXPECT_EQ(m.can_finish(), before.can_finish());
    EXPECT_EQ(m.finished(), before.finished());
    EXPECT_EQ(m.in_plain_string(4), before.in_plain_string(4));
    for (int c = 0; c < 256; ++c) {
      JsonMatcher x = m, y = before;
      EXPECT_EQ(x.feed(static_cast<unsigned char>(c)), y.feed(static_cast<unsigned char>(c))) << prefix << " " << c;
    }
  }
  // A multi-byte feed rejected in its middle takes none of its bytes.
  JsonMatcher m = after(s, R"({"active":true,)");
  EXPECT_FALSE(m.feed(std::string_view(R"("age":1,"nope")")));
  EXPECT_TRUE(m.feed(std::string_view(R"("age":1,"name":"ok"})")));
  EXPECT_TRUE(m.finished());
}

TEST(JsonGrammar, InPlainString) {
  const auto any = schema("{}");
  EXPECT_FALSE(JsonMatcher(any).in_plain_string(1));
  EXPECT_TRUE(after(any, "\"").in_plain_string(100));
  EXPECT_TRUE(after(any, "[\"abc").in_plain_string(100));
  EXPECT_FALSE(after(any, "[\"abc\\").in_plain_string(1));
  EXPECT_FALSE(after(any, "[\"abc\\u00").in_plain_string(1));
  EXPECT_TRUE(after(any, "[\"abc\\u00e9").in_plain_string(1));
  EXPECT_FALSE(after(any, "[\"a\xC3").in_plain_string(1));
  EXPECT_TRUE(after(any, "[\"a\xC3\xA9").in_plain_string(1));
  EXPECT_FALSE(after(any, "[\"a\"").in_plain_string(1));
  EXPECT_TRUE(after(JsonSchema::any_object(), "{\"ke").in_plain_string(64));  // a free-form key
  const auto person = schema(kPerson);
  EXPECT_FALSE(after(person, "{\"act").in_plain_string(1));  // a property name is a literal
  EXPECT_TRUE(after(person, R"({"active":true,"age":1,"name":"An)").in_plain_string(64));
  EXPECT_FALSE(after(schema(R"({"enum": ["red", "rose"]})"), "\"r").in_plain_string(1));
  // Mixed alternatives: plain only if every one is.
  const auto mix = schema(R"({"anyOf": [{"type": "string"}, {"enum": ["abc"]}]})");
  EXPECT_FALSE(after(mix, "\"ab").in_plain_string(1));
  EXPECT_TRUE(after(mix, "\"abd").in_plain_string(1));
  // maxLength: plain only while `bytes` more code points fit.
  const auto bounded = schema(R"({"type": "string", "maxLength": 5})");
  const JsonMatcher ab = after(bounded, "\"ab");
  EXPECT_TRUE(ab.in_plain_string(3));
  EXPECT_FALSE(ab.in_plain_string(4));
  JsonMatcher full = ab;
  EXPECT_TRUE(full.feed(std::string_view("xyz")));
  EXPECT_FALSE(full.feed(static_cast<unsigned char>('w')));

  // The promise, checked on copies: every such byte string of at most `bytes` bytes is accepted.
  const std::vector<std::string> plain = {"", "x", "hello", "h\xC3\xA9llo", "\xE6\x97\xA5\xE6\x9C\xAC",
                                          "\xF0\x9F\x98\x80", "ab\xE6\x97", "\xF0\x9F\x98", "\x7F/'{}[],:",
                                          "\xF4\x8F\xBF\xBF", "\xED\x9F\xBF"};
  for (const JsonMatcher& m : {after(any, "\""), after(any, "{\"k\":\"x"), after(JsonSchema::any_object(), "{\"k"),
                               after(person, R"({"active":true,"age":1,"name":"A)"), ab}) {
    const int bytes = m.in_plain_string(10) ? 10 : 3;
    ASSERT_TRUE(m.in_plain_string(bytes));
    for (const std::string& p : plain) {
      if (int(p.size()) > bytes) continue;
      JsonMatcher copy = m;
      EXPECT_TRUE(copy.feed(std::string_view(p))) << p;
    }
  }
}

TEST(JsonGrammar, SchemaErrors) {
  auto message = test_util::schema_error;
  auto has = [](const std::string& msg, std::string_view part) { return msg.find(part) != std::string::npos; };
  // Bounds: subschemas, and alternatives an anyOf opens at once (a nested anyOf's count in its parent's).
  json big = {{"anyOf", json::array()}};
  for (int i = 0; i < 70; ++i)
    big["anyOf"].push_back({{"type", "object"}, {"properties", {{"k" + std::to_string(i), {{"type", "integer"}}}}}});
  std::string m = message(big.dump());
  EXPECT_TRUE(has(m, "70 alternatives") && has(m, "at most 64")) << m;
  json nested = {{"anyOf", {{{"anyOf", json::array()}}, {{"type", "string"}}}}};
  for (int i = 0; i < 64; ++i) nested["anyOf"][0]["anyOf"].push_back({{"const", i}});
  m = message(nested.dump());
  EXPECT_TRUE(has(m, "65 alternatives")) << m;
  json wide = {{"type", "object"}, {"properties", json::object()}};
  for (int i = 0; i < 5000; ++i) wide["properties"]["p" + std::to_string(i)] = {{"const", i}};
  m = message(wide.dump());
  EXPECT_TRUE(has(m, "more than 4096 subschemas")) << m;
  m = message(R"({"type": "object", "patternProperties": {"^a": {"type": "string"}}})");
  EXPECT_TRUE(has(m, "\"patternProperties\"") && has(m, "not supported")) << m;
  // A pattern the regex compiler refuses (an anchor inside): named with its location.
  m = message(R"({"type": "object", "properties": {"name": {"type": "string", "pattern": "a^b"}}})");
  EXPECT_TRUE(has(m, "\"pattern\"") && has(m, "#/properties/name") && has(m, "anchor")) << m;
  m = message(R"({"type": "integer", "minimum": 0})");
  EXPECT_TRUE(has(m, "\"minimum\"") && has(m, " at #")) << m;
  m = message(R"({"not": {"type": "string"}})");
  EXPECT_TRUE(has(m, "\"not\"")) << m;
  m = message(R"({"type": "array", "items": {"uniqueItems": true}})");
  EXPECT_TRUE(has(m, "\"uniqueItems\"") && has(m, "#/items")) << m;
  m = message(R"({"$ref": "#/$defs/Missing", "$defs": {"Other": {}}})");
  EXPECT_TRUE(has(m, "#/$defs/Missing")) << m;
  m = message(R"({"$ref": "https://example.com/schema"})");
  EXPECT_TRUE(has(m, "https://example.com/schema") && has(m, "not supported")) << m;
  m = message(R"({"$ref": "#/properties/a"})");
  EXPECT_TRUE(has(m, "not supported")) << m;
  m = message(R"({"type": "foo"})");
  EXPECT_TRUE(has(m, "\"foo\"")) << m;
  m = message(R"({"type": 3})");
  EXPECT_TRUE(has(m, "\"type\"")) << m;
  m = message(R"({"type": "array", "minItems": -1})");
  EXPECT_TRUE(has(m, "minItems")) << m;
  m = message(R"({"type": "string", "minLength": 3, "maxLength": 2})");
  EXPECT_TRUE(has(m, "minLength")) << m;
  m = message(R"({"type": "array", "items": [{"type": "string"}]})");
  EXPECT_TRUE(has(m, "\"items\"")) << m;
  m = message(R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})");
  EXPECT_TRUE(has(m, "\"b\"") && has(m, "required")) << m;
  m = message(R"({"type": "object", "anyOf": [{"required": ["a"]}]})");
  EXPECT_TRUE(has(m, "anyOf") && has(m, "type")) << m;
  m = message(R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})");
  EXPECT_TRUE(has(m, "allOf")) << m;
  m = message(R"({"$ref": "#"})");
  EXPECT_TRUE(has(m, "$ref")) << m;
  m = message(R"({"type": "integer", "enum": ["a", "b"]})");
  EXPECT_TRUE(has(m, "no JSON value")) << m;
  m = message(R"({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]})");
  EXPECT_TRUE(has(m, "no JSON value")) << m;
  m = message(R"({"enum": []})");
  EXPECT_TRUE(has(m, "enum")) << m;
  m = message("false");
  EXPECT_TRUE(has(m, "no JSON value")) << m;
  m = message("[]");
  EXPECT_TRUE(has(m, "expected an object or a boolean")) << m;
  // Annotations are accepted and ignored; so are unused $defs.
  EXPECT_EQ(message(R"({"title": "t", "description": "d", "default": 1, "examples": [1], "$schema": "x",
                       "format": "date-time", "deprecated": false, "strict": true, "type": "string",
                       "$defs": {"Unused": {"pattern": "x"}}})"), "no UserError");
}

// Random values from nlohmann's serializer: the any-value schema and any_object() accept them; every proper prefix
// of an object, array or string is incomplete; and one byte changed, the matcher agrees with nlohmann's parser.
namespace {

std::string random_string(std::mt19937& rng) {
  static const std::vector<std::string> pieces = {"a", "Z", "0", " ", "\"", "\\", "/", "\n", "\t", "\x01", "\x1f",
                                                  "\x7f", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "{", "]",
                                                  ":", ",", "e", "-", "\xEF\xBF\xBF"};
  std::string s;
  for (int n = int(rng() % 8); n > 0; --n) s += pieces[rng() % pieces.size()];
  return s;
}

// Whether `text` is JSON by nlohmann's parser. Its parser also refuses a number too large for a double (1e999),
// which is valid JSON syntax: such a number (only the one around byte `mutated` can be one, if given) is judged
// as null.
bool json_syntax_ok(std::string text, size_t mutated = std::string::npos) {
  for (;;) {
    try {
      const json parsed = json::parse(text);
      return !parsed.is_discarded();
    } catch (const json::parse_error&) {
      return false;
    } catch (const json::out_of_range& e) {
      const std::string msg = e.what(), prefix = "number overflow parsing '";
      const size_t q = msg.find(prefix);
      if (q == std::string::npos) return false;
      const std::string token = msg.substr(q + prefix.size(), msg.rfind('\'') - q - prefix.size());
      const size_t at = mutated == std::string::npos ? text.find(token) : text.rfind(token, mutated);
      if (at == std::string::npos || (mutated != std::string::npos && at + token.size() <= mutated)) {
        ADD_FAILURE() << "overflowing number " << token << " not at byte " << mutated << " of " << text;
        return false;
      }
      // The lexer ended the number where no number can go on, and "null" ends at the same byte.
      text.replace(at, token.size(), "null");
    }
  }
}

json random_value(std::mt19937& rng, int depth) {
  switch (rng() % (depth > 0 ? 8 : 6)) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return int64_t(rng() % 2000000001) - 1000000000;
    case 3: return std::ldexp(double(int32_t(rng())), int(rng() % 120) - 60);
    case 4: return double(rng() % 1000) / 8;
    case 5: return random_string(rng);
    case 6: {
      json a = json::array();
      for (int n = int(rng() % 5); n > 0; --n) a.push_back(random_value(rng, depth - 1));
      return a;
    }
    default: {
      json o = json::object();
      for (int n = int(rng() % 5); n > 0; --n) o[random_string(rng)] = random_value(rng, depth - 1);
      return o;
    }
  }
}

}  // namespace

TEST(JsonGrammar, RandomValuesAgreeWithNlohmann) {
  std::mt19937 rng(20240611);
  const auto any = schema("{}");
  const auto obj = JsonSchema::any_object();
  const std::string mutations = "{}[],:\"\\ \n0123456789-+.eEtrufalsn\x01\x7f\xC3\xA9\xFF\x80";
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 400; ++iter) {
    json v = random_value(rng, 4);
    if (iter % 3 == 0) v = json::object({{"k", v}, {random_string(rng), random_value(rng, 3)}});
    for (const std::string& text : {v.dump(), v.dump(2)}) {
      ASSERT_TRUE(valid(any, text));
      if (v.is_object()) {
        ASSERT_TRUE(valid(obj, text));
      } else {
        ASSERT_TRUE(rejected_at(obj, text, 0));
      }
    }
    // Mutations of the compact text, which has no whitespace between tokens: then the only difference from
    // nlohmann's parser is that no whitespace may follow the root value.
    const std::string text = v.dump();
    for (int k = 0; k < 20; ++k) {
      std::string t = text;
      const size_t i = rng() % t.size();
      t[i] = mutations[rng() % mutations.size()];
      const bool oracle = json_syntax_ok(t, i) && !is_space(t.back());
      JsonMatcher m(any);
      const bool ours = first_rejected(m, t) == kAll && m.can_finish();
      ASSERT_EQ(ours, oracle) << "text " << text << "\nmutated at " << i << ": " << t;
      (ours ? accepted : rejected) += 1;
    }
  }
  // The mutations exercise both verdicts (1665 / 6335 with this seed).
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(rejected, 4000);
}

// Exactness, from the inside: random walks over the accepted bytes never reach a state that is neither complete
// nor continuable, finished() is exactly "complete and nothing continues", and every complete text parses.
TEST(JsonGrammar, RandomWalksNeverDeadEnd) {
  const std::vector<std::string> schemas = {
      kPerson,
      R"({"$ref": "#/$defs/N", "$defs": {"N": {"type": "object", "properties": {"v": {"enum": [1, 12, "x"]},
          "kids": {"type": "array", "items": {"$ref": "#/$defs/N"}, "maxItems": 2}}, "required": ["v"]}}})",
      R"({"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "null"},
          "b": false}, "required": ["ab"]}, {"type": "string", "minLength": 2, "maxLength": 3}, {"type": "null"},
          {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 3}]})",
      R"({"type": "object", "additionalProperties": {"type": "array", "items": {"const": {"k": [true]}}}})",
      "{}",
  };
  std::mt19937 rng(99);
  const std::string closers = "\"}],:";
  int completed = 0;
  for (const std::string& text : schemas) {
    const auto s = schema(text);
    for (int walk = 0; walk < 25; ++walk) {
      JsonMatcher m(s);
      std::string doc;
      for (int step = 0; step < 300; ++step) {
        const std::vector<unsigned char> ok = test_util::accepted_bytes(m);
        ASSERT_TRUE(!ok.empty() || m.can_finish()) << "dead end after " << doc;
        ASSERT_EQ(m.finished(), m.can_finish() && ok.empty()) << doc;
        if (m.can_finish()) {
          ASSERT_TRUE(json_syntax_ok(doc)) << doc;
          if (ok.empty() || rng() % 3 == 0) {
            ++completed;
            break;
          }
        }
        // Mostly structural bytes when there are some, so that walks end; whitespace rarely.
        std::vector<unsigned char> pick;
        for (unsigned char c : ok)
          if (closers.find(char(c)) != std::string::npos) pick.push_back(c);
        if (pick.empty() || rng() % 2 == 0) pick = ok;
        unsigned char c = pick[rng() % pick.size()];
        if (is_space(char(c)) && rng() % 4 != 0) c = pick[rng() % pick.size()];
        ASSERT_TRUE(m.feed(c));
        doc += char(c);
      }
    }
  }
  EXPECT_GT(completed, 100);  // 125 of 125 with this seed
}

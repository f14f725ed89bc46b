// Typed conversion of raw tool-call parameter text (Qwen3-Coder's <parameter=NAME>value</parameter>) into
// JSON, driven by the JSON schema the request declared for that parameter. Matches the observable rules of
// the SGLang / vLLM qwen3_coder parsers: "null" is null for any type; string types keep the text; integer
// and number types are parsed; booleans are true/false (any case); object/array types are parsed as JSON,
// else as a Python literal ({'a': True}); anything that fails to convert stays the raw string.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::parsers {

// The types a parameter schema allows, lower-cased, in declaration order: "type" as a string or a list,
// else the "type" of each anyOf / oneOf member. Empty when the schema names none.
std::vector<std::string> schema_types(const nlohmann::ordered_json& param_schema);

// param_schema: the property's schema, or nullptr for a parameter the tool does not declare (kept a string).
nlohmann::ordered_json convert_param_value(std::string_view raw, const nlohmann::ordered_json* param_schema);

// A Python literal as ast.literal_eval reads it (dict, list, tuple, str, int, float, True/False/None),
// converted to JSON the way json.dumps would (tuples become arrays, non-string keys become strings).
// nullopt when the text is not such a literal.
std::optional<nlohmann::ordered_json> parse_python_literal(std::string_view text);

}  // namespace moeserve::parsers

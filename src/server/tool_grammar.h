// tool_choice 'required' or a named function, as a grammar: the call the model writes after the forced opening is
// constrained to the tools' declared parameters in the tool-call parser's own syntax (as SGLang constrains such
// calls), so that a required call is always one the parser reads, naming a declared function with its parameters.
//  - hermes / qwen25: `<tool_call>\n` opens the call; the output is the JSON object {"name": NAME, "arguments": {...}}
//    by a JSON schema whose "arguments" is the function's parameters schema (a keyword the grammar does not
//    support is skipped: the call may then break a bound such as "minimum"), an anyOf of the functions for
//    'required';
//  - qwen3_coder: `<tool_call>\n<function=` (+ NAME>\n when named) opens it; the rest by a regular expression: each
//    declared parameter in the schema's order, the required ones present, as <parameter=P>\nVALUE\n</parameter>\n
//    (VALUE: an integer, number, boolean or string enum by its type, else any text without the markers that end a
//    value: </parameter>, <parameter=, </function>), then </function>\n</tool_call>; for 'required' with parallel
//    calls (OpenAI's parallel_tool_calls, default true) more such blocks may follow, each opened by
//    \n<tool_call>\n<function=.
// After the call(s) only the request's end tokens. hermes: one call.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/token_mask.h"

namespace moeserve::server {

struct ToolCallGrammar {
  std::shared_ptr<grammar::ConstraintSpec> spec;  // without its vocabulary (the caller sets it)
  std::string prefix;                             // the forced opening (already in the prompt)
};

// tools: the request's tools (validated: each has function.name); function: the named one, empty for 'required'.
// nullopt-like (spec null) where the parser has no grammar form or the grammar cannot be built (more than
// kMaxToolAlternatives functions, a regex past its bounds): the caller then keeps the unconstrained opening.
constexpr size_t kMaxToolAlternatives = 32;
ToolCallGrammar tool_call_grammar(const std::string& parser, const nlohmann::ordered_json& tools,
                                  const std::string& function, bool parallel = true);

// qwen3_coder's value text: anything without "</parameter>", "<parameter=" or "</function>" (exposed for tests).
std::string qwen3_coder_free_value_regex();

}  // namespace moeserve::server

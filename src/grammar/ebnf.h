// EBNF grammars (SGLang's `ebnf`, vLLM's `guided_grammar`), in the GBNF / xgrammar notation, for the grammars whose
// language is regular: every rule is expanded in place into a regular expression (regex_grammar.h) and the output
// must match the root rule whole. A rule may repeat itself directly at the end of alternatives (right recursion:
// `list ::= item ("," list)?`, `A ::= x A | y` = x*y) or at their start (left recursion: `A ::= A x | y` = yx*), not
// both; any other self-reference, directly or through other rules (arbitrary nesting, such as a JSON value or an
// arithmetic expression), is a UserError naming the cycle; so are undefined and repeated rules, syntax errors (with
// the line and column) and expansions past the regex's bounds.
//
// The notation: `name ::= expression` rules (a rule runs until the next `name ::=`), the root rule `root`; string
// literals "..." (escapes \n \t \r \\ \" \' \xHH \uHHHH \UHHHHHHHH), character classes [...] with ranges and [^...]
// (the same escapes, and \] \- \^), rule references, ( ), alternation |, repetition * + ? {m} {m,} {m,n}; comments
// from # to the end of the line.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "grammar/regex_grammar.h"

namespace moeserve::grammar {

// The root rule as one regular expression (for Regex::compile).
std::string ebnf_to_regex(std::string_view grammar);
// Its compiled form.
std::shared_ptr<const Regex> compile_ebnf(std::string_view grammar);

}  // namespace moeserve::grammar

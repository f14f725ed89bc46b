// Recursive-descent parser following jinja2's grammar (parser.py): the same precedence ladder
// (condexpr > or > and > not > compare > + - > ~ > * / // % > ** > unary > postfix/filters), the same
// statement set, and unknown filters/tests rejected at parse time as jinja2 rejects them at compile time.
#pragma once

#include <string>

#include "template/ast.h"

namespace moeserve::tpl {

// Throws UserError("chat template syntax error at line N: ...").
Body parse_template(const std::string& source);

inline constexpr int kMaxParseDepth = 200;

}  // namespace moeserve::tpl

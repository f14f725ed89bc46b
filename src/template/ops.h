// Python operators and string formatting on template values.
#pragma once

#include <string>

#include "template/value.h"

namespace moeserve::tpl {

// a OP b for + - * / // % ** with Python's semantics (int/float promotion, str/list repetition,
// floor division and modulo signs, ZeroDivisionError messages). 64-bit integers; overflow raises.
Value binary_op(const std::string& op, const Value& a, const Value& b);
Value unary_op(char op, const Value& a);

// "fmt % args" (printf-style), as the `format` filter and the % operator on strings use it.
std::string percent_format(const std::string& fmt, const Value& args);
// str.format(*args, **kwargs).
std::string brace_format(const std::string& fmt, const CallArgs& args);
// format(value, spec) with Python's format-spec mini-language.
std::string format_spec(const Value& v, const std::string& spec);

// Integer conversions used by filters and builtins; raise Python's TypeError text for other types.
int64_t to_index(const Value& v);

}  // namespace moeserve::tpl

// Filters and tests of jinja2 3.1, with Hugging Face's tojson replacing jinja2's HTML-safe one.
#pragma once

#include <string>

#include "template/ast.h"

namespace moeserve::tpl {

// nullptr when there is no such filter / test.
FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);

// Filters that need the render context (jinja2's pass_context): never folded at compile time.
bool is_context_filter(const std::string& name);

// Helpers shared with the evaluator's method calls.
Value call_filter(Interp& in, const std::string& name, const Value& v, CallArgs& args);
bool call_test(Interp& in, const std::string& name, const Value& v, CallArgs& args);

}  // namespace moeserve::tpl

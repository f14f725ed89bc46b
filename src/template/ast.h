// Syntax tree of a parsed template. Node shapes mirror jinja2's (nodes.py) so that evaluation order and
// precedence match it; only the constructs real chat templates use are represented.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "template/value.h"

namespace moeserve::tpl {

using FilterFn = Value (*)(Interp&, const Value&, CallArgs&);
using TestFn = bool (*)(Interp&, const Value&, CallArgs&);

enum class ExprKind {
  Const, Name, List, Tuple, Dict, GetAttr, GetItem, Slice, Call, Filter, Test,
  Not, Neg, Pos, Binary, Concat, Compare, And, Or, CondExpr,
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::Const;
  int line = 0;
  Value constant;                // Const
  std::string name;              // Name; GetAttr attribute; Filter/Test name; Binary operator
  std::vector<ExprPtr> items;    // elements; Dict: key, value, key, value...; positional call args;
                                 // Concat parts; Compare: operands (items[0] is the left-most)
  std::vector<std::string> ops;  // Compare operators: == != < <= > >= in notin
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr a, b, c;  // GetAttr/GetItem: a=object, b=key. Slice: start/stop/step (null = None).
                    // Call: a=callee. Filter/Test: a=subject (null in {% filter %} / {% set %} blocks).
                    // Unary: a. Binary/And/Or: a, b. CondExpr: a=test, b=then, c=else (may be null).
  ExprPtr dyn_args, dyn_kwargs;  // *args / **kwargs in calls
  FilterFn filter = nullptr;     // resolved at parse time, as jinja2 rejects unknown filters when compiling
  TestFn test = nullptr;
  // A constant expression containing a slice. jinja2's optimizer evaluates constant expressions at compile
  // time, and there a failing slice yields undefined (the sandbox's getitem) where the compiled code would
  // raise TypeError (a plain Python subscript); the evaluator reproduces that (Interp::eval).
  bool const_slice = false;
};

struct Target {
  enum class Kind { Name, Tuple, NamespaceAttr };
  Kind kind = Kind::Name;
  std::string name;  // Name; NamespaceAttr: the namespace variable
  std::string attr;  // NamespaceAttr
  std::vector<Target> items;
  int line = 0;
};

enum class StmtKind { Text, Output, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, With, Break, Continue, Scope };

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  Body body;
  bool uses_varargs = false, uses_kwargs = false, uses_caller = false;
  int line = 0;
};

struct Stmt {
  StmtKind kind = StmtKind::Text;
  int line = 0;
  std::string text;                                 // Text
  ExprPtr expr;                                     // Output; For: iterable; Set: value; CallBlock: the call;
                                                    // FilterBlock / SetBlock: filter chain (may be null)
  std::vector<std::pair<ExprPtr, Body>> branches;   // If: (test, body)...; a null test is the else branch
  Target target;                                    // For, Set, SetBlock
  ExprPtr cond;                                     // For: the "if" filter
  Body body, else_body;
  std::unique_ptr<MacroDef> macro;                  // Macro; CallBlock: the caller's signature and body
  std::vector<Target> with_targets;
  std::vector<ExprPtr> with_values;
};

}  // namespace moeserve::tpl

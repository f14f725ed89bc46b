#include "template/interp.h"

#include <fmt/format.h>

#include "template/filters.h"
#include "template/objects.h"
#include "template/ops.h"
#include "template/pystr.h"

namespace moeserve::tpl {
namespace {

// Thrown while folding a constant expression when it turns out not to be constant (jinja2's Impossible).
struct NotConstant {};

// C++ stack use grows with expression and macro nesting; this bounds it like Python's recursion limit.
struct EvalDepth {
  EvalDepth(int& d, int limit) : d_(d) {
    if (++d_ > limit) {
      --d_;
      throw EvalError("maximum recursion depth exceeded");
    }
  }
  ~EvalDepth() { --d_; }
  int& d_;
};

// jinja2's object_type_repr: how error messages name the object an attribute was looked up on.
std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  if (v.is_object()) {
    const std::string t = v.type_name();
    if (t == "Namespace") return "jinja2.utils.Namespace object";
    if (t == "LoopContext") return "jinja2.runtime.LoopContext object";
    if (t == "Macro") return "jinja2.runtime.Macro object";
  }
  return v.type_name() + " object";
}

Value missing_attribute(const Value& obj, const std::string& name) {
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_type_repr(obj), name));
}

Value missing_element(const Value& obj, const Value& key) {
  if (key.is_string()) return missing_attribute(obj, key.str());
  return Value::undefined(fmt::format("{} has no element {}", object_type_repr(obj), repr(key)));
}

// jinja2.compiler.has_safe_repr: values the optimizer may embed as constants.
bool has_safe_repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::None:
    case Value::Kind::Bool:
    case Value::Kind::Int:
    case Value::Kind::Float:
    case Value::Kind::String: return true;
    case Value::Kind::Seq: {
      const SeqKind k = v.seq().kind;
      if (k != SeqKind::List && k != SeqKind::Tuple && k != SeqKind::Range) return false;
      for (const auto& it : v.seq().items)
        if (!has_safe_repr(it)) return false;
      return true;
    }
    case Value::Kind::Dict:
      for (const auto& [k, x] : v.dict().items)
        if (!has_safe_repr(k) || !has_safe_repr(x)) return false;
      return true;
    default: return false;
  }
}

bool subscriptable_seq(const Value& v) {
  if (!v.is_seq()) return false;
  const SeqKind k = v.seq().kind;
  return k == SeqKind::List || k == SeqKind::Tuple || k == SeqKind::Range;
}

}  // namespace

std::string Interp::render(const Body& body, const Value& context) {
  auto root = std::make_shared<Scope>(nullptr);
  install_globals(*root);
  if (context.is_dict())
    for (const auto& [k, v] : context.dict().items)
      if (k.is_string()) root->vars[k.str()] = v;
  std::string out;
  try {
    exec(body, root, out);
  } catch (...) {
    break_cycles();
    throw;
  }
  break_cycles();
  return out;
}

void Interp::register_closure(const ScopePtr& scope) { closures_.push_back(scope); }

// Macros hold their defining scope and that scope holds the macro: clear the scopes at the end of a render
// so that the shared pointers do not keep each other alive.
void Interp::break_cycles() {
  for (auto& w : closures_)
    if (auto s = w.lock()) s->vars.clear();
  closures_.clear();
  for (auto& w : tracked_)
    if (auto o = w.lock()) o->release_refs();
  tracked_.clear();
}

void Interp::tick(size_t n) {
  steps_ += n;
  if (steps_ > kMaxSteps)
    throw EvalError("the template exceeded its work budget (5 million steps); it is probably looping without end");
}

void Interp::enter_macro() {
  if (++macro_depth_ > kMaxMacroDepth) {
    --macro_depth_;
    throw EvalError("maximum recursion depth exceeded in macro calls");
  }
}

void Interp::append_output(std::string& out, const std::string& piece) {
  if (out.size() + piece.size() > kMaxOutputBytes) throw EvalError("template output too large (limit 32 MiB)");
  out += piece;
}

Flow Interp::exec(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const auto& s : body) {
    const Flow f = exec_stmt(*s, scope, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Flow Interp::exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out) {
  EvalDepth guard(depth_, kMaxEvalDepth);
  line_ = s.line;
  switch (s.kind) {
    case StmtKind::Text: append_output(out, s.text); return Flow::Normal;
    case StmtKind::Output: append_output(out, to_str(eval(*s.expr, scope, true))); return Flow::Normal;
    case StmtKind::If:
      for (const auto& [test, body] : s.branches)
        if (!test || eval(*test, scope).truthy()) return exec(body, scope, out);
      return Flow::Normal;
    case StmtKind::For: {
      std::vector<Value> items = iterate(eval(*s.expr, scope));
      if (s.cond) {
        std::vector<Value> kept;
        for (auto& it : items) {
          tick();
          auto sc = std::make_shared<Scope>(scope);
          assign(s.target, it, sc);
          if (eval(*s.cond, sc).truthy()) kept.push_back(std::move(it));
        }
        items = std::move(kept);
      }
      // jinja2 clears its "run the else block" flag at the end of each iteration body, so the else block
      // also runs when every iteration ended in break or continue.
      bool completed_iteration = false;
      if (!items.empty()) {
        auto loop = std::make_shared<LoopObj>(std::move(items));
        const Value loop_value = Value::object(loop);
        for (size_t i = 0; i < loop->size(); ++i) {
          tick();
          loop->set_index(i);
          auto sc = std::make_shared<Scope>(scope);
          sc->vars["loop"] = loop_value;
          assign(s.target, loop->item(i), sc);
          const Flow f = exec(s.body, sc, out);
          if (f == Flow::Break) break;
          if (f == Flow::Normal) completed_iteration = true;
        }
      }
      // The else block sits outside this loop: a break or continue there belongs to the enclosing loop.
      if (!completed_iteration && !s.else_body.empty()) return exec(s.else_body, std::make_shared<Scope>(scope), out);
      return Flow::Normal;
    }
    case StmtKind::Set: assign(s.target, eval(*s.expr, scope), scope); return Flow::Normal;
    // Set, filter and with blocks are inlined in the enclosing loop by jinja2: a break or continue inside
    // them leaves the loop body at once, dropping what the block captured.
    case StmtKind::SetBlock: {
      std::string captured;
      if (const Flow f = exec(s.body, std::make_shared<Scope>(scope), captured); f != Flow::Normal) return f;
      Value v(std::move(captured));
      if (s.expr) v = apply_filters(*s.expr, v, scope);
      assign(s.target, v, scope);
      return Flow::Normal;
    }
    case StmtKind::Macro:
      register_closure(scope);
      scope->vars[s.macro->name] = Value::object(std::make_shared<MacroObj>(s.macro.get(), scope));
      return Flow::Normal;
    case StmtKind::CallBlock: {
      register_closure(scope);
      const Expr& call_expr = *s.expr;
      Value callee = eval(*call_expr.a, scope);
      CallArgs args;
      collect_args(call_expr, scope, args);
      args.kwargs.emplace_back("caller", Value::object(std::make_shared<MacroObj>(s.macro.get(), scope)));
      append_output(out, to_str(call(callee, args)));
      return Flow::Normal;
    }
    case StmtKind::FilterBlock: {
      std::string captured;
      if (const Flow f = exec(s.body, std::make_shared<Scope>(scope), captured); f != Flow::Normal) return f;
      append_output(out, to_str(apply_filters(*s.expr, Value(std::move(captured)), scope)));
      return Flow::Normal;
    }
    case StmtKind::With: {
      std::vector<Value> values;
      for (const auto& v : s.with_values) values.push_back(eval(*v, scope));
      auto sc = std::make_shared<Scope>(scope);
      for (size_t i = 0; i < values.size(); ++i) assign(s.with_targets[i], values[i], sc);
      return exec(s.body, sc, out);
    }
    case StmtKind::Scope: return exec(s.body, std::make_shared<Scope>(scope), out);
    case StmtKind::Break: return Flow::Break;
    case StmtKind::Continue: return Flow::Continue;
  }
  return Flow::Normal;
}

void Interp::assign(const Target& t, const Value& v, const ScopePtr& scope) {
  switch (t.kind) {
    case Target::Kind::Name: scope->vars[t.name] = v; return;
    case Target::Kind::NamespaceAttr: {
      const Value* ns = scope->lookup(t.name);
      auto* obj = (ns && ns->is_object()) ? dynamic_cast<NamespaceObj*>(&ns->obj()) : nullptr;
      if (!obj) throw EvalError("cannot assign attribute on non-namespace object");
      obj->set_attr(t.attr, v);
      return;
    }
    case Target::Kind::Tuple: {
      std::vector<Value> items = iterate(v);
      if (items.size() < t.items.size())
        throw EvalError(
            fmt::format("not enough values to unpack (expected {}, got {})", t.items.size(), items.size()));
      if (items.size() > t.items.size())
        throw EvalError(fmt::format("too many values to unpack (expected {})", t.items.size()));
      for (size_t i = 0; i < items.size(); ++i) assign(t.items[i], items[i], scope);
      return;
    }
  }
}

// jinja2 folds a constant expression at compile time when the result has a safe repr (or when it is the
// whole of a {{ }}, whose value is stringified); otherwise the expression runs as compiled code. The two
// differ only for failing slices, so only constant expressions containing a slice take this path.
Value Interp::eval(const Expr& e, const ScopePtr& scope, bool output_top) {
  EvalDepth guard(depth_, kMaxEvalDepth);
  line_ = e.line;
  if (e.const_slice && const_mode_ == 0) {
    struct ConstMode {
      int& m;
      explicit ConstMode(int& mode) : m(mode) { ++m; }
      ~ConstMode() { --m; }
    };
    try {
      Value v;
      {
        ConstMode cm(const_mode_);
        v = eval_inner(e, scope);
      }
      if (output_top || has_safe_repr(v)) return v;
    } catch (const EvalError&) {  // jinja2: Impossible, keep the node for runtime
    } catch (const NotConstant&) {
    }
    line_ = e.line;
  }
  return eval_inner(e, scope);
}

Value Interp::eval_inner(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case ExprKind::Const: return e.constant;
    case ExprKind::Name: {
      if (const_mode_ > 0) throw NotConstant{};
      if (const Value* v = scope->lookup(e.name)) return *v;
      return Value::undefined(fmt::format("'{}' is undefined", e.name));
    }
    case ExprKind::List:
    case ExprKind::Tuple: {
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const auto& it : e.items) items.push_back(eval(*it, scope));
      return Value::seq(std::move(items), e.kind == ExprKind::List ? SeqKind::List : SeqKind::Tuple);
    }
    case ExprKind::Dict: {
      DictData d;
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        Value k = eval(*e.items[i], scope);
        d.set(k, eval(*e.items[i + 1], scope));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::GetAttr: return getattr(eval(*e.a, scope), e.name);
    case ExprKind::GetItem: {
      Value obj = eval(*e.a, scope);
      if (e.b->kind == ExprKind::Slice) {
        if (const_mode_ == 0 || obj.is_undefined()) return eval_slice(obj, *e.b, scope);
        try {
          return eval_slice(obj, *e.b, scope);
        } catch (const EvalError&) {  // compile-time folding goes through the sandbox getitem
          return Value::undefined(fmt::format("{} has no element slice", object_type_repr(obj)));
        }
      }
      return getitem(obj, eval(*e.b, scope));
    }
    case ExprKind::Slice: throw EvalError("a slice is only valid inside a subscript");
    case ExprKind::Call: {
      if (const_mode_ > 0) throw NotConstant{};
      Value callee = eval(*e.a, scope);
      if (callee.is_undefined()) fail_undefined(callee);
      CallArgs args;
      collect_args(e, scope, args);
      return call(callee, args);
    }
    case ExprKind::Filter: {
      if (const_mode_ > 0 && is_context_filter(e.name)) throw NotConstant{};
      Value subject = eval(*e.a, scope);
      CallArgs args;
      collect_args(e, scope, args);
      line_ = e.line;
      if (!e.filter) throw EvalError(fmt::format("No filter named '{}' found.", e.name));
      return e.filter(*this, subject, args);
    }
    case ExprKind::Test: {
      Value subject = eval(*e.a, scope);
      CallArgs args;
      collect_args(e, scope, args);
      line_ = e.line;
      if (!e.test) throw EvalError(fmt::format("No test named '{}' found.", e.name));
      return Value(e.test(*this, subject, args));
    }
    case ExprKind::Not: return Value(!eval(*e.a, scope).truthy());
    case ExprKind::Neg: return unary_op('-', eval(*e.a, scope));
    case ExprKind::Pos: return unary_op('+', eval(*e.a, scope));
    case ExprKind::Binary: {
      Value l = eval(*e.a, scope);
      Value r = eval(*e.b, scope);
      line_ = e.line;
      return binary_op(e.name, l, r);
    }
    case ExprKind::Concat: {
      std::string out;
      for (const auto& it : e.items) {
        out += to_str(eval(*it, scope));
        if (out.size() > kMaxStringBytes) throw EvalError("string too large");
      }
      return Value(std::move(out));
    }
    case ExprKind::Compare: return eval_compare(e, scope);
    case ExprKind::And: {
      Value l = eval(*e.a, scope);
      return l.truthy() ? eval(*e.b, scope) : l;
    }
    case ExprKind::Or: {
      Value l = eval(*e.a, scope);
      return l.truthy() ? l : eval(*e.b, scope);
    }
    case ExprKind::CondExpr:
      if (eval(*e.a, scope).truthy()) return eval(*e.b, scope);
      if (e.c) return eval(*e.c, scope);
      return Value::undefined(fmt::format(
          "the inline if-expression on line {} evaluated to false and no else section was defined.", e.line));
  }
  return Value();
}

Value Interp::eval_compare(const Expr& e, const ScopePtr& scope) {
  Value left = eval(*e.items[0], scope);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.items[i + 1], scope);
    const std::string& op = e.ops[i];
    line_ = e.line;
    bool r;
    if (op == "==") r = equals(left, right);
    else if (op == "!=") r = !equals(left, right);
    else if (op == "in") r = contains(right, left);
    else if (op == "notin") r = !contains(right, left);
    else {
      const int c = compare(left, right, op.c_str());
      r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!r) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

Value Interp::eval_slice(const Value& obj, const Expr& sl, const ScopePtr& scope) {
  auto bound = [&](const ExprPtr& x) { return x ? eval(*x, scope) : Value::none(); };
  Value start = bound(sl.a), stop = bound(sl.b), step_v = bound(sl.c);
  // jinja2 compiles x[a:b] to a plain Python subscript (no sandbox getitem), so failures are TypeErrors.
  if (obj.is_undefined()) fail_undefined(obj);
  const bool is_str = obj.is_string();
  if (obj.is_dict()) throw EvalError("unhashable type: 'slice'");
  if (!is_str && !subscriptable_seq(obj))
    throw EvalError(fmt::format("'{}' object is not subscriptable", obj.type_name()));
  for (const Value* b : {&start, &stop, &step_v})
    if (!b->is_none() && !b->is_int() && !b->is_bool())
      throw EvalError("slice indices must be integers or None or have an __index__ method");
  const int64_t step = step_v.is_none() ? 1 : step_v.as_int();
  if (step == 0) throw EvalError("slice step cannot be zero");
  std::u32string chars;
  if (is_str) chars = py::decode(obj.str());
  const int64_t len = is_str ? static_cast<int64_t>(chars.size()) : static_cast<int64_t>(obj.seq().items.size());
  // CPython's PySlice_AdjustIndices.
  auto adjust = [&](const Value& b, int64_t dflt) {
    if (b.is_none()) return dflt;
    int64_t x = b.as_int();
    if (x < 0) {
      x += len;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= len) {
      x = step < 0 ? len - 1 : len;
    }
    return x;
  };
  const int64_t lo = adjust(start, step < 0 ? len - 1 : 0);
  const int64_t hi = adjust(stop, step < 0 ? -1 : len);
  std::vector<int64_t> idx;
  for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) idx.push_back(i);
  if (is_str) {
    std::u32string out;
    for (int64_t i : idx) out.push_back(chars[static_cast<size_t>(i)]);
    return Value(py::encode(out));
  }
  std::vector<Value> out;
  for (int64_t i : idx) out.push_back(obj.seq().items[static_cast<size_t>(i)]);
  return Value::seq(std::move(out), obj.seq().kind == SeqKind::Tuple ? SeqKind::Tuple : SeqKind::List);
}

Value Interp::apply_filters(const Expr& f, const Value& subject, const ScopePtr& scope) {
  Value input = f.a ? apply_filters(*f.a, subject, scope) : subject;
  CallArgs args;
  collect_args(f, scope, args);
  line_ = f.line;
  if (!f.filter) throw EvalError(fmt::format("No filter named '{}' found.", f.name));
  return f.filter(*this, input, args);
}

void Interp::collect_args(const Expr& e, const ScopePtr& scope, CallArgs& args) {
  for (const auto& it : e.items) args.args.push_back(eval(*it, scope));
  for (const auto& [k, v] : e.kwargs) args.kwargs.emplace_back(k, eval(*v, scope));
  if (e.dyn_args) {
    for (auto& v : iterate(eval(*e.dyn_args, scope))) args.args.push_back(std::move(v));
  }
  if (e.dyn_kwargs) {
    Value d = eval(*e.dyn_kwargs, scope);
    if (!d.is_dict()) throw EvalError(fmt::format("argument after ** must be a mapping, not {}", d.type_name()));
    for (const auto& [k, v] : d.dict().items) {
      if (!k.is_string()) throw EvalError("keywords must be strings");
      args.kwargs.emplace_back(k.str(), v);
    }
  }
}

Value Interp::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) fail_undefined(callee);
  if (callee.is_object() && callee.obj().callable()) return callee.obj().call(*this, args);
  throw EvalError(fmt::format("'{}' object is not callable", callee.type_name()));
}

Value Interp::getattr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::Undefined: fail_undefined(obj);
    case Value::Kind::Dict: {
      if (auto m = get_method(obj, name)) return *m;
      if (const Value* v = obj.dict().find(Value(name))) return *v;
      return missing_attribute(obj, name);
    }
    case Value::Kind::String:
    case Value::Kind::Seq: {
      if (auto m = get_method(obj, name)) return *m;
      return missing_attribute(obj, name);
    }
    case Value::Kind::Object: return obj.obj().get_attr(name);
    default: return missing_attribute(obj, name);
  }
}

Value Interp::getitem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::Undefined: fail_undefined(obj);
    case Value::Kind::Dict: {
      const Value* v = nullptr;
      try {
        v = obj.dict().find(key);
      } catch (const EvalError&) {  // unhashable key: jinja2 swallows the TypeError
      }
      if (v) return *v;
      if (key.is_string())
        if (auto m = get_method(obj, key.str())) return *m;
      return missing_element(obj, key);
    }
    case Value::Kind::String:
    case Value::Kind::Seq: {
      if (key.is_int() || key.is_bool()) {
        if (obj.is_seq() && !subscriptable_seq(obj)) return missing_element(obj, key);
        int64_t i = key.as_int();
        if (obj.is_string() && py::is_ascii(obj.str())) {
          const int64_t n = static_cast<int64_t>(obj.str().size());
          if (i < 0) i += n;
          if (i < 0 || i >= n) return missing_element(obj, key);
          return Value(std::string(1, obj.str()[static_cast<size_t>(i)]));
        }
        if (obj.is_string()) {
          std::u32string u = py::decode(obj.str());
          const int64_t n = static_cast<int64_t>(u.size());
          if (i < 0) i += n;
          if (i < 0 || i >= n) return missing_element(obj, key);
          return Value(py::encode(std::u32string_view(&u[static_cast<size_t>(i)], 1)));
        }
        const auto& items = obj.seq().items;
        const int64_t n = static_cast<int64_t>(items.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return missing_element(obj, key);
        return items[static_cast<size_t>(i)];
      }
      if (key.is_string())
        if (auto m = get_method(obj, key.str())) return *m;
      return missing_element(obj, key);
    }
    case Value::Kind::Object:
      if (key.is_string()) return obj.obj().get_attr(key.str());
      return missing_element(obj, key);
    default: return missing_element(obj, key);
  }
}

}  // namespace moeserve::tpl

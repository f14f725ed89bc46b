// Tree-walking evaluator with jinja2's scoping rules.
//
// Scopes: the render context and globals form the root scope; {% set %} writes to the innermost scope;
// every for-loop iteration, macro call, call/filter/set block and {% with %} gets a fresh child scope, so
// assignments inside a loop body never leak out of it (which is why templates use namespace()), while {% if %}
// shares its enclosing scope. Macros close over the scope they were defined in and see its current values.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "template/ast.h"

namespace moeserve::tpl {

struct Scope {
  explicit Scope(std::shared_ptr<Scope> p) : parent(std::move(p)) {}
  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { Normal, Break, Continue };

class Interp {
 public:
  // `now`: the clock strftime_now reads; unset means the local time at the call.
  explicit Interp(std::optional<std::tm> now) : now_(now) {}

  std::string render(const Body& body, const Value& context);

  Flow exec(const Body& body, const ScopePtr& scope, std::string& out);
  // `output_top`: e is the whole expression of a {{ }} (matters for constant folding, see eval).
  Value eval(const Expr& e, const ScopePtr& scope, bool output_top = false);
  Value call(const Value& callee, CallArgs& args);

  // Sandboxed obj.name and obj[key], with jinja2's fallbacks between the two.
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);

  // Counts work (loop iterations, macro calls, filter items) against a budget so that no template can hang.
  void tick(size_t n = 1);
  int line() const { return line_; }
  const std::optional<std::tm>& now() const { return now_; }

  // Macro call bookkeeping for the recursion limit.
  void enter_macro();
  void leave_macro() { --macro_depth_; }
  // Objects that can form reference cycles; released when the render ends.
  void track(const std::shared_ptr<Object>& o) { tracked_.push_back(o); }

  static constexpr size_t kMaxSteps = 5'000'000;
  static constexpr int kMaxMacroDepth = 200;
  static constexpr int kMaxEvalDepth = 2500;
  static constexpr size_t kMaxOutputBytes = kMaxStringBytes;

 private:
  Flow exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out);
  void assign(const Target& t, const Value& v, const ScopePtr& scope);
  Value eval_inner(const Expr& e, const ScopePtr& scope);
  Value eval_compare(const Expr& e, const ScopePtr& scope);
  Value eval_slice(const Value& obj, const Expr& slice, const ScopePtr& scope);
  Value apply_filters(const Expr& chain, const Value& subject, const ScopePtr& scope);
  void collect_args(const Expr& e, const ScopePtr& scope, CallArgs& args);
  void append_output(std::string& out, const std::string& piece);
  void register_closure(const ScopePtr& scope);
  void break_cycles();

  std::optional<std::tm> now_;
  size_t steps_ = 0;
  int depth_ = 0;
  int macro_depth_ = 0;
  int line_ = 0;
  int const_mode_ = 0;  // > 0 while evaluating an expression the way jinja2's optimizer folds it
  std::vector<std::weak_ptr<Scope>> closures_;  // scopes that macros captured (see break_cycles)
  std::vector<std::weak_ptr<Object>> tracked_;
};

}  // namespace moeserve::tpl

#include "template/parser.h"

#include <set>

#include "core/error.h"
#include "template/filters.h"
#include "template/lexer.h"

namespace moeserve::tpl {
namespace {

// Marks Expr::const_slice bottom-up. "Constant" is what jinja2's optimizer may be able to fold (nodes.py
// as_const): literals and operators over them, filters and tests except those that need the render context.
// as_const is lazy in `x if c else y`, `and` and `or`, so an untaken branch may be non-constant; whether
// folding really succeeds is settled when the expression is evaluated (Interp::eval).
struct ConstInfo {
  bool is_const = true;
  bool has_slice = false;
};

[[noreturn]] void fail_at(int line, const std::string& msg) {
  throw UserError(fmt::format("chat template syntax error at line {}: {}", line, msg));
}

// Post-parse pass over each expression: marks Expr::const_slice, and rejects unknown filters and tests,
// which jinja2 rejects at compile time except in "soft" places (inside {% if %} and x-if-c-else-y), where
// the error waits until the filter actually runs.
ConstInfo check_expr(Expr* e, bool soft) {
  if (!e) return {};
  if (e->kind == ExprKind::CondExpr) soft = true;
  if (!soft && ((e->kind == ExprKind::Filter && !e->filter) || (e->kind == ExprKind::Test && !e->test)))
    fail_at(e->line, fmt::format("No {} named '{}'.", e->kind == ExprKind::Filter ? "filter" : "test", e->name));
  ConstInfo info;
  if (e->kind == ExprKind::CondExpr) {
    const ConstInfo test = check_expr(e->a.get(), soft), then = check_expr(e->b.get(), soft),
                    other = check_expr(e->c.get(), soft);
    info.is_const = test.is_const && (then.is_const || (e->c && other.is_const));
    info.has_slice = test.has_slice || then.has_slice || other.has_slice;
    e->const_slice = info.is_const && info.has_slice;
    return info;
  }
  if (e->kind == ExprKind::And || e->kind == ExprKind::Or) {
    const ConstInfo left = check_expr(e->a.get(), soft), right = check_expr(e->b.get(), soft);
    info.is_const = left.is_const;
    info.has_slice = left.has_slice || right.has_slice;
    e->const_slice = info.is_const && info.has_slice;
    return info;
  }
  auto merge = [&](Expr* child) {
    const ConstInfo c = check_expr(child, soft);
    info.is_const = info.is_const && c.is_const;
    info.has_slice = info.has_slice || c.has_slice;
  };
  merge(e->a.get());
  merge(e->b.get());
  merge(e->c.get());
  merge(e->dyn_args.get());
  merge(e->dyn_kwargs.get());
  for (auto& x : e->items) merge(x.get());
  for (auto& kv : e->kwargs) merge(kv.second.get());
  if (e->kind == ExprKind::Name || e->kind == ExprKind::Call) info.is_const = false;
  if (e->kind == ExprKind::Filter && (!e->a || !e->filter)) info.is_const = false;  // block chains, unknown
  if (e->kind == ExprKind::Test && !e->test) info.is_const = false;
  if (e->kind == ExprKind::Filter && is_context_filter(e->name)) info.is_const = false;
  if (e->kind == ExprKind::GetItem && e->b && e->b->kind == ExprKind::Slice) info.has_slice = true;
  e->const_slice = info.is_const && info.has_slice;
  return info;
}

// Statements: soft follows jinja2's frames. {% if %} makes its tests and bodies soft; statements with a
// frame of their own (for bodies, macros, call/filter/set blocks, with bodies) start hard again, while
// expressions evaluated in the enclosing frame (a for's iterable, a set's value) keep its softness.
void check_body(Body& body, bool soft);

void check_stmt(Stmt& s, bool soft) {
  switch (s.kind) {
    case StmtKind::If:
      for (auto& [test, body] : s.branches) {
        check_expr(test.get(), true);
        check_body(body, true);
      }
      return;
    case StmtKind::For:
      check_expr(s.expr.get(), soft);
      check_expr(s.cond.get(), false);
      check_body(s.body, false);
      check_body(s.else_body, false);
      return;
    case StmtKind::Output:
    case StmtKind::Set: check_expr(s.expr.get(), soft); return;
    case StmtKind::CallBlock: check_expr(s.expr.get(), soft); break;
    case StmtKind::With:
      for (auto& v : s.with_values) check_expr(v.get(), soft);
      break;
    default: check_expr(s.expr.get(), false); break;
  }
  check_body(s.body, false);
  check_body(s.else_body, false);
  if (s.macro) {
    for (auto& d : s.macro->defaults) check_expr(d.get(), false);
    check_body(s.macro->body, false);
  }
}

void check_body(Body& body, bool soft) {
  for (auto& s : body) check_stmt(*s, soft);
}

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse_all() {
    Body body = subparse({});
    if (cur().type != TokType::Eof) fail(cur().line, "unexpected tokens after the end of the template");
    return body;
  }

 private:
  // ---- token stream -------------------------------------------------------------------------------------
  const Token& cur() const { return t_[pos_]; }
  const Token& look() const { return t_[std::min(pos_ + 1, t_.size() - 1)]; }
  const Token& next() {
    const Token& tok = t_[pos_];
    if (pos_ + 1 < t_.size()) ++pos_;
    return tok;
  }
  bool is_op(const char* op) const { return cur().type == TokType::Op && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == TokType::Name && cur().value == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }

  [[noreturn]] void fail(int line, const std::string& msg) const {
    throw UserError(fmt::format("chat template syntax error at line {}: {}", line, msg));
  }

  std::string describe_cur() const {
    const Token& tok = cur();
    if (tok.type == TokType::Name || tok.type == TokType::Op) return tok.value;
    return describe(tok.type);
  }

  void expect_op(const char* op) {
    if (!skip_op(op)) fail(cur().line, fmt::format("expected token '{}', got '{}'", op, describe_cur()));
  }
  std::string expect_name() {
    if (cur().type != TokType::Name) fail(cur().line, fmt::format("expected name, got '{}'", describe_cur()));
    return next().value;
  }
  void expect(TokType type) {
    if (cur().type != type)
      fail(cur().line, fmt::format("expected '{}', got '{}'", describe(type), describe_cur()));
    next();
  }

  struct DepthGuard {
    DepthGuard(Parser& p, int line) : p_(p) {
      if (++p_.depth_ > kMaxParseDepth) p_.fail(line, "template nesting too deep");
    }
    ~DepthGuard() { --p_.depth_; }
    Parser& p_;
  };

  static ExprPtr node(ExprKind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // ---- statements ---------------------------------------------------------------------------------------
  // Parses until a block tag whose name is in `ends` (left unconsumed) or the end of the template.
  Body subparse(const std::vector<std::string>& ends) {
    Body body;
    while (cur().type != TokType::Eof) {
      const Token& tok = cur();
      if (tok.type == TokType::Data) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Text;
        s->line = tok.line;
        s->text = tok.value;
        body.push_back(std::move(s));
        next();
      } else if (tok.type == TokType::VarBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Output;
        s->line = tok.line;
        s->expr = parse_tuple(true, {}, false);
        expect(TokType::VarEnd);
        body.push_back(std::move(s));
      } else if (tok.type == TokType::BlockBegin) {
        next();
        if (cur().type == TokType::Name)
          for (const auto& e : ends)
            if (cur().value == e) return body;
        body.push_back(parse_statement());
        expect(TokType::BlockEnd);
      } else {
        fail(tok.line, fmt::format("unexpected '{}'", describe_cur()));
      }
    }
    if (!ends.empty()) {
      std::string want;
      for (size_t i = 0; i < ends.size(); ++i) want += (i ? " or '" : "'") + ends[i] + "'";
      fail(cur().line, fmt::format("Unexpected end of template. Jinja was looking for the following tags: {}. "
                                   "The innermost block that needs to be closed is '{}'.",
                                   want, tag_stack_.empty() ? "?" : tag_stack_.back()));
    }
    return body;
  }

  // "{% ... %}" body then the closing tag named by `ends`.
  Body parse_statements(const std::vector<std::string>& ends, bool drop_needle) {
    skip_op(":");
    expect(TokType::BlockEnd);
    Body body = subparse(ends);
    if (drop_needle) next();
    return body;
  }

  StmtPtr parse_statement() {
    const Token& tok = cur();
    if (tok.type != TokType::Name) fail(tok.line, "tag name expected");
    DepthGuard g(*this, tok.line);
    const std::string tag = tok.value;
    tag_stack_.push_back(tag);
    StmtPtr s;
    if (tag == "for") s = parse_for();
    else if (tag == "if") s = parse_if();
    else if (tag == "set") s = parse_set();
    else if (tag == "macro") s = parse_macro();
    else if (tag == "call") s = parse_call_block();
    else if (tag == "filter") s = parse_filter_block();
    else if (tag == "with") s = parse_with();
    else if (tag == "print") {
      s = std::make_unique<Stmt>();
      s->kind = StmtKind::Output;
      s->line = next().line;
      s->expr = parse_tuple(true, {}, false);
    } else if (tag == "generation") {  // Hugging Face's AssistantTracker tag: renders its body unchanged
      s = std::make_unique<Stmt>();
      s->kind = StmtKind::Scope;
      s->line = next().line;
      const int saved_loops = loop_depth_;  // HF compiles it to a call block: a function of its own
      loop_depth_ = 0;
      s->body = parse_statements({"endgeneration"}, true);
      loop_depth_ = saved_loops;
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail(tok.line, fmt::format("'{}' outside of a loop", tag));
      s = std::make_unique<Stmt>();
      s->kind = tag == "break" ? StmtKind::Break : StmtKind::Continue;
      s->line = next().line;
    } else if (tag == "block" || tag == "extends" || tag == "include" || tag == "import" || tag == "from" ||
               tag == "autoescape") {
      fail(tok.line, fmt::format("the '{}' tag is not supported in chat templates", tag));
    } else {
      fail(tok.line, fmt::format("Encountered unknown tag '{}'.", tag));
    }
    tag_stack_.pop_back();
    return s;
  }

  StmtPtr parse_for() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::For;
    s->line = next().line;
    s->target = parse_assign_target(true, false, {"in"});
    if (!skip_name("in")) fail(cur().line, fmt::format("expected 'in', got '{}'", describe_cur()));
    s->expr = parse_tuple(false, {"recursive"}, false);
    if (skip_name("if")) s->cond = parse_expression(true);
    if (is_name("recursive")) fail(cur().line, "recursive loops are not supported in chat templates");
    ++loop_depth_;
    s->body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    if (next().value == "else") s->else_body = parse_statements({"endfor"}, true);
    return s;
  }

  StmtPtr parse_if() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::If;
    s->line = next().line;
    while (true) {
      ExprPtr test = parse_tuple(false, {}, false);
      Body body = parse_statements({"elif", "else", "endif"}, false);
      s->branches.emplace_back(std::move(test), std::move(body));
      const std::string tag = next().value;
      if (tag == "elif") continue;
      if (tag == "else") s->branches.emplace_back(nullptr, parse_statements({"endif"}, true));
      break;
    }
    return s;
  }

  StmtPtr parse_set() {
    auto s = std::make_unique<Stmt>();
    s->line = next().line;
    s->target = parse_assign_target(true, true, {});
    if (skip_op("=")) {
      s->kind = StmtKind::Set;
      s->expr = parse_tuple(true, {}, false);
      return s;
    }
    s->kind = StmtKind::SetBlock;
    if (is_op("|")) s->expr = parse_filter(nullptr, false);
    s->body = parse_statements({"endset"}, true);
    return s;
  }

  // Parameter list "(a, b=default)" of a macro or call block.
  void parse_signature(MacroDef& m) {
    expect_op("(");
    while (!is_op(")")) {
      if (!m.params.empty()) expect_op(",");
      const int line = cur().line;
      m.params.push_back(expect_name());
      if (skip_op("=")) {
        m.defaults.push_back(parse_expression(true));
      } else if (!m.defaults.empty()) {
        fail(line, "non-default argument follows default argument");
      }
    }
    expect_op(")");
  }

  // Macro bodies are separate functions in jinja2: loop controls do not cross them, and the body's use of
  // varargs/kwargs/caller decides which extra arguments the macro accepts.
  void parse_macro_body(MacroDef& m, const char* end) {
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    used_names_.emplace_back();
    m.body = parse_statements({end}, true);
    const auto& used = used_names_.back();
    m.uses_varargs = used.count("varargs") > 0;
    m.uses_kwargs = used.count("kwargs") > 0;
    m.uses_caller = used.count("caller") > 0;
    used_names_.pop_back();
    loop_depth_ = saved_loops;
  }

  StmtPtr parse_macro() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::Macro;
    s->line = next().line;
    s->macro = std::make_unique<MacroDef>();
    s->macro->line = s->line;
    s->macro->name = expect_name();
    parse_signature(*s->macro);
    parse_macro_body(*s->macro, "endmacro");
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::CallBlock;
    s->line = next().line;
    s->macro = std::make_unique<MacroDef>();
    s->macro->name = "caller";
    s->macro->line = s->line;
    if (is_op("(")) parse_signature(*s->macro);
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::Call) fail(s->line, "expected call");
    parse_macro_body(*s->macro, "endcall");
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::FilterBlock;
    s->line = next().line;
    s->expr = parse_filter(nullptr, true);
    s->body = parse_statements({"endfilter"}, true);
    return s;
  }

  StmtPtr parse_with() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::With;
    s->line = next().line;
    while (cur().type != TokType::BlockEnd) {
      if (!s->with_targets.empty()) expect_op(",");
      s->with_targets.push_back(parse_assign_target(true, false, {}));
      expect_op("=");
      s->with_values.push_back(parse_expression(true));
    }
    s->body = parse_statements({"endwith"}, true);
    return s;
  }

  // A name, "ns.attr" (set only), or a tuple of names, as the left side of set/for/with.
  Target parse_assign_target(bool with_tuple, bool with_namespace, const std::vector<std::string>& extra_end) {
    Target t;
    t.line = cur().line;
    if (with_namespace && cur().type == TokType::Name && look().type == TokType::Op && look().value == ".") {
      t.kind = Target::Kind::NamespaceAttr;
      t.name = next().value;
      next();
      t.attr = expect_name();
      return t;
    }
    std::vector<Target> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(parse_target_primary());
      if (!is_op(",")) break;
      is_tuple = true;
    }
    if (items.empty()) fail(t.line, "expected an assignment target");
    if (!with_tuple && is_tuple) fail(t.line, "can't assign to 'tuple' here");
    if (!is_tuple) return std::move(items[0]);
    t.kind = Target::Kind::Tuple;
    t.items = std::move(items);
    return t;
  }

  Target parse_target_primary() {
    Target t;
    t.line = cur().line;
    if (skip_op("(")) {
      t = parse_assign_target(true, false, {});
      expect_op(")");
      return t;
    }
    if (cur().type != TokType::Name) fail(cur().line, fmt::format("can't assign to '{}'", describe_cur()));
    const std::string& n = cur().value;
    if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None")
      fail(cur().line, "can't assign to 'const'");
    t.name = next().value;
    return t;
  }

  // ---- expressions --------------------------------------------------------------------------------------
  bool is_tuple_end(const std::vector<std::string>& extra_end) const {
    const Token& tok = cur();
    if (tok.type == TokType::VarEnd || tok.type == TokType::BlockEnd || (tok.type == TokType::Op && tok.value == ")"))
      return true;
    if (tok.type == TokType::Name)
      for (const auto& e : extra_end)
        if (tok.value == e) return true;
    return false;
  }

  ExprPtr parse_tuple(bool with_condexpr, const std::vector<std::string>& extra_end, bool explicit_parens) {
    const int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(parse_expression(with_condexpr));
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail(line, fmt::format("Expected an expression, got '{}'", describe_cur()));
    }
    auto e = node(ExprKind::Tuple, line);
    e->items = std::move(args);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard g(*this, cur().line);
    if (!with_condexpr) return parse_or();
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      const int line = next().line;
      auto e = node(ExprKind::CondExpr, line);
      e->a = parse_or();
      e->b = std::move(expr);
      if (skip_name("else")) e->c = parse_expression(true);
      expr = std::move(e);
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      auto e = node(ExprKind::Or, next().line);
      e->a = std::move(left);
      e->b = parse_and();
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      auto e = node(ExprKind::And, next().line);
      e->a = std::move(left);
      e->b = parse_not();
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard g(*this, cur().line);
      auto e = node(ExprKind::Not, next().line);
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    auto e = node(ExprKind::Compare, line);
    while (true) {
      static const char* kOps[] = {"==", "!=", "<", "<=", ">", ">="};
      bool matched = false;
      for (const char* op : kOps) {
        if (is_op(op)) {
          next();
          e->ops.push_back(op);
          matched = true;
          break;
        }
      }
      if (!matched) {
        if (skip_name("in")) {
          e->ops.push_back("in");
        } else if (is_name("not") && look().type == TokType::Name && look().value == "in") {
          next();
          next();
          e->ops.push_back("notin");
        } else {
          break;
        }
      }
      e->items.push_back(parse_math1());
    }
    if (e->ops.empty()) return first;
    e->items.insert(e->items.begin(), std::move(first));
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
    auto e = node(ExprKind::Binary, line);
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      std::string o = op.value;
      left = binary(o, std::move(left), parse_concat(), op.line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    const int line = cur().line;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto e = node(ExprKind::Concat, line);
    e->items.push_back(std::move(first));
    while (skip_op("~")) e->items.push_back(parse_math2());
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      std::string o = op.value;
      left = binary(o, std::move(left), parse_pow(), op.line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const int line = next().line;
      left = binary("**", std::move(left), parse_unary(true), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(*this, cur().line);
    ExprPtr n;
    if (is_op("-") || is_op("+")) {
      const Token& op = next();
      n = node(op.value == "-" ? ExprKind::Neg : ExprKind::Pos, op.line);
      n->a = parse_unary(false);
    } else {
      n = parse_primary();
    }
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filter_expr(std::move(n));
    return n;
  }

  ExprPtr parse_primary() {
    const Token& tok = cur();
    ExprPtr e;
    if (tok.type == TokType::Name) {
      const std::string& v = tok.value;
      if (v == "true" || v == "True" || v == "false" || v == "False") {
        e = node(ExprKind::Const, tok.line);
        e->constant = Value(v == "true" || v == "True");
      } else if (v == "none" || v == "None") {
        e = node(ExprKind::Const, tok.line);
        e->constant = Value::none();
      } else {
        e = node(ExprKind::Name, tok.line);
        e->name = v;
        for (auto& used : used_names_) used.insert(v);
      }
      next();
    } else if (tok.type == TokType::String) {
      e = node(ExprKind::Const, tok.line);
      std::string buf;
      while (cur().type == TokType::String) buf += next().value;  // adjacent literals concatenate
      e->constant = Value(std::move(buf));
    } else if (tok.type == TokType::Int || tok.type == TokType::Float) {
      e = node(ExprKind::Const, tok.line);
      e->constant = tok.type == TokType::Int ? Value(tok.ival) : Value(tok.fval);
      next();
    } else if (is_op("(")) {
      next();
      e = parse_tuple(true, {}, true);
      expect_op(")");
    } else if (is_op("[")) {
      e = node(ExprKind::List, next().line);
      while (!is_op("]")) {
        if (!e->items.empty()) expect_op(",");
        if (is_op("]")) break;
        e->items.push_back(parse_expression(true));
      }
      expect_op("]");
    } else if (is_op("{")) {
      e = node(ExprKind::Dict, next().line);
      while (!is_op("}")) {
        if (!e->items.empty()) expect_op(",");
        if (is_op("}")) break;
        e->items.push_back(parse_expression(true));
        expect_op(":");
        e->items.push_back(parse_expression(true));
      }
      expect_op("}");
    } else {
      fail(tok.line, fmt::format("unexpected '{}'", describe_cur()));
    }
    return e;
  }

  ExprPtr parse_postfix(ExprPtr n) {
    while (true) {
      if (is_op(".") || is_op("[")) n = parse_subscript(std::move(n));
      else if (is_op("(")) n = parse_call(std::move(n));
      else break;
    }
    return n;
  }

  ExprPtr parse_filter_expr(ExprPtr n) {
    while (true) {
      if (is_op("|")) n = parse_filter(std::move(n), false);
      else if (is_name("is")) n = parse_test(std::move(n));
      else if (is_op("(")) n = parse_call(std::move(n));
      else break;
    }
    return n;
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const Token& tok = next();
    if (tok.value == ".") {
      const Token& attr = cur();
      if (attr.type == TokType::Name) {
        auto e = node(ExprKind::GetAttr, tok.line);
        e->a = std::move(obj);
        e->name = next().value;
        return e;
      }
      if (attr.type != TokType::Int) fail(attr.line, "expected name or number");
      auto e = node(ExprKind::GetItem, tok.line);
      e->a = std::move(obj);
      e->b = node(ExprKind::Const, attr.line);
      e->b->constant = Value(attr.ival);
      next();
      return e;
    }
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = node(ExprKind::GetItem, tok.line);
    e->a = std::move(obj);
    if (args.size() == 1) {
      e->b = std::move(args[0]);
    } else {
      e->b = node(ExprKind::Tuple, tok.line);
      e->b->items = std::move(args);
    }
    return e;
  }

  ExprPtr parse_subscribed() {
    const int line = cur().line;
    ExprPtr start;
    if (!skip_op(":")) {
      ExprPtr n = parse_expression(true);
      if (!is_op(":")) return n;
      next();
      start = std::move(n);
    }
    auto e = node(ExprKind::Slice, line);
    e->a = std::move(start);
    auto end_of_slot = [&] { return is_op("]") || is_op(",") || is_op(":"); };
    if (!end_of_slot()) e->b = parse_expression(true);
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(",")) e->c = parse_expression(true);
    }
    return e;
  }

  void parse_call_args(Expr& e) {
    const int line = cur().line;
    expect_op("(");
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) fail(line, "invalid syntax for function call expression");
    };
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*")) {
        ensure(!e.dyn_args && !e.dyn_kwargs);
        next();
        e.dyn_args = parse_expression(true);
      } else if (is_op("**")) {
        ensure(!e.dyn_kwargs);
        next();
        e.dyn_kwargs = parse_expression(true);
      } else if (cur().type == TokType::Name && look().type == TokType::Op && look().value == "=") {
        ensure(!e.dyn_kwargs);
        std::string key = next().value;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        ensure(!e.dyn_args && !e.dyn_kwargs && e.kwargs.empty());
        e.items.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(ExprKind::Call, cur().line);
    e->a = std::move(callee);
    parse_call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    return name;
  }

  ExprPtr parse_filter(ExprPtr subject, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      const int line = cur().line;
      auto e = node(ExprKind::Filter, line);
      e->name = dotted_name();
      e->filter = find_filter(e->name);  // unknown: checked in check_tree, which knows the context
      if (is_op("(")) parse_call_args(*e);
      e->a = std::move(subject);
      subject = std::move(e);
    }
    return subject;
  }

  ExprPtr parse_test(ExprPtr subject) {
    const int line = next().line;  // "is"
    const bool negated = skip_name("not");
    auto e = node(ExprKind::Test, line);
    e->name = dotted_name();
    e->test = find_test(e->name);  // unknown: checked in check_tree
    const Token& tok = cur();
    const bool arg_start = tok.type == TokType::Name || tok.type == TokType::String || tok.type == TokType::Int ||
                           tok.type == TokType::Float || is_op("(") || is_op("[") || is_op("{");
    if (is_op("(")) {
      parse_call_args(*e);
    } else if (arg_start && !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail(tok.line, "You cannot chain multiple tests with is");
      e->items.push_back(parse_postfix(parse_primary()));
    }
    e->a = std::move(subject);
    if (!negated) return e;
    auto n = node(ExprKind::Not, line);
    n->a = std::move(e);
    return n;
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<std::string> tag_stack_;
  std::vector<std::set<std::string>> used_names_;
};

}  // namespace

Body parse_template(const std::string& source) {
  Body body = Parser(tokenize(source)).parse_all();
  check_body(body, false);
  return body;
}

}  // namespace moeserve::tpl

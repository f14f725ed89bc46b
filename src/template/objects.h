// Callable and attribute-bearing objects: macros, namespace(), the loop variable, bound methods and the
// globals Hugging Face's environment provides (range, namespace, dict, cycler, joiner, raise_exception,
// strftime_now).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "template/ast.h"
#include "template/interp.h"
#include "template/jinja.h"

namespace moeserve::tpl {

// Binds positional/keyword arguments the way a Python signature would, for builtins, filters and methods.
class ArgReader {
 public:
  ArgReader(CallArgs& args, std::string fn) : args_(args), fn_(std::move(fn)), used_(args.kwargs.size(), false) {}
  // The argument at position `pos` (counting after the implicit subject) or keyword `name`.
  Value get(size_t pos, const char* name, Value dflt = Value());
  bool has(size_t pos, const char* name) const;
  // Rejects arguments nobody asked for, like Python's "unexpected keyword argument".
  void done();

 private:
  CallArgs& args_;
  std::string fn_;
  std::vector<bool> used_;
  size_t max_pos_ = 0;
};

class MacroObj : public Object {
 public:
  MacroObj(const MacroDef* def, ScopePtr closure) : def_(def), closure_(std::move(closure)) {}
  std::string type_name() const override { return "Macro"; }
  std::string repr() const override { return "<Macro '" + def_->name + "'>"; }
  Value get_attr(const std::string& name) const override;
  bool callable() const override { return true; }
  Value call(Interp& in, CallArgs& args) override;

 private:
  const MacroDef* def_;
  ScopePtr closure_;
};

class NamespaceObj : public Object {
 public:
  std::string type_name() const override { return "Namespace"; }
  std::string repr() const override;
  Value get_attr(const std::string& name) const override;
  void set_attr(const std::string& name, Value v) { attrs_.set(Value(name), std::move(v)); }
  DictData& attrs() { return attrs_; }
  void release_refs() override { attrs_.clear(); }

 private:
  DictData attrs_;
};

class LoopObj : public Object {
 public:
  explicit LoopObj(std::vector<Value> items) : items_(std::move(items)) {}
  std::string type_name() const override { return "LoopContext"; }
  std::string repr() const override;
  Value get_attr(const std::string& name) const override;
  void set_index(size_t i) { idx_ = i; }
  size_t size() const { return items_.size(); }
  const Value& item(size_t i) const { return items_[i]; }
  // loop.changed(*values): state lives in the loop object, as in jinja2.
  bool changed(const Value& v);

 private:
  std::vector<Value> items_;
  size_t idx_ = 0;
  bool has_last_ = false;
  Value last_changed_;
};

// A Python builtin or a bound method: a name plus a C++ function.
class NativeFn : public Object {
 public:
  using Fn = std::function<Value(Interp&, CallArgs&)>;
  NativeFn(std::string repr, Fn fn) : repr_(std::move(repr)), fn_(std::move(fn)) {}
  std::string type_name() const override { return "builtin_function_or_method"; }
  std::string repr() const override { return repr_; }
  bool callable() const override { return true; }
  Value call(Interp& in, CallArgs& args) override { return fn_(in, args); }

 private:
  std::string repr_;
  Fn fn_;
};

void install_globals(Scope& root);

// Methods of str, dict and list reachable through the sandbox (methods.cpp): nullopt when `name` is not a
// method of `self`; mutating methods come back as an undefined value that raises jinja2's SecurityError
// message when called, as in ImmutableSandboxedEnvironment.
std::optional<Value> get_method(const Value& self, const std::string& name);

}  // namespace moeserve::tpl

// The value model of the template engine: Python's objects as jinja2 sees them.
//
// JSON alone cannot carry what templates need: jinja2's Undefined (printable, falsy, but raising when used
// in arithmetic), tuples (printed as (a, b)), dict views, one-shot generators returned by map/select, and
// callables (macros, namespace(), loop.cycle, bound str methods). Value is a small tagged handle; strings,
// lists and dicts are shared and immutable (the sandbox forbids mutating them), so copies are cheap.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::tpl {

// Raised while rendering; the message is what Python would print for the same failure. Template::render
// turns it into a UserError that also names the template line.
class EvalError : public std::runtime_error {
 public:
  explicit EvalError(const std::string& msg) : std::runtime_error(msg) {}
};

class Value;
class Object;
class Interp;

// How a sequence prints and behaves: a Python list, tuple, dict view, range or one-shot iterator.
enum class SeqKind : uint8_t { List, Tuple, DictKeys, DictValues, DictItems, Range, Generator, Reversed };

struct SeqData;
struct DictData;

class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, Seq, Dict, Object };

  Value() = default;  // undefined, with no name
  Value(bool b) : kind_(Kind::Bool) { u_.b = b; }  // NOLINT: implicit like Python literals
  Value(int v) : kind_(Kind::Int) { u_.i = v; }
  Value(int64_t v) : kind_(Kind::Int) { u_.i = v; }
  Value(double v) : kind_(Kind::Float) { u_.f = v; }
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}

  // An undefined value that raises `message` when used in an operation jinja2's Undefined refuses.
  static Value undefined(std::string message);
  static Value none();
  static Value seq(std::vector<Value> items, SeqKind kind = SeqKind::List);
  static Value tuple(std::vector<Value> items) { return seq(std::move(items), SeqKind::Tuple); }
  static Value dict(DictData d);
  static Value object(std::shared_ptr<Object> o);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_seq() const { return kind_ == Kind::Seq; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_object() const { return kind_ == Kind::Object; }

  bool as_bool() const { return u_.b; }
  int64_t as_int() const { return kind_ == Kind::Bool ? (u_.b ? 1 : 0) : u_.i; }  // bool is an int in Python
  double as_double() const { return kind_ == Kind::Float ? u_.f : static_cast<double>(as_int()); }
  const std::string& str() const { return *static_cast<const std::string*>(p_.get()); }
  const SeqData& seq() const { return *static_cast<const SeqData*>(p_.get()); }
  const DictData& dict() const { return *static_cast<const DictData*>(p_.get()); }
  Object& obj() const { return *static_cast<Object*>(p_.get()); }
  std::shared_ptr<Object> obj_ptr() const { return std::static_pointer_cast<Object>(p_); }
  // What using this undefined value raises (e.g. "'x' is undefined").
  std::string undefined_message() const;
  bool same_object(const Value& o) const { return p_ == o.p_; }

  bool truthy() const;
  std::string type_name() const;  // Python's type(x).__name__

 private:
  Kind kind_ = Kind::Undefined;
  union {
    bool b;
    int64_t i;
    double f;
  } u_{};
  std::shared_ptr<void> p_;  // string, SeqData, DictData, Object, or the undefined message
};

struct SeqData {
  std::vector<Value> items;
  SeqKind kind = SeqKind::List;
  int64_t range_start = 0, range_stop = 0, range_step = 1;  // for repr of range objects
  mutable bool consumed = false;                            // generators iterate once, like Python's
};

// An insertion-ordered mapping with Python key equality (1 == 1.0 == True). Small dicts (every message)
// search linearly; larger ones keep a hash index.
struct DictData {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  void set(const Value& key, Value v);
  size_t size() const { return items.size(); }
  void clear() {
    items.clear();
    index_.clear();
  }

 private:
  std::unordered_map<std::string, size_t> index_;
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

// Macros, namespaces, loop contexts, builtins and bound methods.
class Object : public std::enable_shared_from_this<Object> {
 public:
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;
  virtual std::string repr() const = 0;
  // Attribute lookup through the sandbox; undefined when absent.
  virtual Value get_attr(const std::string& name) const;
  virtual bool callable() const { return false; }
  virtual Value call(Interp& interp, CallArgs& args);
  // Drops references to other values; called when a render ends so that reference cycles
  // (a namespace holding itself) do not keep memory alive.
  virtual void release_refs() {}
};

// Python semantics shared by the evaluator and the filters.
std::string to_str(const Value& v);  // str(v)
std::string repr(const Value& v);    // repr(v)
bool equals(const Value& a, const Value& b);
// a < b (negative), == (0), > (positive) for orderable pairs; raises TypeError's message otherwise.
int compare(const Value& a, const Value& b, const char* op);
// len(v); raises for values without a length.
int64_t length(const Value& v);
// iter(v) materialised: list items, dict keys, string characters; undefined iterates as empty.
std::vector<Value> iterate(const Value& v);
// `needle in haystack`.
bool contains(const Value& haystack, const Value& needle);
// Fails with the value's undefined message (jinja2's UndefinedError).
[[noreturn]] void fail_undefined(const Value& v);

struct JsonOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;  // the indent unit when has_indent
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
// json.dumps(v, ...) as Hugging Face's tojson filter calls it.
std::string to_json(const Value& v, const JsonOptions& opts);

// Limits that keep hostile templates from exhausting memory or stack.
inline constexpr size_t kMaxStringBytes = size_t{32} << 20;  // a 1M-token prompt is ~4 MiB
inline constexpr size_t kMaxSeqItems = size_t{1} << 20;
inline constexpr int kMaxValueDepth = 400;

}  // namespace moeserve::tpl

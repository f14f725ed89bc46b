#include "template/value.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "template/pystr.h"

namespace moeserve::tpl {
namespace {

// Recursion guard for repr/json/equality/ordering over values that may be nested arbitrarily deep. One
// counter per thread, so that walks which re-enter each other (a namespace printing its attributes) share it.
thread_local int t_value_depth = 0;

struct DepthGuard {
  explicit DepthGuard(int& d = t_value_depth) : d_(d) {
    if (++d_ > kMaxValueDepth) {
      --d_;
      throw EvalError("maximum recursion depth exceeded while processing a nested value");
    }
  }
  ~DepthGuard() { --d_; }
  int& d_;
};

// The value that makes `k` unhashable (Python names the innermost one), or null.
const Value* unhashable_part(const Value& k) {
  DepthGuard g;
  if (k.is_dict()) return &k;
  if (k.is_seq()) {
    if (k.seq().kind != SeqKind::Tuple) return &k;
    for (const auto& it : k.seq().items)
      if (const Value* bad = unhashable_part(it)) return bad;
  }
  return nullptr;
}

void require_hashable(const Value& k) {
  if (const Value* bad = unhashable_part(k)) throw EvalError(fmt::format("unhashable type: '{}'", bad->type_name()));
}

std::string key_fingerprint(const Value& k) {
  DepthGuard g;
  switch (k.kind()) {
    case Value::Kind::String: return "s" + k.str();
    case Value::Kind::Bool:
    case Value::Kind::Int: return "i" + std::to_string(k.as_int());
    case Value::Kind::Float: {
      double f = k.as_double();
      if (std::floor(f) == f && std::fabs(f) < 9e18) return "i" + std::to_string(static_cast<int64_t>(f));
      return "f" + py::float_repr(f);
    }
    case Value::Kind::None: return "n";
    case Value::Kind::Undefined: return "u";
    case Value::Kind::Seq: {
      std::string fp = "t(";
      for (const auto& it : k.seq().items) fp += key_fingerprint(it) + ",";
      return fp + ")";
    }
    case Value::Kind::Object: return fmt::format("o{}", static_cast<const void*>(&k.obj()));
    default: throw EvalError(fmt::format("unhashable type: '{}'", k.type_name()));
  }
}

void repr_into(std::string& out, const Value& v, int& depth);

void repr_items(std::string& out, const std::vector<Value>& items, int& depth) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    repr_into(out, items[i], depth);
  }
}

void repr_into(std::string& out, const Value& v, int& depth) {
  DepthGuard g(depth);
  if (out.size() > kMaxStringBytes) throw EvalError("value too large to print");
  switch (v.kind()) {
    case Value::Kind::Undefined: out += "Undefined"; return;
    case Value::Kind::String: out += py::repr(v.str()); return;
    case Value::Kind::Seq: {
      const SeqData& s = v.seq();
      switch (s.kind) {
        case SeqKind::List: out += '['; repr_items(out, s.items, depth); out += ']'; return;
        case SeqKind::Tuple:
          out += '(';
          repr_items(out, s.items, depth);
          out += s.items.size() == 1 ? ",)" : ")";
          return;
        case SeqKind::DictKeys: out += "dict_keys(["; repr_items(out, s.items, depth); out += "])"; return;
        case SeqKind::DictValues: out += "dict_values(["; repr_items(out, s.items, depth); out += "])"; return;
        case SeqKind::DictItems: out += "dict_items(["; repr_items(out, s.items, depth); out += "])"; return;
        case SeqKind::Range:
          out += s.range_step == 1 ? fmt::format("range({}, {})", s.range_start, s.range_stop)
                                   : fmt::format("range({}, {}, {})", s.range_start, s.range_stop, s.range_step);
          return;
        case SeqKind::Generator: out += "<generator object>"; return;
        case SeqKind::Reversed: out += "<list_reverseiterator object>"; return;
      }
      return;
    }
    case Value::Kind::Dict: {
      out += '{';
      bool first = true;
      for (const auto& [k, val] : v.dict().items) {
        if (!first) out += ", ";
        first = false;
        repr_into(out, k, depth);
        out += ": ";
        repr_into(out, val, depth);
      }
      out += '}';
      return;
    }
    default: out += to_str(v); return;
  }
}

bool equals_depth(const Value& a, const Value& b, int& depth) {
  DepthGuard g(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return a.str() == b.str();
    case Value::Kind::Seq: {
      const SeqData &x = a.seq(), &y = b.seq();
      if (x.kind == SeqKind::Generator || x.kind == SeqKind::Reversed) return a.same_object(b);
      const bool x_list = x.kind == SeqKind::List, y_list = y.kind == SeqKind::List;
      if (x.kind != y.kind && (x_list || y_list || x.kind == SeqKind::Tuple || y.kind == SeqKind::Tuple))
        return false;
      if (x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!equals_depth(x.items[i], y.items[i], depth)) return false;
      return true;
    }
    case Value::Kind::Dict: {
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, v] : a.dict().items) {
        const Value* o = b.dict().find(k);
        if (!o || !equals_depth(v, *o, depth)) return false;
      }
      return true;
    }
    case Value::Kind::Object: return a.same_object(b);
    default: return false;
  }
}

std::string json_float(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f < 0 ? "-Infinity" : "Infinity";
  return py::float_repr(f);
}

std::string json_key(const Value& k, const JsonOptions& o) {
  switch (k.kind()) {
    case Value::Kind::String: return py::json_quote(k.str(), o.ensure_ascii);
    case Value::Kind::Bool: return k.as_bool() ? "\"true\"" : "\"false\"";
    case Value::Kind::Int: return "\"" + std::to_string(k.as_int()) + "\"";
    case Value::Kind::Float: return "\"" + json_float(k.as_double()) + "\"";
    case Value::Kind::None: return "\"null\"";
    default: throw EvalError(fmt::format("keys must be str, int, float, bool or None, not {}", k.type_name()));
  }
}

void json_into(std::string& out, const Value& v, const JsonOptions& o, int level, int& depth) {
  DepthGuard g(depth);
  if (out.size() > kMaxStringBytes) throw EvalError("value too large to serialise");
  auto newline = [&](int lvl) {
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += o.indent;
  };
  switch (v.kind()) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.as_int()); return;
    case Value::Kind::Float: out += json_float(v.as_double()); return;
    case Value::Kind::String: out += py::json_quote(v.str(), o.ensure_ascii); return;
    case Value::Kind::Seq: {
      const SeqData& s = v.seq();
      if (s.kind != SeqKind::List && s.kind != SeqKind::Tuple) break;
      if (s.items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      if (o.has_indent) newline(level + 1);
      for (size_t i = 0; i < s.items.size(); ++i) {
        if (i) {
          out += o.item_sep;
          if (o.has_indent) newline(level + 1);
        }
        json_into(out, s.items[i], o, level + 1, depth);
      }
      if (o.has_indent) newline(level);
      out += ']';
      return;
    }
    case Value::Kind::Dict: {
      const auto& items = v.dict().items;
      if (items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> order;
      for (const auto& kv : items) order.push_back(&kv);
      if (o.sort_keys)
        std::stable_sort(order.begin(), order.end(),
                         [](auto* x, auto* y) { return compare(x->first, y->first, "<") < 0; });
      out += '{';
      if (o.has_indent) newline(level + 1);
      bool first = true;
      for (const auto* kv : order) {
        if (!first) {
          out += o.item_sep;
          if (o.has_indent) newline(level + 1);
        }
        first = false;
        out += json_key(kv->first, o);
        out += o.key_sep;
        json_into(out, kv->second, o, level + 1, depth);
      }
      if (o.has_indent) newline(level);
      out += '}';
      return;
    }
    default: break;
  }
  throw EvalError(fmt::format("Object of type {} is not JSON serializable", v.type_name()));
}

}  // namespace

Value::Value(std::string s) : kind_(Kind::String), p_(std::make_shared<std::string>(std::move(s))) {
  if (str().size() > kMaxStringBytes) throw EvalError("string too large (limit 32 MiB)");
}

Value Value::undefined(std::string message) {
  Value v;
  v.p_ = std::make_shared<std::string>(std::move(message));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}

Value Value::seq(std::vector<Value> items, SeqKind kind) {
  if (items.size() > kMaxSeqItems) throw EvalError("sequence too large");
  Value v;
  v.kind_ = Kind::Seq;
  auto d = std::make_shared<SeqData>();
  d->items = std::move(items);
  d->kind = kind;
  v.p_ = std::move(d);
  return v;
}

Value Value::dict(DictData d) {
  Value v;
  v.kind_ = Kind::Dict;
  v.p_ = std::make_shared<DictData>(std::move(d));
  return v;
}

Value Value::object(std::shared_ptr<Object> o) {
  Value v;
  v.kind_ = Kind::Object;
  v.p_ = std::move(o);
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      // Python ints are unbounded; beyond int64 we keep the magnitude as a float.
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return seq(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      DictData d;
      for (const auto& [k, e] : j.items()) d.set(Value(k), from_json(e));
      return dict(std::move(d));
    }
    default: return none();
  }
}

std::string Value::undefined_message() const {
  if (p_) return *static_cast<const std::string*>(p_.get());
  return "value is undefined";
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return u_.b;
    case Kind::Int: return u_.i != 0;
    case Kind::Float: return u_.f != 0.0;
    case Kind::String: return !str().empty();
    case Kind::Seq:
      if (seq().kind == SeqKind::Generator || seq().kind == SeqKind::Reversed) return true;
      return !seq().items.empty();
    case Kind::Dict: return dict().size() != 0;
    case Kind::Object: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::Dict: return "dict";
    case Kind::Object: return obj().type_name();
    case Kind::Seq:
      switch (seq().kind) {
        case SeqKind::List: return "list";
        case SeqKind::Tuple: return "tuple";
        case SeqKind::DictKeys: return "dict_keys";
        case SeqKind::DictValues: return "dict_values";
        case SeqKind::DictItems: return "dict_items";
        case SeqKind::Range: return "range";
        case SeqKind::Generator: return "generator";
        case SeqKind::Reversed: return "list_reverseiterator";
      }
  }
  return "object";
}

const Value* DictData::find(const Value& key) const {
  require_hashable(key);
  if (!index_.empty()) {
    auto it = index_.find(key_fingerprint(key));
    return it == index_.end() ? nullptr : &items[it->second].second;
  }
  for (const auto& kv : items)
    if (equals_depth(kv.first, key, t_value_depth)) return &kv.second;
  return nullptr;
}

void DictData::set(const Value& key, Value v) {
  require_hashable(key);
  constexpr size_t kIndexFrom = 8;
  if (!index_.empty()) {
    std::string fp = key_fingerprint(key);
    auto it = index_.find(fp);
    if (it != index_.end()) {
      items[it->second].second = std::move(v);
      return;
    }
    index_.emplace(std::move(fp), items.size());
    items.emplace_back(key, std::move(v));
    return;
  }
  for (auto& kv : items) {
    if (equals_depth(kv.first, key, t_value_depth)) {
      kv.second = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
  if (items.size() > kIndexFrom)
    for (size_t i = 0; i < items.size(); ++i) index_.emplace(key_fingerprint(items[i].first), i);
}

Value Object::get_attr(const std::string& name) const {
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", type_name(), name));
}

Value Object::call(Interp&, CallArgs&) { throw EvalError(fmt::format("'{}' object is not callable", type_name())); }

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.as_bool() ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.as_int());
    case Value::Kind::Float: return py::float_repr(v.as_double());
    case Value::Kind::String: return v.str();
    case Value::Kind::Object: return v.obj().repr();
    default: return repr(v);
  }
}

std::string repr(const Value& v) {
  std::string out;
  repr_into(out, v, t_value_depth);
  return out;
}

bool equals(const Value& a, const Value& b) {
  return equals_depth(a, b, t_value_depth);
}

int compare(const Value& a, const Value& b, const char* op) {
  DepthGuard g;
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_seq() && b.is_seq() && a.seq().kind == b.seq().kind &&
      (a.seq().kind == SeqKind::List || a.seq().kind == SeqKind::Tuple)) {
    const auto &x = a.seq().items, &y = b.seq().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equals(x[i], y[i])) return compare(x[i], y[i], op);
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  throw EvalError(fmt::format("'{}' not supported between instances of '{}' and '{}'", op, a.type_name(),
                              b.type_name()));
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: return static_cast<int64_t>(py::length(v.str()));
    case Value::Kind::Dict: return static_cast<int64_t>(v.dict().size());
    case Value::Kind::Seq:
      if (v.seq().kind != SeqKind::Generator && v.seq().kind != SeqKind::Reversed)
        return static_cast<int64_t>(v.seq().items.size());
      break;
    default: break;
  }
  throw EvalError(fmt::format("object of type '{}' has no len()", v.type_name()));
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::String: {
      std::vector<Value> out;
      std::u32string u = py::decode(v.str());
      out.reserve(u.size());
      for (char32_t c : u) out.emplace_back(py::encode(std::u32string_view(&c, 1)));
      return out;
    }
    case Value::Kind::Seq: {
      const SeqData& s = v.seq();
      if (s.kind == SeqKind::Generator || s.kind == SeqKind::Reversed) {
        if (s.consumed) return {};
        s.consumed = true;
      }
      return s.items;
    }
    case Value::Kind::Dict: {
      std::vector<Value> out;
      out.reserve(v.dict().size());
      for (const auto& kv : v.dict().items) out.push_back(kv.first);
      return out;
    }
    default: throw EvalError(fmt::format("'{}' object is not iterable", v.type_name()));
  }
}

bool contains(const Value& hay, const Value& needle) {
  switch (hay.kind()) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::String:
      if (!needle.is_string())
        throw EvalError(
            fmt::format("'in <string>' requires string as left operand, not {}", needle.type_name()));
      return hay.str().find(needle.str()) != std::string::npos;
    case Value::Kind::Dict: return hay.dict().find(needle) != nullptr;
    case Value::Kind::Seq: {
      for (const auto& it : iterate(hay))
        if (equals(it, needle)) return true;
      return false;
    }
    default: throw EvalError(fmt::format("argument of type '{}' is not iterable", hay.type_name()));
  }
}

void fail_undefined(const Value& v) { throw EvalError(v.undefined_message()); }

std::string to_json(const Value& v, const JsonOptions& opts) {
  std::string out;
  json_into(out, v, opts, 0, t_value_depth);
  return out;
}

}  // namespace moeserve::tpl

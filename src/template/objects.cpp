#include "template/objects.h"

#include <algorithm>
#include <ctime>

#include <fmt/format.h>

#include "template/ops.h"

namespace moeserve::tpl {

// ---- ArgReader ------------------------------------------------------------------------------------------

Value ArgReader::get(size_t pos, const char* name, Value dflt) {
  max_pos_ = std::max(max_pos_, pos + 1);
  for (size_t i = 0; i < args_.kwargs.size(); ++i) {
    if (args_.kwargs[i].first != name) continue;
    if (pos < args_.args.size())
      throw EvalError(fmt::format("{}() got multiple values for argument '{}'", fn_, name));
    used_[i] = true;
    return args_.kwargs[i].second;
  }
  if (pos < args_.args.size()) return args_.args[pos];
  return dflt;
}

bool ArgReader::has(size_t pos, const char* name) const {
  if (pos < args_.args.size()) return true;
  for (const auto& kv : args_.kwargs)
    if (kv.first == name) return true;
  return false;
}

void ArgReader::done() {
  if (args_.args.size() > max_pos_)
    throw EvalError(fmt::format("{}() takes at most {} argument(s) ({} given)", fn_, max_pos_, args_.args.size()));
  for (size_t i = 0; i < used_.size(); ++i)
    if (!used_[i])
      throw EvalError(fmt::format("{}() got an unexpected keyword argument '{}'", fn_, args_.kwargs[i].first));
}

// ---- macros ---------------------------------------------------------------------------------------------

Value MacroObj::get_attr(const std::string& name) const {
  if (name == "name") return Value(def_->name);
  if (name == "arguments") {
    std::vector<Value> a(def_->params.begin(), def_->params.end());
    return Value::tuple(std::move(a));
  }
  if (name == "catch_kwargs") return Value(def_->uses_kwargs);
  if (name == "catch_varargs") return Value(def_->uses_varargs);
  if (name == "caller") return Value(def_->uses_caller);
  return Object::get_attr(name);
}

// Argument binding follows jinja2's Macro.__call__: positionals first, then keywords for the remaining
// parameters, then caller/kwargs/varargs only when the body refers to them.
Value MacroObj::call(Interp& in, CallArgs& a) {
  in.tick();
  const MacroDef& d = *def_;
  const size_t n = d.params.size();
  auto sc = std::make_shared<Scope>(closure_);
  std::vector<bool> bound(n, false);
  for (size_t i = 0; i < n && i < a.args.size(); ++i) {
    sc->vars[d.params[i]] = a.args[i];
    bound[i] = true;
  }
  DictData extra_kwargs;
  bool have_caller = false;
  for (auto& [k, v] : a.kwargs) {
    auto it = std::find(d.params.begin(), d.params.end(), k);
    const size_t idx = static_cast<size_t>(it - d.params.begin());
    if (it != d.params.end() && !bound[idx]) {
      sc->vars[k] = v;
      bound[idx] = true;
      continue;
    }
    if (k == "caller" && d.uses_caller && !have_caller) {
      sc->vars["caller"] = v;
      have_caller = true;
      continue;
    }
    if (!d.uses_kwargs) {
      if (k == "caller")
        throw EvalError(fmt::format("macro '{}' was invoked with two values for the special caller argument. This is most likely a bug.", d.name));
      throw EvalError(fmt::format("macro '{}' takes no keyword argument '{}'", d.name, k));
    }
    extra_kwargs.set(Value(k), v);
  }
  if (a.args.size() > n && !d.uses_varargs)
    throw EvalError(fmt::format("macro '{}' takes not more than {} argument(s)", d.name, n));
  if (d.uses_caller && !have_caller && !sc->vars.count("caller"))
    sc->vars["caller"] = Value::undefined("No caller defined");
  if (d.uses_kwargs) sc->vars["kwargs"] = Value::dict(std::move(extra_kwargs));
  if (d.uses_varargs) {
    std::vector<Value> rest;
    for (size_t i = n; i < a.args.size(); ++i) rest.push_back(a.args[i]);
    sc->vars["varargs"] = Value::tuple(std::move(rest));
  }
  const size_t first_default = n - d.defaults.size();
  for (size_t i = 0; i < n; ++i) {
    if (bound[i]) continue;
    if (i >= first_default) {
      sc->vars[d.params[i]] = in.eval(*d.defaults[i - first_default], sc);
    } else {
      sc->vars[d.params[i]] = Value::undefined(fmt::format("parameter '{}' was not provided", d.params[i]));
    }
  }
  in.enter_macro();
  struct Leave {
    Interp& in;
    ~Leave() { in.leave_macro(); }
  } leave{in};
  std::string out;
  in.exec(d.body, sc, out);
  return Value(std::move(out));
}

// ---- namespace ------------------------------------------------------------------------------------------

std::string NamespaceObj::repr() const {
  std::string s = "<Namespace {";
  bool first = true;
  for (const auto& [k, v] : attrs_.items) {
    if (!first) s += ", ";
    first = false;
    s += tpl::repr(k) + ": " + tpl::repr(v);
  }
  return s + "}>";
}

Value NamespaceObj::get_attr(const std::string& name) const {
  if (const Value* v = attrs_.find(Value(name))) return *v;
  return Value::undefined(fmt::format("'jinja2.utils.Namespace object' has no attribute '{}'", name));
}

// ---- loop -----------------------------------------------------------------------------------------------

std::string LoopObj::repr() const { return fmt::format("<LoopContext {}/{}>", idx_ + 1, items_.size()); }

bool LoopObj::changed(const Value& v) {
  if (has_last_ && equals(v, last_changed_)) return false;
  has_last_ = true;
  last_changed_ = v;
  return true;
}

Value LoopObj::get_attr(const std::string& name) const {
  const auto n = static_cast<int64_t>(items_.size());
  const auto i = static_cast<int64_t>(idx_);
  if (name == "index") return Value(i + 1);
  if (name == "index0") return Value(i);
  if (name == "revindex") return Value(n - i);
  if (name == "revindex0") return Value(n - i - 1);
  if (name == "first") return Value(i == 0);
  if (name == "last") return Value(i == n - 1);
  if (name == "length") return Value(n);
  if (name == "depth") return Value(1);
  if (name == "depth0") return Value(0);
  if (name == "previtem") return i > 0 ? items_[idx_ - 1] : Value::undefined("there is no previous item");
  if (name == "nextitem") return i + 1 < n ? items_[idx_ + 1] : Value::undefined("there is no next item");
  if (name == "cycle") {
    const size_t at = idx_;
    return Value::object(std::make_shared<NativeFn>("<bound method LoopContext.cycle>",
                                                    [at](Interp&, CallArgs& a) -> Value {
                                                      if (a.args.empty())
                                                        throw EvalError("no items for cycling given");
                                                      return a.args[at % a.args.size()];
                                                    }));
  }
  if (name == "changed") {
    // The bound method keeps its loop alive, as a Python bound method would.
    auto self = std::static_pointer_cast<LoopObj>(std::const_pointer_cast<Object>(shared_from_this()));
    return Value::object(std::make_shared<NativeFn>("<bound method LoopContext.changed>",
                                                    [self](Interp&, CallArgs& a) -> Value {
                                                      return Value(self->changed(Value::tuple(a.args)));
                                                    }));
  }
  return Value::undefined(fmt::format("'jinja2.runtime.LoopContext object' has no attribute '{}'", name));
}

// ---- globals --------------------------------------------------------------------------------------------

namespace {

Value make_range(CallArgs& a) {
  if (!a.kwargs.empty()) throw EvalError("range() takes no keyword arguments");
  if (a.args.empty() || a.args.size() > 3)
    throw EvalError(fmt::format("range expected at most 3 arguments, got {}", a.args.size()));
  int64_t start = 0, stop, step = 1;
  if (a.args.size() == 1) {
    stop = to_index(a.args[0]);
  } else {
    start = to_index(a.args[0]);
    stop = to_index(a.args[1]);
    if (a.args.size() == 3) step = to_index(a.args[2]);
  }
  if (step == 0) throw EvalError("range() arg 3 must not be zero");
  // Length computed in 128-bit so that extreme bounds cannot overflow.
  __int128 len = 0;
  if (step > 0 && stop > start) len = (static_cast<__int128>(stop) - start + step - 1) / step;
  if (step < 0 && stop < start) len = (static_cast<__int128>(start) - stop - step - 1) / -step;
  constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE
  if (len > kMaxRange)
    throw EvalError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  std::vector<Value> items;
  items.reserve(static_cast<size_t>(len));
  for (int64_t k = 0; k < static_cast<int64_t>(len); ++k) items.emplace_back(start + k * step);
  Value v = Value::seq(std::move(items), SeqKind::Range);
  auto& sd = const_cast<SeqData&>(v.seq());
  sd.range_start = start;
  sd.range_stop = stop;
  sd.range_step = step;
  return v;
}

// dict(mapping_or_pairs, **kwargs) / namespace(...) share Python's dict() argument rules.
void fill_dict(DictData& d, CallArgs& a, const char* fn) {
  if (a.args.size() > 1) throw EvalError(fmt::format("{} expected at most 1 argument, got {}", fn, a.args.size()));
  if (!a.args.empty()) {
    const Value& src = a.args[0];
    if (src.is_dict()) {
      for (const auto& [k, v] : src.dict().items) d.set(k, v);
    } else {
      for (const auto& pair : iterate(src)) {
        std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2)
          throw EvalError(fmt::format("dictionary update sequence element has length {}; 2 is required", kv.size()));
        d.set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : a.kwargs) d.set(Value(k), v);
}

class CyclerObj : public Object {
 public:
  explicit CyclerObj(std::vector<Value> items) : items_(std::move(items)) {}
  std::string type_name() const override { return "Cycler"; }
  std::string repr() const override { return "<jinja2.utils.Cycler object>"; }
  Value get_attr(const std::string& name) const override {
    auto self = std::static_pointer_cast<CyclerObj>(std::const_pointer_cast<Object>(shared_from_this()));
    if (name == "current") return items_[pos_];
    if (name == "next")
      return Value::object(std::make_shared<NativeFn>("<bound method Cycler.next>", [self](Interp&, CallArgs&) {
        Value v = self->items_[self->pos_];
        self->pos_ = (self->pos_ + 1) % self->items_.size();
        return v;
      }));
    if (name == "reset")
      return Value::object(std::make_shared<NativeFn>("<bound method Cycler.reset>", [self](Interp&, CallArgs&) {
        self->pos_ = 0;
        return Value::none();
      }));
    return Object::get_attr(name);
  }
  void release_refs() override { items_.assign(1, Value()); }

 private:
  std::vector<Value> items_;
  size_t pos_ = 0;
};

Value native(const std::string& name, NativeFn::Fn fn) {
  return Value::object(std::make_shared<NativeFn>("<built-in function " + name + ">", std::move(fn)));
}

std::string strftime_py(const std::tm& tm, const std::string& fmt_str) {
  if (fmt_str.empty()) return "";
  for (size_t cap = 256; cap <= 1 << 20; cap *= 4) {
    std::string buf(cap, '\0');
    // A trailing space keeps strftime's 0 return meaningful (it also means "empty result").
    const std::string f = fmt_str + " ";
    const size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
    if (n > 0) {
      buf.resize(n - 1);
      return buf;
    }
  }
  throw EvalError("strftime result too long");
}

}  // namespace

void install_globals(Scope& root) {
  root.vars["range"] = native("range", [](Interp&, CallArgs& a) { return make_range(a); });
  root.vars["dict"] = native("dict", [](Interp&, CallArgs& a) {
    DictData d;
    fill_dict(d, a, "dict");
    return Value::dict(std::move(d));
  });
  root.vars["namespace"] = native("namespace", [](Interp& in, CallArgs& a) {
    auto ns = std::make_shared<NamespaceObj>();
    fill_dict(ns->attrs(), a, "namespace");
    in.track(ns);
    return Value::object(ns);
  });
  root.vars["cycler"] = native("cycler", [](Interp& in, CallArgs& a) -> Value {
    if (a.args.empty()) throw EvalError("at least one item has to be provided");
    auto c = std::make_shared<CyclerObj>(a.args);
    in.track(c);
    return Value::object(c);
  });
  root.vars["joiner"] = native("joiner", [](Interp&, CallArgs& a) {
    ArgReader r(a, "joiner");
    const std::string sep = to_str(r.get(0, "sep", Value(", ")));
    r.done();
    auto used = std::make_shared<bool>(false);
    return Value::object(std::make_shared<NativeFn>("<jinja2.utils.Joiner object>",
                                                    [sep, used](Interp&, CallArgs&) {
                                                      if (!*used) {
                                                        *used = true;
                                                        return Value("");
                                                      }
                                                      return Value(sep);
                                                    }));
  });
  // Hugging Face's globals (transformers' _compile_jinja_template).
  root.vars["raise_exception"] = native("raise_exception", [](Interp&, CallArgs& a) -> Value {
    ArgReader r(a, "raise_exception");
    const Value msg = r.get(0, "message");
    r.done();
    if (!r.has(0, "message")) throw EvalError("raise_exception() missing 1 required positional argument: 'message'");
    throw TemplateRaisedError(to_str(msg));
  });
  root.vars["strftime_now"] = native("strftime_now", [](Interp& in, CallArgs& a) {
    ArgReader r(a, "strftime_now");
    const Value f = r.get(0, "format");
    r.done();
    if (!f.is_string()) throw EvalError("strftime() argument 1 must be str");
    std::tm tm{};
    if (in.now()) {
      tm = *in.now();
    } else {
      const std::time_t t = std::time(nullptr);
      localtime_r(&t, &tm);
    }
    return Value(strftime_py(tm, f.str()));
  });
}

}  // namespace moeserve::tpl

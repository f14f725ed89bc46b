// Python str / dict / list methods as the immutable sandbox exposes them.
#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "template/objects.h"
#include "template/ops.h"
#include "template/pystr.h"

namespace moeserve::tpl {
namespace {

std::optional<std::string> opt_str(const Value& v, const char* what) {
  if (v.is_none()) return std::nullopt;
  if (!v.is_string()) {
    if (std::string(what) == "sep") throw EvalError(fmt::format("must be str or None, not {}", v.type_name()));
    throw EvalError(fmt::format("{} arg must be None or str", what));
  }
  return v.str();
}

const std::string& need_str(const Value& v) {
  if (!v.is_string()) throw EvalError(fmt::format("must be str, not {}", v.type_name()));
  return v.str();
}

// Code-point window [start, end) of s, as Python's optional start/end arguments select it.
std::u32string window(const std::u32string& u, const Value& start, const Value& end) {
  const auto n = static_cast<int64_t>(u.size());
  auto norm = [n](const Value& v, int64_t dflt) {
    if (v.is_none() || v.is_undefined()) return dflt;
    int64_t x = to_index(v);
    if (x < 0) x = std::max<int64_t>(0, x + n);
    return std::min(x, n);
  };
  const int64_t b = norm(start, 0), e = norm(end, n);
  if (b >= e) return {};
  return u.substr(static_cast<size_t>(b), static_cast<size_t>(e - b));
}

Value affix_test(const Value& self, ArgReader& r, bool prefix) {
  const char* fn = prefix ? "startswith" : "endswith";
  const Value what = r.get(0, "prefix");
  std::u32string u = py::decode(self.str());
  const std::u32string w = window(u, r.get(1, "start", Value::none()), r.get(2, "end", Value::none()));
  r.done();
  std::vector<std::string> options;
  if (what.is_string()) {
    options.push_back(what.str());
  } else if (what.is_seq() && what.seq().kind == SeqKind::Tuple) {
    for (const auto& o : what.seq().items) {
      if (!o.is_string())
        throw EvalError(fmt::format("tuple for {} must only contain str, not {}", fn, o.type_name()));
      options.push_back(o.str());
    }
  } else {
    throw EvalError(fmt::format("{} first arg must be str or a tuple of str, not {}", fn, what.type_name()));
  }
  const std::string s = py::encode(w);
  for (const auto& o : options) {
    if (o.size() > s.size()) continue;
    if (prefix ? s.compare(0, o.size(), o) == 0 : s.compare(s.size() - o.size(), o.size(), o) == 0) return Value(true);
  }
  return Value(false);
}

Value find_impl(const Value& self, ArgReader& r, bool reverse, bool raise) {
  const std::string& sub = need_str(r.get(0, "sub"));
  const Value start = r.get(1, "start", Value::none()), end = r.get(2, "end", Value::none());
  r.done();
  int64_t pos;
  if (start.is_none() && end.is_none()) {
    pos = py::find(self.str(), sub, reverse);
  } else {
    const std::u32string u = py::decode(self.str());
    const int64_t n = static_cast<int64_t>(u.size());
    int64_t b = start.is_none() ? 0 : to_index(start);
    if (b < 0) b = std::max<int64_t>(0, b + n);
    const std::u32string w = window(u, start, end);
    pos = py::find(py::encode(w), sub, reverse);
    if (pos >= 0) pos += std::min(b, n);
  }
  if (pos < 0 && raise) throw EvalError("substring not found");
  return Value(pos);
}

bool all_chars(const std::string& s, bool (*pred)(char32_t)) {
  const std::u32string u = py::decode(s);
  return !u.empty() && std::all_of(u.begin(), u.end(), pred);
}

char32_t fill_char(const Value& v) {
  if (v.is_none()) return U' ';
  if (!v.is_string() || py::length(v.str()) != 1)
    throw EvalError("The fill character must be exactly one character long");
  return py::decode(v.str())[0];
}

Value str_method(const std::string& name, const Value& self, ArgReader& r) {
  const std::string& s = self.str();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    auto chars = opt_str(r.get(0, "chars", Value::none()), name.c_str());
    r.done();
    return Value(py::strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    auto sep = opt_str(r.get(0, "sep", Value::none()), "sep");
    const int64_t maxsplit = to_index(r.get(1, "maxsplit", Value(-1)));
    r.done();
    if (sep && sep->empty()) throw EvalError("empty separator");
    auto parts = name == "split" ? py::split(s, sep, maxsplit) : py::rsplit(s, sep, maxsplit);
    return Value::seq(std::vector<Value>(parts.begin(), parts.end()));
  }
  if (name == "splitlines") {
    const bool keep = r.get(0, "keepends", Value(false)).truthy();
    r.done();
    auto parts = py::splitlines(s, keep);
    return Value::seq(std::vector<Value>(parts.begin(), parts.end()));
  }
  if (name == "startswith" || name == "endswith") return affix_test(self, r, name == "startswith");
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "swapcase" ||
      name == "casefold") {
    r.done();
    if (name == "upper") return Value(py::upper(s));
    if (name == "title") return Value(py::title(s));
    if (name == "capitalize") return Value(py::capitalize(s));
    if (name == "swapcase") return Value(py::swapcase(s));
    return Value(py::lower(s));
  }
  if (name == "replace") {
    const Value old_v = r.get(0, "old"), new_v = r.get(1, "new");
    for (int k = 0; k < 2; ++k) {
      const Value& a = k == 0 ? old_v : new_v;
      if (!a.is_string())
        throw EvalError(fmt::format("replace() argument {} must be str, not {}", k + 1, a.type_name()));
    }
    const std::string& old = old_v.str();
    const std::string& repl = new_v.str();
    const int64_t count = to_index(r.get(2, "count", Value(-1)));
    r.done();
    std::string out = py::replace(s, old, repl, count);
    if (out.size() > kMaxStringBytes) throw EvalError("string too large");
    return Value(std::move(out));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex")
    return find_impl(self, r, name[0] == 'r', name.find("index") != std::string::npos);
  if (name == "count") {
    const std::string& sub = need_str(r.get(0, "sub"));
    r.done();
    return Value(py::count(s, sub));
  }
  if (name == "join") {
    const Value it = r.get(0, "iterable");
    r.done();
    std::string out;
    size_t i = 0;
    for (const auto& v : iterate(it)) {
      if (!v.is_string())
        throw EvalError(fmt::format("sequence item {}: expected str instance, {} found", i, v.type_name()));
      if (i++) out += s;
      out += v.str();
      if (out.size() > kMaxStringBytes) throw EvalError("string too large");
    }
    return Value(std::move(out));
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    const int64_t width = to_index(r.get(0, "width"));
    const char32_t fill = fill_char(r.get(1, "fillchar", Value::none()));
    r.done();
    if (width > static_cast<int64_t>(kMaxStringBytes)) throw EvalError("string too large");
    return Value(py::pad(s, width, fill, name == "center" ? '^' : (name == "ljust" ? '<' : '>')));
  }
  if (name == "zfill") {
    const int64_t width = to_index(r.get(0, "width"));
    r.done();
    if (width > static_cast<int64_t>(kMaxStringBytes)) throw EvalError("string too large");
    const int64_t len = static_cast<int64_t>(py::length(s));
    if (width <= len) return self;
    const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
    return Value((sign ? s.substr(0, 1) : "") + std::string(static_cast<size_t>(width - len), '0') + s.substr(sign ? 1 : 0));
  }
  if (name == "partition" || name == "rpartition") {
    const std::string& sep = need_str(r.get(0, "sep"));
    r.done();
    if (sep.empty()) throw EvalError("empty separator");
    const size_t hit = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (hit == std::string::npos)
      return name == "partition" ? Value::tuple({Value(s), Value(""), Value("")})
                                 : Value::tuple({Value(""), Value(""), Value(s)});
    return Value::tuple({Value(s.substr(0, hit)), Value(sep), Value(s.substr(hit + sep.size()))});
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string& a = need_str(r.get(0, "affix"));
    r.done();
    if (name == "removeprefix") return Value(s.compare(0, a.size(), a) == 0 ? s.substr(a.size()) : s);
    if (a.size() <= s.size() && s.compare(s.size() - a.size(), a.size(), a) == 0) return Value(s.substr(0, s.size() - a.size()));
    return self;
  }
  r.done();
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") return Value(all_chars(s, py::is_digit));
  if (name == "isalpha") return Value(all_chars(s, py::is_alpha));
  if (name == "isalnum") return Value(all_chars(s, py::is_alnum));
  if (name == "isspace") return Value(all_chars(s, py::is_space));
  if (name == "isupper" || name == "islower") {
    const bool want_upper = name == "isupper";
    bool cased = false;
    for (char32_t c : py::decode(s)) {
      if (py::is_upper_char(c)) {
        if (!want_upper) return Value(false);
        cased = true;
      } else if (py::is_lower_char(c)) {
        if (want_upper) return Value(false);
        cased = true;
      }
    }
    return Value(cased);
  }
  throw EvalError("unknown str method " + name);
}

const std::set<std::string>& str_methods() {
  static const std::set<std::string> k = {
      "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "upper", "lower",
      "title", "capitalize", "swapcase", "casefold", "replace", "find", "rfind", "index", "rindex", "count",
      "join", "center", "ljust", "rjust", "zfill", "partition", "rpartition", "removeprefix", "removesuffix",
      "isdigit", "isdecimal", "isnumeric", "isalpha", "isalnum", "isspace", "isupper", "islower", "format"};
  return k;
}

Value bound(const Value& self, const std::string& name, std::function<Value(Interp&, CallArgs&)> fn) {
  return Value::object(std::make_shared<NativeFn>(fmt::format("<built-in method {} of {} object>", name, self.type_name()), std::move(fn)));
}

Value unsafe(const Value& self, const std::string& name) {
  return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, self.type_name()));
}

std::vector<Value> dict_view(const DictData& d, int which) {
  std::vector<Value> out;
  out.reserve(d.size());
  for (const auto& [k, v] : d.items) {
    if (which == 0) out.push_back(k);
    else if (which == 1) out.push_back(v);
    else out.push_back(Value::tuple({k, v}));
  }
  return out;
}

}  // namespace

std::optional<Value> get_method(const Value& self, const std::string& name) {
  if (self.is_string()) {
    if (!str_methods().count(name)) return std::nullopt;
    if (name == "format")
      return bound(self, name, [self](Interp&, CallArgs& a) { return Value(brace_format(self.str(), a)); });
    return bound(self, name, [self, name](Interp&, CallArgs& a) {
      ArgReader r(a, name);
      return str_method(name, self, r);
    });
  }
  if (self.is_dict()) {
    static const std::set<std::string> kUnsafe = {"clear", "pop", "popitem", "setdefault", "update"};
    if (kUnsafe.count(name)) return unsafe(self, name);
    if (name == "items" || name == "keys" || name == "values") {
      const int which = name == "keys" ? 0 : (name == "values" ? 1 : 2);
      const SeqKind kind = which == 0 ? SeqKind::DictKeys : (which == 1 ? SeqKind::DictValues : SeqKind::DictItems);
      return bound(self, name, [self, which, kind, name](Interp&, CallArgs& a) {
        ArgReader r(a, name);
        r.done();
        return Value::seq(dict_view(self.dict(), which), kind);
      });
    }
    if (name == "get")
      return bound(self, name, [self](Interp&, CallArgs& a) {
        ArgReader r(a, "get");
        const Value key = r.get(0, "key");
        const Value dflt = r.get(1, "default", Value::none());
        r.done();
        if (!r.has(0, "key")) throw EvalError("get expected at least 1 argument, got 0");
        const Value* v = self.dict().find(key);
        return v ? *v : dflt;
      });
    if (name == "copy") return bound(self, name, [self](Interp&, CallArgs&) { return self; });
    return std::nullopt;
  }
  if (self.is_seq()) {
    const SeqKind k = self.seq().kind;
    if (k != SeqKind::List && k != SeqKind::Tuple && k != SeqKind::Range) return std::nullopt;
    static const std::set<std::string> kUnsafe = {"append", "clear", "pop", "reverse", "insert", "sort", "extend", "remove"};
    if (k == SeqKind::List && kUnsafe.count(name)) return unsafe(self, name);
    if (name == "count")
      return bound(self, name, [self](Interp&, CallArgs& a) {
        ArgReader r(a, "count");
        const Value x = r.get(0, "value");
        r.done();
        int64_t n = 0;
        for (const auto& it : self.seq().items) n += equals(it, x) ? 1 : 0;
        return Value(n);
      });
    if (name == "index")
      return bound(self, name, [self](Interp&, CallArgs& a) {
        ArgReader r(a, "index");
        const Value x = r.get(0, "value");
        r.done();
        const auto& items = self.seq().items;
        for (size_t i = 0; i < items.size(); ++i)
          if (equals(items[i], x)) return Value(static_cast<int64_t>(i));
        throw EvalError(fmt::format("{} is not in {}", repr(x), self.type_name()));
      });
    if (name == "copy" && k == SeqKind::List) return bound(self, name, [self](Interp&, CallArgs&) { return self; });
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace moeserve::tpl

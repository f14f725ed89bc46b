#include "template/filters.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include <fmt/format.h>

#include "template/interp.h"
#include "template/objects.h"
#include "template/ops.h"
#include "template/pystr.h"

namespace moeserve::tpl {
namespace {

// ---- helpers shared by several filters ------------------------------------------------------------------

Value generator(std::vector<Value> items) { return Value::seq(std::move(items), SeqKind::Generator); }

Value ignore_case(const Value& v) { return v.is_string() ? Value(py::lower(v.str())) : v; }

// jinja2's make_attrgetter: "a.b.0" walks items (falling back to attributes), digits become indices.
Value get_path(Interp& in, const Value& item, const Value& attribute) {
  if (attribute.is_none() || attribute.is_undefined()) return item;
  if (!attribute.is_string()) return in.getitem(item, attribute);
  Value v = item;
  for (const auto& part : py::split(attribute.str(), std::string("."), -1)) {
    const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    v = in.getitem(v, digits ? Value(static_cast<int64_t>(std::strtoll(part.c_str(), nullptr, 10))) : Value(part));
  }
  return v;
}

void sort_values(std::vector<Value>& items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? compare(keys[b], keys[a], "<") < 0 : compare(keys[a], keys[b], "<") < 0;
  });
  std::vector<Value> out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(items[i]);
  items = std::move(out);
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Python's int(str): surrounding whitespace, a sign, digits with single underscores between them.
std::optional<int64_t> parse_py_int(const std::string& raw, int base) {
  std::string s = py::strip(raw, std::nullopt, true, true);
  if (s.empty()) return std::nullopt;
  bool neg = false;
  size_t i = 0;
  if (s[0] == '+' || s[0] == '-') neg = s[i++] == '-';
  if (base == 16 && s.size() > i + 1 && s[i] == '0' && (s[i + 1] | 0x20) == 'x') i += 2;
  std::string digits;
  for (; i < s.size(); ++i) {
    if (s[i] == '_' && !digits.empty() && i + 1 < s.size() && s[i + 1] != '_') continue;
    digits += s[i];
  }
  if (digits.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(digits.c_str(), &end, base);
  if (*end != '\0' || errno == ERANGE) return std::nullopt;
  return neg ? -v : v;
}

std::optional<double> parse_py_float(const std::string& raw) {
  std::string s = py::strip(raw, std::nullopt, true, true);
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i)
    if (!(s[i] == '_' && i > 0 && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
          std::isdigit(static_cast<unsigned char>(s[i + 1]))))
      clean += s[i];
  if (clean.empty()) return std::nullopt;
  const std::string low = py::lower(clean);
  const std::string body = (low[0] == '+' || low[0] == '-') ? low.substr(1) : low;
  if (body == "inf" || body == "infinity" || body == "nan") {
    const double v = body == "nan" ? NAN : INFINITY;
    return low[0] == '-' ? -v : v;
  }
  if (low.find_first_not_of("0123456789+-.e") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(clean.c_str(), &end);
  if (*end != '\0') return std::nullopt;
  return v;
}

// ---- filters --------------------------------------------------------------------------------------------

Value f_default(Interp&, const Value& v, CallArgs& a) {
  ArgReader r(a, "default");
  const Value dflt = r.get(0, "default_value", Value(""));
  const bool boolean = r.get(1, "boolean", Value(false)).truthy();
  r.done();
  if (v.is_undefined() || (boolean && !v.truthy())) return dflt;
  return v;
}

Value f_length(Interp&, const Value& v, CallArgs& a) {
  ArgReader(a, "length").done();
  return Value(length(v));
}

Value f_join(Interp& in, const Value& v, CallArgs& a) {
  ArgReader r(a, "join");
  const std::string sep = to_str(r.get(0, "d", Value("")));
  const Value attribute = r.get(1, "attribute", Value::none());
  r.done();
  std::string out;
  bool first = true;
  for (const auto& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(get_path(in, item, attribute));
    if (out.size() > kMaxStringBytes) throw EvalError("string too large");
  }
  return Value(std::move(out));
}

Value f_map(Interp& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  if (!v.truthy()) return generator({});
  const std::vector<Value> items = iterate(v);
  in.tick(items.size());
  if (a.args.empty()) {
    Value attribute, dflt = Value::none();
    bool have_attr = false;
    for (const auto& [k, val] : a.kwargs) {
      if (k == "attribute") attribute = val, have_attr = true;
      else if (k == "default") dflt = val;
      else throw EvalError(fmt::format("Unexpected keyword argument '{}'", k));
    }
    if (!have_attr) throw EvalError("map requires a filter argument");
    for (const auto& item : items) {
      Value got = get_path(in, item, attribute);
      out.push_back(got.is_undefined() && !dflt.is_none() ? dflt : got);
    }
    return generator(std::move(out));
  }
  const std::string name = to_str(a.args[0]);
  CallArgs rest;
  rest.args.assign(a.args.begin() + 1, a.args.end());
  rest.kwargs = a.kwargs;
  for (const auto& item : items) {
    CallArgs copy = rest;
    out.push_back(call_filter(in, name, item, copy));
  }
  return generator(std::move(out));
}

// select / reject / selectattr / rejectattr (jinja2's select_or_reject).
Value select_impl(Interp& in, const Value& v, CallArgs& a, bool keep_if, bool lookup_attr) {
  if (!v.truthy()) return generator({});
  size_t off = 0;
  Value attribute;
  if (lookup_attr) {
    if (a.args.empty()) throw EvalError("Missing parameter for attribute name");
    attribute = a.args[0];
    off = 1;
  }
  std::optional<std::string> test_name;
  CallArgs test_args;
  if (a.args.size() > off) {
    test_name = to_str(a.args[off]);
    test_args.args.assign(a.args.begin() + static_cast<long>(off) + 1, a.args.end());
    test_args.kwargs = a.kwargs;
  }
  const std::vector<Value> items = iterate(v);
  in.tick(items.size());
  std::vector<Value> out;
  for (const auto& item : items) {
    const Value subject = lookup_attr ? get_path(in, item, attribute) : item;
    bool ok;
    if (test_name) {
      CallArgs copy = test_args;
      ok = call_test(in, *test_name, subject, copy);
    } else {
      ok = subject.truthy();
    }
    if (ok == keep_if) out.push_back(item);
  }
  return generator(std::move(out));
}

Value f_select(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, false); }
Value f_reject(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, false); }
Value f_selectattr(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, true); }
Value f_rejectattr(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, true); }

Value f_first(Interp&, const Value& v, CallArgs& a) {
  ArgReader(a, "first").done();
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interp&, const Value& v, CallArgs& a) {
  ArgReader(a, "last").done();
  // jinja2: next(iter(reversed(seq)))
  const bool reversible = v.is_undefined() || v.is_string() || v.is_dict() ||
                          (v.is_seq() && v.seq().kind != SeqKind::Generator && v.seq().kind != SeqKind::Reversed);
  if (!reversible) throw EvalError(fmt::format("'{}' object is not reversible", v.type_name()));
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_list(Interp&, const Value& v, CallArgs& a) {
  ArgReader(a, "list").done();
  return Value::seq(iterate(v));
}

Value f_string(Interp&, const Value& v, CallArgs& a) {
  ArgReader(a, "string").done();
  return Value(to_str(v));
}

Value str_filter(const Value& v, CallArgs& a, const char* name, std::string (*fn)(std::string_view)) {
  ArgReader(a, name).done();
  return Value(fn(to_str(v)));
}
Value f_upper(Interp&, const Value& v, CallArgs& a) { return str_filter(v, a, "upper", py::upper); }
Value f_lower(Interp&, const Value& v, CallArgs& a) { return str_filter(v, a, "lower", py::lower); }
Value f_capitalize(Interp&, const Value& v, CallArgs& a) { return str_filter(v, a, "capitalize", py::capitalize); }

// jinja2's title filter: capitalises after runs of "-", whitespace and opening brackets (not str.title).
Value f_title(Interp&, const Value& v, CallArgs& a) {
  ArgReader(a, "title").done();
  std::u32string u = py::decode(to_str(v));
  auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py::is_space(c); };
  bool at_start = true;
  for (auto& c : u) {
    if (is_sep(c)) {
      at_start = true;
      continue;
    }
    c = at_start ? py::to_upper(c) : py::to_lower(c);
    at_start = false;
  }
  return Value(py::encode(u));
}

Value f_trim(Interp&, const Value& v, CallArgs& a) {
  ArgReader r(a, "trim");
  const Value chars = r.get(0, "chars", Value::none());
  r.done();
  std::optional<std::string> set;
  if (!chars.is_none()) set = to_str(chars);
  return Value(py::strip(to_str(v), set, true, true));
}

Value f_replace(Interp&, const Value& v, CallArgs& a) {
  ArgReader r(a, "replace");
  const std::string old = to_str(r.get(0, "old")), repl = to_str(r.get(1, "new"));
  const Value count = r.get(2, "count", Value::none());
  r.done();
  std::string out = py::replace(to_str(v), old, repl, count.is_none() ? -1 : to_index(count));
  if (out.size() > kMaxStringBytes) throw EvalError("string too large");
  return Value(std::move(out));
}

Value f_format(Interp&, const Value& v, CallArgs& a) {
  if (!a.args.empty() && !a.kwargs.empty())
    throw EvalError("can't handle positional and keyword arguments at the same time");
  if (!a.kwargs.empty()) {
    DictData d;
    for (const auto& [k, val] : a.kwargs) d.set(Value(k), val);
    return Value(percent_format(to_str(v), Value::dict(std::move(d))));
  }
  return Value(percent_format(to_str(v), Value::tuple(a.args)));
}

Value f_int(Interp&, const Value& v, CallArgs& a) {
  ArgReader r(a, "int");
  const Value dflt = r.get(0, "default", Value(0));
  const int64_t base = to_index(r.get(1, "base", Value(10)));
  r.done();
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) {
    const double f = v.as_double();
    if (std::isnan(f)) return dflt;
    if (std::isinf(f)) throw EvalError("cannot convert float infinity to integer");
    if (std::fabs(f) >= 9.2e18) throw EvalError("integer overflow (templates use 64-bit integers)");
    return Value(static_cast<int64_t>(f));
  }
  if (v.is_string()) {
    if (auto i = parse_py_int(v.str(), static_cast<int>(base))) return Value(*i);
    if (auto f = parse_py_float(v.str())) {
      if (std::isnan(*f)) return dflt;
      if (std::isinf(*f)) throw EvalError("cannot convert float infinity to integer");
      if (std::fabs(*f) < 9.2e18) return Value(static_cast<int64_t>(*f));
    }
  }
  return dflt;
}

Value f_float(Interp&, const Value& v, CallArgs& a) {
  ArgReader r(a, "float");
  const Value dflt = r.get(0, "default", Value(0.0));
  r.done();
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string())
    if (auto f = parse_py_float(v.str())) return Value(*f);
  return dflt;
}

Value f_abs(Interp&, const Value& v, CallArgs& a) {
  ArgReader(a, "abs").done();
  if (v.is_float()) return Value(std::fabs(v.as_double()));
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) throw EvalError("integer overflow (templates use 64-bit integers)");
    return Value(static_cast<int64_t>(std::llabs(v.as_int())));
  }
  throw EvalError(fmt::format("bad operand type for abs(): '{}'", v.type_name()));
}

Value f_round(Interp&, const Value& v, CallArgs& a) {
  ArgReader r(a, "round");
  const int64_t precision = to_index(r.get(0, "precision", Value(0)));
  const std::string method = to_str(r.get(1, "method", Value("common")));
  r.done();
  if (method != "common" && method != "ceil" && method != "floor")
    throw EvalError("method must be common, ceil or floor");
  if (!v.is_number()) throw EvalError(fmt::format("type {} doesn't define __round__ method", v.type_name()));
  if (precision > 300 || precision < -300) return v.is_float() ? v : Value(v.as_int());
  const double scale = std::pow(10.0, static_cast<double>(precision));
  if (method != "common") {
    const double x = v.as_double() * scale;
    return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
  }
  if (!v.is_float() && precision >= 0) return Value(v.as_int());
  if (!v.is_float()) return Value(static_cast<int64_t>(std::nearbyint(v.as_double() / (1.0 / scale)) * (1.0 / scale)));
  const double x = v.as_double();
  if (!std::isfinite(x)) return v;
  if (precision >= 0 && std::fabs(x) >= 4.5e15) return v;  // no fractional bits left to round
  if (precision >= 0) {
    // printf rounds the exact binary value half-to-even, as CPython's correctly rounded round() does.
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), x);
    return Value(std::strtod(buf, nullptr));
  }
  return Value(std::nearbyint(x * scale) / scale);
}

// Hugging Face's tojson: json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
// sort_keys=sort_keys), without jinja2's HTML escaping.
Value f_tojson(Interp&, const Value& v, CallArgs& a) {
  ArgReader r(a, "tojson");
  JsonOptions o;
  o.ensure_ascii = r.get(0, "ensure_ascii", Value(false)).truthy();
  const Value indent = r.get(1, "indent", Value::none());
  const Value separators = r.get(2, "separators", Value::none());
  o.sort_keys = r.get(3, "sort_keys", Value(false)).truthy();
  r.done();
  if (!indent.is_none()) {
    o.has_indent = true;
    if (indent.is_string()) o.indent = indent.str();
    else o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(to_index(indent), 4096))), ' ');
    o.item_sep = ",";
  }
  if (!separators.is_none()) {
    std::vector<Value> seps = iterate(separators);
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string())
      throw EvalError("separators must be a pair of strings");
    o.item_sep = seps[0].str();
    o.key_sep = seps[1].str();
  }
  return Value(to_json(v, o));
}

Value f_items(Interp&, const Value& v, CallArgs& a) {
  ArgReader(a, "items").done();
  if (v.is_undefined()) return generator({});
  if (!v.is_dict()) throw EvalError("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, val] : v.dict().items) out.push_back(Value::tuple({k, val}));
  return generator(std::move(out));
}

Value f_dictsort(Interp&, const Value& v, CallArgs& a) {
  ArgReader r(a, "dictsort");
  const bool case_sensitive = r.get(0, "case_sensitive", Value(false)).truthy();
  const std::string by = to_str(r.get(1, "by", Value("key")));
  const bool reverse = r.get(2, "reverse", Value(false)).truthy();
  r.done();
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_dict()) throw EvalError(fmt::format("'{}' object has no attribute 'items'", v.type_name()));
  if (by != "key" && by != "value") throw EvalError("You can only sort by either \"key\" or \"value\"");
  std::vector<Value> items, keys;
  for (const auto& [k, val] : v.dict().items) {
    items.push_back(Value::tuple({k, val}));
    const Value& key = by == "key" ? k : val;
    keys.push_back(case_sensitive ? key : ignore_case(key));
  }
  sort_values(items, keys, reverse);
  return Value::seq(std::move(items));
}

Value f_sort(Interp& in, const Value& v, CallArgs& a) {
  ArgReader r(a, "sort");
  const bool reverse = r.get(0, "reverse", Value(false)).truthy();
  const bool case_sensitive = r.get(1, "case_sensitive", Value(false)).truthy();
  const Value attribute = r.get(2, "attribute", Value::none());
  r.done();
  std::vector<Value> items = iterate(v), keys;
  in.tick(items.size());
  for (const auto& it : items) {
    if (attribute.is_string() && attribute.str().find(',') != std::string::npos) {
      std::vector<Value> parts;  // "a,b": sort by a tuple of attributes
      for (const auto& p : py::split(attribute.str(), std::string(","), -1)) {
        Value got = get_path(in, it, Value(py::strip(p, std::nullopt, true, true)));
        parts.push_back(case_sensitive ? got : ignore_case(got));
      }
      keys.push_back(Value::tuple(std::move(parts)));
    } else {
      Value got = get_path(in, it, attribute);
      keys.push_back(case_sensitive ? got : ignore_case(got));
    }
  }
  sort_values(items, keys, reverse);
  return Value::seq(std::move(items));
}

Value f_unique(Interp& in, const Value& v, CallArgs& a) {
  ArgReader r(a, "unique");
  const bool case_sensitive = r.get(0, "case_sensitive", Value(false)).truthy();
  const Value attribute = r.get(1, "attribute", Value::none());
  r.done();
  std::vector<Value> out, seen;
  const std::vector<Value> items = iterate(v);
  in.tick(items.size());
  DictData seen_set;
  for (const auto& it : items) {
    Value key = get_path(in, it, attribute);
    if (!case_sensitive) key = ignore_case(key);
    if (seen_set.find(key)) continue;
    seen_set.set(key, Value(true));
    out.push_back(it);
  }
  return generator(std::move(out));
}

Value minmax(Interp& in, const Value& v, CallArgs& a, bool want_max) {
  ArgReader r(a, want_max ? "max" : "min");
  const bool case_sensitive = r.get(0, "case_sensitive", Value(false)).truthy();
  const Value attribute = r.get(1, "attribute", Value::none());
  r.done();
  const std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key;
  for (size_t i = 0; i < items.size(); ++i) {
    Value key = get_path(in, items[i], attribute);
    if (!case_sensitive) key = ignore_case(key);
    if (i == 0 || (want_max ? compare(key, best_key, ">") > 0 : compare(key, best_key, "<") < 0)) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}
Value f_min(Interp& in, const Value& v, CallArgs& a) { return minmax(in, v, a, false); }
Value f_max(Interp& in, const Value& v, CallArgs& a) { return minmax(in, v, a, true); }

Value f_sum(Interp& in, const Value& v, CallArgs& a) {
  ArgReader r(a, "sum");
  const Value attribute = r.get(0, "attribute", Value::none());
  Value total = r.get(1, "start", Value(0));
  r.done();
  if (total.is_string()) throw EvalError("sum() can't sum strings [use ''.join(seq) instead]");
  for (const auto& it : iterate(v)) {
    try {
      total = binary_op("+", total, get_path(in, it, attribute));
    } catch (const EvalError& e) {
      // CPython's sum() adds in place once its running total is a float: the message then says "+=".
      std::string msg = e.what();
      const std::string from = "operand type(s) for +:";
      if (auto at = msg.find(from); at != std::string::npos && total.is_float())
        msg.replace(at, from.size(), "operand type(s) for +=:");
      throw EvalError(msg);
    }
  }
  return total;
}

Value f_reverse(Interp&, const Value& v, CallArgs& a) {
  ArgReader(a, "reverse").done();
  if (v.is_string()) {
    std::u32string u = py::decode(v.str());
    std::reverse(u.begin(), u.end());
    return Value(py::encode(u));
  }
  if (!v.is_undefined() && !v.is_seq() && !v.is_dict()) throw EvalError("argument must be iterable");
  const bool one_shot = v.is_seq() && (v.seq().kind == SeqKind::Generator || v.seq().kind == SeqKind::Reversed);
  std::vector<Value> items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::seq(std::move(items), one_shot ? SeqKind::List : SeqKind::Reversed);
}

Value f_attr(Interp&, const Value& v, CallArgs& a) {
  ArgReader r(a, "attr");
  const std::string name = to_str(r.get(0, "name"));
  r.done();
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_object()) return v.obj().get_attr(name);
  if (auto m = get_method(v, name)) return *m;
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", v.type_name(), name));
}

Value f_indent(Interp&, const Value& v, CallArgs& a) {
  ArgReader r(a, "indent");
  const Value width = r.get(0, "width", Value(4));
  const bool first = r.get(1, "first", Value(false)).truthy();
  const bool blank = r.get(2, "blank", Value(false)).truthy();
  r.done();
  // jinja2 does `s += "\n"` on the value itself, so only strings get through.
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_seq() && v.seq().kind == SeqKind::List) throw EvalError("'list' object has no attribute 'splitlines'");
  if (v.is_seq() && v.seq().kind == SeqKind::Tuple)
    throw EvalError("can only concatenate tuple (not \"str\") to tuple");
  if (!v.is_string())
    throw EvalError(fmt::format("unsupported operand type(s) for +=: '{}' and 'str'", v.type_name()));
  std::string ind = width.is_string() ? width.str() : std::string(static_cast<size_t>(std::clamp<int64_t>(to_index(width), 0, 4096)), ' ');
  const std::string s = to_str(v) + "\n";
  std::vector<std::string> lines = py::splitlines(s, false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : ind + lines[i]);
  }
  if (first) rv = ind + rv;
  return Value(std::move(rv));
}

Value f_safe(Interp&, const Value& v, CallArgs& a) {
  ArgReader(a, "safe").done();
  return Value(to_str(v));
}

Value f_escape(Interp&, const Value& v, CallArgs& a) {
  ArgReader(a, "escape").done();
  return Value(html_escape(to_str(v)));
}

Value f_wordcount(Interp&, const Value& v, CallArgs& a) {
  ArgReader(a, "wordcount").done();
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : py::decode(to_str(v))) {
    const bool w = py::is_word(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

Value f_center(Interp&, const Value& v, CallArgs& a) {
  ArgReader r(a, "center");
  const int64_t width = to_index(r.get(0, "width", Value(80)));
  r.done();
  if (width > static_cast<int64_t>(kMaxStringBytes)) throw EvalError("string too large");
  return Value(py::pad(to_str(v), width, U' ', '^'));
}

Value f_truncate(Interp&, const Value& v, CallArgs& a) {
  ArgReader r(a, "truncate");
  const int64_t len = to_index(r.get(0, "length", Value(255)));
  const bool killwords = r.get(1, "killwords", Value(false)).truthy();
  const std::string end = to_str(r.get(2, "end", Value("...")));
  const Value leeway_v = r.get(3, "leeway", Value::none());
  r.done();
  const int64_t leeway = leeway_v.is_none() ? 5 : to_index(leeway_v);
  const int64_t end_len = static_cast<int64_t>(py::length(end));
  if (len < end_len) throw EvalError(fmt::format("expected length >= {}, got {}", end_len, len));
  if (leeway < 0) throw EvalError(fmt::format("expected leeway >= 0, got {}", leeway));
  if (!v.is_string()) {  // jinja2 applies len() and slicing to the value itself
    if (length(v) <= len + leeway) return v;
    if (v.is_dict()) throw EvalError("unhashable type: 'slice'");
    if (killwords)
      throw EvalError(fmt::format("can only concatenate {} (not \"str\") to {}", v.type_name(), v.type_name()));
    throw EvalError(fmt::format("'{}' object has no attribute 'rsplit'", v.type_name()));
  }
  const std::u32string u = py::decode(v.str());
  if (static_cast<int64_t>(u.size()) <= len + leeway) return v;
  std::string head = py::encode(std::u32string_view(u).substr(0, static_cast<size_t>(len - end_len)));
  if (killwords) return Value(head + end);
  auto parts = py::rsplit(head, std::string(" "), 1);
  return Value(parts[0] + end);
}

Value f_batch(Interp&, const Value& v, CallArgs& a) {
  ArgReader r(a, "batch");
  const int64_t count = to_index(r.get(0, "linecount"));
  const Value fill = r.get(1, "fill_with", Value::none());
  r.done();
  if (count <= 0) throw EvalError("batch size must be positive");
  std::vector<Value> out, tmp;
  for (const auto& it : iterate(v)) {
    if (static_cast<int64_t>(tmp.size()) == count) {
      out.push_back(Value::seq(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(it);
  }
  if (!tmp.empty()) {
    if (!fill.is_none())
      while (static_cast<int64_t>(tmp.size()) < count) tmp.push_back(fill);
    out.push_back(Value::seq(std::move(tmp)));
  }
  return generator(std::move(out));
}

Value f_unsupported(Interp&, const Value&, CallArgs&) {
  throw EvalError("this filter is not supported by moeserve's template engine");
}

const std::unordered_map<std::string, FilterFn>& filter_table() {
  static const std::unordered_map<std::string, FilterFn> k = {
      {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize}, {"center", f_center},
      {"count", f_length}, {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort}, {"e", f_escape},
      {"escape", f_escape}, {"forceescape", f_escape}, {"first", f_first}, {"float", f_float},
      {"format", f_format}, {"indent", f_indent}, {"int", f_int}, {"items", f_items}, {"join", f_join},
      {"last", f_last}, {"length", f_length}, {"list", f_list}, {"lower", f_lower}, {"map", f_map},
      {"max", f_max}, {"min", f_min}, {"reject", f_reject}, {"rejectattr", f_rejectattr},
      {"replace", f_replace}, {"reverse", f_reverse}, {"round", f_round}, {"safe", f_safe},
      {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string},
      {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim}, {"truncate", f_truncate},
      {"unique", f_unique}, {"upper", f_upper}, {"wordcount", f_wordcount},
      // jinja2 has these; chat templates do not use them.
      {"filesizeformat", f_unsupported}, {"groupby", f_unsupported}, {"pprint", f_unsupported},
      {"random", f_unsupported}, {"slice", f_unsupported}, {"striptags", f_unsupported},
      {"urlencode", f_unsupported}, {"urlize", f_unsupported}, {"wordwrap", f_unsupported},
      {"xmlattr", f_unsupported},
  };
  return k;
}

// ---- tests ----------------------------------------------------------------------------------------------

Value arg0(CallArgs& a, const char* name) {
  ArgReader r(a, name);
  Value v = r.get(0, "other");
  r.done();
  if (!r.has(0, "other")) throw EvalError(fmt::format("{}() missing 1 required positional argument", name));
  return v;
}

bool t_defined(Interp&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Interp&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Interp&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_boolean(Interp&, const Value& v, CallArgs&) { return v.is_bool(); }
bool t_true(Interp&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_false(Interp&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool t_integer(Interp&, const Value& v, CallArgs&) { return v.is_int(); }
bool t_float(Interp&, const Value& v, CallArgs&) { return v.is_float(); }
bool t_number(Interp&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_string(Interp&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_mapping(Interp&, const Value& v, CallArgs&) { return v.is_dict(); }
bool t_iterable(Interp&, const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_seq() || v.is_dict() ||
         (v.is_object() && v.type_name() == "LoopContext");
}
bool t_sequence(Interp&, const Value& v, CallArgs&) {
  if (v.is_undefined() || v.is_string() || v.is_dict()) return true;
  if (!v.is_seq()) return false;
  const SeqKind k = v.seq().kind;
  return k == SeqKind::List || k == SeqKind::Tuple || k == SeqKind::Range;
}
bool t_callable(Interp&, const Value& v, CallArgs&) {
  return v.is_undefined() || (v.is_object() && v.obj().callable());
}
bool t_odd(Interp&, const Value& v, CallArgs&) { return equals(binary_op("%", v, Value(2)), Value(1)); }
bool t_even(Interp&, const Value& v, CallArgs&) { return equals(binary_op("%", v, Value(2)), Value(0)); }
bool t_divisibleby(Interp&, const Value& v, CallArgs& a) {
  return equals(binary_op("%", v, arg0(a, "divisibleby")), Value(0));
}
bool t_eq(Interp&, const Value& v, CallArgs& a) { return equals(v, arg0(a, "eq")); }
bool t_ne(Interp&, const Value& v, CallArgs& a) { return !equals(v, arg0(a, "ne")); }
bool t_lt(Interp&, const Value& v, CallArgs& a) { return compare(v, arg0(a, "lt"), "<") < 0; }
bool t_le(Interp&, const Value& v, CallArgs& a) { return compare(v, arg0(a, "le"), "<=") <= 0; }
bool t_gt(Interp&, const Value& v, CallArgs& a) { return compare(v, arg0(a, "gt"), ">") > 0; }
bool t_ge(Interp&, const Value& v, CallArgs& a) { return compare(v, arg0(a, "ge"), ">=") >= 0; }
bool t_in(Interp&, const Value& v, CallArgs& a) { return contains(arg0(a, "in"), v); }
// `is` identity: the singletons compare by value, containers and objects by address.
bool t_sameas(Interp&, const Value& v, CallArgs& a) {
  const Value o = arg0(a, "sameas");
  if (v.kind() != o.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::None:
    case Value::Kind::Undefined: return true;
    case Value::Kind::Bool:
    case Value::Kind::Int: return v.as_int() == o.as_int();
    case Value::Kind::Float: return false;
    default: return v.same_object(o);
  }
}
bool t_lower(Interp& in, const Value& v, CallArgs&) {
  CallArgs none;
  return get_method(Value(to_str(v)), "islower")->obj().call(in, none).truthy();
}
bool t_upper(Interp& in, const Value& v, CallArgs&) {
  CallArgs none;
  return get_method(Value(to_str(v)), "isupper")->obj().call(in, none).truthy();
}
bool t_escaped(Interp&, const Value&, CallArgs&) { return false; }
bool t_filter(Interp&, const Value& v, CallArgs&) { return v.is_string() && find_filter(v.str()) != nullptr; }
bool t_test(Interp&, const Value& v, CallArgs&) { return v.is_string() && find_test(v.str()) != nullptr; }

const std::unordered_map<std::string, TestFn>& test_table() {
  static const std::unordered_map<std::string, TestFn> k = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"boolean", t_boolean},
      {"true", t_true}, {"false", t_false}, {"integer", t_integer}, {"float", t_float}, {"number", t_number},
      {"string", t_string}, {"mapping", t_mapping}, {"iterable", t_iterable}, {"sequence", t_sequence},
      {"callable", t_callable}, {"odd", t_odd}, {"even", t_even}, {"divisibleby", t_divisibleby},
      {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne}, {"lt", t_lt},
      {"lessthan", t_lt}, {"<", t_lt}, {"le", t_le}, {"<=", t_le}, {"gt", t_gt}, {"greaterthan", t_gt},
      {">", t_gt}, {"ge", t_ge}, {">=", t_ge}, {"in", t_in}, {"sameas", t_sameas}, {"lower", t_lower},
      {"upper", t_upper}, {"escaped", t_escaped}, {"filter", t_filter}, {"test", t_test},
  };
  return k;
}

}  // namespace

bool is_context_filter(const std::string& name) {
  return name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr" ||
         name == "random";
}

FilterFn find_filter(const std::string& name) {
  auto it = filter_table().find(name);
  return it == filter_table().end() ? nullptr : it->second;
}

TestFn find_test(const std::string& name) {
  auto it = test_table().find(name);
  return it == test_table().end() ? nullptr : it->second;
}

Value call_filter(Interp& in, const std::string& name, const Value& v, CallArgs& args) {
  FilterFn f = find_filter(name);
  if (!f) throw EvalError(fmt::format("No filter named '{}'.", name));
  return f(in, v, args);
}

bool call_test(Interp& in, const std::string& name, const Value& v, CallArgs& args) {
  TestFn t = find_test(name);
  if (!t) throw EvalError(fmt::format("No test named '{}'.", name));
  return t(in, v, args);
}

}  // namespace moeserve::tpl

#include "template/ops.h"

#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "template/pystr.h"

namespace moeserve::tpl {
namespace {

[[noreturn]] void overflow() { throw EvalError("integer overflow (templates use 64-bit integers)"); }

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  throw EvalError(
      fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name()));
}

bool is_list_or_tuple(const Value& v) {
  return v.is_seq() && (v.seq().kind == SeqKind::List || v.seq().kind == SeqKind::Tuple);
}

bool is_intlike(const Value& v) { return v.is_int() || v.is_bool(); }

Value repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const std::string& s = seq.str();
    if (!s.empty() && static_cast<size_t>(n) > kMaxStringBytes / s.size()) throw EvalError("string too large");
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value(std::move(out));
  }
  const auto& items = seq.seq().items;
  if (!items.empty() && static_cast<size_t>(n) > kMaxSeqItems / items.size()) throw EvalError("sequence too large");
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::seq(std::move(out), seq.seq().kind);
}

// CPython's float floor division and modulo (floatobject.c float_divmod).
void float_divmod(double vx, double wx, double& div_out, double& mod_out) {
  double mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  double floordiv;
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
  div_out = floordiv;
  mod_out = mod;
}

int64_t int_floordiv(int64_t a, int64_t b) {
  if (a == INT64_MIN && b == -1) overflow();
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t int_mod(int64_t a, int64_t b) {
  if (b == -1) return 0;
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

std::string group_digits(const std::string& digits, char sep, size_t every) {
  std::string out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i && (n - i) % every == 0) out += sep;
    out += digits[i];
  }
  return out;
}

std::string c_format_double(char type, int precision, bool alt, double v) {
  char fmtbuf[16];
  std::snprintf(fmtbuf, sizeof fmtbuf, "%%%s.%d%c", alt ? "#" : "", precision, type);
  char buf[512];
  const int n = std::snprintf(buf, sizeof buf, fmtbuf, v);
  if (n < 0) return "";
  if (static_cast<size_t>(n) < sizeof buf) return std::string(buf, static_cast<size_t>(n));
  std::string big(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(big.data(), big.size(), fmtbuf, v);
  big.resize(static_cast<size_t>(n));
  return big;
}

struct Spec {
  char32_t fill = ' ';
  char align = 0;
  char sign = '-';
  bool alt = false;
  bool zero = false;
  int64_t width = -1;
  char grouping = 0;
  int precision = -1;
  char type = 0;
};

Spec parse_spec(const std::string& spec_utf8) {
  std::u32string s = py::decode(spec_utf8);
  Spec sp;
  size_t i = 0;
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '=' || c == '^'; };
  if (s.size() >= 2 && is_align(s[1])) {
    sp.fill = s[0];
    sp.align = static_cast<char>(s[1]);
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    sp.align = static_cast<char>(s[0]);
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) sp.sign = static_cast<char>(s[i++]);
  if (i < s.size() && s[i] == '#') sp.alt = true, ++i;
  if (i < s.size() && s[i] == '0') sp.zero = true, ++i;
  if (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    sp.width = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      sp.width = sp.width * 10 + (s[i++] - '0');
      if (sp.width > 1'000'000) throw EvalError("Too many decimal digits in format string");
    }
  }
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) sp.grouping = static_cast<char>(s[i++]);
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (i >= s.size() || s[i] < '0' || s[i] > '9') throw EvalError("Format specifier missing precision");
    sp.precision = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      sp.precision = sp.precision * 10 + static_cast<int>(s[i++] - '0');
      if (sp.precision > 1000) throw EvalError("precision too big");
    }
  }
  if (i < s.size()) sp.type = static_cast<char>(s[i++]);
  if (i < s.size()) throw EvalError("Invalid format specifier");
  return sp;
}

// Pads a formatted number: `sign_prefix` (sign and 0x) goes before '=' padding, `body` after it.
std::string pad_number(const Spec& sp, const std::string& sign_prefix, const std::string& body) {
  char align = sp.align ? sp.align : '>';
  char32_t fill = sp.fill;
  if (sp.zero && !sp.align) {
    align = '=';
    fill = '0';
  }
  const int64_t len = static_cast<int64_t>(py::length(sign_prefix) + py::length(body));
  if (sp.width <= len) return sign_prefix + body;
  if (align == '=') {
    std::string f;
    py::append_utf8(f, fill);
    std::string out = sign_prefix;
    for (int64_t k = 0; k < sp.width - len; ++k) out += f;
    return out + body;
  }
  return py::pad(sign_prefix + body, sp.width, fill, align);
}

std::string sign_of(bool negative, char sign) {
  if (negative) return "-";
  if (sign == '+') return "+";
  if (sign == ' ') return " ";
  return "";
}

std::string format_int(int64_t v, const Spec& sp) {
  const bool neg = v < 0;
  const uint64_t mag = neg ? (~static_cast<uint64_t>(v) + 1) : static_cast<uint64_t>(v);
  std::string digits, prefix;
  char type = sp.type ? sp.type : 'd';
  switch (type) {
    case 'd':
    case 'n': digits = std::to_string(mag); break;
    case 'x': digits = fmt::format("{:x}", mag); prefix = sp.alt ? "0x" : ""; break;
    case 'X': digits = fmt::format("{:X}", mag); prefix = sp.alt ? "0X" : ""; break;
    case 'o': digits = fmt::format("{:o}", mag); prefix = sp.alt ? "0o" : ""; break;
    case 'b': digits = fmt::format("{:b}", mag); prefix = sp.alt ? "0b" : ""; break;
    case 'c': {
      std::string c;
      py::append_utf8(c, static_cast<char32_t>(v));
      return py::pad(c, sp.width, sp.fill, sp.align ? sp.align : '<');
    }
    default: throw EvalError(fmt::format("Unknown format code '{}' for object of type 'int'", type));
  }
  if (sp.grouping) digits = group_digits(digits, sp.grouping, (type == 'd' || type == 'n') ? 3 : 4);
  return pad_number(sp, sign_of(neg, sp.sign) + prefix, digits);
}

std::string format_float(double v, const Spec& sp) {
  const bool neg = std::signbit(v) && !std::isnan(v);
  const double mag = std::fabs(v);
  std::string body;
  const int prec = sp.precision < 0 ? 6 : sp.precision;
  switch (sp.type) {
    case 0:
      if (sp.precision < 0) {
        body = py::float_repr(mag);
      } else {
        body = c_format_double('g', std::max(prec, 1), sp.alt, mag);
        if (std::isfinite(mag) && body.find_first_of(".e") == std::string::npos) body += ".0";
      }
      break;
    case 'e': case 'E': case 'f': case 'F': case 'g': case 'G':
      body = c_format_double(sp.type, prec, sp.alt, mag);
      break;
    case 'n': body = c_format_double('g', prec, sp.alt, mag); break;
    case '%': body = c_format_double('f', prec, sp.alt, mag * 100) + "%"; break;
    default: throw EvalError(fmt::format("Unknown format code '{}' for object of type 'float'", sp.type));
  }
  if (sp.grouping) {
    const size_t end = body.find_first_not_of("0123456789");
    body = group_digits(body.substr(0, end), sp.grouping, 3) + (end == std::string::npos ? "" : body.substr(end));
  }
  return pad_number(sp, sign_of(neg, sp.sign), body);
}

}  // namespace

int64_t to_index(const Value& v) {
  if (is_intlike(v)) return v.as_int();
  if (v.is_undefined()) fail_undefined(v);
  throw EvalError(fmt::format("'{}' object cannot be interpreted as an integer", v.type_name()));
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "%" && a.is_string()) return Value(percent_format(a.str(), b));  // str.__mod__ accepts undefined
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const bool nums = a.is_number() && b.is_number();
  const bool any_float = a.is_float() || b.is_float();
  if (op == "+") {
    if (nums) {
      if (any_float) return Value(a.as_double() + b.as_double());
      int64_t r;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) overflow();
      return Value(r);
    }
    if (a.is_string() && b.is_string()) {
      if (a.str().size() + b.str().size() > kMaxStringBytes) throw EvalError("string too large");
      return Value(a.str() + b.str());
    }
    if (is_list_or_tuple(a) && is_list_or_tuple(b) && a.seq().kind == b.seq().kind) {
      std::vector<Value> items = a.seq().items;
      items.insert(items.end(), b.seq().items.begin(), b.seq().items.end());
      return Value::seq(std::move(items), a.seq().kind);
    }
    if (a.is_string() || is_list_or_tuple(a))
      throw EvalError(fmt::format("can only concatenate {} (not \"{}\") to {}", a.type_name(), b.type_name(),
                                  a.type_name()));
    unsupported("+", a, b);
  }
  if (op == "-") {
    if (!nums) unsupported("-", a, b);
    if (any_float) return Value(a.as_double() - b.as_double());
    int64_t r;
    if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) overflow();
    return Value(r);
  }
  if (op == "*") {
    if (nums) {
      if (any_float) return Value(a.as_double() * b.as_double());
      int64_t r;
      if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) overflow();
      return Value(r);
    }
    const bool a_seq = a.is_string() || is_list_or_tuple(a), b_seq = b.is_string() || is_list_or_tuple(b);
    if (a_seq && is_intlike(b)) return repeat(a, b.as_int());
    if (b_seq && is_intlike(a)) return repeat(b, a.as_int());
    if (a_seq || b_seq)
      throw EvalError(fmt::format("can't multiply sequence by non-int of type '{}'", (a_seq ? b : a).type_name()));
    unsupported("*", a, b);
  }
  if (op == "/") {
    if (!nums) unsupported("/", a, b);
    if (b.as_double() == 0.0) throw EvalError(any_float ? "float division by zero" : "division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string()) return Value(percent_format(a.str(), b));
    if (!nums) unsupported(op, a, b);
    if (!any_float) {
      if (b.as_int() == 0) throw EvalError(op == "//" ? "integer division or modulo by zero" : "integer modulo by zero");
      return Value(op == "//" ? int_floordiv(a.as_int(), b.as_int()) : int_mod(a.as_int(), b.as_int()));
    }
    if (b.as_double() == 0.0) throw EvalError(op == "//" ? "float floor division by zero" : "float modulo");
    double d, m;
    float_divmod(a.as_double(), b.as_double(), d, m);
    return Value(op == "//" ? d : m);
  }
  if (op == "**") {
    if (!nums) unsupported("** or pow()", a, b);
    if (!any_float && b.as_int() >= 0) {
      int64_t base = a.as_int(), e = b.as_int(), r = 1;
      while (e > 0) {
        if (e & 1)
          if (__builtin_mul_overflow(r, base, &r)) overflow();
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) overflow();
      }
      return Value(r);
    }
    if (a.as_double() == 0.0 && b.as_double() < 0)
      throw EvalError("0.0 cannot be raised to a negative power");
    return Value(std::pow(a.as_double(), b.as_double()));
  }
  throw EvalError("unknown operator " + op);
}

Value unary_op(char op, const Value& a) {
  if (a.is_undefined()) fail_undefined(a);
  if (!a.is_number()) throw EvalError(fmt::format("bad operand type for unary {}: '{}'", op, a.type_name()));
  if (op == '+') return a.is_float() ? a : Value(a.as_int());
  if (a.is_float()) return Value(-a.as_double());
  if (a.as_int() == INT64_MIN) overflow();
  return Value(-a.as_int());
}

std::string percent_format(const std::string& f, const Value& args) {
  std::vector<Value> list;
  const DictData* mapping = nullptr;
  // CPython treats any non-tuple argument with __getitem__ as a mapping: unused arguments are then no error.
  const bool mapping_like = args.is_dict() || args.is_undefined() ||
                            (args.is_seq() && (args.seq().kind == SeqKind::List || args.seq().kind == SeqKind::Range));
  if (args.is_seq() && args.seq().kind == SeqKind::Tuple) {
    list = args.seq().items;
  } else {
    if (args.is_dict()) mapping = &args.dict();
    list.push_back(args);
  }
  size_t next_arg = 0;
  auto take = [&]() -> Value {
    if (next_arg >= list.size()) throw EvalError("not enough arguments for format string");
    return list[next_arg++];
  };
  std::string out;
  bool used_mapping = false;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out += f[i];
      continue;
    }
    if (++i >= f.size()) throw EvalError("incomplete format");
    Value arg;
    bool have_arg = false;
    if (f[i] == '(') {
      const size_t close = f.find(')', i);
      if (close == std::string::npos) throw EvalError("incomplete format key");
      if (!mapping) throw EvalError("format requires a mapping");
      const Value* v = mapping->find(Value(f.substr(i + 1, close - i - 1)));
      if (!v) throw EvalError(py::repr(f.substr(i + 1, close - i - 1)));
      arg = *v;
      have_arg = used_mapping = true;
      i = close + 1;
    }
    Spec sp;
    sp.align = '>';
    for (; i < f.size() && std::string_view("-+ #0").find(f[i]) != std::string_view::npos; ++i) {
      if (f[i] == '-') sp.align = '<';
      else if (f[i] == '+') sp.sign = '+';
      else if (f[i] == ' ' && sp.sign != '+') sp.sign = ' ';
      else if (f[i] == '#') sp.alt = true;
      else if (f[i] == '0') sp.zero = true;
    }
    if (i < f.size() && f[i] == '*') {
      sp.width = to_index(take());
      ++i;
    } else {
      while (i < f.size() && f[i] >= '0' && f[i] <= '9') {
        sp.width = std::max<int64_t>(sp.width, 0) * 10 + (f[i++] - '0');
        if (sp.width > 1'000'000) throw EvalError("width too big");
      }
    }
    if (sp.width > 1'000'000) throw EvalError("width too big");
    if (i < f.size() && f[i] == '.') {
      ++i;
      sp.precision = 0;
      if (i < f.size() && f[i] == '*') {
        const int64_t p = to_index(take());
        if (p > 1000) throw EvalError("precision too big");
        sp.precision = static_cast<int>(p);
        ++i;
      } else {
        while (i < f.size() && f[i] >= '0' && f[i] <= '9') {
          sp.precision = sp.precision * 10 + (f[i++] - '0');
          if (sp.precision > 1000) throw EvalError("precision too big");
        }
      }
    }
    while (i < f.size() && (f[i] == 'h' || f[i] == 'l' || f[i] == 'L')) ++i;
    if (i >= f.size()) throw EvalError("incomplete format");
    const char type = f[i];
    if (type == '%') {
      out += '%';
      continue;
    }
    if (!have_arg) arg = take();
    if (sp.align == '<') sp.zero = false;
    std::string piece;
    switch (type) {
      case 's':
      case 'r':
      case 'a': {
        std::string s = type == 's' ? to_str(arg) : repr(arg);
        if (sp.precision >= 0) {
          std::u32string u = py::decode(s);
          if (u.size() > static_cast<size_t>(sp.precision)) s = py::encode(std::u32string_view(u).substr(0, sp.precision));
        }
        piece = py::pad(s, sp.width, ' ', sp.align);
        break;
      }
      case 'd': case 'i': case 'u': case 'x': case 'X': case 'o': {
        if (arg.is_undefined()) fail_undefined(arg);
        int64_t v;
        if (arg.is_float() && (type == 'd' || type == 'i' || type == 'u')) {
          if (!std::isfinite(arg.as_double())) throw EvalError("cannot convert float infinity to integer");
          v = static_cast<int64_t>(arg.as_double());
        } else if (is_intlike(arg)) {
          v = arg.as_int();
        } else {
          throw EvalError(fmt::format("%{} format: {} is required, not {}", type,
                                      (type == 'x' || type == 'X' || type == 'o') ? "an integer" : "a real number",
                                      arg.type_name()));
        }
        Spec is = sp;
        is.type = (type == 'i' || type == 'u') ? 'd' : type;
        is.align = sp.align == '<' ? '<' : 0;
        piece = format_int(v, is);
        break;
      }
      case 'e': case 'E': case 'f': case 'F': case 'g': case 'G': {
        if (arg.is_undefined()) fail_undefined(arg);
        if (!arg.is_number()) throw EvalError(fmt::format("must be real number, not {}", arg.type_name()));
        Spec fs = sp;
        fs.type = type;
        fs.align = sp.align == '<' ? '<' : 0;
        piece = format_float(arg.as_double(), fs);
        break;
      }
      case 'c': {
        std::string c = arg.is_string() ? arg.str() : "";
        if (!arg.is_string()) py::append_utf8(c, static_cast<char32_t>(to_index(arg)));
        piece = py::pad(c, sp.width, ' ', sp.align);
        break;
      }
      default: throw EvalError(fmt::format("unsupported format character '{}'", type));
    }
    out += piece;
  }
  if (!used_mapping && !mapping_like && next_arg < list.size())
    throw EvalError("not all arguments converted during string formatting");
  return out;
}

std::string format_spec(const Value& v, const std::string& spec) {
  if (spec.empty()) return to_str(v);
  Spec sp = parse_spec(spec);
  if (v.is_string()) {
    if (sp.type && sp.type != 's')
      throw EvalError(fmt::format("Unknown format code '{}' for object of type 'str'", sp.type));
    if (sp.align == '=') throw EvalError("'=' alignment not allowed in string format specifier");
    std::string s = v.str();
    if (sp.precision >= 0) {
      std::u32string u = py::decode(s);
      if (u.size() > static_cast<size_t>(sp.precision)) s = py::encode(std::u32string_view(u).substr(0, sp.precision));
    }
    return py::pad(s, sp.width, sp.fill, sp.align ? sp.align : '<');
  }
  if (v.is_int() || v.is_bool()) {
    if (sp.type && std::string_view("eEfFgG%").find(sp.type) != std::string_view::npos)
      return format_float(v.as_double(), sp);
    return format_int(v.as_int(), sp);
  }
  if (v.is_float()) return format_float(v.as_double(), sp);
  throw EvalError(fmt::format("unsupported format string passed to {}.__format__", v.type_name()));
}

std::string brace_format(const std::string& f, const CallArgs& args) {
  std::string out;
  size_t auto_idx = 0;
  bool used_auto = false, used_manual = false;
  auto lookup = [&](const std::string& field) -> Value {
    size_t i = 0;
    while (i < field.size() && field[i] != '.' && field[i] != '[') ++i;
    const std::string first = field.substr(0, i);
    Value v;
    if (first.empty()) {
      if (used_manual) throw EvalError("cannot switch from manual field specification to automatic field numbering");
      used_auto = true;
      if (auto_idx >= args.args.size())
        throw EvalError(fmt::format("Replacement index {} out of range for positional args tuple", auto_idx));
      v = args.args[auto_idx++];
    } else if (first.find_first_not_of("0123456789") == std::string::npos) {
      if (used_auto) throw EvalError("cannot switch from automatic field numbering to manual field specification");
      used_manual = true;
      const size_t idx = first.size() > 9 ? args.args.size() : std::stoul(first);
      if (idx >= args.args.size())
        throw EvalError(fmt::format("Replacement index {} out of range for positional args tuple", idx));
      v = args.args[idx];
    } else {
      bool found = false;
      for (const auto& [k, kv] : args.kwargs)
        if (k == first) v = kv, found = true;
      if (!found) throw EvalError(py::repr(first));
    }
    while (i < field.size()) {  // .attr and [key] on dicts and lists
      std::string key;
      if (field[i] == '.') {
        size_t j = i + 1;
        while (j < field.size() && field[j] != '.' && field[j] != '[') ++j;
        key = field.substr(i + 1, j - i - 1);
        i = j;
      } else {
        const size_t j = field.find(']', i);
        if (j == std::string::npos) throw EvalError("Missing ']' in format string");
        key = field.substr(i + 1, j - i - 1);
        i = j + 1;
      }
      const Value* found = nullptr;
      if (v.is_dict()) found = v.dict().find(Value(key));
      if (v.is_seq() && !key.empty() && key.size() < 10 && key.find_first_not_of("0123456789") == std::string::npos) {
        const size_t idx = std::stoul(key);
        if (idx < v.seq().items.size()) found = &v.seq().items[idx];
      }
      if (!found) throw EvalError(py::repr(key));
      v = *found;
    }
    return v;
  };
  for (size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if (c == '}') {
      if (i + 1 < f.size() && f[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      throw EvalError("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t j = i + 1;
    int nest = 1;
    while (j < f.size() && nest > 0) {
      if (f[j] == '{') ++nest;
      if (f[j] == '}') --nest;
      if (nest > 0) ++j;
    }
    if (j >= f.size()) throw EvalError("expected '}' before end of string");
    std::string field = f.substr(i + 1, j - i - 1);
    i = j;
    std::string spec;
    char conv = 0;
    const size_t colon = field.find(':');
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    const size_t bang = field.find('!');
    if (bang != std::string::npos) {
      if (bang + 2 != field.size()) throw EvalError("expected ':' after conversion specifier");
      conv = field[bang + 1];
      field.resize(bang);
    }
    if (spec.find('{') != std::string::npos) spec = brace_format(spec, args);
    Value v = lookup(field);
    if (conv == 'r' || conv == 'a') v = Value(repr(v));
    else if (conv == 's') v = Value(to_str(v));
    else if (conv) throw EvalError(fmt::format("Unknown conversion specifier {}", conv));
    out += format_spec(v, spec);
  }
  return out;
}

}  // namespace moeserve::tpl

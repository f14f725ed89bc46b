#include "cli/flags.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "core/error.h"

namespace moeserve::cli {

namespace {

int64_t parse_int(const std::string& flag, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  long long r = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE) throw_user("--{}: expected an integer, got '{}'", flag, v);
  return r;
}

// An integer flag's value within [min, max], or a UserError naming the flag and the range.
int64_t parse_int_in(const std::string& flag, const std::string& v, int64_t min, int64_t max) {
  const int64_t r = parse_int(flag, v);
  if (r < min || r > max) {
    if (max == INT64_MAX) throw_user("--{}: must be at least {}, got {}", flag, min, r);
    throw_user("--{}: must be between {} and {}, got {}", flag, min, max, r);
  }
  return r;
}

double parse_double(const std::string& flag, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  double r = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno == ERANGE) throw_user("--{}: expected a number, got '{}'", flag, v);
  return r;
}

// Edit distance for "did you mean" suggestions.
size_t distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string join(const std::vector<std::string>& v) {
  std::string r;
  for (auto& s : v) r += (r.empty() ? "" : ", ") + s;
  return r;
}

}  // namespace

void FlagSet::add_string(const std::string& name, std::string* dst, const std::string& help,
                         std::vector<std::string> choices) {
  Flag f{name, help, "STR", *dst, choices, nullptr};
  f.set = [this, name, dst, choices](const std::string& v) {
    if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end())
      throw_user("--{}: invalid value '{}' (valid: {})", name, v, join(choices));
    *dst = v;
  };
  flags_.push_back(std::move(f));
}

void FlagSet::add_int(const std::string& name, int64_t* dst, const std::string& help, int64_t min, int64_t max) {
  Flag f{name, help, "INT", std::to_string(*dst), {}, nullptr};
  f.set = [name, dst, min, max](const std::string& v) { *dst = parse_int_in(name, v, min, max); };
  flags_.push_back(std::move(f));
}

void FlagSet::add_double(const std::string& name, double* dst, const std::string& help, double min, double max) {
  Flag f{name, help, "NUM", fmt::format("{}", *dst), {}, nullptr};
  f.set = [name, dst, min, max](const std::string& v) {
    double r = parse_double(name, v);
    if (!(r >= min && r <= max)) throw_user("--{}: must be between {} and {}, got {}", name, min, max, v);
    *dst = r;
  };
  flags_.push_back(std::move(f));
}

void FlagSet::add_bool(const std::string& name, bool* dst, const std::string& help) {
  Flag f{name, help, "", *dst ? "true" : "false", {}, nullptr};
  f.is_bool = true;
  f.set = [name, dst](const std::string& v) {
    if (v == "" || v == "true" || v == "1") *dst = true;
    else if (v == "false" || v == "0") *dst = false;
    else throw_user("--{}: expected true or false, got '{}'", name, v);
  };
  flags_.push_back(std::move(f));
}

void FlagSet::add_int_list(const std::string& name, std::vector<int64_t>* dst, const std::string& help, int64_t min,
                           int64_t max) {
  Flag f{name, help, "INT[,INT...]", "", {}, nullptr};
  f.is_list = true;
  f.set = [name, dst, min, max](const std::string& v) {
    std::string cur;
    for (char c : v + ",") {
      if (c == ',' || c == ' ') {
        if (!cur.empty()) dst->push_back(parse_int_in(name, cur, min, max));
        cur.clear();
      } else {
        cur += c;
      }
    }
  };
  flags_.push_back(std::move(f));
}

void FlagSet::alias(const std::string& alias, const std::string& name) { aliases_.push_back({alias, name}); }

FlagSet::Flag* FlagSet::find(const std::string& name) {
  std::string n = name;
  for (auto& [a, target] : aliases_)
    if (a == name) n = target;
  for (auto& f : flags_)
    if (f.name == n) return &f;
  // SGLang accepts underscores in place of dashes.
  std::string dashed = n;
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  if (dashed != n) return find(dashed);
  return nullptr;
}

bool FlagSet::was_set(const std::string& name) const {
  for (auto& f : flags_)
    if (f.name == name) return f.set_by_user;
  return false;
}

bool FlagSet::parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (a.rfind("--", 0) != 0)
      throw_user("moeserve {}: unexpected argument '{}' (flags start with --; see moeserve {} --help)", command_, a,
                 command_);
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    Flag* f = find(name);
    if (!f) {
      std::string best;
      size_t bd = 4;
      for (auto& g : flags_)
        if (size_t d = distance(name, g.name); d < bd) bd = d, best = g.name;
      throw_user("moeserve {}: unknown flag --{}{} (see moeserve {} --help)", command_, name,
                 best.empty() ? "" : " (did you mean --" + best + "?)", command_);
    }
    if (!has_value) {
      if (f->is_bool) {
        // A following true/false is the value; anything else is the next flag.
        if (i + 1 < args.size() && (args[i + 1] == "true" || args[i + 1] == "false")) value = args[++i];
      } else if (f->is_list) {
        bool any = false;
        while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
          f->set(args[++i]);
          any = true;
        }
        if (!any) throw_user("--{}: needs a value", f->name);
        f->set_by_user = true;
        continue;
      } else {
        if (i + 1 >= args.size()) throw_user("--{}: needs a value", f->name);
        value = args[++i];
      }
    }
    f->set(value);
    f->set_by_user = true;
  }
  return true;
}

std::string FlagSet::help() const {
  std::string r = fmt::format("usage: moeserve {} [flags]\n\n{}\n\nflags:\n", command_, summary_);
  for (auto& f : flags_) {
    std::string head = "  --" + f.name + (f.kind.empty() ? "" : " " + f.kind);
    for (auto& [a, t] : aliases_)
      if (t == f.name) head += ", --" + a;
    std::string tail = f.help;
    if (!f.choices.empty()) tail += " {" + join(f.choices) + "}";
    // A help text that says its own default ("the model's") keeps it; the stored value would contradict it.
    if (!f.default_text.empty() && !f.is_list && f.help.find("(default:") == std::string::npos)
      tail += " (default: " + f.default_text + ")";
    if (head.size() < 34) r += fmt::format("{:<34}{}\n", head, tail);
    else r += head + "\n" + std::string(34, ' ') + tail + "\n";
  }
  return r;
}

}  // namespace moeserve::cli

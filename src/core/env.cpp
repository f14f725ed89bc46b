#include "core/env.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "core/log.h"

namespace moeserve {

std::optional<bool> parse_env_flag(std::string_view value) {
  std::string v(value);
  for (char& c : v) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  return std::nullopt;
}

std::optional<long> parse_env_int(std::string_view value, long lo, long hi) {
  const std::string v(value);
  if (v.empty() || std::isspace(static_cast<unsigned char>(v[0]))) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (errno != 0 || end != v.c_str() + v.size() || x < lo || x > hi) return std::nullopt;
  return x;
}

bool env_flag(const char* name, bool fallback) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return fallback;
  if (std::optional<bool> v = parse_env_flag(e)) return *v;
  log_warn("{}='{}' is not a switch value (1/0, true/false, on/off, yes/no): using the default, {}", name,
           std::string(e), fallback ? "on" : "off");
  return fallback;
}

long env_int(const char* name, long fallback, long lo, long hi) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return fallback;
  if (std::optional<long> v = parse_env_int(e, lo, hi)) return *v;
  log_warn("{}='{}' is not an integer from {} to {}: using the default, {}", name, std::string(e), lo, hi, fallback);
  return fallback;
}

}  // namespace moeserve

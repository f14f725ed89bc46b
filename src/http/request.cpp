#include "http/request.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_depth.h"

namespace moeserve::http {

namespace {

char ascii_lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  }
  return true;
}

void Headers::add(std::string name, std::string value) { fields_.emplace_back(std::move(name), std::move(value)); }

const std::string* Headers::find(std::string_view name) const {
  for (const auto& [n, v] : fields_) {
    if (iequals(n, name)) return &v;
  }
  return nullptr;
}

std::string Headers::get(std::string_view name, std::string_view fallback) const {
  const std::string* v = find(name);
  return v ? *v : std::string(fallback);
}

std::optional<std::string> Request::query_param(std::string_view name) const {
  auto it = query.find(std::string(name));
  if (it == query.end()) return std::nullopt;
  return it->second;
}

nlohmann::json Request::json() const {
  if (body.empty()) throw UserError("the request body is empty; expected a JSON object");
  if (json_nesting_exceeds(body))
    throw UserError(fmt::format("the request body nests arrays and objects more than {} levels deep", kMaxJsonDepth));
  try {
    return nlohmann::json::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    throw UserError(fmt::format("the request body is not valid JSON: {}", e.what()));
  }
}

std::string percent_decode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '%' && i + 2 < s.size()) {
      int hi = hex_value(s[i + 1]);
      int lo = hex_value(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        continue;
      }
    }
    out.push_back(plus_is_space && c == '+' ? ' ' : c);
  }
  return out;
}

void split_target(std::string_view target, std::string& path, std::map<std::string, std::string>& query) {
  size_t q = target.find('?');
  path = std::string(target.substr(0, q));
  query.clear();
  if (q == std::string_view::npos) return;
  std::string_view rest = target.substr(q + 1);
  size_t hash = rest.find('#');
  if (hash != std::string_view::npos) rest = rest.substr(0, hash);
  while (!rest.empty()) {
    size_t amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view{} : rest.substr(amp + 1);
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    std::string key = percent_decode(pair.substr(0, eq), true);
    std::string value = eq == std::string_view::npos ? std::string() : percent_decode(pair.substr(eq + 1), true);
    query[std::move(key)] = std::move(value);
  }
}

}  // namespace moeserve::http

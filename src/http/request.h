// One parsed HTTP request as a route handler sees it. Plain data: no transport types.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace moeserve::http {

// ASCII case-insensitive equality (header names, the "Bearer" scheme).
bool iequals(std::string_view a, std::string_view b);

// Header fields in arrival order; lookups ignore case as HTTP requires.
class Headers {
 public:
  void add(std::string name, std::string value);
  // The first field called `name`, or nullptr.
  const std::string* find(std::string_view name) const;
  std::string get(std::string_view name, std::string_view fallback = {}) const;
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  const std::vector<std::pair<std::string, std::string>>& fields() const { return fields_; }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

struct Request {
  std::string method;                        // as sent: "GET", "POST", ...
  std::string target;                        // raw request-target: "/v1/models?x=1"
  std::string path;                          // target before '?', not decoded: "/v1/models"
  std::map<std::string, std::string> query;  // decoded query parameters (the last of repeated names wins)
  Headers headers;
  std::string body;  // whole body (Content-Length or chunked), at most ServerOptions::max_body_bytes
  std::string remote_address;
  uint16_t remote_port = 0;
  int version = 11;  // 10 for HTTP/1.0, 11 for HTTP/1.1

  const std::string* header(std::string_view name) const { return headers.find(name); }
  std::optional<std::string> query_param(std::string_view name) const;
  // The body parsed as JSON; throws UserError (answered 400) when it is not valid JSON.
  nlohmann::json json() const;
};

// Percent-decoding for query components ('+' is a space there). Malformed escapes are kept verbatim.
std::string percent_decode(std::string_view s, bool plus_is_space);

// Splits a request-target into its path and decoded query parameters.
void split_target(std::string_view target, std::string& path, std::map<std::string, std::string>& query);

}  // namespace moeserve::http

#include "http/router.h"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "core/error.h"
#include "http/errors.h"

namespace moeserve::http {

bool constant_time_equals(std::string_view a, std::string_view b) {
  size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() != b.size() ? 1u : 0u;
  for (size_t i = 0; i < n; ++i) {
    unsigned char ca = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char cb = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(ca ^ cb);
  }
  return diff == 0;
}

void Router::add(std::string method, std::string path, Handler handler) {
  MS_CHECK(handler != nullptr, "route {} {} has no handler", method, path);
  MS_CHECK(!path.empty() && path[0] == '/', "route path must start with '/': {}", path);
  auto& routes = routes_[path];
  for (const Route& r : routes) MS_CHECK(r.method != method, "route {} {} registered twice", method, path);
  routes.push_back(Route{std::move(method), std::move(handler)});
}

void Router::set_api_key(std::string key, std::vector<std::string> exempt_paths) {
  api_key_ = std::move(key);
  exempt_paths_ = std::move(exempt_paths);
}

bool Router::authorized(const Request& request) const {
  if (api_key_.empty()) return true;
  if (std::find(exempt_paths_.begin(), exempt_paths_.end(), request.path) != exempt_paths_.end()) return true;
  const std::string* auth = request.header("Authorization");
  if (auth == nullptr) return false;
  std::string_view v = *auth;
  constexpr std::string_view kScheme = "Bearer";
  if (v.size() <= kScheme.size() || !iequals(v.substr(0, kScheme.size()), kScheme) || v[kScheme.size()] != ' ') {
    return false;
  }
  v.remove_prefix(kScheme.size());
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return constant_time_equals(v, api_key_);
}

Router::RouteMap::const_iterator Router::wildcard_route(std::string_view path) const {
  auto best = routes_.end();
  for (auto it = routes_.begin(); it != routes_.end(); ++it) {
    std::string_view prefix = it->first;
    if (prefix.size() < 2 || prefix.substr(prefix.size() - 2) != "/*") continue;
    prefix.remove_suffix(1);  // keeps the '/': "/v1/models/*" takes "/v1/models/x", not "/v1/models/"
    if (path.size() > prefix.size() && path.substr(0, prefix.size()) == prefix &&
        (best == routes_.end() || it->first.size() > best->first.size()))
      best = it;
  }
  return best;
}

void Router::dispatch(const Request& request, const std::shared_ptr<Responder>& responder) const {
  if (!authorized(request)) {
    responder->set_header("WWW-Authenticate", "Bearer");
    responder->respond_error(401, "Invalid or missing API key: send 'Authorization: Bearer <key>'.");
    return;
  }
  auto it = routes_.find(request.path);
  if (it == routes_.end()) it = wildcard_route(request.path);
  if (it == routes_.end()) {
    responder->respond_error(404, fmt::format("Not found: {} {}", request.method, request.path));
    return;
  }
  const Route* route = nullptr;
  std::string allow;
  for (const Route& r : it->second) {
    if (r.method == request.method) route = &r;
    allow += allow.empty() ? r.method : ", " + r.method;
  }
  if (route == nullptr) {
    responder->set_header("Allow", allow);
    responder->respond_error(
        405, fmt::format("Method {} is not allowed for {} (allowed: {})", request.method, request.path, allow));
    return;
  }
  try {
    route->handler(request, responder);
  } catch (const UserError& e) {
    if (!responder->started()) responder->respond_error(400, e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moeserve http: handler for %s %s threw: %s\n", request.method.c_str(),
                 request.path.c_str(), e.what());
    if (!responder->started()) responder->respond_error(500, fmt::format("internal error: {}", e.what()));
  } catch (...) {
    if (!responder->started()) responder->respond_error(500, "internal error");
  }
}

}  // namespace moeserve::http

// Route table and API-key policy: (method, path) -> handler, 401 / 404 / 405 answered here.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "http/request.h"
#include "http/responder.h"

namespace moeserve::http {

// Runs on an I/O thread and must not block: parse the request, hand the Responder to whoever completes it.
// A UserError thrown before the response started is answered 400 with its message; any other exception 500.
using Handler = std::function<void(const Request&, std::shared_ptr<Responder>)>;

class Router {
 public:
  // A path ending in "/*" takes every path below it that no exact route takes (the longest such prefix wins).
  void add(std::string method, std::string path, Handler handler);
  // With a non-empty key, every path except `exempt_paths` needs "Authorization: Bearer <key>".
  void set_api_key(std::string key, std::vector<std::string> exempt_paths);

  void dispatch(const Request& request, const std::shared_ptr<Responder>& responder) const;

 private:
  struct Route {
    std::string method;
    Handler handler;
  };
  using RouteMap = std::map<std::string, std::vector<Route>, std::less<>>;
  bool authorized(const Request& request) const;
  RouteMap::const_iterator wildcard_route(std::string_view path) const;

  RouteMap routes_;
  std::string api_key_;
  std::vector<std::string> exempt_paths_;
};

// Equality whose time does not depend on where the inputs differ (only on their lengths).
bool constant_time_equals(std::string_view a, std::string_view b);

}  // namespace moeserve::http

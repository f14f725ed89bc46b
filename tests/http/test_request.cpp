// Pieces of the transport that need no socket: target splitting, decoding, error bodies, key comparison.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "http/errors.h"
#include "http/request.h"
#include "http/router.h"

namespace moeserve::http {
namespace {

TEST(HttpRequest, SplitTargetDecodesQuery) {
  std::string path;
  std::map<std::string, std::string> query;
  split_target("/v1/models?name=a%20b&flag&x=1+2&x=3&empty=#frag", path, query);
  EXPECT_EQ(path, "/v1/models");
  EXPECT_EQ(query.at("name"), "a b");
  EXPECT_EQ(query.at("flag"), "");
  EXPECT_EQ(query.at("x"), "3");  // the last one wins
  EXPECT_EQ(query.at("empty"), "");
  EXPECT_EQ(query.size(), 4u);

  split_target("/health", path, query);
  EXPECT_EQ(path, "/health");
  EXPECT_TRUE(query.empty());
}

TEST(HttpRequest, PercentDecodeKeepsMalformedEscapes) {
  EXPECT_EQ(percent_decode("a%2Fb%zz%4", false), "a/b%zz%4");
  EXPECT_EQ(percent_decode("a+b", false), "a+b");
  EXPECT_EQ(percent_decode("a+b", true), "a b");
  EXPECT_EQ(percent_decode("%", true), "%");
}

TEST(HttpRequest, HeadersIgnoreCase) {
  Headers h;
  h.add("Content-Type", "application/json");
  h.add("X-Thing", "1");
  h.add("x-thing", "2");
  ASSERT_NE(h.find("content-type"), nullptr);
  EXPECT_EQ(*h.find("CONTENT-TYPE"), "application/json");
  EXPECT_EQ(h.get("X-THING"), "1");  // the first one
  EXPECT_EQ(h.get("missing", "dflt"), "dflt");
  EXPECT_FALSE(h.contains("content-length"));
}

TEST(HttpRequest, JsonBodyErrorsAreUserErrors) {
  Request r;
  r.body = R"({"a": [1, 2]})";
  EXPECT_EQ(r.json()["a"][1], 2);
  r.body = "{not json";
  EXPECT_THROW(r.json(), UserError);
  r.body.clear();
  EXPECT_THROW(r.json(), UserError);
  // Nesting past core/json_depth.h's limit is refused before parsing (a JSON value that deep would overflow the
  // stack when copied); at the limit it parses.
  r.body = std::string(300, '[') + std::string(300, ']');
  EXPECT_THROW(r.json(), UserError);
  r.body = std::string(256, '[') + std::string(256, ']');
  EXPECT_TRUE(r.json().is_array());
}

TEST(HttpErrors, OpenAIErrorShape) {
  auto e = error_json(404, "no such model");
  EXPECT_EQ(e, nlohmann::json::parse(
                   R"({"error": {"message": "no such model", "type": "invalid_request_error",
                                 "param": null, "code": 404}})"));
  auto s = error_json(503, "not ready", {}, "model");
  EXPECT_EQ(s["error"]["type"], "server_error");
  EXPECT_EQ(s["error"]["param"], "model");
  EXPECT_EQ(s["error"]["code"], 503);
  EXPECT_EQ(error_json(400, "x", "BadRequestError")["error"]["type"], "BadRequestError");
  EXPECT_EQ(status_reason(413), "Content Too Large");
  EXPECT_EQ(status_reason(599), "Unknown");
}

TEST(HttpRouter, ConstantTimeEquals) {
  EXPECT_TRUE(constant_time_equals("secret", "secret"));
  EXPECT_FALSE(constant_time_equals("secret", "secreT"));
  EXPECT_FALSE(constant_time_equals("secret", "secret1"));
  EXPECT_FALSE(constant_time_equals("", "a"));
  EXPECT_TRUE(constant_time_equals("", ""));
}

TEST(HttpRouter, DuplicateRouteIsABug) {
  Router router;
  router.add("GET", "/a", [](const Request&, std::shared_ptr<Responder>) {});
  EXPECT_THROW(router.add("GET", "/a", [](const Request&, std::shared_ptr<Responder>) {}), InternalError);
  EXPECT_NO_THROW(router.add("POST", "/a", [](const Request&, std::shared_ptr<Responder>) {}));
}

}  // namespace
}  // namespace moeserve::http

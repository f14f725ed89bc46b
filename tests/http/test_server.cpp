// Request/response behaviour of the server over real sockets on 127.0.0.1 (ephemeral ports).
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/error.h"
#include "http/server.h"
#include "raw_client.h"

namespace moeserve::http {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using test::RawClient;
using test::get_request;
using test::post_request;

ServerOptions test_options() {
  ServerOptions o;
  o.port = 0;
  o.io_threads = 2;
  return o;
}

void add_basic_routes(Server& s) {
  s.route("GET", "/health", [](const Request&, std::shared_ptr<Responder> r) { r->respond(200, "text/plain", "ok"); });
  s.route("GET", "/v1/models", [](const Request&, std::shared_ptr<Responder> r) {
    r->respond_json(200, {{"object", "list"}, {"data", json::array({{{"id", "m"}}})}});
  });
  s.route("POST", "/echo", [](const Request& req, std::shared_ptr<Responder> r) {
    json in = req.json();
    r->respond_json(200, {{"body", in},
                          {"method", req.method},
                          {"path", req.path},
                          {"query", req.query},
                          {"x_test", req.headers.get("x-TEST")},
                          {"remote", req.remote_address},
                          {"version", req.version}});
  });
}

TEST(HttpServer, GetAndPostJson) {
  Server server(test_options());
  add_basic_routes(server);
  server.start();
  ASSERT_NE(server.port(), 0);

  RawClient c(server.port());
  c.send(get_request("/v1/models"));
  auto r = c.read_response();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-type"), "application/json");
  EXPECT_EQ(json::parse(r.body)["data"][0]["id"], "m");

  c.send(post_request("/echo?a=1&b=x%2Fy", R"({"messages": [{"role": "user", "content": "hi"}]})",
                      "X-Test: value\r\n"));
  r = c.read_response();
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["body"]["messages"][0]["content"], "hi");
  EXPECT_EQ(j["method"], "POST");
  EXPECT_EQ(j["path"], "/echo");
  EXPECT_EQ(j["query"]["a"], "1");
  EXPECT_EQ(j["query"]["b"], "x/y");
  EXPECT_EQ(j["x_test"], "value");
  EXPECT_EQ(j["remote"], "127.0.0.1");
  EXPECT_EQ(j["version"], 11);
}

TEST(HttpServer, NotFoundAndMethodNotAllowedUseTheErrorShape) {
  Server server(test_options());
  add_basic_routes(server);
  server.start();
  RawClient c(server.port());

  c.send(get_request("/nope"));
  auto r = c.read_response();
  EXPECT_EQ(r.status, 404);
  json j = json::parse(r.body);
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["code"], 404);
  EXPECT_TRUE(j["error"]["param"].is_null());
  EXPECT_NE(j["error"]["message"].get<std::string>().find("/nope"), std::string::npos);

  c.send(post_request("/v1/models", "{}"));
  r = c.read_response();
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.header("allow"), "GET");
  j = json::parse(r.body);
  EXPECT_EQ(j["error"]["code"], 405);
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");

  // The connection is still usable after both.
  c.send(get_request("/health"));
  EXPECT_EQ(c.read_response().status, 200);
}

TEST(HttpServer, PrefixRoutesTakeWhatNoExactRouteTakes) {
  Server server(test_options());
  add_basic_routes(server);
  auto named = [](std::string name) {
    return [name](const Request& req, std::shared_ptr<Responder> r) {
      r->respond_json(200, {{"route", name}, {"path", req.path}});
    };
  };
  server.route("GET", "/v1/models/*", named("model"));
  server.route("GET", "/v1/models/special", named("exact"));
  server.route("GET", "/v1/models/a/*", named("longer"));
  server.start();
  RawClient c(server.port());
  auto route_of = [&](const std::string& path) {
    c.send(get_request(path));
    auto r = c.read_response();
    if (r.status != 200) return std::to_string(r.status);
    json j = json::parse(r.body);
    return j.contains("route") ? j["route"].get<std::string>() : std::string("list");
  };
  EXPECT_EQ(route_of("/v1/models/x"), "model");
  EXPECT_EQ(route_of("/v1/models/Qwen%2FQwen3"), "model");
  EXPECT_EQ(route_of("/v1/models/Qwen/Qwen3"), "model");
  EXPECT_EQ(route_of("/v1/models/special"), "exact");
  EXPECT_EQ(route_of("/v1/models/a/b"), "longer");
  EXPECT_EQ(route_of("/v1/models/a"), "model");
  EXPECT_EQ(route_of("/v1/models"), "list");  // add_basic_routes' exact route
  EXPECT_EQ(route_of("/v1/models/"), "404");   // the prefix alone is not below it
  EXPECT_EQ(route_of("/v1/modelsx"), "404");
  EXPECT_EQ(route_of("/v1/models/*"), "model");  // a literal '*' is just a name
  c.send(post_request("/v1/models/x", "{}"));
  EXPECT_EQ(c.read_response().status, 405);
}

TEST(HttpServer, HandlerErrorsBecome400And500) {
  Server server(test_options());
  add_basic_routes(server);
  server.route("GET", "/throws", [](const Request&, std::shared_ptr<Responder>) {
    throw std::runtime_error("boom");
  });
  server.route("GET", "/drops", [](const Request&, std::shared_ptr<Responder>) {});
  server.start();
  RawClient c(server.port());

  c.send(post_request("/echo", "{bad json"));
  auto r = c.read_response();
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(json::parse(r.body)["error"]["message"].get<std::string>().find("not valid JSON"), std::string::npos);

  c.send(get_request("/throws"));
  r = c.read_response();
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "server_error");

  RawClient c2(server.port());
  c2.send(get_request("/drops"));
  r = c2.read_response();
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(r.header("connection"), "close");
}

TEST(HttpServer, ApiKey) {
  ServerOptions o = test_options();
  o.api_key = "sk-test-123";
  Server server(o);
  add_basic_routes(server);
  server.route("GET", "/metrics", [](const Request&, std::shared_ptr<Responder> r) { r->respond(200, "text/plain", "m 1\n"); });
  server.start();
  RawClient c(server.port());

  c.send(get_request("/v1/models"));
  auto r = c.read_response();
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(json::parse(r.body)["error"]["code"], 401);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "invalid_request_error");

  c.send(get_request("/v1/models", "Authorization: Bearer sk-test-12\r\n"));
  EXPECT_EQ(c.read_response().status, 401);
  c.send(get_request("/v1/models", "Authorization: Basic sk-test-123\r\n"));
  EXPECT_EQ(c.read_response().status, 401);
  c.send(get_request("/v1/models", "Authorization: Bearer sk-test-123\r\n"));
  EXPECT_EQ(c.read_response().status, 200);
  c.send(get_request("/v1/models", "authorization: bearer sk-test-123\r\n"));
  EXPECT_EQ(c.read_response().status, 200);

  // Exempt paths need no key.
  c.send(get_request("/health"));
  EXPECT_EQ(c.read_response().status, 200);
  c.send(get_request("/metrics"));
  EXPECT_EQ(c.read_response().status, 200);
}

TEST(HttpServer, BodyLimitAnswers413AndTheServerGoesOn) {
  ServerOptions o = test_options();
  o.max_body_bytes = 1024;
  Server server(o);
  add_basic_routes(server);
  server.start();

  {  // Declared too large: answered before the body is read.
    RawClient c(server.port());
    c.send(post_request("/echo", std::string(5000, 'x')));
    auto r = c.read_response();
    EXPECT_EQ(r.status, 413);
    EXPECT_EQ(json::parse(r.body)["error"]["code"], 413);
    EXPECT_EQ(r.header("connection"), "close");
    EXPECT_TRUE(c.wait_closed(3s));
  }
  {  // Chunked, growing past the limit.
    RawClient c(server.port());
    std::string req = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 3; ++i) req += "200\r\n" + std::string(512, 'y') + "\r\n";
    req += "0\r\n\r\n";
    c.send(req);
    EXPECT_EQ(c.read_response().status, 413);
    EXPECT_TRUE(c.wait_closed(3s));
  }
  {  // "Expect: 100-continue" with a body too large: 413 instead of 100.
    RawClient c(server.port());
    c.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n");
    EXPECT_EQ(c.read_response().status, 413);
  }
  RawClient c(server.port());
  c.send(post_request("/echo", R"({"ok": true})"));
  auto r = c.read_response();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["body"]["ok"], true);
}

TEST(HttpServer, ChunkedRequestBodyAndExpectContinue) {
  Server server(test_options());
  add_basic_routes(server);
  server.start();
  RawClient c(server.port());
  c.send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
         "5\r\n{\"a\":\r\n3;ext=1\r\n 42\r\n1\r\n}\r\n0\r\n\r\n");
  auto r = c.read_response();
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["body"]["a"], 42);

  std::string body = R"({"b": "expect"})";
  c.send(fmt::format("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
                     body.size()));
  EXPECT_EQ(c.read_response().status, 100);
  c.send(body);
  r = c.read_response();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["body"]["b"], "expect");
}

TEST(HttpServer, MalformedRequestsAre400AndClosed) {
  Server server(test_options());
  add_basic_routes(server);
  server.start();
  for (std::string bad : {"GARBAGE\r\n\r\n", "GET /health HTTP/9.9\r\n\r\n", "GET /x HTTP/1.1\r\nBad Header\r\n\r\n",
                          "POST /echo HTTP/1.1\r\nContent-Length: abc\r\n\r\n"}) {
    RawClient c(server.port());
    c.send(bad);
    auto r = c.read_response();
    EXPECT_EQ(r.status, 400) << bad;
    EXPECT_EQ(json::parse(r.body)["error"]["code"], 400);
    EXPECT_TRUE(c.wait_closed(3s)) << bad;
  }
  // A request after a good one on the same connection: the good one is answered first.
  RawClient c(server.port());
  c.send(get_request("/health") + "NOT HTTP\r\n\r\n");
  EXPECT_EQ(c.read_response().status, 200);
  EXPECT_EQ(c.read_response().status, 400);
  EXPECT_TRUE(c.wait_closed(3s));
}

TEST(HttpServer, HeaderLimit431) {
  ServerOptions o = test_options();
  o.max_header_bytes = 2048;
  Server server(o);
  add_basic_routes(server);
  server.start();
  RawClient c(server.port());
  c.send(get_request("/health", "X-Big: " + std::string(4000, 'a') + "\r\n"));
  auto r = c.read_response();
  EXPECT_EQ(r.status, 431);
  EXPECT_TRUE(c.wait_closed(3s));
  RawClient c2(server.port());
  c2.send(get_request("/health", "X-Small: " + std::string(1000, 'a') + "\r\n"));
  EXPECT_EQ(c2.read_response().status, 200);
}

TEST(HttpServer, KeepAliveManyRequestsOneConnection) {
  Server server(test_options());
  add_basic_routes(server);
  server.start();
  RawClient c(server.port());
  for (int i = 0; i < 20; ++i) {
    c.send(post_request("/echo", fmt::format(R"({{"i": {}}})", i)));
    auto r = c.read_response();
    ASSERT_EQ(r.status, 200);
    EXPECT_EQ(json::parse(r.body)["body"]["i"], i);
    EXPECT_EQ(r.header("connection"), "keep-alive");
  }
  EXPECT_EQ(server.open_connections(), 1u);
}

TEST(HttpServer, PipelinedRequestsAnsweredInOrder) {
  Server server(test_options());
  add_basic_routes(server);
  std::vector<std::thread> workers;
  std::mutex mu;
  // The first request completes last (from another thread); its answer must still come first.
  server.route("GET", "/slow", [&](const Request& req, std::shared_ptr<Responder> r) {
    std::lock_guard lock(mu);
    workers.emplace_back([r, id = req.query_param("id").value_or("?")] {
      std::this_thread::sleep_for(100ms);
      r->respond(200, "text/plain", "slow " + id);
    });
  });
  server.start();
  RawClient c(server.port());
  c.send(get_request("/slow?id=1") + get_request("/health") + post_request("/echo", R"({"n": 3})") +
         get_request("/slow?id=4"));
  EXPECT_EQ(c.read_response().body, "slow 1");
  EXPECT_EQ(c.read_response().body, "ok");
  EXPECT_EQ(json::parse(c.read_response().body)["body"]["n"], 3);
  EXPECT_EQ(c.read_response().body, "slow 4");
  std::lock_guard lock(mu);
  for (auto& t : workers) t.join();
}

TEST(HttpServer, DeepPipelinePausesReadingAndResumes) {
  ServerOptions o = test_options();
  o.max_pipelined_requests = 1;
  Server server(o);
  add_basic_routes(server);
  server.start();
  RawClient c(server.port());
  std::string burst;
  for (int i = 0; i < 30; ++i) burst += post_request("/echo", fmt::format(R"({{"i": {}}})", i));
  c.send(burst);
  for (int i = 0; i < 30; ++i) {
    auto r = c.read_response();
    ASSERT_EQ(r.status, 200);
    EXPECT_EQ(json::parse(r.body)["body"]["i"], i);
  }
}

TEST(HttpServer, ConnectionLimitAnswers503) {
  ServerOptions o = test_options();
  o.max_connections = 2;
  Server server(o);
  add_basic_routes(server);
  server.start();
  RawClient a(server.port());
  RawClient b(server.port());
  for (RawClient* c : {&a, &b}) {
    c->send(get_request("/health"));
    EXPECT_EQ(c->read_response().status, 200);
  }
  RawClient over(server.port());
  over.send(get_request("/health"));
  auto r = over.read_response();
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "server_error");
  EXPECT_TRUE(over.wait_closed(3s));
  over.close();  // else the server lingers on it (linger_timeout) waiting for the client's close
  a.close();
  // Once a slot is free, new connections are served again.
  auto deadline = std::chrono::steady_clock::now() + 3s;
  int status = 0;
  while (status != 200 && std::chrono::steady_clock::now() < deadline) {
    RawClient c(server.port());
    c.send(get_request("/health"));
    status = c.read_response().status;
  }
  EXPECT_EQ(status, 200);
}

TEST(HttpServer, ResponseCompletedFromAnotherThread) {
  Server server(test_options());
  std::thread worker;
  std::atomic<bool> disconnect_called{false};
  server.route("POST", "/generate", [&](const Request& req, std::shared_ptr<Responder> r) {
    r->on_disconnect([&] { disconnect_called = true; });
    worker = std::thread([r, body = req.body] {
      std::this_thread::sleep_for(150ms);
      EXPECT_TRUE(r->is_open());
      EXPECT_TRUE(r->respond_json(200, {{"text", json::parse(body)["text"]}}));
      EXPECT_FALSE(r->is_open());
      EXPECT_FALSE(r->respond_json(200, {}));  // only once
    });
  });
  server.start();
  RawClient c(server.port());
  auto t0 = std::chrono::steady_clock::now();
  c.send(post_request("/generate", R"({"text": "later"})"));
  auto r = c.read_response();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 140ms);
  EXPECT_EQ(json::parse(r.body)["text"], "later");
  worker.join();
  c.close();
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(disconnect_called);  // the response was complete before the client left
}

TEST(HttpServer, HalfClosedClientStillGetsItsAnswer) {
  Server server(test_options());
  add_basic_routes(server);
  server.start();
  RawClient c(server.port());
  c.send(get_request("/health") + post_request("/echo", "{}"));
  c.shutdown_write();
  EXPECT_EQ(c.read_response().body, "ok");
  EXPECT_EQ(c.read_response().status, 200);
  EXPECT_TRUE(c.wait_closed(3s));
}

TEST(HttpServer, Http10GetsCloseDelimitedAnswers) {
  Server server(test_options());
  add_basic_routes(server);
  server.start();
  RawClient c(server.port());
  c.send("GET /health HTTP/1.0\r\n\r\n");
  auto r = c.read_response();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok");
  EXPECT_EQ(r.header("connection"), "close");
  EXPECT_TRUE(c.wait_closed(3s));
}

TEST(HttpServer, SlowAndIdleClientsAreDropped) {
  ServerOptions o = test_options();
  o.header_timeout = 300ms;
  o.body_timeout = 300ms;
  o.idle_timeout = 400ms;
  Server server(o);
  add_basic_routes(server);
  server.start();

  auto t0 = std::chrono::steady_clock::now();
  RawClient slow_header(server.port());
  slow_header.send("GET /health HTTP/1.1\r\nHost: x\r\n");  // never finishes the header
  RawClient slow_body(server.port());
  slow_body.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"a\":");
  RawClient idle(server.port());
  RawClient used(server.port());
  used.send(get_request("/health"));
  EXPECT_EQ(used.read_response().status, 200);

  EXPECT_EQ(slow_header.read_response(3s).status, 408);
  EXPECT_TRUE(slow_header.wait_closed(3s));
  EXPECT_EQ(slow_body.read_response(3s).status, 408);
  EXPECT_TRUE(slow_body.wait_closed(3s));
  EXPECT_TRUE(idle.wait_closed(3s));
  EXPECT_TRUE(idle.buffer().empty());
  EXPECT_TRUE(used.wait_closed(3s));
  auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(elapsed, 280ms);
  EXPECT_LT(elapsed, 2500ms);
}

TEST(HttpServer, PortInUseIsAClearUserError) {
  Server first(test_options());
  first.start();
  ServerOptions o = test_options();
  o.port = first.port();
  Server second(o);
  try {
    second.start();
    FAIL() << "second server started on a used port";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("port {} is in use: ", first.port())), std::string::npos)
        << e.what();
  }
}

TEST(HttpServer, AddressNotOnThisMachineIsAUserError) {
  ServerOptions o = test_options();
  o.host = "192.0.2.1";  // TEST-NET-1: never a local address
  Server server(o);
  EXPECT_THROW(server.start(), UserError);
}

}  // namespace
}  // namespace moeserve::http

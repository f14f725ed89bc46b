// The check of the http_request target: whatever bytes a client sends, the server (src/http: Beast's request
// parser, our connection state machine, pipelining, 100-continue, limits, timeouts) answers with well-formed HTTP
// responses or closes the connection, promptly, never with a 5xx, and goes on serving other clients. Kept apart
// from fuzz_checks.h because it links the transport (Asio + Beast) and the bench client's response parser.
//
// Input layout: byte 0 = flags (bit 0: the bytes go out in two writes 2 ms apart, split where byte 1 says, so that
// the server parses a request that arrives in pieces), byte 1 = the split point (as a fraction of the rest / 255),
// then the bytes sent on one connection. The client half-closes after them and reads until the server closes.
//
// What must hold:
//   - the server closes the connection within 5 s of the half-close (its timeouts here are 20-1,000 ms);
//   - what it sent parses as a sequence of HTTP/1.x responses (HttpResponseParser, the one `moeserve bench` uses;
//     a "100 Continue" may stand alone when the client closes before sending the body it announced),
//     each with a status of 100-499 or 503 (a 500 would be an internal error, a 501-502 / 504-599 one we never send);
//     after a response to a HEAD request only the first response is checked (its body is absent by design);
//   - a new connection then gets 200 from GET /health: no input leaves the server unable to serve.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "benchclient/http_parser.h"
#include "fuzz_checks.h"
#include "http/server.h"

namespace moeserve::fuzz {

namespace http_detail {

// One server for the whole run, on an ephemeral port of 127.0.0.1, with short timeouts and small limits so that
// the fuzzer reaches them.
inline http::Server& fuzz_server() {
  static const std::unique_ptr<http::Server> s = [] {
    http::ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.io_threads = 2;
    o.max_body_bytes = 4096;
    o.max_header_bytes = 2048;
    o.idle_timeout = std::chrono::milliseconds(300);
    o.header_timeout = std::chrono::milliseconds(100);
    o.body_timeout = std::chrono::milliseconds(100);
    o.write_timeout = std::chrono::milliseconds(1000);
    o.linger_timeout = std::chrono::milliseconds(20);
    o.api_key = "k";  // every route but /health needs "Authorization: Bearer k" (the seeds carry it)
    auto srv = std::make_unique<http::Server>(o);
    srv->route("GET", "/health", [](const http::Request&, std::shared_ptr<http::Responder> r) {
      r->respond(200, "text/plain", "ok");
    });
    // The body's size only: a reflected body could contain text that looks like a status line.
    srv->route("POST", "/echo", [](const http::Request& req, std::shared_ptr<http::Responder> r) {
      r->respond(200, "text/plain", std::to_string(req.body.size()) + " bytes");
    });
    srv->route("POST", "/json", [](const http::Request& req, std::shared_ptr<http::Responder> r) {
      r->respond(200, "text/plain", req.json().is_object() ? "object" : "other");  // bad JSON: UserError -> 400
    });
    srv->route("GET", "/stream", [](const http::Request&, std::shared_ptr<http::Responder> r) {
      r->start_stream();
      for (int i = 0; i < 3; ++i) r->send_data("{\"i\": " + std::to_string(i) + "}");
      r->send_done();
      r->end();
    });
    srv->start();
    return srv;
  }();
  return *s;
}

// Each connection from the next of 250 loopback source addresses (127.0.1.1 ..): the server closes first, so every
// exchange leaves its 4-tuple in TIME_WAIT for a minute, and from one source address the ~28 k ephemeral ports ran
// out after ~29 k inputs ("cannot connect": EADDRNOTAVAIL).
inline int connect_local(int port) {
  static unsigned next_source = 0;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  FUZZ_CHECK(fd >= 0, "socket() failed");
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl((127u << 24) | (1u << 8) | (1u + next_source++ % 250u));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) {
    const int e = errno;
    ::close(fd);
    FUZZ_CHECK(false, "cannot bind a loopback source address: {}", std::strerror(e));
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    const int e = errno;
    ::close(fd);
    FUZZ_CHECK(false, "cannot connect to the server on port {}: {}", port, std::strerror(e));
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// Sends what it can (the server may close early, after an error response: that is allowed).
inline void send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    bytes.remove_prefix(size_t(n));
  }
}

// Reads until the peer closes (true) or `timeout` passes without it (false).
inline bool read_until_close(int fd, std::string& out, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[16384];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, int(left.count())) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;  // closed (or reset)
    out.append(buf, size_t(n));
  }
}

struct Fd {
  int fd;
  ~Fd() { ::close(fd); }
};

}  // namespace http_detail

inline void check_http_request(std::string_view in) {
  using namespace http_detail;
  http::Server& srv = fuzz_server();
  const uint8_t flags = in.size() > 0 ? uint8_t(in[0]) : 0, split = in.size() > 1 ? uint8_t(in[1]) : 0;
  std::string_view bytes = in.size() > 2 ? in.substr(2) : std::string_view();

  std::string out;
  {
    Fd c{connect_local(srv.port())};
    if (flags & 1) {
      const size_t at = bytes.size() * split / 255;
      send_all(c.fd, bytes.substr(0, at));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      send_all(c.fd, bytes.substr(at));
    } else {
      send_all(c.fd, bytes);
    }
    ::shutdown(c.fd, SHUT_WR);
    FUZZ_CHECK(read_until_close(c.fd, out, std::chrono::seconds(5)),
               "the server neither closed nor finished within 5 s of the half-close; it sent {}", show(out));
  }

  // The responses, in order.
  const bool head = bytes.find("HEAD") != std::string_view::npos;
  std::string_view rest = out;
  constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";  // may precede a close: body never came
  for (int k = 0; !rest.empty(); ++k) {
    while (rest.substr(0, kContinue.size()) == kContinue) rest.remove_prefix(kContinue.size());
    if (rest.empty()) break;
    bench::HttpResponseParser p([](std::string_view) {});
    const bool fed = p.feed(rest);
    if (fed && !p.done()) p.on_eof();
    FUZZ_CHECK(p.done() && !p.failed(), "response {} does not parse ({}): {}", k, p.error(), show(std::string(rest)));
    const int st = p.status();
    FUZZ_CHECK((st >= 100 && st < 500) || st == 503, "response {} has status {}: {}", k, st, show(std::string(rest)));
    if (head) break;
    rest.remove_prefix(p.bytes_received() - p.extra_bytes());
  }

  // Still serving.
  std::string health;
  {
    Fd c{connect_local(srv.port())};
    send_all(c.fd, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    FUZZ_CHECK(read_until_close(c.fd, health, std::chrono::seconds(5)), "GET /health got no complete answer: {}",
               show(health));
  }
  FUZZ_CHECK(health.rfind("HTTP/1.1 200", 0) == 0, "GET /health after the input answered {}", show(health));
}

}  // namespace moeserve::fuzz

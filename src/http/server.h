// Asynchronous HTTP/1.1 server: a few I/O threads (Asio), any number of connections, no thread per connection.
//
//   Server server(options);
//   server.route("GET", "/health", [](const Request&, std::shared_ptr<Responder> r) { r->respond(200, ...); });
//   server.start();                 // binds host:port, starts the I/O threads; throws UserError if taken
//   ...
//   server.stop_accepting();        // graceful shutdown: no new connections, idle ones closed
//   server.wait_idle(30s);          // outstanding responses finish (or the time runs out)
//   server.close_all();             // the rest are closed; their on_disconnect callbacks fire
//
// Per connection: keep-alive, pipelined requests answered in order (one at a time: the next is handed to its
// handler once the previous response is complete), Content-Length and chunked bodies, "Expect: 100-continue".
// Protocol errors are answered 400 (431 headers too large, 413 body too large, 408 too slow) and the connection
// is closed. While a response is outstanding the connection keeps reading, so a client that goes away is seen
// at once and the response's on_disconnect fires (only a client that pipelines more than
// max_pipelined_requests behind it pauses that reading; its departure is then seen at the next write).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "http/errors.h"
#include "http/request.h"
#include "http/responder.h"
#include "http/router.h"

namespace moeserve::http {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 30000;  // 0: an ephemeral port, see Server::port()
  int io_threads = 2;

  size_t max_body_bytes = 32u << 20;     // larger bodies: 413
  size_t max_header_bytes = 64u << 10;   // request line + header fields; larger: 431
  size_t max_connections = 10000;        // more are answered 503 and closed
  size_t max_pipelined_requests = 16;    // parsed ahead of the one being answered; then reading pauses
  size_t max_stream_queue_bytes = 16u << 20;  // unwritten stream bytes per connection before the client
                                              // counts as gone (send_* returns false)

  // Slow or idle clients.
  std::chrono::milliseconds idle_timeout{60'000};    // keep-alive connection without a request
  std::chrono::milliseconds header_timeout{10'000};  // first byte of a request to the end of its header
  std::chrono::milliseconds body_timeout{60'000};    // end of the header to the end of the body
  std::chrono::milliseconds write_timeout{60'000};   // a write that makes no progress (client not reading)
  std::chrono::milliseconds linger_timeout{2'000};   // after "Connection: close", wait this long for the
                                                     // client's close before closing (so it reads the answer)

  // Optional API key: when set, every path except auth_exempt_paths needs "Authorization: Bearer <key>".
  std::string api_key;
  std::vector<std::string> auth_exempt_paths = {"/health", "/health_generate", "/metrics"};
};

class Server {
 public:
  explicit Server(ServerOptions options = {});
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Before start(). Methods and paths are compared exactly ("GET", "/v1/models").
  void route(std::string method, std::string path, Handler handler);

  // Binds and listens, then runs the I/O threads. UserError if the address cannot be used.
  void start();
  uint16_t port() const;  // the bound port (useful with port 0)
  const ServerOptions& options() const;

  // Graceful shutdown, in this order. stop_accepting(): the listening socket is closed, idle keep-alive
  // connections are closed, and responses from now on say "Connection: close".
  void stop_accepting();
  // Returns true once no response is outstanding, false if `timeout` passed first.
  bool wait_idle(std::chrono::milliseconds timeout);
  // Closes every connection; outstanding responses see on_disconnect. Returns once that has happened.
  void close_all();
  // close_all() and joins the I/O threads. Idempotent.
  void stop();

  size_t open_connections() const;
  size_t outstanding_responses() const;  // requests handed to a handler whose response is not yet written

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::http

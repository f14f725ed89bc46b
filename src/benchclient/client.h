// The load generator's HTTP side: one thread running Boost.Asio drives every request (thousands of open
// connections are fine). Connections are HTTP/1.1 keep-alive, reused by later requests, and a request that finds
// its reused connection closed by the server is retried once on a fresh one. Asio stays out of this header.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "benchclient/backend.h"
#include "benchclient/metrics.h"

namespace moeserve::bench {

struct Endpoint {
  std::string host = "127.0.0.1";
  uint16_t port = 30000;
  std::string path_prefix;  // from a base URL with a path, e.g. http://gateway/llm -> "/llm"

  // http://host[:port][/prefix]; https is refused (no TLS in this client).
  static Endpoint from_base_url(const std::string& url);
  std::string base_url() const;
};

struct HttpCall {
  std::string method = "POST";
  std::string path;  // below the endpoint's prefix
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // besides Host, Content-Type, Content-Length
};
// The bytes of an HTTP/1.1 request.
std::string serialize_request(const Endpoint& ep, const HttpCall& call);

struct HttpReply {
  int status = 0;          // 0: no response
  std::string error;       // transport error ("" when a response arrived)
  std::string body;
};

struct BenchJob {
  HttpCall call;
  int64_t prompt_len = 0;  // the dataset's, used when the server does not report one
  double send_at_s = 0;    // seconds after the run starts
};

struct RunOptions {
  Backend backend = Backend::kSglang;
  int64_t max_concurrency = 0;  // 0: no limit
  double request_timeout_s = 6 * 3600;
  std::function<void(size_t done, size_t total)> on_progress;  // after each completion, on the I/O thread
};

class BenchClient {
 public:
  explicit BenchClient(Endpoint ep);  // resolves the host (UserError if it cannot)
  ~BenchClient();
  BenchClient(const BenchClient&) = delete;
  BenchClient& operator=(const BenchClient&) = delete;

  // Sends every job at its time (queued while max_concurrency requests are in flight) and waits for all.
  // Results are in job order; duration_s is from the run start to the last completion.
  std::vector<RequestResult> run(const std::vector<BenchJob>& jobs, const RunOptions& opts, double* duration_s);
  // One plain request (e.g. GET /get_model_info), waiting for the whole body.
  HttpReply fetch(const HttpCall& call, double timeout_s);

  const Endpoint& endpoint() const;
  size_t connections_opened() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::bench

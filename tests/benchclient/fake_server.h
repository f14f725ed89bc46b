// A small streaming LLM server for the benchmark client's end-to-end tests: POSIX sockets, a thread per
// connection, HTTP/1.1 keep-alive. It answers /generate (SGLang events), /v1/completions and
// /v1/chat/completions (OpenAI chunks with a final usage chunk) with known timing: the first event `ttft_s` after
// the request, then one event every tokens_per_event * itl_s, each carrying tokens_per_event tokens. Every event
// is written as two chunks of the chunked body, split inside the JSON, to exercise the client's parser.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::bench::testing {

struct FakeServerOptions {
  double ttft_s = 0.04;
  double itl_s = 0.01;
  int tokens_per_event = 1;
  int64_t vocab_size = 1000;
  int reject_every = 0;         // > 0: every Nth generation request gets HTTP 400
  int max_requests_per_conn = 0;  // > 0: silently close a connection after that many responses
  bool continuous_usage = false;  // OpenAI chunks carry usage on every chunk (vLLM continuous_usage_stats)
};

class FakeServer {
 public:
  explicit FakeServer(FakeServerOptions opts = {});
  ~FakeServer();
  FakeServer(const FakeServer&) = delete;
  FakeServer& operator=(const FakeServer&) = delete;

  uint16_t port() const { return port_; }
  int connections() const { return connections_; }
  int generation_requests() const { return generations_; }
  int max_in_flight() const { return max_in_flight_; }
  std::vector<nlohmann::json> bodies() const;       // generation request bodies, in arrival order
  std::vector<std::string> request_heads() const;   // request lines + headers, in arrival order

 private:
  void accept_loop();
  void serve(int fd);
  // Returns false when the connection must close.
  bool handle(int fd, const std::string& head, const std::string& body);
  bool stream_generation(int fd, const std::string& path, const nlohmann::json& req);

  FakeServerOptions opts_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0}, generations_{0}, in_flight_{0}, max_in_flight_{0};
  std::thread acceptor_;
  mutable std::mutex mu_;
  std::vector<std::thread> workers_;
  std::vector<int> conn_fds_;
  std::vector<nlohmann::json> bodies_;
  std::vector<std::string> heads_;
};

}  // namespace moeserve::bench::testing

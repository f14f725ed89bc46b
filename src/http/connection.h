// Internal: state shared by the acceptor and the connections, and the connection entry point.
// Includes Asio (not Beast); only server.cpp and connection.cpp see it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <boost/asio/ip/tcp.hpp>

#include "http/router.h"
#include "http/server.h"

namespace moeserve::http::detail {

using Clock = std::chrono::steady_clock;

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// What the server asks of a connection, from any thread; the work runs on the connection's strand.
class ConnectionControl {
 public:
  virtual ~ConnectionControl() = default;
  virtual void post_close(std::function<void()> done) = 0;  // `done` runs after the close (on the strand)
  virtual void post_drain() = 0;                            // close if idle; the server is shutting down
  virtual void post_check_timeouts() = 0;
  virtual bool deadline_passed(int64_t now) const = 0;
};

struct ServerState {
  explicit ServerState(ServerOptions opts) : options(std::move(opts)) {}

  const ServerOptions options;
  Router router;  // fixed once the server runs
  std::atomic<bool> draining{false};
  std::atomic<size_t> open_connections{0};

  // Responses handed to a handler and not yet written (or abandoned by a close).
  void begin_response() {
    std::lock_guard lock(idle_mu);
    ++outstanding;
  }
  void end_response() {
    std::lock_guard lock(idle_mu);
    if (--outstanding == 0) idle_cv.notify_all();
  }
  std::mutex idle_mu;
  std::condition_variable idle_cv;
  size_t outstanding = 0;

  // Open connections, for close_all / stop_accepting / the timeout sweep.
  uint64_t add_connection(std::weak_ptr<ConnectionControl> c) {
    std::lock_guard lock(reg_mu);
    uint64_t id = next_id++;
    connections.emplace(id, std::move(c));
    return id;
  }
  void remove_connection(uint64_t id) {
    std::lock_guard lock(reg_mu);
    connections.erase(id);
  }
  std::vector<std::shared_ptr<ConnectionControl>> snapshot() {
    std::vector<std::shared_ptr<ConnectionControl>> out;
    std::lock_guard lock(reg_mu);
    out.reserve(connections.size());
    for (auto it = connections.begin(); it != connections.end();) {
      if (auto c = it->second.lock()) {
        out.push_back(std::move(c));
        ++it;
      } else {
        it = connections.erase(it);
      }
    }
    return out;
  }
  std::mutex reg_mu;
  std::unordered_map<uint64_t, std::weak_ptr<ConnectionControl>> connections;
  uint64_t next_id = 1;
};

// Takes over an accepted socket (whose executor is its own strand). With `reject_status` != 0 the connection
// only answers that error and closes (too many connections).
void start_connection(boost::asio::ip::tcp::socket socket, std::shared_ptr<ServerState> state,
                      std::weak_ptr<void> io_keepalive, int reject_status = 0);

}  // namespace moeserve::http::detail

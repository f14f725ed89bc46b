// Internal: the link between Responder (any thread) and the connection that writes for it (I/O thread).
// Free of Asio/Beast so that responder.cpp and router.cpp compile fast.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "http/responder.h"

namespace moeserve::http::detail {

// What the connection does once the submitted bytes are written.
enum class Completion {
  None,       // more of this response follows
  KeepAlive,  // the response is complete; serve the next request
  Close,      // the response is complete; close the connection gracefully
  Abort,      // close the connection now, dropping what is queued (slow client)
};

// Implemented by the connection. Thread-safe.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  // Queues bytes of response `seq` (the connection's request counter); stale sequence numbers are dropped.
  virtual void submit(uint64_t seq, std::string bytes, Completion completion) = 0;
  virtual size_t queued_bytes() const = 0;
  // The server is shutting down: responses should say "Connection: close".
  virtual bool draining() const = 0;
};

struct ResponderState {
  enum class Phase { Fresh, Streaming, Done };

  mutable std::mutex mu;
  Phase phase = Phase::Fresh;
  bool disconnected = false;  // the connection closed before the response was complete
  bool aborted = false;       // we gave up on a slow client; the close is on its way
  std::function<void()> on_disconnect;
  std::vector<std::pair<std::string, std::string>> headers;
  bool stream_until_close = false;  // HTTP/1.0 stream: no chunked encoding, the close ends it

  // Fixed at creation.
  std::weak_ptr<ResponseSink> sink;
  std::shared_ptr<void> io_keepalive;  // keeps the I/O context (that sink posts to) alive
  uint64_t seq = 0;
  bool http11 = true;
  bool keep_alive = true;
  size_t max_stream_queue_bytes = 0;
};

struct ResponderAccess {
  static std::shared_ptr<Responder> create(std::unique_ptr<ResponderState> state) {
    return std::shared_ptr<Responder>(new Responder(std::move(state)));
  }
  // From the I/O thread when the connection closes with this response outstanding.
  static void notify_disconnected(Responder& r);
  // The handler has completed (or abandoned) the response: a peer close no longer concerns it.
  static bool finished(const Responder& r);
};

}  // namespace moeserve::http::detail

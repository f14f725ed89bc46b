// The answer side of one request.
//
// Thread-safe and never blocking: a handler may keep the shared_ptr and complete the response later from any
// thread (the engine's). Every call queues bytes that the connection's I/O thread writes in order.
//
//   respond(...) / respond_json(...)                   one whole response, or
//   start_stream(...), send_*(...) repeatedly, end()   a streamed one (chunked; HTTP/1.0: until close).
//
// Calls return false when they did nothing: the client is gone, the response was already completed, or (for
// stream sends) the connection's output queue is over ServerOptions::max_stream_queue_bytes, in which case the
// client is too slow, its connection is closed and on_disconnect fires.
// A Responder dropped without a response answers 500; one dropped mid-stream has what it queued written, then
// the connection closes without the final chunk (the client sees an incomplete response, not a complete one).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace moeserve::http {

namespace detail {
struct ResponderState;
struct ResponderAccess;
}  // namespace detail

class Responder {
 public:
  ~Responder();
  Responder(const Responder&) = delete;
  Responder& operator=(const Responder&) = delete;

  // Extra response header for the coming response; ignored once it has started.
  void set_header(std::string name, std::string value);

  bool respond(int status, std::string_view content_type, std::string body);
  bool respond_json(int status, const nlohmann::json& body);
  // error_json(status, message, type, param) as the body.
  bool respond_error(int status, std::string_view message, std::string_view type = {},
                     std::string_view param = {});

  bool start_stream(int status = 200, std::string_view content_type = "text/event-stream");
  bool send_chunk(std::string_view data);          // raw bytes of the stream
  bool send_event(const nlohmann::json& event);    // SSE "data: <json>\n\n"
  bool send_data(std::string_view text);           // SSE "data: <text>\n\n" (one data: line per text line)
  bool send_done();                                // SSE "data: [DONE]\n\n"
  bool end();                                      // completes the stream

  // `callback` runs once, on an I/O thread, if the connection closes (client gone, I/O error, slow client,
  // close_all) before the response was completed; it is dropped, never called, once the response is complete.
  // Registered after such a close, it runs at once on the calling thread. It must not block.
  void on_disconnect(std::function<void()> callback);

  bool is_open() const;         // the client is there and the response is not yet completed
  bool started() const;         // respond() or start_stream() was called
  size_t queued_bytes() const;  // bytes of this connection waiting to be written

 private:
  friend struct detail::ResponderAccess;
  explicit Responder(std::unique_ptr<detail::ResponderState> state);
  bool send_stream_bytes(std::string framed_payload);
  std::unique_ptr<detail::ResponderState> st_;
};

}  // namespace moeserve::http

// Incremental parsers for what a benchmark client receives: an HTTP/1.1 response (status line, headers, a body
// framed by Content-Length, chunked transfer coding or the connection close) and, inside it, a Server-Sent
// Events stream. Both accept their input split at any byte: TCP delivers it in arbitrary pieces.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moeserve::bench {

class HttpResponseParser {
 public:
  // Receives the decoded body (chunk framing removed), piece by piece, as it arrives.
  using BodySink = std::function<void(std::string_view)>;

  explicit HttpResponseParser(BodySink sink) : sink_(std::move(sink)) {}

  // Feeds the next bytes of the connection. Returns false on a protocol error (error() says what).
  // Bytes after the end of the response are counted in extra_bytes() and otherwise ignored.
  bool feed(std::string_view data);
  // The peer closed the connection: ends a body delimited by the close; an error anywhere else.
  bool on_eof();
  // Back to the initial state (for another attempt of the same request), keeping the sink.
  void reset() { *this = HttpResponseParser(std::move(sink_)); }

  bool headers_done() const { return state_ > State::kHeaders; }
  bool done() const { return state_ == State::kDone; }
  bool failed() const { return state_ == State::kError; }
  const std::string& error() const { return error_; }
  size_t bytes_received() const { return bytes_received_; }
  size_t extra_bytes() const { return extra_bytes_; }

  int status() const { return status_; }
  const std::string& reason() const { return reason_; }
  // Header value by lower-case name; "" if absent. Repeated headers are joined with ", ".
  std::string header(std::string_view lower_name) const;
  // Whether the connection may carry another request after this response.
  bool keep_alive() const;
  bool is_event_stream() const;

 private:
  enum class State { kStatusLine, kHeaders, kBodyLength, kBodyUntilClose, kChunkSize, kChunkData, kChunkDataEnd,
                     kTrailers, kDone, kError };
  bool fail(std::string msg);
  // Takes one line (without CR LF) from data, buffering partial lines. Returns false if the line is incomplete.
  bool take_line(std::string_view& data, std::string& line);
  bool on_status_line(const std::string& line);
  bool on_header_line(const std::string& line);
  bool on_headers_end();
  bool on_chunk_size_line(const std::string& line);

  BodySink sink_;
  State state_ = State::kStatusLine;
  std::string partial_, error_, reason_;
  int status_ = 0, minor_version_ = 1;
  std::vector<std::pair<std::string, std::string>> headers_;
  uint64_t remaining_ = 0;  // body or chunk bytes still to come
  size_t bytes_received_ = 0, extra_bytes_ = 0, header_bytes_ = 0;
};

// Server-Sent Events (WHATWG HTML "event stream" interpretation): lines end in LF, CR LF or CR; "data:" lines
// accumulate (joined by LF) and an empty line dispatches the event; comments and other fields are ignored.
// Lenient at the end: finish() dispatches data that was not followed by the blank line.
class SseParser {
 public:
  using EventSink = std::function<void(std::string_view data)>;
  explicit SseParser(EventSink sink) : sink_(std::move(sink)) {}

  void feed(std::string_view bytes);
  void finish();
  size_t events() const { return events_; }

 private:
  void on_line(std::string_view line);
  void dispatch();

  EventSink sink_;
  std::string line_, data_;
  bool has_data_ = false, after_cr_ = false, at_start_ = true;
  size_t events_ = 0;
};

}  // namespace moeserve::bench

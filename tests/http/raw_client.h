// A small blocking HTTP/1.1 client over plain sockets for the transport tests: it sends exactly the bytes a
// test gives it and parses answers strictly, so framing mistakes of the server show up.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace moeserve::http::test {

using namespace std::chrono_literals;

struct RawResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;                            // de-chunked
  bool chunked = false;
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// Parses one complete response from the front of `buf` and removes it; nullopt if incomplete.
// A response without Content-Length or chunked encoding is read until `eof`.
std::optional<RawResponse> take_response(std::string& buf, bool eof = false);

// Decodes a complete chunked body from the front of `buf`; nullopt if the final chunk has not arrived.
std::optional<std::string> decode_chunked(std::string_view buf, size_t* consumed = nullptr);

class RawClient {
 public:
  explicit RawClient(uint16_t port, std::chrono::milliseconds timeout = 5s);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  static bool can_connect(uint16_t port);

  void send(std::string_view bytes);
  // Reads once (waiting up to `timeout`); false on timeout. Sets eof() when the server closed.
  bool read_some(std::chrono::milliseconds timeout);
  // Reads until `buffer()` contains `needle` (true) or the time runs out / the server closes (false).
  bool read_until(std::string_view needle, std::chrono::milliseconds timeout = 5s);
  RawResponse read_response(std::chrono::milliseconds timeout = 5s);
  // True if the server closes the connection within `timeout` (data read meanwhile is kept).
  bool wait_closed(std::chrono::milliseconds timeout = 5s);
  void close();
  void shutdown_write();

  std::string& buffer() { return buf_; }
  bool eof() const { return eof_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  bool eof_ = false;
  std::string buf_;
};

std::string get_request(std::string_view path, std::string_view extra_headers = {});
std::string post_request(std::string_view path, std::string_view body, std::string_view extra_headers = {});

}  // namespace moeserve::http::test

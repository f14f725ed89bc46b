#include "raw_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace moeserve::http::test {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

int connect_to(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(fmt::format("socket: {}", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

std::optional<std::string> decode_chunked(std::string_view buf, size_t* consumed) {
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t eol = buf.find("\r\n", pos);
    if (eol == std::string_view::npos) return std::nullopt;
    std::string size_line(buf.substr(pos, eol - pos));
    size_t size = 0;
    try {
      size = std::stoul(size_line, nullptr, 16);
    } catch (...) {
      throw std::runtime_error("bad chunk size line: '" + size_line + "'");
    }
    pos = eol + 2;
    if (size == 0) {
      if (buf.size() < pos + 2) return std::nullopt;
      if (buf.substr(pos, 2) != "\r\n") throw std::runtime_error("trailers are not expected");
      if (consumed) *consumed = pos + 2;
      return out;
    }
    if (buf.size() < pos + size + 2) return std::nullopt;
    out.append(buf.substr(pos, size));
    if (buf.substr(pos + size, 2) != "\r\n") throw std::runtime_error("chunk data not followed by CRLF");
    pos += size + 2;
  }
}

std::optional<RawResponse> take_response(std::string& buf, bool eof) {
  size_t head_end = buf.find("\r\n\r\n");
  if (head_end == std::string::npos) return std::nullopt;
  RawResponse r;
  std::string_view head(buf.data(), head_end);
  size_t line_end = head.find("\r\n");
  std::string_view status_line = head.substr(0, line_end);
  if (status_line.substr(0, 9) != "HTTP/1.1 ") throw std::runtime_error("bad status line: " + std::string(status_line));
  r.status = std::stoi(std::string(status_line.substr(9, 3)));
  size_t pos = line_end == std::string_view::npos ? head.size() : line_end + 2;
  while (pos < head.size()) {
    size_t e = head.find("\r\n", pos);
    if (e == std::string_view::npos) e = head.size();
    std::string_view line = head.substr(pos, e - pos);
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) throw std::runtime_error("bad header line: " + std::string(line));
    r.headers[lower(std::string(line.substr(0, colon)))] = trim(line.substr(colon + 1));
    pos = e + 2;
  }
  size_t body_start = head_end + 4;
  bool no_body = (r.status >= 100 && r.status < 200) || r.status == 204 || r.status == 304;
  if (no_body) {
    buf.erase(0, body_start);
    return r;
  }
  if (lower(r.header("transfer-encoding")) == "chunked") {
    r.chunked = true;
    size_t used = 0;
    auto body = decode_chunked(std::string_view(buf).substr(body_start), &used);
    if (!body) return std::nullopt;
    r.body = std::move(*body);
    buf.erase(0, body_start + used);
    return r;
  }
  if (r.headers.count("content-length")) {
    size_t n = std::stoul(r.header("content-length"));
    if (buf.size() < body_start + n) return std::nullopt;
    r.body = buf.substr(body_start, n);
    buf.erase(0, body_start + n);
    return r;
  }
  if (!eof) return std::nullopt;
  r.body = buf.substr(body_start);
  buf.clear();
  return r;
}

RawClient::RawClient(uint16_t port, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while ((fd_ = connect_to(port)) < 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error(fmt::format("cannot connect to port {}: {}", port, std::strerror(errno)));
    }
    ::usleep(10'000);
  }
}

RawClient::~RawClient() { close(); }

bool RawClient::can_connect(uint16_t port) {
  int fd = connect_to(port);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

void RawClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void RawClient::shutdown_write() { ::shutdown(fd_, SHUT_WR); }

void RawClient::send(std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(fmt::format("send: {}", std::strerror(errno)));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

bool RawClient::read_some(std::chrono::milliseconds timeout) {
  if (eof_) return false;
  pollfd p{fd_, POLLIN, 0};
  int rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
  if (rc <= 0) return false;
  char tmp[65536];
  ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
  if (n <= 0) {
    eof_ = true;  // orderly close or reset: either way the server is gone
    return false;
  }
  buf_.append(tmp, static_cast<size_t>(n));
  return true;
}

bool RawClient::read_until(std::string_view needle, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (buf_.find(needle) == std::string::npos) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || eof_) return false;
    read_some(left);
  }
  return true;
}

RawResponse RawClient::read_response(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (auto r = take_response(buf_, eof_)) return *r;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || eof_) {
      throw std::runtime_error(fmt::format("no complete response (eof={}), got: '{}'", eof_, buf_.substr(0, 300)));
    }
    read_some(left);
  }
}

bool RawClient::wait_closed(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!eof_) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    read_some(left);
  }
  return true;
}

std::string get_request(std::string_view path, std::string_view extra_headers) {
  return fmt::format("GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\n{}\r\n", path, extra_headers);
}

std::string post_request(std::string_view path, std::string_view body, std::string_view extra_headers) {
  return fmt::format("POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: {}\r\n{}\r\n{}",
                     path, body.size(), extra_headers, body);
}

}  // namespace moeserve::http::test

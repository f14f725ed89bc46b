#include <cstdio>
#include <ctime>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "http/errors.h"
#include "http/transport.h"

namespace moeserve::http {

using detail::Completion;
using detail::ResponderState;
using Phase = ResponderState::Phase;

namespace {

// Header names and values come from our own routes, but may echo client data: never let them split lines.
std::string sanitize_header_text(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c == '\r' || c == '\n') c = ' ';
  }
  return out;
}

void append_date(std::string& out) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  size_t n = std::strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  out += "Date: ";
  out.append(buf, n);
  out += "\r\n";
}

bool status_has_no_body(int status) { return (status >= 100 && status < 200) || status == 204 || status == 304; }

std::string format_head(const ResponderState& st, int status, std::string_view content_type,
                        std::optional<size_t> content_length, bool chunked, bool close) {
  std::string h;
  h.reserve(256);
  h += fmt::format("HTTP/1.1 {} {}\r\n", status, status_reason(status));
  h += "Server: moeserve\r\n";
  append_date(h);
  if (!content_type.empty()) {
    h += "Content-Type: ";
    h += sanitize_header_text(content_type);
    h += "\r\n";
  }
  if (content_length) h += fmt::format("Content-Length: {}\r\n", *content_length);
  if (chunked) h += "Transfer-Encoding: chunked\r\n";
  h += close ? "Connection: close\r\n" : "Connection: keep-alive\r\n";
  for (const auto& [name, value] : st.headers) {
    h += sanitize_header_text(name);
    h += ": ";
    h += sanitize_header_text(value);
    h += "\r\n";
  }
  h += "\r\n";
  return h;
}

std::string sse_data(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 16);
  size_t pos = 0;
  while (true) {
    size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    out += "data: ";
    out += line;
    out += '\n';
    if (nl == std::string_view::npos) break;
    pos = nl + 1;
  }
  out += '\n';
  return out;
}

// Takes the disconnect callback out of the state so that it is destroyed outside the lock: it often holds the
// last reference to the Responder itself.
std::function<void()> take_callback(ResponderState& st) {
  std::function<void()> cb;
  cb.swap(st.on_disconnect);
  return cb;
}

}  // namespace

Responder::Responder(std::unique_ptr<ResponderState> state) : st_(std::move(state)) {}

Responder::~Responder() {
  // No lock: nobody else can hold a reference any more.
  ResponderState& st = *st_;
  if (st.phase == Phase::Done || st.disconnected) return;
  auto sink = st.sink.lock();
  if (!sink) return;
  if (st.phase == Phase::Fresh) {
    std::string body = error_json(500, "the request handler finished without a response").dump();
    std::string bytes = format_head(st, 500, "application/json", body.size(), false, true) + body;
    sink->submit(st.seq, std::move(bytes), Completion::Close);
  } else {
    // No terminating chunk: ending the stream cleanly would tell the client it is complete, and it is not.
    // What was queued is still written, then the connection closes.
    sink->submit(st.seq, {}, Completion::Close);
  }
}

void Responder::set_header(std::string name, std::string value) {
  std::lock_guard lock(st_->mu);
  if (st_->phase == Phase::Fresh) st_->headers.emplace_back(std::move(name), std::move(value));
}

bool Responder::respond(int status, std::string_view content_type, std::string body) {
  std::function<void()> dropped;
  std::lock_guard lock(st_->mu);
  ResponderState& st = *st_;
  if (st.phase != Phase::Fresh) return false;
  st.phase = Phase::Done;
  dropped = take_callback(st);
  auto sink = st.sink.lock();
  if (!sink || st.disconnected) return false;
  bool close = !st.keep_alive || sink->draining();
  if (status_has_no_body(status)) body.clear();
  std::string bytes = format_head(st, status, content_type,
                                  status_has_no_body(status) ? std::nullopt : std::optional<size_t>(body.size()),
                                  false, close);
  bytes += body;
  sink->submit(st.seq, std::move(bytes), close ? Completion::Close : Completion::KeepAlive);
  return true;
}

bool Responder::respond_json(int status, const nlohmann::json& body) {
  return respond(status, "application/json",
                 body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

bool Responder::respond_error(int status, std::string_view message, std::string_view type,
                              std::string_view param) {
  return respond_json(status, error_json(status, message, type, param));
}

bool Responder::start_stream(int status, std::string_view content_type) {
  std::lock_guard lock(st_->mu);
  ResponderState& st = *st_;
  if (st.phase != Phase::Fresh) return false;
  auto sink = st.sink.lock();
  if (!sink || st.disconnected) return false;
  st.phase = Phase::Streaming;
  // HTTP/1.0 has no chunked encoding: the stream runs until we close the connection.
  st.stream_until_close = !st.http11;
  bool close = st.stream_until_close || !st.keep_alive || sink->draining();
  if (content_type == "text/event-stream") {
    st.headers.emplace_back("Cache-Control", "no-cache");
    st.headers.emplace_back("X-Accel-Buffering", "no");  // proxies must not buffer the events
  }
  if (close) st.keep_alive = false;
  sink->submit(st.seq, format_head(st, status, content_type, std::nullopt, !st.stream_until_close, close),
               Completion::None);
  return true;
}

bool Responder::send_stream_bytes(std::string payload) {
  std::lock_guard lock(st_->mu);
  ResponderState& st = *st_;
  if (st.phase != Phase::Streaming || st.disconnected || st.aborted) return false;
  auto sink = st.sink.lock();
  if (!sink) return false;
  if (payload.empty()) return true;  // an empty chunk would end the stream
  std::string framed;
  if (st.stream_until_close) {
    framed = std::move(payload);
  } else {
    framed = fmt::format("{:x}\r\n", payload.size());
    framed.reserve(framed.size() + payload.size() + 2);
    framed += payload;
    framed += "\r\n";
  }
  if (sink->queued_bytes() + framed.size() > st.max_stream_queue_bytes) {
    // The client does not read: give up on it. The close fires on_disconnect from the I/O thread.
    st.aborted = true;
    sink->submit(st.seq, {}, Completion::Abort);
    return false;
  }
  sink->submit(st.seq, std::move(framed), Completion::None);
  return true;
}

bool Responder::send_chunk(std::string_view data) { return send_stream_bytes(std::string(data)); }

bool Responder::send_event(const nlohmann::json& event) {
  std::string s = "data: ";
  s += event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  s += "\n\n";
  return send_stream_bytes(std::move(s));
}

bool Responder::send_data(std::string_view text) { return send_stream_bytes(sse_data(text)); }

bool Responder::send_done() { return send_stream_bytes("data: [DONE]\n\n"); }

bool Responder::end() {
  std::function<void()> dropped;
  std::lock_guard lock(st_->mu);
  ResponderState& st = *st_;
  if (st.phase != Phase::Streaming) return false;
  st.phase = Phase::Done;
  dropped = take_callback(st);
  auto sink = st.sink.lock();
  if (!sink || st.disconnected) return false;
  if (st.stream_until_close) {
    sink->submit(st.seq, {}, Completion::Close);
  } else {
    sink->submit(st.seq, "0\r\n\r\n", st.keep_alive ? Completion::KeepAlive : Completion::Close);
  }
  return true;
}

void Responder::on_disconnect(std::function<void()> callback) {
  std::function<void()> replaced;  // destroyed after the lock is released
  {
    std::lock_guard lock(st_->mu);
    if (!st_->disconnected) {
      if (st_->phase != Phase::Done) {
        replaced = std::move(st_->on_disconnect);
        st_->on_disconnect = std::move(callback);
      } else {
        replaced = std::move(callback);
      }
      return;
    }
  }
  if (callback) callback();
}

bool Responder::is_open() const {
  std::lock_guard lock(st_->mu);
  return !st_->disconnected && !st_->aborted && st_->phase != Phase::Done && !st_->sink.expired();
}

bool Responder::started() const {
  std::lock_guard lock(st_->mu);
  return st_->phase != Phase::Fresh;
}

size_t Responder::queued_bytes() const {
  auto sink = st_->sink.lock();
  return sink ? sink->queued_bytes() : 0;
}

namespace detail {

void ResponderAccess::notify_disconnected(Responder& r) {
  std::function<void()> cb;
  {
    std::lock_guard lock(r.st_->mu);
    if (r.st_->disconnected || r.st_->phase == Phase::Done) return;
    r.st_->disconnected = true;
    cb = take_callback(*r.st_);
  }
  if (!cb) return;
  try {
    cb();
  } catch (const std::exception& e) {
    fmt::print(stderr, "moeserve http: on_disconnect callback threw: {}\n", e.what());
  } catch (...) {
    fmt::print(stderr, "moeserve http: on_disconnect callback threw\n");
  }
}

bool ResponderAccess::finished(const Responder& r) {
  std::lock_guard lock(r.st_->mu);
  return r.st_->phase == Phase::Done;
}

}  // namespace detail

}  // namespace moeserve::http

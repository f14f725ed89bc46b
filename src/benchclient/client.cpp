#include "benchclient/client.h"

#include <array>
#include <chrono>
#include <deque>
#include <optional>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "benchclient/http_parser.h"
#include "core/error.h"

namespace moeserve::bench {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using SteadyClock = std::chrono::steady_clock;

namespace {

double to_s(SteadyClock::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }
double now_s() { return to_s(SteadyClock::now()); }

constexpr size_t kMaxErrorBody = 64 * 1024;
constexpr size_t kMaxPlainBody = size_t(256) << 20;

std::string host_for_url(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

struct Conn {
  explicit Conn(asio::io_context& io) : sock(io) {}
  tcp::socket sock;
  bool connected = false;
  bool reused = false;  // has carried a whole response: the server may since have closed it
};

// What the exchanges share: the I/O context, the resolved server, the connection count.
struct Shared {
  asio::io_context io;
  tcp::resolver::results_type addrs;
  std::string where;  // host:port for messages
  size_t opened = 0;
  std::vector<std::shared_ptr<Conn>> idle;

  std::shared_ptr<Conn> new_conn() {
    ++opened;
    return std::make_shared<Conn>(io);
  }
  std::shared_ptr<Conn> take_conn() {
    if (idle.empty()) return new_conn();
    auto c = std::move(idle.back());
    idle.pop_back();
    return c;
  }
};

// One request on one connection: connect if needed, write, read the response to its end. Single-threaded: every
// handler runs on the thread running the io_context.
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  using Done = std::function<void(Exchange&)>;

  Exchange(Shared& sh, const std::string* wire, std::optional<Backend> backend, double timeout_s, Done done)
      : sh_(sh), wire_(wire), backend_(backend), timeout_s_(timeout_s), done_(std::move(done)), timer_(sh.io) {}

  void start(std::shared_ptr<Conn> conn) {
    conn_ = std::move(conn);
    t_start_ = t_read_ = now_s();
    if (backend_) reader_.emplace(*backend_, t_start_);
    timer_.expires_after(std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(timeout_s_)));
    timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (!ec && !self->finished_) self->finish(fmt::format("timed out after {} s", self->timeout_s_));
    });
    begin();
  }

 private:
  Shared& sh_;
  const std::string* wire_;
  std::optional<Backend> backend_;
  double timeout_s_;
  Done done_;
  asio::steady_timer timer_;
  SseParser sse_{[this](std::string_view data) { reader_->on_event(data, t_read_); }};
  std::array<char, 16384> buf_;
  double t_read_ = 0;
  bool finished_ = false, retried_ = false;

 public:  // the outcome, read by the Done callback
  HttpResponseParser parser_{[this](std::string_view b) { on_body(b); }};  // status, headers
  std::optional<ResponseReader> reader_;
  std::shared_ptr<Conn> conn_;
  double t_start_ = 0, t_end_ = 0;
  std::string error_;  // transport or protocol error
  std::string body_;   // error bodies and non-streamed bodies
  bool keep_conn_ = false;

 private:
  void begin() {
    if (conn_->connected) return write();
    asio::async_connect(conn_->sock, sh_.addrs, [self = shared_from_this()](error_code ec, const tcp::endpoint&) {
      if (self->finished_) return;
      if (ec) return self->finish(fmt::format("cannot connect to {}: {}", self->sh_.where, ec.message()));
      error_code ignored;
      self->conn_->sock.set_option(tcp::no_delay(true), ignored);
      self->conn_->connected = true;
      self->write();
    });
  }

  void write() {
    asio::async_write(conn_->sock, asio::buffer(*wire_), [self = shared_from_this()](error_code ec, size_t) {
      if (self->finished_) return;
      if (ec) return self->on_transport_error(ec, "sending the request to");
      self->read();
    });
  }

  void read() {
    conn_->sock.async_read_some(asio::buffer(buf_), [self = shared_from_this()](error_code ec, size_t n) {
      if (self->finished_) return;
      try {
        self->on_read(ec, n);
      } catch (const std::exception& e) {
        self->finish(std::string("while reading the response: ") + e.what());
      }
    });
  }

  void on_read(error_code ec, size_t n) {
    if (n > 0) {
      t_read_ = now_s();
      if (!parser_.feed(std::string_view(buf_.data(), n)))
        return finish(fmt::format("bad HTTP response from {}: {}", sh_.where, parser_.error()));
      if (!error_.empty()) return finish(error_);  // the body sink gave up
    }
    if (ec == asio::error::eof) {
      if (parser_.on_eof()) return complete();
      return on_transport_error(ec, "reading the response from");
    }
    if (ec) return on_transport_error(ec, "reading the response from");
    if (parser_.done()) return complete();
    read();
  }

  void on_body(std::string_view b) {
    bool ok = parser_.status() >= 200 && parser_.status() < 300;
    if (ok && reader_ && parser_.is_event_stream()) return sse_.feed(b);
    size_t cap = ok ? kMaxPlainBody : kMaxErrorBody;
    if (body_.size() + b.size() > cap) {
      if (ok) error_ = "response body larger than 256 MiB";
      b = b.substr(0, cap - std::min(cap, body_.size()));
    }
    body_.append(b);
  }

  void on_transport_error(error_code ec, const char* what) {
    // A kept-alive connection the server closed meanwhile: the request never reached it, try a fresh one.
    if (conn_->reused && parser_.bytes_received() == 0 && !retried_) {
      retried_ = true;
      parser_.reset();
      error_code ignored;
      conn_->sock.close(ignored);
      conn_ = sh_.new_conn();
      return begin();
    }
    finish(fmt::format("{} {}: {}", what, sh_.where, ec == asio::error::eof ? parser_.error() : ec.message()));
  }

  void complete() {
    t_end_ = t_read_;
    int status = parser_.status();
    if (reader_ && status >= 200 && status < 300) {
      if (parser_.is_event_stream()) sse_.finish();
      else reader_->on_json_body(body_, t_end_);
    }
    keep_conn_ = parser_.keep_alive() && parser_.extra_bytes() == 0;
    finish("");
  }

  void finish(std::string err) {
    if (finished_) return;
    finished_ = true;
    error_ = std::move(err);
    if (t_end_ == 0) t_end_ = now_s();
    timer_.cancel();
    if (keep_conn_ && error_.empty()) {
      conn_->reused = true;
    } else {
      keep_conn_ = false;
      error_code ignored;
      conn_->sock.close(ignored);
      conn_->connected = false;
    }
    done_(*this);
  }
};

}  // namespace

Endpoint Endpoint::from_base_url(const std::string& url) {
  std::string rest = url;
  if (rest.rfind("https://", 0) == 0)
    throw_user("--base-url {}: https is not supported by this client; use http:// (or a local TLS proxy)", url);
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  MS_USER_CHECK(rest.find("://") == std::string::npos, "--base-url {}: only http:// URLs are supported", url);
  Endpoint ep;
  size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  ep.path_prefix = slash == std::string::npos ? "" : rest.substr(slash);
  while (!ep.path_prefix.empty() && ep.path_prefix.back() == '/') ep.path_prefix.pop_back();
  std::string port_text;
  if (!authority.empty() && authority[0] == '[') {  // [v6 literal]:port
    size_t close = authority.find(']');
    MS_USER_CHECK(close != std::string::npos, "--base-url {}: unterminated [ in the host", url);
    ep.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      MS_USER_CHECK(authority[close + 1] == ':', "--base-url {}: expected :port after the host", url);
      port_text = authority.substr(close + 2);
    }
  } else {
    size_t colon = authority.rfind(':');
    ep.host = authority.substr(0, colon);
    if (colon != std::string::npos) port_text = authority.substr(colon + 1);
  }
  MS_USER_CHECK(!ep.host.empty(), "--base-url {}: no host (expected http://host[:port][/path])", url);
  ep.port = 80;
  if (!port_text.empty()) {
    char* end = nullptr;
    long p = std::strtol(port_text.c_str(), &end, 10);
    MS_USER_CHECK(*end == '\0' && p >= 1 && p <= 65535, "--base-url {}: bad port '{}'", url, port_text);
    ep.port = uint16_t(p);
  }
  return ep;
}

std::string Endpoint::base_url() const {
  return fmt::format("http://{}:{}{}", host_for_url(host), port, path_prefix);
}

std::string serialize_request(const Endpoint& ep, const HttpCall& call) {
  std::string r = fmt::format("{} {}{} HTTP/1.1\r\nHost: {}:{}\r\nUser-Agent: moeserve-bench\r\nAccept: */*\r\n",
                              call.method, ep.path_prefix, call.path, host_for_url(ep.host), ep.port);
  if (!call.body.empty() || call.method == "POST")
    r += fmt::format("Content-Type: application/json\r\nContent-Length: {}\r\n", call.body.size());
  for (auto& [k, v] : call.headers) r += k + ": " + v + "\r\n";
  r += "\r\n";
  r += call.body;
  return r;
}

struct BenchClient::Impl {
  Endpoint ep;
  Shared sh;
};

BenchClient::BenchClient(Endpoint ep) : impl_(std::make_unique<Impl>()) {
  impl_->ep = std::move(ep);
  impl_->sh.where = fmt::format("{}:{}", host_for_url(impl_->ep.host), impl_->ep.port);
  tcp::resolver resolver(impl_->sh.io);
  error_code ec;
  impl_->sh.addrs = resolver.resolve(impl_->ep.host, std::to_string(impl_->ep.port), ec);
  MS_USER_CHECK(!ec, "cannot resolve host '{}': {}", impl_->ep.host, ec.message());
}

BenchClient::~BenchClient() = default;

const Endpoint& BenchClient::endpoint() const { return impl_->ep; }
size_t BenchClient::connections_opened() const { return impl_->sh.opened; }

std::vector<RequestResult> BenchClient::run(const std::vector<BenchJob>& jobs, const RunOptions& opts,
                                            double* duration_s) {
  Shared& sh = impl_->sh;
  const size_t n = jobs.size();
  std::vector<std::string> wires(n);
  for (size_t i = 0; i < n; ++i) wires[i] = serialize_request(impl_->ep, jobs[i].call);
  std::vector<RequestResult> results(n);
  std::deque<size_t> waiting;  // arrived, held back by max_concurrency
  size_t next_arrival = 0, in_flight = 0, completed = 0;
  asio::steady_timer arrivals(sh.io);
  const SteadyClock::time_point t0 = SteadyClock::now();
  const double t0_s = to_s(t0);
  double t_last = t0_s;

  std::function<void()> try_start;
  auto on_done = [&](size_t i, Exchange& ex) {
    RequestResult& r = results[i];
    r.start_s = ex.t_start_ - t0_s;
    r.http_status = ex.parser_.status();
    int status = r.http_status;
    if (!ex.error_.empty()) {
      r.error = ex.error_;
      r.latency_s = ex.t_end_ - ex.t_start_;
    } else if (status < 200 || status >= 300) {
      r.error = describe_http_error(status, ex.parser_.reason(), ex.body_);
      r.latency_s = ex.t_end_ - ex.t_start_;
    } else {
      ex.reader_->fill(r, ex.t_end_, jobs[i].prompt_len);
      r.error = ex.reader_->error();
    }
    r.success = r.error.empty();
    if (ex.keep_conn_) sh.idle.push_back(ex.conn_);
    t_last = std::max(t_last, ex.t_end_);
    --in_flight;
    ++completed;
    if (opts.on_progress) opts.on_progress(completed, n);
    try_start();
  };
  try_start = [&] {
    while (!waiting.empty() && (opts.max_concurrency <= 0 || int64_t(in_flight) < opts.max_concurrency)) {
      size_t i = waiting.front();
      waiting.pop_front();
      ++in_flight;
      auto ex = std::make_shared<Exchange>(sh, &wires[i], opts.backend, opts.request_timeout_s,
                                           [&on_done, i](Exchange& e) { on_done(i, e); });
      ex->start(sh.take_conn());
    }
  };
  std::function<void()> pump;
  pump = [&] {
    double elapsed = now_s() - t0_s;
    while (next_arrival < n && jobs[next_arrival].send_at_s <= elapsed) waiting.push_back(next_arrival++);
    try_start();
    if (next_arrival < n) {
      arrivals.expires_at(t0 + std::chrono::duration_cast<SteadyClock::duration>(
                                   std::chrono::duration<double>(jobs[next_arrival].send_at_s)));
      arrivals.async_wait([&](error_code ec) {
        if (!ec) pump();
      });
    }
  };
  asio::post(sh.io, pump);
  sh.io.restart();
  sh.io.run();
  if (duration_s) *duration_s = t_last - t0_s;
  return results;
}

HttpReply BenchClient::fetch(const HttpCall& call, double timeout_s) {
  Shared& sh = impl_->sh;
  std::string wire = serialize_request(impl_->ep, call);
  HttpReply reply;
  auto ex = std::make_shared<Exchange>(sh, &wire, std::nullopt, timeout_s, [&](Exchange& e) {
    reply.status = e.parser_.status();
    reply.error = e.error_;
    reply.body = e.body_;
    if (e.keep_conn_) sh.idle.push_back(e.conn_);
  });
  ex->start(sh.take_conn());
  ex.reset();
  sh.io.restart();
  sh.io.run();
  return reply;
}

}  // namespace moeserve::bench

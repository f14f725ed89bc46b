// One client connection: reads and parses requests (Beast's parser over a flat buffer), hands them to the
// router one at a time, and writes what the Responder queues. Everything here runs on the connection's strand
// except the few methods marked "any thread".
//
// Reading never stops while a response is outstanding (unless max_pipelined_requests are already parsed):
// that is how a client that goes away mid-stream is seen at once, with nothing being written.
#include "http/connection.h"

#include <cstdio>
#include <deque>
#include <limits>
#include <optional>
#include <string>

#include <boost/asio/post.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <fmt/format.h>

#include "http/transport.h"

namespace moeserve::http::detail {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

constexpr size_t kReadChunk = 16 * 1024;
constexpr size_t kMaxGather = 64;                // buffers per write system call
constexpr size_t kMaxDiscardBytes = 64u << 20;  // read and dropped while closing gracefully

int64_t to_ns(std::chrono::milliseconds ms) { return static_cast<int64_t>(ms.count()) * 1'000'000; }

struct Pending {
  Request request;
  bool keep_alive = true;
  int error_status = 0;  // a protocol error, answered instead of routed
  std::string error_message;
};

class Connection final : public ResponseSink,
                         public ConnectionControl,
                         public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, std::shared_ptr<ServerState> state, std::weak_ptr<void> io_keepalive)
      : socket_(std::move(socket)),
        ex_(socket_.get_executor()),
        state_(std::move(state)),
        opts_(state_->options),
        io_keepalive_(std::move(io_keepalive)) {}

  // Any thread (the acceptor's).
  void start(int reject_status) {
    state_->open_connections.fetch_add(1);
    id_ = state_->add_connection(std::weak_ptr<Connection>(shared_from_this()));
    error_code ec;
    tcp::endpoint remote = socket_.remote_endpoint(ec);
    if (!ec) {
      remote_address_ = remote.address().to_string();
      remote_port_ = remote.port();
    }
    socket_.set_option(tcp::no_delay(true), ec);  // SSE events must leave at once
    asio::post(ex_, [self = shared_from_this(), reject_status] {
      self->idle_since_ = now_ns();
      if (reject_status != 0) {
        self->protocol_error(reject_status, "the server has too many open connections; retry later");
      }
      self->update_read_deadline();
      self->do_read();
    });
  }

  // ResponseSink: any thread.
  void submit(uint64_t seq, std::string bytes, Completion completion) override {
    queued_.fetch_add(bytes.size());
    asio::post(ex_, [self = shared_from_this(), seq, bytes = std::move(bytes), completion]() mutable {
      self->on_submit(seq, std::move(bytes), completion);
    });
  }
  size_t queued_bytes() const override { return queued_.load(std::memory_order_relaxed); }
  bool draining() const override { return state_->draining.load(); }

  // ConnectionControl: any thread.
  void post_close(std::function<void()> done) override {
    asio::post(ex_, [self = shared_from_this(), done = std::move(done)] {
      self->close_socket();
      if (done) done();
    });
  }
  void post_drain() override {
    asio::post(ex_, [self = shared_from_this()] {
      if (!self->closed_ && self->idle()) self->close_socket();
    });
  }
  void post_check_timeouts() override {
    asio::post(ex_, [self = shared_from_this()] { self->check_timeouts(); });
  }
  bool deadline_passed(int64_t now) const override {
    int64_t rd = read_deadline_.load(std::memory_order_relaxed);
    int64_t wd = write_deadline_.load(std::memory_order_relaxed);
    return (rd != 0 && now >= rd) || (wd != 0 && now >= wd);
  }

 private:
  bool idle() const { return !active_ && !parser_ && inbuf_.size() == 0 && pending_.empty(); }

  // ---- input ----

  void do_read() {
    if (closed_ || reading_ || peer_eof_) return;
    bool discarding = lingering_ || input_done_;
    if (!discarding && pending_.size() >= opts_.max_pipelined_requests) return;  // resumed by finish_response
    reading_ = true;
    socket_.async_read_some(inbuf_.prepare(kReadChunk),
                            [self = shared_from_this()](error_code ec, size_t n) { self->on_read(ec, n); });
  }

  void on_read(error_code ec, size_t n) {
    reading_ = false;
    if (closed_) return;
    if (ec) {
      if (ec == asio::error::eof && !lingering_) {
        peer_eof_ = true;
        // A client that half-closes after its request still gets an answer the handler has completed;
        // an answer still being produced is abandoned (the usual case: the client went away).
        if (active_) {
          auto r = responder_.lock();
          if (r == nullptr || ResponderAccess::finished(*r)) {
            update_read_deadline();
            return;
          }
        }
      }
      close_socket();
      return;
    }
    inbuf_.commit(n);
    if (lingering_ || input_done_) {
      discarded_bytes_ += inbuf_.size();
      inbuf_.consume(inbuf_.size());
      if (discarded_bytes_ > kMaxDiscardBytes) {
        close_socket();
        return;
      }
      do_read();
      return;
    }
    parse_input();
    if (closed_) return;
    update_read_deadline();
    do_read();
  }

  void parse_input() {
    while (!closed_ && !input_done_ && inbuf_.size() > 0 && pending_.size() < opts_.max_pipelined_requests) {
      if (!parser_) {
        parser_.emplace();
        parser_->header_limit(static_cast<std::uint32_t>(
            std::min<size_t>(opts_.max_header_bytes, std::numeric_limits<std::uint32_t>::max())));
        parser_->body_limit(static_cast<std::uint64_t>(opts_.max_body_bytes));
        parser_->eager(true);
        request_since_ = now_ns();
        body_since_ = 0;
        continue_sent_ = false;
      }
      error_code ec;
      size_t used = parser_->put(inbuf_.data(), ec);
      inbuf_.consume(used);
      if (ec == bhttp::error::need_more) ec = {};
      if (ec) {
        parse_error(ec);
        return;
      }
      if (parser_->is_header_done() && body_since_ == 0) body_since_ = now_ns();
      if (parser_->is_done()) {
        bool keep_alive = parser_->get().keep_alive();
        pending_.push_back(make_pending(parser_->release(), keep_alive));
        parser_.reset();
        continue;
      }
      maybe_send_continue();
      if (used == 0) break;
    }
    dispatch_next();
  }

  Pending make_pending(bhttp::request<bhttp::string_body>&& msg, bool keep_alive) {
    Pending p;
    Request& r = p.request;
    r.method = std::string(msg.method_string());
    r.target = std::string(msg.target());
    split_target(r.target, r.path, r.query);
    for (const auto& field : msg) r.headers.add(std::string(field.name_string()), std::string(field.value()));
    r.body = std::move(msg.body());
    r.remote_address = remote_address_;
    r.remote_port = remote_port_;
    r.version = static_cast<int>(msg.version());
    p.keep_alive = keep_alive;
    return p;
  }

  void parse_error(const error_code& ec) {
    if (ec == bhttp::error::body_limit) {
      protocol_error(413, fmt::format("the request body is larger than the limit of {} bytes", opts_.max_body_bytes));
    } else if (ec == bhttp::error::header_limit) {
      protocol_error(431, fmt::format("the request header is larger than the limit of {} bytes",
                                      opts_.max_header_bytes));
    } else {
      protocol_error(400, fmt::format("malformed HTTP request: {}", ec.message()));
    }
  }

  // Answers `status` after whatever is already queued, then closes; later input is read and dropped.
  void protocol_error(int status, std::string message) {
    input_done_ = true;
    parser_.reset();
    inbuf_.consume(inbuf_.size());
    Pending p;
    p.keep_alive = false;
    p.error_status = status;
    p.error_message = std::move(message);
    pending_.push_back(std::move(p));
    dispatch_next();
  }

  // curl and others wait (about a second) for "100 Continue" before sending a large body.
  void maybe_send_continue() {
    if (continue_sent_ || !parser_ || !parser_->is_header_done() || parser_->is_done()) return;
    if (active_ || writing_ || !out_.empty()) return;  // would interleave with a response
    const auto& header = parser_->get();
    auto it = header.find(bhttp::field::expect);
    if (it == header.end() || !iequals(it->value(), "100-continue")) return;
    continue_sent_ = true;
    std::string bytes = "HTTP/1.1 100 Continue\r\n\r\n";
    queued_.fetch_add(bytes.size());
    out_.push_back(std::move(bytes));
    do_write();
  }

  // ---- requests and responses ----

  void dispatch_next() {
    if (closed_ || active_ || lingering_ || pending_.empty()) return;
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    active_ = true;
    ++seq_;
    completion_ = Completion::None;
    state_->begin_response();
    update_read_deadline();

    auto st = std::make_unique<ResponderState>();
    st->sink = std::weak_ptr<ResponseSink>(shared_from_this());
    st->io_keepalive = io_keepalive_.lock();
    st->seq = seq_;
    st->http11 = p.request.version >= 11;
    st->keep_alive = p.keep_alive && p.error_status == 0;
    st->max_stream_queue_bytes = opts_.max_stream_queue_bytes;
    auto responder = ResponderAccess::create(std::move(st));
    responder_ = responder;
    if (p.error_status != 0) {
      responder->respond_error(p.error_status, p.error_message);
      return;
    }
    state_->router.dispatch(p.request, responder);
  }

  void on_submit(uint64_t seq, std::string bytes, Completion completion) {
    size_t n = bytes.size();
    if (closed_ || !active_ || seq != seq_ || completion_ != Completion::None) {
      queued_.fetch_sub(n);
      return;
    }
    if (completion == Completion::Abort) {
      queued_.fetch_sub(n);
      close_socket();
      return;
    }
    if (n > 0) out_.push_back(std::move(bytes));
    completion_ = completion;
    do_write();
  }

  void do_write() {
    if (closed_ || writing_) return;
    if (out_.empty()) {
      if (active_ && completion_ != Completion::None) finish_response();
      return;
    }
    gather_.clear();
    size_t offset = out_offset_;
    for (auto it = out_.begin(); it != out_.end() && gather_.size() < kMaxGather; ++it) {
      gather_.emplace_back(it->data() + offset, it->size() - offset);
      offset = 0;
    }
    writing_ = true;
    write_deadline_.store(now_ns() + to_ns(opts_.write_timeout), std::memory_order_relaxed);
    socket_.async_write_some(gather_,
                             [self = shared_from_this()](error_code ec, size_t n) { self->on_write(ec, n); });
  }

  void on_write(error_code ec, size_t n) {
    writing_ = false;
    write_deadline_.store(0, std::memory_order_relaxed);
    if (closed_) return;
    if (ec) {
      close_socket();
      return;
    }
    queued_.fetch_sub(n);
    while (n > 0) {
      size_t left = out_.front().size() - out_offset_;
      if (n >= left) {
        n -= left;
        out_.pop_front();
        out_offset_ = 0;
      } else {
        out_offset_ += n;
        n = 0;
      }
    }
    do_write();
  }

  void finish_response() {
    Completion c = completion_;
    active_ = false;
    completion_ = Completion::None;
    responder_.reset();
    state_->end_response();
    if (c == Completion::Close) {
      start_linger();
      return;
    }
    if (pending_.empty() && (peer_eof_ || (state_->draining.load() && !parser_))) {
      if (peer_eof_) {
        close_socket();
      } else {
        start_linger();
      }
      return;
    }
    int64_t now = now_ns();
    idle_since_ = now;
    if (parser_) {
      request_since_ = now;  // the clock of a pipelined request starts when it is its turn
      if (body_since_ != 0) body_since_ = now;
    }
    dispatch_next();
    if (closed_) return;
    if (!input_done_ && inbuf_.size() > 0) parse_input();  // input parked while the pipeline was full
    if (closed_) return;
    update_read_deadline();
    maybe_send_continue();
    do_read();
  }

  // Graceful close: our side is finished; read (and drop) until the client closes, so that its unread
  // request bytes do not turn our close into a reset that destroys the answer it has not read yet.
  void start_linger() {
    if (closed_) return;
    if (peer_eof_) {
      close_socket();
      return;
    }
    lingering_ = true;
    pending_.clear();
    parser_.reset();
    inbuf_.consume(inbuf_.size());
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    linger_until_ = now_ns() + to_ns(opts_.linger_timeout);
    update_read_deadline();
    do_read();
  }

  void close_socket() {
    if (closed_) return;
    closed_ = true;
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    state_->remove_connection(id_);
    state_->open_connections.fetch_sub(1);
    read_deadline_.store(0);
    write_deadline_.store(0);
    pending_.clear();
    parser_.reset();
    if (!writing_) {  // else the cancelled write still refers to it; freed with the connection
      out_.clear();
      out_offset_ = 0;
    }
    if (active_) {
      active_ = false;
      state_->end_response();
      auto r = responder_.lock();
      responder_.reset();
      if (r != nullptr) ResponderAccess::notify_disconnected(*r);
    }
  }

  void check_timeouts() {
    if (closed_) return;
    int64_t now = now_ns();
    int64_t wd = write_deadline_.load(std::memory_order_relaxed);
    if (wd != 0 && now >= wd) {  // the client stopped reading
      close_socket();
      return;
    }
    int64_t rd = read_deadline_.load(std::memory_order_relaxed);
    if (rd == 0 || now < rd) return;
    if (lingering_ || idle()) {
      close_socket();
      return;
    }
    protocol_error(408, "timed out waiting for the rest of the request");
  }

  void update_read_deadline() {
    int64_t d = 0;
    if (closed_) {
      d = 0;
    } else if (lingering_) {
      d = linger_until_;
    } else if (active_ || input_done_ || peer_eof_) {
      d = 0;
    } else if (parser_ && parser_->is_header_done()) {
      d = body_since_ + to_ns(opts_.body_timeout);
    } else if (parser_ || inbuf_.size() > 0) {
      d = request_since_ + to_ns(opts_.header_timeout);
    } else {
      d = idle_since_ + to_ns(opts_.idle_timeout);
    }
    read_deadline_.store(d, std::memory_order_relaxed);
  }

  tcp::socket socket_;
  asio::any_io_executor ex_;  // the connection's strand
  std::shared_ptr<ServerState> state_;
  const ServerOptions& opts_;
  std::weak_ptr<void> io_keepalive_;
  uint64_t id_ = 0;
  std::string remote_address_;
  uint16_t remote_port_ = 0;

  // Input.
  beast::flat_buffer inbuf_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::deque<Pending> pending_;
  bool reading_ = false;
  bool input_done_ = false;  // after a protocol error: input is read and dropped
  bool peer_eof_ = false;
  bool continue_sent_ = false;
  bool lingering_ = false;
  size_t discarded_bytes_ = 0;

  // Read deadline: which clock applies depends on the phase (idle, header, body, linger).
  int64_t idle_since_ = 0;
  int64_t request_since_ = 0;
  int64_t body_since_ = 0;
  int64_t linger_until_ = 0;
  std::atomic<int64_t> read_deadline_{0};
  std::atomic<int64_t> write_deadline_{0};

  // The response being answered (at most one: pipelined requests wait in pending_).
  bool active_ = false;
  uint64_t seq_ = 0;
  std::weak_ptr<Responder> responder_;
  Completion completion_ = Completion::None;

  // Output.
  std::deque<std::string> out_;
  size_t out_offset_ = 0;  // bytes of out_.front() already written
  std::vector<asio::const_buffer> gather_;
  bool writing_ = false;
  std::atomic<size_t> queued_{0};
  bool closed_ = false;
};

}  // namespace

void start_connection(tcp::socket socket, std::shared_ptr<ServerState> state, std::weak_ptr<void> io_keepalive,
                      int reject_status) {
  auto connection = std::make_shared<Connection>(std::move(socket), std::move(state), std::move(io_keepalive));
  connection->start(reject_status);
}

}  // namespace moeserve::http::detail

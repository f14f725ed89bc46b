#include "http/server.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "core/error.h"
#include "http/connection.h"

namespace moeserve::http {

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

// Set on the server's I/O threads: calls that wait for I/O work must not wait there (they would wait for
// themselves).
thread_local bool t_on_io_thread = false;

constexpr std::chrono::seconds kShutdownStepTimeout{2};

std::chrono::milliseconds sweep_interval(const ServerOptions& o) {
  auto shortest = std::min({o.idle_timeout, o.header_timeout, o.body_timeout, o.write_timeout, o.linger_timeout});
  return std::clamp(shortest / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(250));
}

// Counts down posted work; the waiter may give up first, so it is shared.
struct Latch {
  explicit Latch(size_t n) : left(n) {}
  void count_down() {
    std::lock_guard lock(mu);
    if (left > 0 && --left == 0) cv.notify_all();
  }
  bool wait_for(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return left == 0; });
  }
  std::mutex mu;
  std::condition_variable cv;
  size_t left;
};

}  // namespace

struct Server::Impl {
  explicit Impl(ServerOptions options)
      : state(std::make_shared<detail::ServerState>(std::move(options))),
        ioc(std::make_shared<asio::io_context>(std::max(1, state->options.io_threads))),
        accept_strand(asio::make_strand(*ioc)),
        acceptor(accept_strand),
        accept_retry(accept_strand),
        sweep_timer(accept_strand) {}

  void do_accept() {
    acceptor.async_accept(asio::make_strand(*ioc),
                          [this](error_code ec, tcp::socket socket) { on_accept(ec, std::move(socket)); });
  }

  void on_accept(error_code ec, tcp::socket socket) {
    if (!acceptor.is_open()) return;  // stop_accepting()
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      if (ec == asio::error::connection_aborted) {  // the client gave up while queued: next one
        do_accept();
        return;
      }
      // Out of descriptors (EMFILE) or a connection reset while queued: back off instead of spinning.
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](error_code e) {
        if (!e && acceptor.is_open()) do_accept();
      });
      return;
    }
    int reject = state->open_connections.load() >= state->options.max_connections ? 503 : 0;
    detail::start_connection(std::move(socket), state, std::weak_ptr<void>(ioc), reject);
    do_accept();
  }

  void schedule_sweep() {
    sweep_timer.expires_after(sweep_interval(state->options));
    sweep_timer.async_wait([this](error_code ec) {
      if (ec) return;
      int64_t now = detail::now_ns();
      for (const auto& c : state->snapshot()) {
        if (c->deadline_passed(now)) c->post_check_timeouts();
      }
      schedule_sweep();
    });
  }

  // Runs `fn` on the acceptor's strand and waits for it (not on an I/O thread: there it only posts).
  void run_on_accept_strand(std::function<void()> fn) {
    auto done = std::make_shared<std::promise<void>>();
    auto future = done->get_future();
    asio::post(accept_strand, [fn = std::move(fn), done] {
      fn();
      done->set_value();
    });
    if (!t_on_io_thread) future.wait_for(kShutdownStepTimeout);
  }

  std::shared_ptr<detail::ServerState> state;
  std::shared_ptr<asio::io_context> ioc;  // shared with live Responders, which post to it
  asio::strand<asio::io_context::executor_type> accept_strand;
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  asio::steady_timer sweep_timer;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  uint16_t port = 0;
  bool started = false;
  bool stopped = false;
};

Server::Server(ServerOptions options) {
  MS_USER_CHECK(options.io_threads >= 1, "the HTTP server needs at least one I/O thread (got {})",
                options.io_threads);
  MS_USER_CHECK(options.max_pipelined_requests >= 1, "max_pipelined_requests must be at least 1");
  impl_ = std::make_unique<Impl>(std::move(options));
}

Server::~Server() { stop(); }

void Server::route(std::string method, std::string path, Handler handler) {
  MS_CHECK(!impl_->started, "routes must be added before the server starts ({} {})", method, path);
  impl_->state->router.add(std::move(method), std::move(path), std::move(handler));
}

void Server::start() {
  Impl& im = *impl_;
  MS_CHECK(!im.started, "the HTTP server was already started");
  const ServerOptions& o = im.state->options;

  error_code ec;
  tcp::endpoint endpoint;
  asio::ip::address address = asio::ip::make_address(o.host, ec);
  if (!ec) {
    endpoint = tcp::endpoint(address, o.port);
  } else {
    tcp::resolver resolver(*im.ioc);
    auto results = resolver.resolve(o.host, std::to_string(o.port), tcp::resolver::passive, ec);
    if (ec || results.empty()) {
      throw_user("cannot use host '{}': {} (give an IP address such as 127.0.0.1 or 0.0.0.0)", o.host,
                 ec ? ec.message() : "no address");
    }
    endpoint = results.begin()->endpoint();
  }

  im.acceptor.open(endpoint.protocol(), ec);
  if (ec) throw_user("cannot open a socket for {}:{}: {}", o.host, o.port, ec.message());
  im.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  im.acceptor.bind(endpoint, ec);
  if (ec == asio::error::address_in_use) {
    throw_user("port {} is in use: {} (another server is listening on {}:{}; stop it or choose another --port)",
               o.port, ec.message(), o.host, o.port);
  }
  if (ec) throw_user("cannot listen on {}:{}: {}", o.host, o.port, ec.message());
  im.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw_user("cannot listen on {}:{}: {}", o.host, o.port, ec.message());
  im.port = im.acceptor.local_endpoint(ec).port();

  im.state->router.set_api_key(o.api_key, o.auth_exempt_paths);
  im.started = true;
  im.work.emplace(im.ioc->get_executor());
  asio::post(im.accept_strand, [&im] {
    im.do_accept();
    im.schedule_sweep();
  });
  for (int i = 0; i < o.io_threads; ++i) {
    im.threads.emplace_back([ioc = im.ioc] {
      t_on_io_thread = true;
      while (true) {
        try {
          ioc->run();
          return;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "moeserve http: exception on an I/O thread: %s\n", e.what());
        }
      }
    });
  }
}

uint16_t Server::port() const { return impl_->port; }

const ServerOptions& Server::options() const { return impl_->state->options; }

void Server::stop_accepting() {
  Impl& im = *impl_;
  im.state->draining.store(true);
  if (!im.started || im.stopped) return;
  im.run_on_accept_strand([&im] {
    error_code ignored;
    im.acceptor.close(ignored);
    im.accept_retry.cancel();
  });
  for (const auto& c : im.state->snapshot()) c->post_drain();
}

bool Server::wait_idle(std::chrono::milliseconds timeout) {
  auto& st = *impl_->state;
  std::unique_lock lock(st.idle_mu);
  return st.idle_cv.wait_for(lock, timeout, [&] { return st.outstanding == 0; });
}

void Server::close_all() {
  Impl& im = *impl_;
  if (!im.started || im.stopped) return;
  stop_accepting();
  auto connections = im.state->snapshot();
  auto latch = std::make_shared<Latch>(connections.size());
  for (const auto& c : connections) c->post_close([latch] { latch->count_down(); });
  if (!t_on_io_thread) latch->wait_for(kShutdownStepTimeout);
}

void Server::stop() {
  Impl& im = *impl_;
  if (!im.started || im.stopped) return;
  close_all();
  im.stopped = true;
  im.work.reset();
  im.ioc->stop();
  for (auto& t : im.threads) {
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();  // stop() from a handler: this thread leaves run() when the handler returns
    } else {
      t.join();
    }
  }
  im.threads.clear();
}

size_t Server::open_connections() const { return impl_->state->open_connections.load(); }

size_t Server::outstanding_responses() const {
  auto& st = *impl_->state;
  std::lock_guard lock(st.idle_mu);
  return st.outstanding;
}

}  // namespace moeserve::http

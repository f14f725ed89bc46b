// Streaming (SSE over chunked encoding), disconnect detection, many concurrent streams, graceful shutdown.
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <set>
#include <mutex>
#include <thread>

#include "http/server.h"
#include "raw_client.h"

namespace moeserve::http {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using test::RawClient;
using test::get_request;
using test::post_request;

ServerOptions test_options() {
  ServerOptions o;
  o.port = 0;
  o.io_threads = 2;
  return o;
}

// Collects the Responders of streams as handlers start them, for a test thread to drive.
struct StreamBox {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<Responder>> streams;

  void add(std::shared_ptr<Responder> r) {
    std::lock_guard lock(mu);
    streams.push_back(std::move(r));
    cv.notify_all();
  }
  bool wait_for_count(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return streams.size() >= n; });
  }
  std::shared_ptr<Responder> at(size_t i) {
    std::lock_guard lock(mu);
    return streams.at(i);
  }
};

// Records when a disconnect callback fired.
struct DisconnectProbe {
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  Clock::time_point when;
  std::function<void()> callback() {
    return [this] {
      std::lock_guard lock(mu);
      ++calls;
      when = Clock::now();
      cv.notify_all();
    };
  }
  bool wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return calls > 0; });
  }
};

// GET /stream: starts a stream and leaves its responder in `box` (telling `probe`, if any, of a disconnect).
void add_stream_route(Server& server, StreamBox& box, DisconnectProbe* probe = nullptr) {
  server.route("GET", "/stream", [&box, probe](const Request&, std::shared_ptr<Responder> r) {
    if (probe != nullptr) r->on_disconnect(probe->callback());
    r->start_stream();
    box.add(std::move(r));
  });
}

TEST(HttpStreaming, SseFramingAndKeepAlive) {
  Server server(test_options());
  StreamBox box;
  add_stream_route(server, box);
  server.route("GET", "/health", [](const Request&, std::shared_ptr<Responder> r) { r->respond(200, "text/plain", "ok"); });
  server.start();

  RawClient c(server.port());
  c.send(get_request("/stream"));
  ASSERT_TRUE(box.wait_for_count(1, 5s));
  auto r = box.at(0);
  EXPECT_TRUE(r->is_open());
  ASSERT_TRUE(r->send_event({{"i", 0}, {"text", "héllo"}}));
  // Each event leaves at once: the client sees the first before the second is sent.
  ASSERT_TRUE(c.read_until("data: {\"i\":0,\"text\":\"héllo\"}\n\n"));
  EXPECT_NE(c.buffer().find("Content-Type: text/event-stream\r\n"), std::string::npos);
  EXPECT_NE(c.buffer().find("Transfer-Encoding: chunked\r\n"), std::string::npos);
  EXPECT_NE(c.buffer().find("Cache-Control: no-cache\r\n"), std::string::npos);

  std::thread producer([r] {
    EXPECT_TRUE(r->send_data("line1\nline2"));
    EXPECT_TRUE(r->send_chunk(": comment\n\n"));
    EXPECT_TRUE(r->send_chunk(""));  // nothing to send; must not end the stream
    EXPECT_TRUE(r->send_done());
    EXPECT_TRUE(r->end());
    EXPECT_FALSE(r->send_done());
    EXPECT_FALSE(r->end());
  });
  auto resp = c.read_response();
  producer.join();
  EXPECT_EQ(resp.status, 200);
  EXPECT_TRUE(resp.chunked);
  EXPECT_EQ(resp.body,
            "data: {\"i\":0,\"text\":\"héllo\"}\n\n"
            "data: line1\ndata: line2\n\n"
            ": comment\n\n"
            "data: [DONE]\n\n");
  EXPECT_TRUE(c.buffer().empty());

  // Same connection, next request.
  c.send(get_request("/health"));
  EXPECT_EQ(c.read_response().body, "ok");
  EXPECT_TRUE(server.wait_idle(1s));  // the client may read the answer before the server's write completes
}

TEST(HttpStreaming, DisconnectFiresPromptlyWhenClientLeavesMidStream) {
  Server server(test_options());
  StreamBox box;
  DisconnectProbe probe;
  server.route("GET", "/stream", [&](const Request&, std::shared_ptr<Responder> r) {
    r->on_disconnect(probe.callback());
    r->start_stream();
    r->send_event({{"token", "a"}});
    box.add(std::move(r));
  });
  server.start();

  RawClient c(server.port());
  c.send(get_request("/stream"));
  ASSERT_TRUE(c.read_until("data: {\"token\":\"a\"}\n\n"));
  ASSERT_TRUE(box.wait_for_count(1, 5s));
  EXPECT_EQ(server.outstanding_responses(), 1u);
  // Nothing is being written now: the server must notice the close through its pending read.
  auto closed_at = Clock::now();
  c.close();
  ASSERT_TRUE(probe.wait(2s));
  auto latency = probe.when - closed_at;
  EXPECT_LT(latency, 300ms);
  std::printf("[          ] on_disconnect fired %lld us after the client closed\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::microseconds>(latency).count()));
  auto r = box.at(0);
  EXPECT_FALSE(r->is_open());
  EXPECT_FALSE(r->send_event({{"token", "b"}}));
  EXPECT_FALSE(r->end());
  EXPECT_EQ(probe.calls, 1);
  EXPECT_TRUE(server.wait_idle(1s));

  // Registered after the close: runs at once.
  bool late = false;
  r->on_disconnect([&] { late = true; });
  EXPECT_TRUE(late);
}

TEST(HttpStreaming, DisconnectWhileTheAnswerIsBeingComputed) {
  Server server(test_options());
  StreamBox box;
  DisconnectProbe probe;
  server.route("POST", "/generate", [&](const Request&, std::shared_ptr<Responder> r) {
    r->on_disconnect(probe.callback());
    box.add(std::move(r));  // the "engine" holds it and never answers
  });
  server.start();
  RawClient c(server.port());
  c.send(post_request("/generate", "{}"));
  ASSERT_TRUE(box.wait_for_count(1, 5s));
  c.close();
  ASSERT_TRUE(probe.wait(2s));
  EXPECT_FALSE(box.at(0)->respond_json(200, {}));
}

TEST(HttpStreaming, SlowReaderIsDroppedInsteadOfBufferingForever) {
  ServerOptions o = test_options();
  o.max_stream_queue_bytes = 256u << 10;
  Server server(o);
  StreamBox box;
  DisconnectProbe probe;
  add_stream_route(server, box, &probe);
  server.start();
  RawClient c(server.port());  // never reads
  c.send(get_request("/stream"));
  ASSERT_TRUE(box.wait_for_count(1, 5s));
  auto r = box.at(0);
  std::string chunk(64u << 10, 'x');
  int sent = 0;
  bool refused = false;
  for (; sent < 4000; ++sent) {  // at most 256 MB; kernel buffers hold a few MB
    if (!r->send_chunk(chunk)) {
      refused = true;
      break;
    }
  }
  EXPECT_TRUE(refused) << "sent " << sent << " chunks";
  EXPECT_TRUE(probe.wait(2s));
  EXPECT_FALSE(r->is_open());
}

TEST(HttpStreaming, AbandonedStreamClosesTheConnection) {
  Server server(test_options());
  server.route("GET", "/stream", [](const Request&, std::shared_ptr<Responder> r) {
    r->start_stream();
    r->send_event({{"partial", true}});
    // r goes out of scope without end(): the client must not see a complete stream.
  });
  server.start();
  RawClient c(server.port());
  c.send(get_request("/stream"));
  EXPECT_TRUE(c.wait_closed(3s));
  EXPECT_NE(c.buffer().find("data: {\"partial\":true}"), std::string::npos);
  EXPECT_EQ(c.buffer().find("\r\n0\r\n\r\n"), std::string::npos);
}

TEST(HttpStreaming, Http10StreamEndsWithClose) {
  Server server(test_options());
  server.route("GET", "/stream", [](const Request&, std::shared_ptr<Responder> r) {
    r->start_stream();
    r->send_event({{"x", 1}});
    r->send_done();
    r->end();
  });
  server.start();
  RawClient c(server.port());
  c.send("GET /stream HTTP/1.0\r\n\r\n");
  ASSERT_TRUE(c.wait_closed(3s));
  auto resp = test::take_response(c.buffer(), true);
  ASSERT_TRUE(resp.has_value());
  EXPECT_FALSE(resp->chunked);
  EXPECT_EQ(resp->header("connection"), "close");
  EXPECT_EQ(resp->body, "data: {\"x\":1}\n\ndata: [DONE]\n\n");
}

void raise_fd_limit(rlim_t want) {
  rlimit lim{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &lim), 0);
  if (lim.rlim_cur >= want) return;
  lim.rlim_cur = std::min(want, lim.rlim_max);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lim), 0);
  ASSERT_GE(lim.rlim_cur, want) << "RLIMIT_NOFILE hard limit too low for this test";
}

TEST(HttpStreaming, ThousandConcurrentStreams) {
  constexpr size_t kStreams = 1000;
  constexpr int kEvents = 3;
  raise_fd_limit(2 * kStreams + 200);  // both ends live in this process

  Server server(test_options());
  StreamBox box;
  server.route("GET", "/stream", [&box](const Request& req, std::shared_ptr<Responder> r) {
    r->set_header("X-Stream-Id", req.query_param("id").value_or(""));
    r->start_stream();
    box.add(std::move(r));
  });
  server.start();
  auto t0 = Clock::now();

  std::vector<std::unique_ptr<RawClient>> clients;
  clients.reserve(kStreams);
  for (size_t i = 0; i < kStreams; ++i) {
    clients.push_back(std::make_unique<RawClient>(server.port()));
    clients.back()->send(get_request(fmt::format("/stream?id={}", i)));
  }
  // Every stream is open at the same time.
  ASSERT_TRUE(box.wait_for_count(kStreams, 20s)) << box.streams.size();
  EXPECT_EQ(server.open_connections(), kStreams);
  EXPECT_EQ(server.outstanding_responses(), kStreams);
  auto t_open = Clock::now();

  // The "engine": one thread sends every stream its events, interleaved.
  std::thread engine([&] {
    for (int e = 0; e < kEvents; ++e) {
      for (size_t i = 0; i < kStreams; ++i) {
        EXPECT_TRUE(box.at(i)->send_event({{"event", e}}));
      }
    }
    for (size_t i = 0; i < kStreams; ++i) {
      auto r = box.at(i);
      EXPECT_TRUE(r->send_done());
      EXPECT_TRUE(r->end());
    }
  });

  // Read all of them with poll() until each stream is complete.
  std::vector<pollfd> fds(kStreams);
  for (size_t i = 0; i < kStreams; ++i) fds[i] = pollfd{clients[i]->fd(), POLLIN, 0};
  std::vector<bool> done(kStreams, false);
  size_t remaining = kStreams;
  auto deadline = Clock::now() + 30s;
  while (remaining > 0 && Clock::now() < deadline) {
    int n = ::poll(fds.data(), fds.size(), 200);
    ASSERT_GE(n, 0);
    for (size_t i = 0; i < kStreams && n > 0; ++i) {
      if (fds[i].revents == 0) continue;
      --n;
      clients[i]->read_some(0ms);
      if (!done[i] && clients[i]->buffer().find("\r\n0\r\n\r\n") != std::string::npos) {
        done[i] = true;
        fds[i].fd = -1;  // poll ignores it from now on
        --remaining;
      }
      if (clients[i]->eof() && !done[i]) {
        ADD_FAILURE() << "stream " << i << " closed early";
        done[i] = true;
        fds[i].fd = -1;
        --remaining;
      }
    }
  }
  engine.join();
  ASSERT_EQ(remaining, 0u);

  std::string expected_body;
  for (int e = 0; e < kEvents; ++e) expected_body += fmt::format("data: {{\"event\":{}}}\n\n", e);
  expected_body += "data: [DONE]\n\n";
  // Responders were collected in arrival order: match them by the id echoed in a header.
  std::set<std::string> ids;
  for (size_t i = 0; i < kStreams; ++i) {
    auto resp = test::take_response(clients[i]->buffer());
    ASSERT_TRUE(resp.has_value()) << i;
    EXPECT_EQ(resp->status, 200);
    EXPECT_EQ(resp->header("x-stream-id"), std::to_string(i));
    ids.insert(resp->header("x-stream-id"));
    EXPECT_EQ(resp->body, expected_body) << i;
  }
  EXPECT_EQ(ids.size(), kStreams);
  EXPECT_TRUE(server.wait_idle(5s));
  auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
  std::printf("[          ] %zu streams open in %lld ms, all events delivered in %lld ms\n", kStreams,
              static_cast<long long>(ms(t_open - t0)), static_cast<long long>(ms(Clock::now() - t_open)));
}

TEST(HttpStreaming, GracefulShutdownLetsTheInFlightStreamFinish) {
  Server server(test_options());
  StreamBox box;
  DisconnectProbe probe;
  add_stream_route(server, box, &probe);
  server.route("GET", "/health", [](const Request&, std::shared_ptr<Responder> r) { r->respond(200, "text/plain", "ok"); });
  server.start();
  uint16_t port = server.port();

  RawClient streaming(port);
  streaming.send(get_request("/stream"));
  ASSERT_TRUE(box.wait_for_count(1, 5s));
  RawClient idle_keepalive(port);
  idle_keepalive.send(get_request("/health"));
  EXPECT_EQ(idle_keepalive.read_response().status, 200);

  server.stop_accepting();
  EXPECT_FALSE(RawClient::can_connect(port));
  EXPECT_TRUE(idle_keepalive.wait_closed(2s));  // idle connections are closed at once
  EXPECT_FALSE(server.wait_idle(100ms));        // the stream is still going

  auto r = box.at(0);
  std::thread engine([r] {
    std::this_thread::sleep_for(100ms);
    EXPECT_TRUE(r->send_event({{"after", "stop_accepting"}}));
    EXPECT_TRUE(r->send_done());
    EXPECT_TRUE(r->end());
  });
  EXPECT_TRUE(server.wait_idle(5s));
  engine.join();
  auto resp = streaming.read_response();
  EXPECT_EQ(resp.body, "data: {\"after\":\"stop_accepting\"}\n\ndata: [DONE]\n\n");
  EXPECT_TRUE(streaming.wait_closed(3s));  // no more requests on it: the server is going away
  EXPECT_EQ(probe.calls, 0);
  server.close_all();
  server.stop();
}

TEST(HttpStreaming, CloseAllEndsStreamsAndFiresDisconnect) {
  Server server(test_options());
  StreamBox box;
  DisconnectProbe probe;
  add_stream_route(server, box, &probe);
  server.start();
  RawClient c(server.port());
  c.send(get_request("/stream"));
  ASSERT_TRUE(box.wait_for_count(1, 5s));

  server.stop_accepting();
  EXPECT_FALSE(server.wait_idle(50ms));
  server.close_all();
  EXPECT_EQ(probe.calls, 1);  // already fired when close_all returns
  EXPECT_TRUE(server.wait_idle(1s));
  EXPECT_TRUE(c.wait_closed(2s));
  EXPECT_FALSE(box.at(0)->send_event({{"late", true}}));
  server.stop();
  // The engine may still hold Responders after the server is gone.
  EXPECT_FALSE(box.at(0)->end());
}

}  // namespace
}  // namespace moeserve::http

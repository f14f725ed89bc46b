// moeserve bench against a real (fake) streaming server on 127.0.0.1 with known timing: first token after
// 30 ms, then a token every 10 ms.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <numeric>

#include "benchclient/bench.h"
#include "benchclient/dataset.h"
#include "core/error.h"
#include "fake_server.h"

namespace moeserve::bench {
namespace {

using testing::FakeServer;
using testing::FakeServerOptions;

constexpr double kTtft = 0.03, kItl = 0.01;
// Upper slack for a loaded 2-core machine; lower bounds are exact (the server sleeps at least that long).
constexpr double kSlackMs = 150;

FakeServerOptions server_options() {
  FakeServerOptions o;
  o.ttft_s = kTtft;
  o.itl_s = kItl;
  return o;
}

BenchConfig config(uint16_t port) {
  BenchConfig c;
  c.port = port;
  c.num_prompts = 12;
  c.random_input_len = 32;
  c.random_output_len = 6;
  c.random_range_ratio = 1.0;
  c.max_concurrency = 4;
  c.disable_tqdm = true;
  return c;
}

// first_tokens: tokens in the first event (the server sends that many per event).
void expect_plausible_timing(const BenchOutcome& out, int64_t tokens_per_request, int64_t first_tokens = 1) {
  for (auto& r : out.results) {
    ASSERT_TRUE(r.success) << r.error;
    EXPECT_EQ(r.output_len, tokens_per_request);
    EXPECT_GE(r.ttft_s * 1e3, kTtft * 1e3 - 0.5);
    EXPECT_LE(r.ttft_s * 1e3, kTtft * 1e3 + kSlackMs);
    double itl_sum = std::accumulate(r.itl_s.begin(), r.itl_s.end(), 0.0);
    EXPECT_GE(r.latency_s, r.ttft_s + itl_sum - 1e-9);
  }
  EXPECT_GE(out.metrics.itl_ms.mean, kItl * 1e3 * 0.75);
  EXPECT_LE(out.metrics.itl_ms.mean, kItl * 1e3 + 20);
  // The decode time is (n - first) * itl, spread over n - 1 tokens.
  double tpot_ms = kItl * 1e3 * double(tokens_per_request - first_tokens) / double(tokens_per_request - 1);
  // Lower bound as loose as the ITL's: when the client reads the first event late (a loaded 2-core machine), that lag
  // is counted in the TTFT and taken out of the TPOT (seen at 9.4995 against a bound of 9.5 under ./scripts/test.sh).
  EXPECT_GE(out.metrics.tpot_ms.mean, tpot_ms * 0.75);
  EXPECT_LE(out.metrics.tpot_ms.mean, tpot_ms + 20);
  double min_e2e = (kTtft + kItl * double(tokens_per_request - first_tokens)) * 1e3;
  EXPECT_GE(out.metrics.e2e_ms.min, min_e2e - 0.5);
  EXPECT_LE(out.metrics.e2e_ms.median, min_e2e + kSlackMs);
}

TEST(BenchE2E, SglangBackendCountsTimingConcurrencyAndKeepAlive) {
  FakeServer server(server_options());
  BenchConfig c = config(server.port());
  BenchOutcome out = run_benchmark(c, nullptr);
  EXPECT_EQ(out.metrics.completed, 12);
  EXPECT_EQ(out.metrics.failed, 0);
  EXPECT_EQ(out.metrics.total_input, 12 * 32);  // the server's prompt_tokens
  EXPECT_EQ(out.metrics.total_output, 12 * 6);
  expect_plausible_timing(out, 6);
  EXPECT_EQ(out.metrics.itl_ms.count, 12u * 5);
  // 12 requests, 4 at a time, about 80 ms each: three waves.
  EXPECT_GE(out.metrics.duration_s, 3 * (kTtft + 5 * kItl) - 0.002);
  EXPECT_GT(out.metrics.concurrency, 2.0);
  EXPECT_LE(out.metrics.concurrency, 4.0 + 1e-9);
  EXPECT_LE(server.max_in_flight(), 4);
  EXPECT_EQ(server.generation_requests(), 13);  // one warm-up
  // Keep-alive: never more connections than requests in flight (the warm-up's is reused).
  EXPECT_LE(server.connections(), 4);
  EXPECT_EQ(int(out.connections_opened), server.connections());
  // Token-id prompts within the vocabulary that /get_model_info gave.
  auto bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 13u);
  EXPECT_EQ(bodies[0]["sampling_params"]["max_new_tokens"], 6);
  for (auto& b : bodies) {
    ASSERT_EQ(b["input_ids"].size(), 32u);
    for (auto& id : b["input_ids"]) EXPECT_LT(id.get<int>(), 1000);
    EXPECT_EQ(b["sampling_params"]["ignore_eos"], true);
    EXPECT_EQ(b["stream"], true);
  }
}

TEST(BenchE2E, MultiTokenEventsAreSpreadForSglangAndCountedForOpenAi) {
  FakeServerOptions o = server_options();
  o.tokens_per_event = 2;
  FakeServer server(o);
  BenchConfig c = config(server.port());
  c.random_output_len = 8;
  c.vocab_size = 500;
  BenchOutcome sg = run_benchmark(c, nullptr);
  expect_plausible_timing(sg, 8, 2);
  for (auto& r : sg.results) EXPECT_EQ(r.itl_s.size(), 6u);  // 2 + 2 + 2 + 2 tokens: 3 gaps spread over 2 each

  c.backend = "openai";
  BenchOutcome oa = run_benchmark(c, nullptr);
  EXPECT_EQ(oa.metrics.completed, 12);
  EXPECT_EQ(oa.metrics.total_output, 12 * 8);  // from the final usage chunk
  for (auto& r : oa.results) EXPECT_EQ(r.itl_s.size(), 3u);  // no per-chunk usage: one token per chunk
  // One gap per two-token chunk. (A single gap may be short when the chunk before it was late: the server keeps
  // to its schedule.)
  EXPECT_GE(oa.metrics.itl_ms.mean, 2 * kItl * 1e3 * 0.75);
  EXPECT_LE(oa.metrics.itl_ms.mean, 2 * kItl * 1e3 + 20);
  auto bodies = server.bodies();
  EXPECT_EQ(bodies.back()["model"], "fake-model");  // from GET /v1/models
  EXPECT_EQ(bodies.back()["prompt"].size(), 32u);
  EXPECT_EQ(bodies.back()["max_tokens"], 8);
  EXPECT_EQ(bodies.back()["stream_options"]["include_usage"], true);
}

TEST(BenchE2E, OpenAiChatWithTextPromptsAndApiKey) {
  FakeServer server(server_options());
  BenchConfig c = config(server.port());
  c.backend = "openai-chat";
  c.api_key = "sk-test";
  c.model = "mine";
  BenchOutcome out = run_benchmark(c, nullptr);
  EXPECT_EQ(out.metrics.completed, 12);
  EXPECT_EQ(out.metrics.total_input, 12 * 32);  // the server counts the words
  expect_plausible_timing(out, 6);
  EXPECT_EQ(out.metrics.itl_ms.count, 12u * 5);  // the role-only first chunk carries no token
  for (auto& h : server.request_heads()) EXPECT_NE(h.find("Authorization: Bearer sk-test"), std::string::npos);
  EXPECT_EQ(server.bodies().back()["model"], "mine");
  EXPECT_TRUE(server.bodies().back()["messages"][0]["content"].is_string());
}

TEST(BenchE2E, HttpErrorsCountAsFailuresAndClosedKeepAliveConnectionsAreRetried) {
  FakeServerOptions o = server_options();
  o.reject_every = 5;
  o.max_requests_per_conn = 2;  // the server drops each connection after two responses, without saying so
  FakeServer server(o);
  BenchConfig c = config(server.port());
  c.num_prompts = 20;
  c.warmup_requests = 0;
  c.max_concurrency = 3;
  c.vocab_size = 100;
  BenchOutcome out = run_benchmark(c, nullptr);
  EXPECT_EQ(out.metrics.failed, 4);
  EXPECT_EQ(out.metrics.completed, 16);
  EXPECT_EQ(out.metrics.total_output, 16 * 6);
  ASSERT_EQ(out.json["errors"].size(), 1u) << out.json["errors"].dump();
  EXPECT_EQ(out.json["errors"][0]["error"], "HTTP 400: prompt is too long");
  EXPECT_EQ(out.json["errors"][0]["count"], 4);
  for (auto& r : out.results) {
    if (!r.success) {
      EXPECT_EQ(r.http_status, 400);
    }
  }
  EXPECT_GE(server.connections(), 10);  // 20 responses, two per connection
}

TEST(BenchE2E, PoissonArrivalsAreHonoured) {
  FakeServer server(server_options());
  BenchConfig c = config(server.port());
  c.num_prompts = 10;
  c.max_concurrency = 0;
  c.request_rate = 25;
  c.random_output_len = 2;
  c.vocab_size = 100;
  c.warmup_requests = 0;
  BenchOutcome out = run_benchmark(c, nullptr);
  auto at = make_arrival_times(10, 25, 1.0, arrival_seed(c.seed));
  ASSERT_EQ(out.results.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_GE(out.results[i].start_s, at[i] - 1e-3) << i;
    EXPECT_LE(out.results[i].start_s, at[i] + 0.05) << i;
  }
  EXPECT_GE(out.metrics.duration_s, at.back() + kTtft + kItl);
}

TEST(BenchE2E, NonStreamingOutputFileAndDetails) {
  FakeServer server(server_options());
  BenchConfig c = config(server.port());
  c.num_prompts = 4;
  c.disable_stream = true;
  c.output_file = ::testing::TempDir() + "/bench_e2e_" + std::to_string(::getpid()) + ".jsonl";
  c.output_details = true;
  std::remove(c.output_file.c_str());
  BenchOutcome out = run_benchmark(c, nullptr);
  for (auto& r : out.results) {
    EXPECT_TRUE(r.success) << r.error;
    EXPECT_DOUBLE_EQ(r.ttft_s, r.latency_s);
    EXPECT_EQ(r.output_len, 6);
  }
  c.output_details = false;
  run_benchmark(c, nullptr);
  std::ifstream in(c.output_file);
  std::string line;
  std::vector<nlohmann::json> lines;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["completed"], 4);
  EXPECT_EQ(lines[0]["output_lens"].size(), 4u);
  EXPECT_FALSE(lines[1].contains("output_lens"));
  EXPECT_EQ(lines[1]["max_concurrency"], 4);
  std::remove(c.output_file.c_str());
}

TEST(BenchE2E, SlowRequestsTimeOut) {
  FakeServerOptions o = server_options();
  o.ttft_s = 0.4;
  FakeServer server(o);
  BenchConfig c = config(server.port());
  c.num_prompts = 2;
  c.warmup_requests = 0;
  c.vocab_size = 10;
  c.request_timeout_s = 0.1;
  BenchOutcome out = run_benchmark(c, nullptr);
  EXPECT_EQ(out.metrics.failed, 2);
  for (auto& r : out.results) {
    EXPECT_EQ(r.error, "timed out after 0.1 s");
    EXPECT_LT(r.latency_s, 0.3);
  }
}

TEST(BenchE2E, UnreachableServerAndBadSettingsAreUserErrors) {
  // A port with nothing listening: bind, read the port, close.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  BenchConfig c = config(ntohs(addr.sin_port));
  try {
    run_benchmark(c, nullptr);  // needs /get_model_info for the vocabulary
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot reach the server"), std::string::npos) << e.what();
  }
  c.vocab_size = 100;
  try {
    run_benchmark(c, nullptr);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("warm-up failed"), std::string::npos) << e.what();
  }
  c.backend = "nope";
  EXPECT_THROW(run_benchmark(c, nullptr), UserError);
  c.backend = "sglang";
  c.extra_request_body = "[1]";
  EXPECT_THROW(run_benchmark(c, nullptr), UserError);
}

}  // namespace
}  // namespace moeserve::bench

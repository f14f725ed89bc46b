#include <gtest/gtest.h>

#include <cmath>

#include "benchclient/metrics.h"

namespace moeserve::bench {
namespace {

// Expected values are numpy.percentile(values, q) with the default linear method, worked by hand:
// position (n - 1) q / 100 between the sorted values.
TEST(Percentile, MatchesNumpyLinear) {
  std::vector<double> v = {10, 1, 4, 3, 2};  // sorted: 1 2 3 4 10
  EXPECT_DOUBLE_EQ(percentile(v, 50), 3.0);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 7.6);   // pos 3.6: 4 + 0.6 * 6
  EXPECT_DOUBLE_EQ(percentile(v, 99), 9.76);  // pos 3.96: 4 + 0.96 * 6
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 10.0);
  EXPECT_DOUBLE_EQ(percentile({15, 20, 35, 40, 50}, 40), 29.0);  // pos 1.6: 20 + 0.6 * 15
  EXPECT_DOUBLE_EQ(percentile({0, 10}, 25), 2.5);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 50), 2.5);  // even count: the mean of the middle two
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7.0);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0.0);
}

TEST(Percentile, SummarizeMeanStdMinMax) {
  Distribution d = summarize({2, 4, 4, 4, 5, 5, 7, 9});
  EXPECT_EQ(d.count, 8u);
  EXPECT_DOUBLE_EQ(d.mean, 5.0);
  EXPECT_DOUBLE_EQ(d.std, 2.0);  // population std (numpy ddof=0)
  EXPECT_DOUBLE_EQ(d.median, 4.5);
  EXPECT_DOUBLE_EQ(d.min, 2.0);
  EXPECT_DOUBLE_EQ(d.max, 9.0);
  EXPECT_DOUBLE_EQ(d.p90, 7.6);  // pos 6.3: 7 + 0.3 * 2
  Distribution e = summarize({});
  EXPECT_EQ(e.count, 0u);
  EXPECT_EQ(e.mean, 0.0);
}

std::vector<RequestResult> sample_results() {
  RequestResult a, b, c, d;
  a.success = true, a.ttft_s = 0.1, a.latency_s = 0.5, a.output_len = 5, a.prompt_len = 10;
  a.itl_s = {0.1, 0.1, 0.1, 0.1};
  b.success = true, b.ttft_s = 0.2, b.latency_s = 0.4, b.output_len = 3, b.prompt_len = 20, b.itl_s = {0.1, 0.1};
  c.success = false, c.error = "HTTP 400: too long", c.prompt_len = 99, c.output_len = 7;
  d.success = true, d.ttft_s = 0.3, d.latency_s = 0.3, d.output_len = 1, d.prompt_len = 5;  // no TPOT
  return {a, b, c, d};
}

TEST(Metrics, ComputedLikeSglang) {
  BenchMetrics m = compute_metrics(sample_results(), 2.0);
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 35);  // failed requests do not count
  EXPECT_EQ(m.total_output, 9);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.input_throughput, 17.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 4.5);
  EXPECT_DOUBLE_EQ(m.total_throughput, 22.0);
  EXPECT_NEAR(m.concurrency, 0.6, 1e-12);  // (0.5 + 0.4 + 0.3) / 2
  EXPECT_EQ(m.tpot_ms.count, 2u);         // (0.5-0.1)/4 and (0.4-0.2)/2
  EXPECT_NEAR(m.tpot_ms.mean, 100.0, 1e-9);
  EXPECT_EQ(m.itl_ms.count, 6u);
  EXPECT_NEAR(m.itl_ms.p99, 100.0, 1e-9);
  EXPECT_NEAR(m.ttft_ms.mean, 200.0, 1e-9);
  EXPECT_NEAR(m.ttft_ms.median, 200.0, 1e-9);
  EXPECT_NEAR(m.ttft_ms.p90, 280.0, 1e-9);  // 100 200 300: pos 1.8
  EXPECT_NEAR(m.e2e_ms.p99, 498.0, 1e-9);   // 300 400 500: pos 1.98
}

// vLLM's peak rates over one-second buckets from the first start, worked by hand (binary fractions, exact):
//   a: start 0, events 0.5 0.875 1.25 1.625 (4 tokens, one an event), in flight 0 - 1.625 (buckets 0, 1)
//   b: start 0.25, events 0.75 0.875 1.125 (6 tokens: two an event), in flight 0.25 - 1.125 (buckets 0, 1)
//   c: start 2.5, one event 2.75 (1 token), in flight 2.5 - 2.75 (bucket 2); a failed request counts nowhere.
// Tokens by bucket 2 + 4, 2 + 2, 1, 0 -> peak 6; requests in flight 2, 2, 1, 0 -> peak 2.
TEST(Metrics, PeakRatesOverOneSecondBuckets) {
  RequestResult a, b, c, f;
  a.success = true, a.start_s = 0, a.ttft_s = 0.5, a.itl_s = {0.375, 0.375, 0.375}, a.latency_s = 1.625;
  a.output_len = 4;
  b.success = true, b.start_s = 0.25, b.ttft_s = 0.5, b.itl_s = {0.125, 0.25}, b.latency_s = 0.875, b.output_len = 6;
  c.success = true, c.start_s = 2.5, c.ttft_s = 0.25, c.latency_s = 0.25, c.output_len = 1;
  f.success = false, f.start_s = 0.5, f.latency_s = 9, f.output_len = 50;
  BenchMetrics m = compute_metrics({a, b, c, f}, 2.75);
  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 6.0);
  EXPECT_EQ(m.max_concurrent_requests, 2);
  // Two more requests in flight through second 2, whose events there outnumber the first second's.
  RequestResult d = c, e = c;
  d.start_s = 2.0, d.ttft_s = 0.25, d.itl_s = {0.25, 0.25}, d.latency_s = 0.75, d.output_len = 9;
  BenchMetrics m2 = compute_metrics({a, b, c, d, e, f}, 2.75);
  EXPECT_DOUBLE_EQ(m2.max_output_tokens_per_s, 11.0);  // bucket 2: 1 + 9 + 1
  EXPECT_EQ(m2.max_concurrent_requests, 3);
  BenchMetrics none = compute_metrics({f}, 1.0);
  EXPECT_EQ(none.max_output_tokens_per_s, 0.0);
  EXPECT_EQ(none.max_concurrent_requests, 0);
  RunInfo info;
  const std::string report = format_report(m, info);
  EXPECT_NE(report.find("Peak output token throughput (tok/s):    6.00"), std::string::npos) << report;
  EXPECT_NE(report.find("Peak concurrent requests:                2.00"), std::string::npos) << report;
  const nlohmann::json j = metrics_to_json(m, info, {a, b, c, f}, false);
  EXPECT_DOUBLE_EQ(j["max_output_tokens_per_s"].get<double>(), 6.0);
  EXPECT_EQ(j["max_concurrent_requests"], 2);
}

TEST(Metrics, ReportAndJson) {
  auto results = sample_results();
  BenchMetrics m = compute_metrics(results, 2.0);
  RunInfo info;
  info.backend = "sglang";
  info.dataset_name = "random";
  info.request_rate = INFINITY;
  info.max_concurrency = 0;
  std::string report = format_report(m, info);
  EXPECT_EQ(report.substr(0, 51), std::string(12, '=') + " Serving Benchmark Result " + std::string(12, '=') + "\n")
      << report;
  EXPECT_NE(report.find("Successful requests:                     3         \n"), std::string::npos) << report;
  EXPECT_NE(report.find("Traffic request rate:                    inf"), std::string::npos);
  EXPECT_NE(report.find("Max request concurrency:                 not set"), std::string::npos);
  EXPECT_NE(report.find("Mean TTFT (ms):                          200.00"), std::string::npos);
  EXPECT_NE(report.find("P90 TTFT (ms):                           280.00"), std::string::npos);
  EXPECT_NE(report.find("P99 E2E Latency (ms):                    498.00"), std::string::npos);
  EXPECT_NE(report.find("Max ITL (ms):"), std::string::npos);
  for (auto& line : {std::string("Time to First Token"), std::string("Inter-Token Latency")})
    EXPECT_NE(report.find(line), std::string::npos);

  nlohmann::json j = metrics_to_json(m, info, results, false);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_TRUE(j["max_concurrency"].is_null());
  EXPECT_EQ(j["completed"], 3);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["total_input_tokens"], 35);
  EXPECT_EQ(j["total_output_tokens"], 9);
  EXPECT_DOUBLE_EQ(j["mean_ttft_ms"].get<double>(), 200.0);
  for (const char* k : {"duration", "request_throughput", "input_throughput", "output_throughput", "total_throughput",
                        "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "p95_itl_ms", "mean_tpot_ms",
                        "mean_e2e_latency_ms", "median_e2e_latency_ms", "p90_e2e_latency_ms", "p99_e2e_latency_ms",
                        "concurrency"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["errors"][0]["error"], "HTTP 400: too long");
  EXPECT_EQ(j["errors"][0]["count"], 1);
  EXPECT_FALSE(j.contains("itls"));
  nlohmann::json d = metrics_to_json(m, info, results, true);
  EXPECT_EQ(d["itls"].size(), 4u);
  EXPECT_EQ(d["output_lens"][0], 5);
}

}  // namespace
}  // namespace moeserve::bench

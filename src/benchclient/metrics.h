// Per-request measurements and what the benchmark reports from them (SGLang bench_serving's definitions):
//  TTFT  time from sending the request to the first token-bearing response event;
//  ITL   gaps between token-bearing events, one entry per token: an event carrying k new tokens after a gap g
//        adds k entries of g/k (SGLang's spreading), so sum(ITL) = e2e - TTFT and count(ITL) = tokens minus the
//        first event's tokens;
//  TPOT  per request (e2e - TTFT) / (output tokens - 1), for requests with more than one output token;
//  E2E   time from sending the request to the end of the response.
// Percentiles use numpy's default (linear interpolation between closest ranks).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::bench {

struct RequestResult {
  bool success = false;
  int http_status = 0;   // 0 when no response arrived
  std::string error;     // why it failed
  double start_s = 0;    // when it was sent, seconds from the benchmark start
  double ttft_s = 0;     // 0 if no token arrived
  double latency_s = 0;  // end to end
  std::vector<double> itl_s;
  int64_t prompt_len = 0;    // the server's prompt token count when it gave one, else the dataset's
  int64_t output_len = 0;    // the server's completion token count when it gave one, else tokens counted in the stream
  int64_t output_chars = 0;  // generated text length in bytes (0 when the server sends ids only)
};

// numpy.percentile(values, q) with the default 'linear' method; values need not be sorted. 0 when empty.
double percentile(std::vector<double> values, double q);

struct Distribution {
  size_t count = 0;
  double mean = 0, std = 0, min = 0, max = 0, median = 0, p90 = 0, p95 = 0, p99 = 0;
};
Distribution summarize(const std::vector<double>& values);

struct BenchMetrics {
  int64_t completed = 0, failed = 0;
  int64_t total_input = 0, total_output = 0;
  double duration_s = 0;
  double request_throughput = 0, input_throughput = 0, output_throughput = 0, total_throughput = 0;
  double concurrency = 0;  // sum of e2e latencies / duration: the mean number of requests in flight
  // vLLM's peaks over one-second buckets from the first request's start: output tokens whose stream event (the first
  // token, then each ITL) fell in the bucket (a request's tokens spread evenly over its events, so that events
  // carrying several tokens count them all), and requests in flight at some time in the bucket.
  double max_output_tokens_per_s = 0;
  int64_t max_concurrent_requests = 0;
  Distribution ttft_ms, tpot_ms, itl_ms, e2e_ms;
};
BenchMetrics compute_metrics(const std::vector<RequestResult>& results, double duration_s);

// What was run, for the report header and the JSON line.
struct RunInfo {
  std::string backend, dataset_name, base_url, model;
  double request_rate = 0;  // inf allowed
  double burstiness = 1;
  int64_t max_concurrency = 0;  // 0: no limit
  int64_t num_prompts = 0, seed = 0;
  int64_t random_input_len = 0, random_output_len = 0, sharegpt_output_len = 0;
  double random_range_ratio = 0;
};

// SGLang-style result table.
std::string format_report(const BenchMetrics& m, const RunInfo& info);
// One JSON object: SGLang's --output-file keys (plus p90s, failed, errors). details: per-request arrays too.
nlohmann::json metrics_to_json(const BenchMetrics& m, const RunInfo& info, const std::vector<RequestResult>& results,
                               bool details);

}  // namespace moeserve::bench

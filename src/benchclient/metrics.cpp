#include "benchclient/metrics.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include <fmt/format.h>

namespace moeserve::bench {

using nlohmann::json;

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double pos = (double(v.size()) - 1) * std::clamp(q, 0.0, 100.0) / 100.0;
  size_t lo = size_t(std::floor(pos)), hi = std::min(lo + 1, v.size() - 1);
  double frac = pos - double(lo);
  return v[lo] + (v[hi] - v[lo]) * frac;
}

Distribution summarize(const std::vector<double>& values) {
  Distribution d;
  d.count = values.size();
  if (values.empty()) return d;
  std::vector<double> v = values;
  std::sort(v.begin(), v.end());
  double n = double(v.size());
  d.mean = std::accumulate(v.begin(), v.end(), 0.0) / n;
  double ss = 0;
  for (double x : v) ss += (x - d.mean) * (x - d.mean);
  d.std = std::sqrt(ss / n);  // numpy's default ddof=0
  d.min = v.front();
  d.max = v.back();
  d.median = percentile(v, 50);
  d.p90 = percentile(v, 90);
  d.p95 = percentile(v, 95);
  d.p99 = percentile(v, 99);
  return d;
}

namespace {

// BenchMetrics::max_output_tokens_per_s and max_concurrent_requests.
void peak_rates(const std::vector<RequestResult>& results, BenchMetrics& m) {
  double first = INFINITY, last = -INFINITY;
  for (auto& r : results)
    if (r.success) first = std::min(first, r.start_s), last = std::max(last, r.start_s + r.latency_s);
  if (!(first <= last)) return;
  const size_t buckets = size_t(std::ceil(last - first)) + 1;
  std::vector<double> tokens(buckets, 0.0);
  std::vector<int64_t> in_flight(buckets, 0);
  auto bucket = [&](double t) { return std::min(size_t(std::max(t - first, 0.0)), buckets - 1); };
  for (auto& r : results) {
    if (!r.success) continue;
    const size_t events = 1 + r.itl_s.size();
    const double per_event = r.output_len > 0 ? double(r.output_len) / double(events) : 1.0;
    double t = r.start_s + r.ttft_s;
    tokens[bucket(t)] += per_event;
    for (double x : r.itl_s) tokens[bucket(t += x)] += per_event;
    for (size_t b = bucket(r.start_s), e = bucket(r.start_s + r.latency_s); b <= e; ++b) ++in_flight[b];
  }
  m.max_output_tokens_per_s = *std::max_element(tokens.begin(), tokens.end());
  m.max_concurrent_requests = *std::max_element(in_flight.begin(), in_flight.end());
}

}  // namespace

BenchMetrics compute_metrics(const std::vector<RequestResult>& results, double duration_s) {
  BenchMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  for (auto& r : results) {
    if (!r.success) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    m.total_input += r.prompt_len;
    m.total_output += r.output_len;
    if (r.output_len > 1) tpot.push_back((r.latency_s - r.ttft_s) / double(r.output_len - 1) * 1e3);
    for (double x : r.itl_s) itl.push_back(x * 1e3);
    ttft.push_back(r.ttft_s * 1e3);
    e2e.push_back(r.latency_s * 1e3);
  }
  if (duration_s > 0) {
    m.request_throughput = double(m.completed) / duration_s;
    m.input_throughput = double(m.total_input) / duration_s;
    m.output_throughput = double(m.total_output) / duration_s;
    m.total_throughput = double(m.total_input + m.total_output) / duration_s;
    m.concurrency = std::accumulate(e2e.begin(), e2e.end(), 0.0) / 1e3 / duration_s;
  }
  peak_rates(results, m);
  m.ttft_ms = summarize(ttft);
  m.tpot_ms = summarize(tpot);
  m.itl_ms = summarize(itl);
  m.e2e_ms = summarize(e2e);
  return m;
}

namespace {

std::string rate_text(double rate) { return std::isinf(rate) ? "inf" : fmt::format("{:.2f}", rate); }

void row(std::string& out, const std::string& name, const std::string& value) {
  out += fmt::format("{:<40} {:<10}\n", name, value);
}
void row(std::string& out, const std::string& name, double value) {
  out += fmt::format("{:<40} {:<10.2f}\n", name, value);
}
void title(std::string& out, const std::string& s, char fill) {
  out += fill == '=' ? fmt::format("{:=^50}\n", s) : fmt::format("{:-^50}\n", s);
}

void dist_rows(std::string& out, const std::string& name, const Distribution& d, bool with_p95_max) {
  row(out, fmt::format("Mean {} (ms):", name), d.mean);
  row(out, fmt::format("Median {} (ms):", name), d.median);
  row(out, fmt::format("P90 {} (ms):", name), d.p90);
  if (with_p95_max) row(out, fmt::format("P95 {} (ms):", name), d.p95);
  row(out, fmt::format("P99 {} (ms):", name), d.p99);
  if (with_p95_max) row(out, fmt::format("Max {} (ms):", name), d.max);
}

}  // namespace

std::string format_report(const BenchMetrics& m, const RunInfo& info) {
  std::string out;
  title(out, " Serving Benchmark Result ", '=');
  row(out, "Backend:", info.backend);
  row(out, "Traffic request rate:", rate_text(info.request_rate));
  row(out, "Max request concurrency:", info.max_concurrency > 0 ? std::to_string(info.max_concurrency) : "not set");
  row(out, "Successful requests:", std::to_string(m.completed));
  row(out, "Failed requests:", std::to_string(m.failed));
  row(out, "Benchmark duration (s):", m.duration_s);
  row(out, "Total input tokens:", std::to_string(m.total_input));
  row(out, "Total generated tokens:", std::to_string(m.total_output));
  row(out, "Request throughput (req/s):", m.request_throughput);
  row(out, "Input token throughput (tok/s):", m.input_throughput);
  row(out, "Output token throughput (tok/s):", m.output_throughput);
  row(out, "Peak output token throughput (tok/s):", m.max_output_tokens_per_s);
  row(out, "Peak concurrent requests:", double(m.max_concurrent_requests));
  row(out, "Total token throughput (tok/s):", m.total_throughput);
  row(out, "Concurrency:", m.concurrency);
  title(out, "End-to-End Latency", '-');
  dist_rows(out, "E2E Latency", m.e2e_ms, false);
  title(out, "Time to First Token", '-');
  dist_rows(out, "TTFT", m.ttft_ms, false);
  title(out, "Time per Output Token (excl. 1st token)", '-');
  dist_rows(out, "TPOT", m.tpot_ms, false);
  title(out, "Inter-Token Latency", '-');
  dist_rows(out, "ITL", m.itl_ms, true);
  title(out, "", '=');
  return out;
}

json metrics_to_json(const BenchMetrics& m, const RunInfo& info, const std::vector<RequestResult>& results,
                     bool details) {
  json j;
  j["backend"] = info.backend;
  j["dataset_name"] = info.dataset_name;
  j["base_url"] = info.base_url;
  j["model"] = info.model.empty() ? json(nullptr) : json(info.model);
  // JSON has no infinity: "inf" as vLLM writes it.
  j["request_rate"] = std::isinf(info.request_rate) ? json("inf") : json(info.request_rate);
  j["burstiness"] = info.burstiness;
  j["max_concurrency"] = info.max_concurrency > 0 ? json(info.max_concurrency) : json(nullptr);
  j["num_prompts"] = info.num_prompts;
  j["seed"] = info.seed;
  j["sharegpt_output_len"] = info.sharegpt_output_len > 0 ? json(info.sharegpt_output_len) : json(nullptr);
  j["random_input_len"] = info.random_input_len;
  j["random_output_len"] = info.random_output_len;
  j["random_range_ratio"] = info.random_range_ratio;
  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  j["input_throughput"] = m.input_throughput;
  j["output_throughput"] = m.output_throughput;
  j["total_throughput"] = m.total_throughput;
  j["total_token_throughput"] = m.total_throughput;  // vLLM's name
  j["concurrency"] = m.concurrency;
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;  // vLLM's names
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  const std::pair<const char*, const Distribution*> dists[] = {
      {"ttft", &m.ttft_ms}, {"tpot", &m.tpot_ms}, {"itl", &m.itl_ms}, {"e2e_latency", &m.e2e_ms}};
  for (auto& [name, d] : dists) {
    j[fmt::format("mean_{}_ms", name)] = d->mean;
    j[fmt::format("median_{}_ms", name)] = d->median;
    j[fmt::format("std_{}_ms", name)] = d->std;
    j[fmt::format("p90_{}_ms", name)] = d->p90;
    j[fmt::format("p95_{}_ms", name)] = d->p95;
    j[fmt::format("p99_{}_ms", name)] = d->p99;
    j[fmt::format("max_{}_ms", name)] = d->max;
  }
  // Distinct error messages with their counts (the first 20).
  std::map<std::string, int64_t> errors;
  for (auto& r : results)
    if (!r.success) ++errors[r.error];
  json err = json::array();
  for (auto& [msg, n] : errors) {
    if (err.size() >= 20) break;
    err.push_back({{"error", msg}, {"count", n}});
  }
  j["errors"] = err;
  if (details) {
    json in = json::array(), out = json::array(), ttfts = json::array(), itls = json::array(),
         lat = json::array(), ok = json::array(), msgs = json::array(), starts = json::array();
    for (auto& r : results) {
      in.push_back(r.prompt_len);
      out.push_back(r.output_len);
      ttfts.push_back(r.ttft_s);
      itls.push_back(r.itl_s);
      lat.push_back(r.latency_s);
      ok.push_back(r.success);
      msgs.push_back(r.error);
      starts.push_back(r.start_s);
    }
    j["input_lens"] = in;
    j["output_lens"] = out;
    j["ttfts"] = ttfts;
    j["itls"] = itls;
    j["e2e_latencies"] = lat;
    j["start_times"] = starts;
    j["success"] = ok;
    j["error_messages"] = msgs;
  }
  return j;
}

}  // namespace moeserve::bench

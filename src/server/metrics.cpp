#include "server/metrics.h"

#include <fmt/format.h>

namespace moeserve::server {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  std::lock_guard<std::mutex> lk(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  counts_[i]++;
  sum_ += v;
  n_++;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string r = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    r += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  r += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, n_, name, sum_, name, n_);
  return r;
}

std::string Metrics::render(const SchedulerStats& s, int64_t page_size, bool cuda_graphs) const {
  auto gauge = [](const char* name, const char* help, double v) {
    return fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
  };
  auto counter = [](const char* name, const char* help, double v) {
    return fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
  };
  std::string r;
  r += gauge("moeserve_num_running_requests", "Requests being decoded or prefilled.", double(s.running));
  r += gauge("moeserve_num_queued_requests", "Requests waiting for admission.", double(s.waiting));
  r += counter("moeserve_prompt_tokens_total", "Prompt tokens of admitted requests.", double(s.prompt_tokens));
  r += counter("moeserve_generation_tokens_total", "Generated tokens.", double(s.generated_tokens));
  r += counter("moeserve_cached_prompt_tokens_total", "Prompt tokens served from the prefix cache.",
               double(s.cached_prompt_tokens));
  r += gauge("moeserve_prefix_cache_hit_rate", "Cached prompt tokens / prompt tokens.",
             s.prompt_tokens ? double(s.cached_prompt_tokens) / double(s.prompt_tokens) : 0.0);
  r += gauge("moeserve_kv_cache_used_tokens", "KV cache tokens in use (requests and prefix cache).",
             double(s.kv_pages_used * page_size));
  r += gauge("moeserve_kv_cache_request_tokens", "KV cache tokens held by running requests.",
             double((s.kv_pages_used - s.kv_pages_cached) * page_size));
  r += gauge("moeserve_kv_cache_total_tokens", "KV cache capacity in tokens.", double(s.kv_pages_total * page_size));
  r += gauge("moeserve_kv_cache_usage_ratio", "Used / total KV pages.",
             s.kv_pages_total ? double(s.kv_pages_used) / double(s.kv_pages_total) : 0.0);
  r += counter("moeserve_preemptions_total", "Requests preempted for lack of KV pages.", double(s.preemptions));
  r += counter("moeserve_engine_steps_total", "Engine steps (one forward each).", double(s.steps));
  r += counter("moeserve_engine_overlapped_steps_total",
               "Engine steps launched while the step before was still running (overlap schedule).",
               double(s.overlapped_steps));
  r += counter("moeserve_engine_step_seconds_total", "Engine thread time in steps.", s.step_seconds);
  r += counter("moeserve_engine_forward_seconds_total",
               "Step time in the executor's forward and sampling (device work, launches, copies).", s.forward_seconds);
  r += counter("moeserve_engine_deliver_seconds_total",
               "Step time delivering outputs (detokenizing, parsers, response chunks).", s.deliver_seconds);
  r += counter("moeserve_constrained_requests_total",
               "Requests (each choice of n) constrained by a grammar (JSON schema, regex, choice, EBNF, tool call).",
               double(s.constrained_requests));
  r += counter("moeserve_grammar_masks_total", "Token masks computed for constrained rows.", double(s.grammar_masks));
  r += counter("moeserve_grammar_mask_seconds_total",
               "Engine thread time computing token masks (a step's rows side by side, up to 8 threads).",
               s.grammar_mask_seconds);
  r += counter("moeserve_requests_total", "Requests received by the generation endpoints.", double(requests_total));
  r += counter("moeserve_requests_failed_total", "Requests that ended with an error.", double(requests_failed));
  r += counter("moeserve_requests_aborted_total", "Requests aborted (client gone).", double(requests_aborted));
  r += gauge("moeserve_cuda_graph_enabled", "1 when decode runs from captured CUDA graphs.", cuda_graphs ? 1 : 0);
  r += ttft.render("moeserve_time_to_first_token_seconds", "Time to first token.");
  r += itl.render("moeserve_inter_token_latency_seconds", "Time between output tokens.");
  r += e2e.render("moeserve_e2e_request_latency_seconds", "End-to-end request latency.");
  return r;
}

}  // namespace moeserve::server

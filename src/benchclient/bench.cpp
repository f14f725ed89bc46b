#include "benchclient/bench.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>

#include "benchclient/backend.h"
#include "benchclient/client.h"
#include "benchclient/dataset.h"
#include "benchclient/progress.h"
#include "core/error.h"

namespace moeserve::bench {

using nlohmann::json;

namespace {

void note(std::FILE* log, const std::string& s) {
  if (!log) return;
  std::fputs(s.c_str(), log);
  std::fputc('\n', log);
  std::fflush(log);
}

// One connection per concurrent request: lift the soft open-file limit to the hard one (as SGLang's bench does).
void raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

json get_json(BenchClient& client, const std::string& path, const std::string& api_key) {
  HttpCall call{"GET", path, "", {}};
  if (!api_key.empty()) call.headers.push_back({"Authorization", "Bearer " + api_key});
  HttpReply r = client.fetch(call, 30);
  MS_USER_CHECK(r.error.empty(), "cannot reach the server at {} ({}); is it running? (set --host/--port or --base-url)",
                client.endpoint().base_url(), r.error);
  if (r.status != 200) return json();
  json j = json::parse(r.body, nullptr, false);
  return j.is_discarded() ? json() : j;
}

}  // namespace

uint64_t arrival_seed(int64_t seed) { return uint64_t(seed) * 0x9E3779B97F4A7C15ull + 1; }

int64_t find_vocab_size(const json& j) {
  if (!j.is_object()) return 0;
  if (auto it = j.find("vocab_size"); it != j.end() && it->is_number_integer() && it->get<int64_t>() > 0)
    return it->get<int64_t>();
  for (auto& [k, v] : j.items())
    if (int64_t n = find_vocab_size(v); n > 0) return n;
  return 0;
}

BenchOutcome run_benchmark(const BenchConfig& cfg, std::FILE* log) {
  const Backend backend = parse_backend(cfg.backend);
  MS_USER_CHECK(cfg.dataset_name == "random" || cfg.dataset_name == "random-ids" || cfg.dataset_name == "sharegpt",
                "--dataset-name: unknown dataset '{}' (valid: random, random-ids, sharegpt)", cfg.dataset_name);
  MS_USER_CHECK(cfg.port >= 1 && cfg.port <= 65535, "--port must be between 1 and 65535, got {}", cfg.port);
  MS_USER_CHECK(cfg.request_rate > 0, "--request-rate must be positive or inf, got {}", cfg.request_rate);
  MS_USER_CHECK(cfg.max_concurrency >= 0, "--max-concurrency must be 0 (no limit) or more, got {}",
                cfg.max_concurrency);
  MS_USER_CHECK(cfg.warmup_requests >= 0, "--warmup-requests must be 0 or more, got {}", cfg.warmup_requests);
  MS_USER_CHECK(cfg.request_timeout_s > 0, "--request-timeout must be positive, got {}", cfg.request_timeout_s);
  SamplingOptions sampling;
  sampling.temperature = cfg.temperature;
  sampling.ignore_eos = !cfg.disable_ignore_eos;
  sampling.stream = !cfg.disable_stream;
  if (!cfg.extra_request_body.empty()) {
    sampling.extra_body = json::parse(cfg.extra_request_body, nullptr, false);
    MS_USER_CHECK(!sampling.extra_body.is_discarded() && sampling.extra_body.is_object(),
                  "--extra-request-body: expected a JSON object, e.g. '{{\"top_k\": 1}}', got '{}'",
                  cfg.extra_request_body);
  }

  Endpoint ep;
  if (!cfg.base_url.empty()) {
    ep = Endpoint::from_base_url(cfg.base_url);
  } else {
    ep.host = cfg.host;
    ep.port = uint16_t(cfg.port);
  }
  raise_fd_limit();
  BenchClient client(ep);

  // The workload.
  std::vector<BenchRequest> requests;
  if (cfg.dataset_name != "sharegpt") {
    // SGLang's random-ids: random token ids. (Its "random" samples ShareGPT text; here it is random ids or words.)
    const std::string format =
        cfg.dataset_name == "random-ids" && cfg.random_prompt_format == "auto" ? "ids" : cfg.random_prompt_format;
    RandomDatasetOptions o;
    o.num_prompts = cfg.num_prompts;
    o.input_len = cfg.random_input_len;
    o.output_len = cfg.random_output_len;
    o.range_ratio = cfg.random_range_ratio;
    o.seed = uint64_t(cfg.seed);
    MS_USER_CHECK(format == "auto" || format == "ids" || format == "text",
                  "--random-prompt-format: unknown '{}' (valid: auto, ids, text)", format);
    o.as_text = format == "text" || (format == "auto" && backend == Backend::kOpenAiChat);
    MS_USER_CHECK(!(backend == Backend::kOpenAiChat && !o.as_text),
                  "--backend openai-chat sends text messages: use --random-prompt-format text (or auto)");
    o.vocab_size = cfg.vocab_size;
    if (!o.as_text && o.vocab_size <= 0) {
      o.vocab_size = find_vocab_size(get_json(client, "/get_model_info", cfg.api_key));
      MS_USER_CHECK(o.vocab_size > 0,
                    "random token-id prompts need the vocabulary size and {}/get_model_info gave none: pass "
                    "--vocab-size N (or --random-prompt-format text)",
                    ep.base_url());
      note(log, fmt::format("Vocabulary size from /get_model_info: {}", o.vocab_size));
    }
    requests = make_random_dataset(o);
  } else {
    ShareGptOptions o;
    o.num_prompts = cfg.num_prompts;
    o.fixed_output_len = cfg.sharegpt_output_len;
    o.context_len = cfg.sharegpt_context_len;
    o.seed = uint64_t(cfg.seed);
    requests = load_sharegpt_dataset(cfg.dataset_path, o);
    if (int64_t(requests.size()) < cfg.num_prompts)
      note(log, fmt::format("Note: {} has only {} usable conversations; benchmarking with {} prompts",
                            cfg.dataset_path, requests.size(), requests.size()));
  }
  int64_t in_tokens = 0, out_tokens = 0;
  for (auto& r : requests) in_tokens += r.prompt_len, out_tokens += r.output_len;
  note(log, fmt::format("#Input tokens: {}{}\n#Output tokens: {}", in_tokens,
                        requests.front().is_ids ? "" : " (estimated)", out_tokens));

  sampling.model = cfg.model;
  if (sampling.model.empty() && backend != Backend::kSglang) {
    json models = get_json(client, "/v1/models", cfg.api_key);
    if (models.is_object() && models.contains("data") && models["data"].is_array() && !models["data"].empty() &&
        models["data"][0].contains("id") && models["data"][0]["id"].is_string())
      sampling.model = models["data"][0]["id"].get<std::string>();
  }

  const std::string path = cfg.endpoint.empty() ? default_endpoint(backend) : cfg.endpoint;
  auto make_job = [&](const BenchRequest& r, int64_t max_tokens, double at) {
    BenchJob job;
    job.call.path = path;
    job.call.body = build_request_body(backend, r, max_tokens, sampling);
    if (!cfg.api_key.empty()) job.call.headers.push_back({"Authorization", "Bearer " + cfg.api_key});
    job.prompt_len = r.prompt_len;
    job.send_at_s = at;
    return job;
  };
  RunOptions run_opts;
  run_opts.backend = backend;
  run_opts.max_concurrency = cfg.max_concurrency;
  run_opts.request_timeout_s = cfg.request_timeout_s;

  // Warm-up: the first prompt, at most 32 output tokens, excluded from the results (as SGLang).
  if (cfg.warmup_requests > 0) {
    note(log, fmt::format("Starting warmup with {} sequences...", cfg.warmup_requests));
    std::vector<BenchJob> warm;
    for (int64_t i = 0; i < cfg.warmup_requests; ++i)
      warm.push_back(make_job(requests.front(), std::min<int64_t>(requests.front().output_len, 32), 0));
    double d = 0;
    auto res = client.run(warm, run_opts, &d);
    if (std::none_of(res.begin(), res.end(), [](auto& r) { return r.success; }))
      throw_user("warm-up failed: {} (server {}{}, --backend {}); check the flags and that GET /health answers 200",
                 res.front().error, ep.base_url(), path, cfg.backend);
    note(log, fmt::format("Warmup completed in {:.2f} s", d));
  }
  if (cfg.flush_cache) {
    HttpReply r = client.fetch(HttpCall{"POST", "/flush_cache", "", {}}, 60);
    note(log, r.status == 200 ? std::string("Cache flushed")
                              : fmt::format("Note: POST /flush_cache failed (HTTP {}) {}", r.status, r.error));
  }

  std::vector<double> at = make_arrival_times(int64_t(requests.size()), cfg.request_rate, cfg.burstiness,
                                              arrival_seed(cfg.seed));
  std::vector<BenchJob> jobs;
  jobs.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) jobs.push_back(make_job(requests[i], requests[i].output_len, at[i]));

  note(log, fmt::format("Traffic request rate: {}\nBurstiness factor: {}\nMaximum request concurrency: {}",
                        std::isinf(cfg.request_rate) ? "inf" : fmt::format("{}", cfg.request_rate), cfg.burstiness,
                        cfg.max_concurrency > 0 ? std::to_string(cfg.max_concurrency) : "not set"));
  ProgressBar bar(log, "Benchmark", jobs.size(), !cfg.disable_tqdm);
  run_opts.on_progress = [&](size_t done, size_t) { bar.update(done); };
  BenchOutcome out;
  double duration = 0;
  out.results = client.run(jobs, run_opts, &duration);
  bar.finish();
  out.connections_opened = client.connections_opened();

  out.info.backend = cfg.backend;
  out.info.dataset_name = cfg.dataset_name;
  out.info.base_url = ep.base_url();
  out.info.model = sampling.model;
  out.info.request_rate = cfg.request_rate;
  out.info.burstiness = cfg.burstiness;
  out.info.max_concurrency = cfg.max_concurrency;
  out.info.num_prompts = int64_t(requests.size());
  out.info.seed = cfg.seed;
  out.info.random_input_len = cfg.random_input_len;
  out.info.random_output_len = cfg.random_output_len;
  out.info.random_range_ratio = cfg.random_range_ratio;
  out.info.sharegpt_output_len = cfg.sharegpt_output_len;
  out.metrics = compute_metrics(out.results, duration);
  out.report = format_report(out.metrics, out.info);
  out.json = metrics_to_json(out.metrics, out.info, out.results, cfg.output_details);
  if (!cfg.output_file.empty()) {
    std::FILE* f = std::fopen(cfg.output_file.c_str(), "a");
    MS_USER_CHECK(f, "--output-file {}: cannot open for appending", cfg.output_file);
    std::string line = out.json.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    bool ok = std::fwrite(line.data(), 1, line.size(), f) == line.size();
    ok = std::fclose(f) == 0 && ok;
    MS_USER_CHECK(ok, "--output-file {}: write failed", cfg.output_file);
  }
  return out;
}

}  // namespace moeserve::bench

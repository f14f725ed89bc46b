// moeserve bench: a serving benchmark client compatible with SGLang's bench_serving and vLLM's `bench serve`
// (same flag names where they have one). The work is in src/benchclient/.
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "benchclient/backend.h"
#include "benchclient/bench.h"
#include "cli/flags.h"

namespace moeserve::cli {

int cmd_bench(const std::vector<std::string>& args) {
  bench::BenchConfig c;
  const double kInf = std::numeric_limits<double>::infinity();
  FlagSet f("bench",
            "Serving benchmark against a running server (SGLang bench_serving compatible): sends --num-prompts "
            "requests from a random or ShareGPT dataset at --request-rate (Poisson) with at most "
            "--max-concurrency in flight, and reports TTFT, inter-token latency (ITL), time per output token "
            "(TPOT) and end-to-end latency (mean, median, p90, p99), request and token throughput.");
  f.add_string("backend", &c.backend,
               "request protocol: sglang = POST /generate, openai = POST /v1/completions, openai-chat = POST "
               "/v1/chat/completions (SGLang/vLLM aliases accepted)",
               bench::backend_names());
  f.add_string("base-url", &c.base_url, "server URL http://host:port[/prefix] (overrides --host and --port)");
  f.add_string("host", &c.host, "server host");
  f.add_int("port", &c.port, "server port", 1, 65535);
  f.add_string("endpoint", &c.endpoint, "request path (default: the backend's)");
  f.add_string("model", &c.model, "model name for OpenAI requests (default: the first of GET /v1/models)");
  f.add_string("api-key", &c.api_key, "sent as Authorization: Bearer KEY");
  f.add_string("dataset-name", &c.dataset_name, "workload (random-ids: random with token-id prompts)",
               {"random", "random-ids", "sharegpt"});
  f.add_string("dataset-path", &c.dataset_path, "ShareGPT JSON file (for --dataset-name sharegpt)");
  f.add_int("num-prompts", &c.num_prompts, "number of requests", 1);
  f.add_int("seed", &c.seed, "random seed for the dataset and the arrival times", 0);
  f.add_int("random-input-len", &c.random_input_len, "random dataset: prompt tokens (at most)", 1);
  f.add_int("random-output-len", &c.random_output_len, "random dataset: output tokens (at most)", 1);
  f.add_double("random-range-ratio", &c.random_range_ratio,
               "random dataset: lengths uniform in [max(int(len * ratio), 1), len]", 0, 1);
  f.add_string("random-prompt-format", &c.random_prompt_format,
               "random dataset: token ids, or text of common one-token words (auto: text for openai-chat)",
               {"auto", "ids", "text"});
  f.add_int("vocab-size", &c.vocab_size, "random token ids are drawn from [0, N); 0 = ask GET /get_model_info", 0);
  f.add_int("sharegpt-output-len", &c.sharegpt_output_len,
            "ShareGPT: output tokens per request; 0 = the reply's length, estimated as chars/4", 0);
  f.add_int("sharegpt-context-len", &c.sharegpt_context_len,
            "ShareGPT: drop conversations with prompt + output above this; 0 = SGLang's rule "
            "(prompt <= 1024, total <= 2048)",
            0);
  f.add_double("request-rate", &c.request_rate, "requests per second, Poisson arrivals; inf = all at once", 1e-9,
               kInf);
  f.add_double("burstiness", &c.burstiness, "arrival gaps are gamma-distributed with this shape (1 = Poisson)",
               1e-6, 1e6);
  f.add_int("max-concurrency", &c.max_concurrency, "most requests in flight at once (0 = no limit)", 0);
  f.add_int("warmup-requests", &c.warmup_requests, "requests sent first and left out of the results", 0);
  f.add_double("request-timeout", &c.request_timeout_s, "seconds before a request counts as failed", 1e-3, 1e9);
  f.add_double("temperature", &c.temperature, "sampling temperature of every request", 0, 100);
  f.add_bool("disable-ignore-eos", &c.disable_ignore_eos, "let requests stop at end-of-sequence tokens");
  f.add_bool("disable-stream", &c.disable_stream, "ask for whole responses (TTFT = end-to-end latency)");
  f.add_string("extra-request-body", &c.extra_request_body,
               "JSON object merged into every request body, e.g. '{\"top_k\": 1}'");
  f.add_bool("flush-cache", &c.flush_cache, "POST /flush_cache before the timed run");
  f.add_bool("disable-tqdm", &c.disable_tqdm, "no progress bar on stderr");
  f.add_string("output-file", &c.output_file, "append the results to this file as one line of JSON");
  f.add_bool("output-details", &c.output_details, "with --output-file: per-request lengths, TTFTs, ITLs, errors");
  std::string tokenizer;
  f.add_string("tokenizer", &tokenizer,
               "accepted for SGLang compatibility and ignored: token counts come from the server's usage reports");
  if (!f.parse(args)) return 0;
  if (!tokenizer.empty())
    std::fprintf(stderr, "Note: --tokenizer is ignored; moeserve bench counts tokens from the server's reports\n");

  bench::BenchOutcome out = bench::run_benchmark(c, stderr);
  std::fputs(out.report.c_str(), stdout);
  std::fflush(stdout);
  if (out.metrics.failed > 0) {
    std::fprintf(stderr, "%lld requests failed:\n", static_cast<long long>(out.metrics.failed));
    for (auto& e : out.json["errors"])
      std::fprintf(stderr, "  %lld x %s\n", static_cast<long long>(e["count"].get<int64_t>()),
                   e["error"].get<std::string>().c_str());
  }
  if (out.metrics.completed == 0) {
    std::fprintf(stderr, "error: every request failed; first error: %s\n",
                 out.results.empty() ? "none sent" : out.results.front().error.c_str());
    return 1;
  }
  return 0;
}

}  // namespace moeserve::cli

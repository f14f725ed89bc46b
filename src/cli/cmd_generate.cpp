#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "core/fs_lookup.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "executor/model_runner.h"
#include "launch/launch.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

#include <filesystem>

namespace moeserve::cli {

using nlohmann::json;

namespace {
json logprob_entry(float lp, int32_t id) { return json::array({lp, id, nullptr}); }
}  // namespace

int cmd_generate(const std::vector<std::string>& args) {
  std::string model_path, device = "auto", log_level = "warning";
  std::vector<int64_t> input_ids;
  std::string prompt;
  int64_t max_new = 16, top_k = -2, top_logprobs = 0, seed = 0, threads = 0, max_total = 0, page_size = 16,
          chunk = 512;
  double temperature = -1, top_p = -1, min_p = -1;
  bool as_json = false, ignore_eos = false, disable_graphs = false;
  double mem_fraction = 0;
  std::string moe_backend = "auto", gemm_backend = "auto";
  FlagSet f("generate", "Offline generation for scripting and debugging: one request, printed as tokens or as "
                        "one JSON object shaped like the /generate response.");
  f.add_string("model-path", &model_path, "Hugging Face checkpoint folder (default: the built-in demo model)");
  f.add_int_list("input-ids", &input_ids, "prompt token ids, e.g. 1,2,3");
  f.add_string("prompt", &prompt, "prompt text (needs the model's tokenizer.json)");
  f.add_int("max-new-tokens", &max_new, "tokens to generate", 0);
  f.add_double("temperature", &temperature, "0 = greedy (default: generation_config.json, else 1)", 0, 100);
  f.add_double("top-p", &top_p, "nucleus sampling (default: generation_config.json, else 1)", 1e-9, 1);
  f.add_int("top-k", &top_k, "top-k sampling, -1 = off (default: generation_config.json)", -1);
  f.add_double("min-p", &min_p, "min-p sampling (default: generation_config.json, else 0)", 0, 1);
  f.add_int("seed", &seed, "sampling seed", 0);
  f.add_int("top-logprobs", &top_logprobs, "top logprobs to report per output token", 0, 1000);
  f.add_bool("json", &as_json, "print one JSON object like the /generate response");
  f.add_bool("ignore-eos", &ignore_eos, "do not stop at end-of-sequence tokens");
  f.add_string("device", &device, "where to run", {"auto", "cpu", "cuda"});
  f.add_int("threads", &threads, "CPU threads (0: all cores)", 0, kMaxPoolThreads);
  f.add_double("mem-fraction-static", &mem_fraction, "GPU memory fraction for weights + KV (0: 0.85)", 0, 1);
  f.add_bool("disable-cuda-graph", &disable_graphs, "no CUDA graphs");
  f.add_string("moe-runner-backend", &moe_backend, "MoE kernel backend (auto, or a name from `moeserve backends`)");
  f.add_string("gemm-backend", &gemm_backend, "dense GEMM backend (auto, or a name from `moeserve backends`)");
  f.add_int("max-total-tokens", &max_total, "KV cache capacity in tokens (0: automatic)", 0, int64_t(1) << 40);
  f.add_int("page-size", &page_size, "KV cache page size in tokens", 1, 4096);
  f.add_int("chunked-prefill-size", &chunk, "prefill chunk in tokens", 1, int64_t(1) << 24);  // as serve's bounds
  f.add_string("log-level", &log_level, "log level", {"debug", "info", "warning", "error"});
  if (!f.parse(args)) return 0;
  set_log_level(parse_log_level(log_level));
  if (input_ids.empty() == prompt.empty())
    throw_user("generate: give the prompt as --input-ids 1,2,3 or as --prompt TEXT (one of them)");
  if (model_path.empty()) model_path = ensure_demo_model();
  // The tokenizer is optional: without one, output is token ids only.
  std::unique_ptr<tok::Tokenizer> tokenizer;
  if (path_exists(model_path + "/tokenizer.json", "--model-path")) tokenizer = tok::Tokenizer::from_file(model_path + "/tokenizer.json");
  if (!prompt.empty()) {
    if (!tokenizer) throw_user("--prompt needs {}/tokenizer.json; use --input-ids", model_path);
    for (int32_t id : tokenizer->encode(prompt, true)) input_ids.push_back(id);
  }
  auto text_of = [&](const std::vector<int32_t>& ids) -> nlohmann::json {
    if (!tokenizer) return nullptr;
    std::vector<int32_t> known;
    for (int32_t id : ids)
      if (id < tokenizer->vocab_size()) known.push_back(id);
    return tokenizer->decode(known, true);
  };

  auto t0 = std::chrono::steady_clock::now();
  LaunchOptions lo;
  lo.model_path = model_path;
  lo.device = device;
  lo.runner.threads = int(threads);
  lo.runner.max_total_tokens = max_total;
  lo.runner.page_size = page_size;
  lo.runner.chunked_prefill_size = chunk;
  lo.max_running_requests = 1;
  lo.mem_fraction_static = mem_fraction;
  lo.disable_cuda_graph = disable_graphs;
  lo.moe_backend = moe_backend;
  lo.gemm_backend = gemm_backend;
  auto runner_ptr = make_runner(lo);
  ModelRunner& runner = *runner_ptr;
  GenerationDefaults gd = GenerationDefaults::from_dir(model_path);
  if (!gd.eos_token_ids.empty()) runner.set_eos_ids(gd.eos_token_ids);

  GenerateRequest req;
  for (int64_t id : input_ids) {
    if (id < 0 || id >= runner.config().vocab_size)
      throw_user("--input-ids: id {} is outside the vocabulary [0, {})", id, runner.config().vocab_size);
    req.input_ids.push_back(int32_t(id));
  }
  req.max_new_tokens = max_new;
  req.sampling.temperature = float(temperature >= 0 ? temperature : (gd.do_sample ? gd.temperature : 0.0));
  req.sampling.top_p = float(top_p > 0 ? top_p : gd.top_p);
  req.sampling.top_k = top_k >= -1 ? top_k : gd.top_k;
  req.sampling.min_p = float(min_p >= 0 ? min_p : gd.min_p);
  req.seed = uint64_t(seed);
  req.top_logprobs = top_logprobs;
  req.ignore_eos = ignore_eos;
  GenerateResult r = runner.generate(req);
  double e2e = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (as_json) {
    json out_lp = json::array(), out_top = json::array();
    for (size_t i = 0; i < r.output_ids.size(); ++i) {
      out_lp.push_back(logprob_entry(r.output_logprobs[i], r.output_ids[i]));
      if (top_logprobs > 0) {
        json step = json::array();
        for (auto& t : r.top_logprobs[i]) step.push_back(logprob_entry(t.logprob, t.id));
        out_top.push_back(step);
      }
    }
    json finish = {{"type", r.finish_reason}};
    if (r.finish_reason == "stop") finish["matched"] = r.matched_stop;
    if (r.finish_reason == "length") finish["length"] = r.output_ids.size();
    json meta = {{"id", "generate-0"},
                 {"prompt_tokens", req.input_ids.size()},
                 {"completion_tokens", r.output_ids.size()},
                 {"cached_tokens", 0},
                 {"finish_reason", finish},
                 {"output_token_logprobs", out_lp},
                 {"e2e_latency", e2e}};
    if (top_logprobs > 0) meta["output_top_logprobs"] = out_top;
    json j = {{"text", text_of(r.output_ids)}, {"output_ids", r.output_ids}, {"meta_info", meta}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::string ids;
  for (auto id : r.output_ids) ids += (ids.empty() ? "" : " ") + std::to_string(id);
  std::printf("%s\n", ids.c_str());
  if (tokenizer) std::printf("%s\n", text_of(r.output_ids).get<std::string>().c_str());
  double tps = r.decode_seconds > 0 && r.output_ids.size() > 1 ? double(r.output_ids.size() - 1) / r.decode_seconds : 0;
  std::fprintf(stderr, "prompt %zu tokens in %.3f s (%.1f tok/s); %zu new tokens, decode %.2f tok/s; finish: %s\n",
               req.input_ids.size(), r.prefill_seconds, double(req.input_ids.size()) / r.prefill_seconds,
               r.output_ids.size(), tps, r.finish_reason.c_str());
  return 0;
}

}  // namespace moeserve::cli

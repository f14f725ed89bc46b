#include "server/api_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>

#include "core/env.h"
#include "core/fs_lookup.h"
#include "core/log.h"
#include "http/server.h"
#include "launch/launch.h"
#include "model/config.h"
#include "server/generation.h"
#include "server/metrics.h"
#include "server/protocol.h"
#include "server/text.h"

namespace moeserve::server {

using json = nlohmann::ordered_json;

namespace {

enum class Phase { Starting, Ready, Failed };

// Everything the routes share. Routes are registered before the model loads, so they check the phase.
struct App {
  ServeOptions opts;
  std::atomic<Phase> phase{Phase::Starting};
  std::string starting_what = "loading the model";
  std::mutex mu;  // guards starting_what / failure
  std::string failure;
  std::unique_ptr<TextLayer> text;
  std::unique_ptr<Engine> engine;
  // `engine` once built, published for the HTTP threads (the loader thread builds it while they answer /health,
  // /metrics and /get_server_info): they read this, never the unique_ptr.
  std::atomic<Engine*> engine_view{nullptr};
  Metrics metrics;
  ServerContext ctx;
  json server_info;
  json model_info;
  json engine_info;  // the executor's device, kernel backends and CUDA graphs
  int64_t page_size = 0;

  void set_stage(const std::string& s) {
    std::lock_guard<std::mutex> lk(mu);
    starting_what = s;
  }
  std::string not_ready_message() {
    std::lock_guard<std::mutex> lk(mu);
    if (Engine* e = started_engine(); e && e->failed()) return "the engine has failed: " + e->failure();
    if (phase == Phase::Failed) return "the engine has failed: " + failure;
    return "the server is starting (" + starting_what + ")";
  }
  bool engine_ok() const { return phase == Phase::Ready && engine && !engine->failed(); }
  Engine* started_engine() const { return engine_view.load(std::memory_order_acquire); }

  // The scheduler's state as SGLang's /get_server_info gives it, one object per data-parallel rank under
  // "internal_states": SGLang's bench_serving reads internal_states[0] after every run against a server it calls
  // "sglang" (a KeyError without it, after the whole run). last_gen_throughput: tokens generated per second of the
  // engine's step time since the previous call that saw new tokens (SGLang: over its last decode log interval).
  json internal_state() {
    Engine* e = started_engine();
    const SchedulerStats s = e ? e->stats() : SchedulerStats{};
    const int64_t page = e ? page_size : 0;  // written before the engine is published
    std::lock_guard<std::mutex> lk(throughput_mu);
    const double busy = s.step_seconds - throughput_seconds;
    const int64_t made = s.generated_tokens - throughput_tokens;
    if (made > 0 && busy > 0) {
      last_gen_throughput = double(made) / busy;
      throughput_seconds = s.step_seconds;
      throughput_tokens = s.generated_tokens;
    }
    return {{"last_gen_throughput", last_gen_throughput},
            {"running_requests", s.running},
            {"waiting_requests", s.waiting},
            {"kv_cache_used_tokens", s.kv_pages_used * page},
            {"kv_cache_total_tokens", s.kv_pages_total * page},
            {"prompt_tokens", s.prompt_tokens},
            {"generated_tokens", s.generated_tokens},
            {"steps", s.steps}};
  }

 private:
  std::mutex throughput_mu;  // guards the three below
  double throughput_seconds = 0, last_gen_throughput = 0;
  int64_t throughput_tokens = 0;
};

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void reply(const std::shared_ptr<http::Responder>& r, int status, const json& j) {
  r->respond(status, "application/json", dump(j));
}

// Runs a handler body, turning errors into OpenAI error objects.
template <typename F>
void guarded(const std::shared_ptr<http::Responder>& r, F&& body) {
  try {
    body();
  } catch (const ApiError& e) {
    r->respond_error(e.status, e.what(), e.status >= 500 ? "server_error" : "invalid_request_error", e.param);
  } catch (const UserError& e) {
    r->respond_error(400, e.what(), "invalid_request_error");
  } catch (const std::exception& e) {
    log_error("request failed: {}", e.what());
    r->respond_error(500, std::string("internal error: ") + e.what(), "server_error");
  }
}

// Requests that need the engine wait for readiness: 503 before.
bool require_ready(App& app, const std::shared_ptr<http::Responder>& r) {
  if (app.engine_ok()) return true;
  if (Engine* e = app.started_engine(); e && e->failed()) app.phase = Phase::Failed;
  r->respond_error(503, app.not_ready_message(), "server_error");
  return false;
}

// A one-token greedy generation through the scheduler; `done(ok)` runs on the engine thread.
void probe_generation(App& app, std::function<void(bool, std::string)> done) {
  auto r = std::make_shared<Request>();
  r->id = app.ctx.next_id.fetch_add(1);
  r->prompt = {0};
  r->params.max_new_tokens = 1;
  r->params.temperature = 0;
  r->params.ignore_eos = true;
  auto called = std::make_shared<std::atomic<bool>>(false);
  r->sink = [done, called](const RequestOutput& o) {
    if (o.finish == FinishReason::None || called->exchange(true)) return;
    done(o.finish != FinishReason::Abort && !o.new_tokens.empty(), o.abort_message);
  };
  app.engine->submit(r);
}

void add_routes(http::Server& srv, App& app) {
  srv.route("GET", "/health", [&app](const http::Request&, std::shared_ptr<http::Responder> r) {
    if (app.engine_ok()) return (void)r->respond(200, "text/plain", "");
    if (Engine* e = app.started_engine(); e && e->failed()) app.phase = Phase::Failed;
    r->respond_error(503, app.not_ready_message(), "server_error");
  });
  srv.route("GET", "/health_generate", [&app](const http::Request&, std::shared_ptr<http::Responder> r) {
    if (!require_ready(app, r)) return;
    guarded(r, [&] {
      probe_generation(app, [r](bool ok, std::string why) {
        if (ok) r->respond(200, "text/plain", "");
        else r->respond_error(503, "generation failed: " + why, "server_error");
      });
    });
  });
  auto model_card = [&app] {
    return json{{"id", app.ctx.parse.served_model_name}, {"object", "model"},         {"created", 0},
                {"owned_by", "moeserve"},                {"root", app.ctx.parse.model_path},
                {"max_model_len", app.ctx.parse.context_length}};
  };
  srv.route("GET", "/v1/models", [model_card](const http::Request&, std::shared_ptr<http::Responder> r) {
    reply(r, 200, json{{"object", "list"}, {"data", json::array({model_card()})}});
  });
  // OpenAI's retrieve (client.models.retrieve): the served name or the model path, percent-encoded or not.
  srv.route("GET", "/v1/models/*", [&app, model_card](const http::Request& hr, std::shared_ptr<http::Responder> r) {
    constexpr std::string_view kPrefix = "/v1/models/";  // the router passes only paths longer than this
    const std::string name = http::percent_decode(std::string_view(hr.path).substr(kPrefix.size()), false);
    guarded(r, [&] {
      check_model_name(name, app.ctx.parse);
      reply(r, 200, model_card());
    });
  });
  srv.route("GET", "/get_model_info", [&app](const http::Request&, std::shared_ptr<http::Responder> r) {
    if (!require_ready(app, r)) return;
    reply(r, 200, app.model_info);
  });
  srv.route("GET", "/get_server_info", [&app](const http::Request&, std::shared_ptr<http::Responder> r) {
    json info;
    {
      std::lock_guard<std::mutex> lk(app.mu);  // bring_up fills it on the loader thread
      info = app.server_info;
    }
    info["status"] = app.engine_ok() ? "ready" : app.not_ready_message();
    info["internal_states"] = json::array({app.internal_state()});
    reply(r, 200, info);
  });
  srv.route("GET", "/metrics", [&app](const http::Request&, std::shared_ptr<http::Responder> r) {
    Engine* e = app.started_engine();
    SchedulerStats s = e ? e->stats() : SchedulerStats{};
    r->respond(200, "text/plain; version=0.0.4", app.metrics.render(s, e ? app.page_size : 0, false));
  });
  srv.route("POST", "/flush_cache", [&app](const http::Request&, std::shared_ptr<http::Responder> r) {
    if (!require_ready(app, r)) return;
    auto freed = std::make_shared<int64_t>(0);
    app.engine->post([freed](Scheduler& s) { *freed = s.flush_prefix_cache(); },
                     [r, freed] { r->respond(200, "text/plain", fmt::format("Cache flushed ({} pages freed).\n", *freed)); });
  });
  auto generation_route = [&app](ApiRequest (*parse)(const json&, const ParseContext&)) {
    return [&app, parse](const http::Request& hr, std::shared_ptr<http::Responder> r) {
      if (!require_ready(app, r)) return;
      guarded(r, [&] {
        json body = parse_body(hr.body);
        start_generation(app.ctx, parse(body, app.ctx.parse), r);
      });
    };
  };
  srv.route("POST", "/v1/chat/completions", generation_route(&parse_chat_request));
  srv.route("POST", "/v1/completions", generation_route(&parse_completion_request));
  srv.route("POST", "/generate", generation_route(&parse_generate_request));
  srv.route("POST", "/tokenize", [&app](const http::Request& hr, std::shared_ptr<http::Responder> r) {
    if (!require_ready(app, r)) return;
    guarded(r, [&] {
      json body = parse_body(hr.body);
      // HF defaults: encode() adds special tokens; apply_chat_template(tokenize=True) does not.
      bool has_messages = body.contains("messages");
      bool add_special = body.contains("add_special_tokens") && body["add_special_tokens"].is_boolean()
                             ? body["add_special_tokens"].get<bool>()
                             : !has_messages;
      std::vector<int32_t> ids;
      if (has_messages) {
        // Checked as /v1/chat/completions checks them; as apply_chat_template(tokenize=True), the rendered text is
        // encoded without extra special tokens.
        const ChatTemplateInputs in = parse_chat_template_inputs(body);
        std::string prompt = app.text->render_chat(in.messages, in.tools, in.add_generation_prompt, in.kwargs);
        ids = app.text->encode(prompt, add_special);
      } else if (body.contains("prompt") && body["prompt"].is_string()) {
        ids = app.text->encode(body["prompt"].get<std::string>(), add_special);
      } else {
        throw ApiError(400, "give 'prompt' (a string) or 'messages'", "prompt");
      }
      reply(r, 200, json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", app.ctx.parse.context_length}});
    });
  });
  srv.route("POST", "/detokenize", [&app](const http::Request& hr, std::shared_ptr<http::Responder> r) {
    if (!require_ready(app, r)) return;
    guarded(r, [&] {
      json body = parse_body(hr.body);
      if (!body.contains("tokens") || !body["tokens"].is_array())
        throw ApiError(400, "'tokens' must be a list of token ids", "tokens");
      std::vector<int32_t> ids;
      for (auto& t : body["tokens"]) {
        if (!t.is_number_integer()) throw ApiError(400, "'tokens' must hold integers", "tokens");
        int64_t id = t.get<int64_t>();
        if (id < 0 || id >= app.ctx.parse.vocab_size)
          throw ApiError(400, fmt::format("token id {} is outside the vocabulary [0, {})", id, app.ctx.parse.vocab_size), "tokens");
        ids.push_back(int32_t(id));
      }
      // Ids past the tokenizer's vocabulary (models pad theirs) decode to nothing, as Hugging Face's decode does.
      std::vector<int32_t> known;
      for (int32_t id : ids)
        if (id < app.text->tokenizer().vocab_size()) known.push_back(id);
      reply(r, 200, json{{"prompt", app.text->decode(known, false)}});
    });
  });
}

// Loads everything, then warms up through the scheduler; throws on failure.
void bring_up(App& app) {
  ServeOptions& o = app.opts;
  RunnerOptions ro;
  ro.threads = int(o.threads);
  ro.page_size = o.page_size > 0 ? o.page_size : 16;
  ro.chunked_prefill_size = o.chunked_prefill_size > 0 ? o.chunked_prefill_size : 512;
  ro.max_total_tokens = o.max_total_tokens;
  if (!path_is_directory(o.model_path, "--model-path"))
    throw_user("--model-path '{}' is not a directory (expected a Hugging Face checkpoint folder)", o.model_path);
  ModelConfig cfg = ModelConfig::from_file(o.model_path + "/config.json");
  const std::string device = resolve_device(o.device);
  int64_t ctx_len = cfg.max_position_embeddings;
  if (o.context_length > 0) {
    if (o.context_length > ctx_len)
      log_warn("--context-length {} exceeds the model's max_position_embeddings {}", o.context_length, ctx_len);
    ctx_len = o.context_length;
  }
  if (device == "cpu" && ro.max_total_tokens <= 0)
    ro.max_total_tokens = std::min<int64_t>(std::max<int64_t>(ctx_len, 4096), 65536);
  if (device == "cuda" && o.chunked_prefill_size <= 0) ro.chunked_prefill_size = 8192;
  const int64_t max_running = o.max_running_requests > 0 ? o.max_running_requests : (device == "cuda" ? 160 : 64);
  app.set_stage("loading the tokenizer");
  app.text = std::make_unique<TextLayer>(o.model_path, o.tokenizer_path, o.chat_template, o.skip_tokenizer_init);
  // Constrained decoding's vocabulary tries (~0.1 s on one core), built beside the model's load rather than inside
  // the first constrained request.
  std::jthread grammar_vocab;  // (joined when bring_up returns or throws)
  if (app.text->has_tokenizer())
    grammar_vocab = std::jthread([&app, v = cfg.vocab_size] {
      try {
        app.text->grammar_vocabulary(v);
      } catch (const std::exception& e) {  // (the first constrained request tries again and reports it)
        log_warn("constrained decoding's vocabulary: {}", e.what());
      }
    });
  app.set_stage(device == "cuda" ? "loading the model onto the GPU, self-testing kernels, capturing CUDA graphs"
                                  : "loading the model");
  LaunchOptions lo;
  lo.model_path = o.model_path;
  lo.device = device;
  lo.runner = ro;
  lo.max_running_requests = max_running;
  lo.mem_fraction_static = o.mem_fraction_static;
  lo.cuda_graph_bs = o.cuda_graph_bs;
  lo.cuda_graph_max_bs = o.cuda_graph_max_bs;
  lo.disable_cuda_graph = o.disable_cuda_graph;
  lo.attention_backend = o.attention_backend;
  lo.moe_backend = o.moe_runner_backend;
  lo.gemm_backend = o.gemm_backend;
  auto runner = make_runner(lo);
  ro = runner->options();
  GenerationDefaults gd = GenerationDefaults::from_dir(o.model_path);
  if (!gd.eos_token_ids.empty()) runner->set_eos_ids(gd.eos_token_ids);
  SchedulerOptions so;
  so.max_running_requests = max_running;
  so.chunked_prefill_size = ro.chunked_prefill_size;
  so.enable_prefix_cache = !o.disable_radix_cache;
  so.overlap_schedule = !o.disable_overlap_schedule;
  // A/B switch: MOESERVE_OVERLAP_MIXED=0 launches only all-decode steps ahead (SchedulerOptions).
  so.overlap_mixed_steps = env_flag("MOESERVE_OVERLAP_MIXED", true);
  // Diagnostics: MOESERVE_STEP_TRACE=file writes one CSV line a step (SchedulerOptions::step_trace_path).
  if (const char* t = std::getenv("MOESERVE_STEP_TRACE")) so.step_trace_path = t;
  app.page_size = ro.page_size;
  app.engine_info = runner->executor().info();
  app.engine = std::make_unique<Engine>(std::move(runner), so);
  app.engine_view.store(app.engine.get(), std::memory_order_release);

  app.ctx.engine = app.engine.get();
  app.ctx.text = app.text.get();
  app.ctx.metrics = &app.metrics;
  app.ctx.parse.text = app.text.get();
  app.ctx.parse.served_model_name = o.served_model_name.empty() ? o.model_path : o.served_model_name;
  app.ctx.parse.model_path = o.model_path;
  app.ctx.parse.context_length = ctx_len;
  app.ctx.parse.vocab_size = cfg.vocab_size;
  if (gd.present) {
    app.ctx.parse.default_temperature = float(gd.do_sample ? gd.temperature : 0.0);
    app.ctx.parse.default_top_p = float(gd.top_p);
    app.ctx.parse.default_top_k = gd.top_k > 0 ? gd.top_k : -1;
    app.ctx.parse.default_min_p = float(gd.min_p);
    app.ctx.parse.default_repetition_penalty = float(gd.repetition_penalty);
  }
  app.ctx.reasoning_parser = o.reasoning_parser;
  app.ctx.tool_call_parser = o.tool_call_parser;
  app.ctx.parse.tool_call_parser = o.tool_call_parser;
  app.ctx.parse.reasoning_parser = o.reasoning_parser;
  app.model_info = {{"model_path", o.model_path},
                    {"tokenizer_path", o.tokenizer_path.empty() ? o.model_path : o.tokenizer_path},
                    {"served_model_name", app.ctx.parse.served_model_name},
                    {"is_generation", true},
                    {"max_context_length", ctx_len},
                    {"config", json::parse(cfg.to_json().dump())}};
  const json exec_info = app.engine_info;
  {
    std::lock_guard<std::mutex> lk(app.mu);  // /get_server_info reads it on the HTTP thread
    app.server_info["model_path"] = o.model_path;
    app.server_info["device"] = exec_info.value("device", device);
    app.server_info["context_length"] = ctx_len;
    app.server_info["max_total_tokens"] = ro.max_total_tokens;
    app.server_info["page_size"] = ro.page_size;
    app.server_info["chunked_prefill_size"] = so.chunked_prefill_size;
    app.server_info["max_running_requests"] = so.max_running_requests;
    app.server_info["disable_radix_cache"] = o.disable_radix_cache;
    app.server_info["disable_overlap_schedule"] = o.disable_overlap_schedule;
    app.server_info["skip_tokenizer_init"] = o.skip_tokenizer_init;
    app.server_info["reasoning_parser"] = o.reasoning_parser.empty() ? json(nullptr) : json(o.reasoning_parser);
    app.server_info["tool_call_parser"] = o.tool_call_parser.empty() ? json(nullptr) : json(o.tool_call_parser);
    app.server_info["kernel_backends"] = exec_info.at("kernel_backends");
    app.server_info["cuda_graphs"] = exec_info.at("cuda_graphs");
  }
  app.set_stage("warm-up generation");
  std::promise<std::pair<bool, std::string>> warm;
  probe_generation(app, [&warm](bool ok, std::string why) { warm.set_value({ok, why}); });
  auto res = warm.get_future().get();
  if (!res.first) throw InternalError("warm-up generation failed: " + res.second);
  app.phase = Phase::Ready;
}

}  // namespace

int run_server(ServeOptions opts) {
  // Signals go to the thread that waits for them, not to whichever thread they hit.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // Thousands of streaming connections need more descriptors than the usual soft limit of 1024.
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = std::min<rlim_t>(nofile.rlim_max, 65535);
    setrlimit(RLIMIT_NOFILE, &nofile);
  }

  App app;
  app.opts = std::move(opts);
  app.ctx.parse.served_model_name = app.opts.served_model_name.empty() ? app.opts.model_path : app.opts.served_model_name;
  app.ctx.parse.model_path = app.opts.model_path;
  app.server_info = {{"version", "moeserve 0.1"}, {"host", app.opts.host}, {"port", app.opts.port}};
  http::ServerOptions ho;
  ho.host = app.opts.host;
  ho.port = uint16_t(app.opts.port);
  ho.api_key = app.opts.api_key;
  ho.max_body_bytes = size_t(app.opts.max_body_bytes);
  http::Server srv(ho);
  add_routes(srv, app);
  srv.start();  // /health answers 503 while the model loads
  log_info("listening on http://{}:{} (starting)", app.opts.host, srv.port());

  std::thread loader([&app] {
    try {
      bring_up(app);
      log_info("ready: {} on http://{}:{}", app.ctx.parse.served_model_name, app.opts.host, app.opts.port);
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> lk(app.mu);
        app.failure = e.what();
      }
      app.phase = Phase::Failed;
      log_error("startup failed: {}", e.what());
      kill(getpid(), SIGTERM);  // wake the main thread: a server that cannot serve exits non-zero
    }
  });

  int sig = 0;
  sigwait(&sigs, &sig);
  loader.join();
  bool failed_start = app.phase == Phase::Failed && !app.engine;
  if (!failed_start)
    log_info("{}: shutting down (in-flight requests get {} s)", sig == SIGTERM ? "SIGTERM" : "SIGINT",
             app.opts.shutdown_timeout_s);
  srv.stop_accepting();
  if (!srv.wait_idle(std::chrono::seconds(app.opts.shutdown_timeout_s)))
    log_warn("shutdown: {} responses still open; aborting them", srv.outstanding_responses());
  if (app.engine) app.engine->stop();  // what is left gets a clean error
  srv.wait_idle(std::chrono::seconds(2));
  srv.stop();
  if (failed_start) {
    std::lock_guard<std::mutex> lk(app.mu);
    throw UserError(app.failure);
  }
  return 0;
}

}  // namespace moeserve::server

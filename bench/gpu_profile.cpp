// Per-op GPU time of one model step next to each op's floor, for the steps the performance targets are about:
// decode at batch 1 and 64 (each sequence with a 512-token context), and a prefill of 512-token prompts; then
// the whole decode step as served (graph replay + sampling + copies), timed on the host.
//   gpu_profile --model-path DIR [--context 512] [--batch-sizes 1,64,128] [--prefill=false] [--mem-fraction-static F]
// With MOESERVE_PROFILE_SKIP_OPS=op,... (norm, qkv, attention, oproj, router, route, experts, lmhead) every step
// leaves those ops out: the served step's time against a run without it is the ops' marginal cost inside the
// chain of programmatic launches (the per-op table cannot show it: its events break that chain).
// With --trace, no per-op events: the served decode steps run under CUPTI's kernel tracing (kernel_trace.h) and each
// kernel's time from the previous kernel's end to its own end is listed, programmatic overlap included.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>

#include "cli/flags.h"
#include "kernel_trace.h"
#include "core/error.h"
#include "core/log.h"
#include "launch/launch.h"

using namespace moeserve;

namespace {

struct Batch {
  ForwardBatch fb;
  std::vector<std::vector<int32_t>> pages;
};

// Appends `seqs` sequences of `ctx` cached tokens each (their KV pages hold whatever is there: timing only), each
// computing `new_tokens` tokens this step; sequence s of the batch gets tokens (977 s + 131 i) mod vocab. (Moving a
// page vector keeps its buffer, so the seqs' page pointers survive b.pages growing.)
void append_seqs(ModelRunner& r, Batch& b, int seqs, int64_t ctx, int64_t new_tokens) {
  for (int k = 0; k < seqs; ++k) {
    const int64_t s = int64_t(b.fb.seqs.size()), row = int64_t(b.fb.tokens.size());
    b.pages.push_back(r.kv().allocator().allocate(r.kv().pages_for(ctx + new_tokens)));
    for (int64_t i = 0; i < new_tokens; ++i) {
      b.fb.tokens.push_back(int32_t((s * 977 + i * 131) % r.config().vocab_size));
      b.fb.positions.push_back(ctx + i);
    }
    b.fb.seqs.push_back({b.pages.back().data(), ctx, new_tokens, row});
    b.fb.logit_rows.push_back(row + new_tokens - 1);
  }
}

Batch make_batch(ModelRunner& r, int seqs, int64_t ctx, int64_t new_tokens) {
  Batch b;
  append_seqs(r, b, seqs, ctx, new_tokens);
  return b;
}

// `decodes` sequences decoding one token at context `ctx`, then prompt sequences of up to 512 new tokens (no cache)
// holding `prompt_tokens` in all: the mixed step a continuous-batching scheduler builds when prompt chunks ride with
// the running decodes.
Batch make_mixed_batch(ModelRunner& r, int decodes, int64_t ctx, int64_t prompt_tokens) {
  Batch b = make_batch(r, decodes, ctx, 1);
  for (int64_t left = prompt_tokens; left > 0; left -= 512) append_seqs(r, b, 1, 0, std::min<int64_t>(left, 512));
  return b;
}

void release(ModelRunner& r, Batch& b) {
  for (auto& p : b.pages) r.kv().allocator().free(p);
}

constexpr int kWarmupSteps = 3;  // untimed steps before served_step_us's timed ones

// Greedy sampling for every logit row of fb (rng: kept alive by the caller).
std::vector<SampleSpec> greedy_specs(const ForwardBatch& fb, std::mt19937_64& rng) {
  std::vector<SampleSpec> specs(fb.logit_rows.size());
  for (auto& s : specs) s.sampler.temperature = 0, s.rng = &rng;
  return specs;
}

double served_step_us(ModelRunner& r, const ForwardBatch& fb, int iters) {
  std::mt19937_64 rng(1);
  const std::vector<SampleSpec> specs = greedy_specs(fb, rng);
  std::vector<Sampled> out;
  for (int i = 0; i < kWarmupSteps; ++i) r.step(fb, specs, out);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) r.step(fb, specs, out);
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
}

// The decode step as the overlap schedule serves it: step i + 1 is launched (its tokens the samples step i leaves on
// the device) before step i is collected, so the host's work hides behind the device's and what remains between two
// steps' kernels is the stream's own work at the boundary (copies, event, graph launch).
double overlapped_step_us(ModelRunner& r, const ForwardBatch& fb, int iters) {
  std::mt19937_64 rng(1);
  const std::vector<SampleSpec> specs = greedy_specs(fb, rng);
  ForwardBatch next = fb;
  next.previous_samples.resize(fb.tokens.size());
  for (size_t i = 0; i < next.previous_samples.size(); ++i) next.previous_samples[i] = int32_t(i);
  std::vector<Sampled> out;
  r.launch(fb, specs);
  for (int i = 0; i < kWarmupSteps; ++i) r.launch(next, specs), r.collect(out);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) r.launch(next, specs), r.collect(out);
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
  r.collect(out);
  return us;
}

// Median time from one step's last kernel end to the next step's first kernel start, over `steps` identical steps
// traced back to back.
double median_boundary_gap_us(const std::vector<bench::KernelRecord>& recs, int steps) {
  if (steps < 2 || recs.size() % size_t(steps) != 0) return -1;
  const size_t n = recs.size() / size_t(steps);
  std::vector<double> gaps;
  for (int i = 0; i + 1 < steps; ++i) {
    uint64_t last_end = 0;
    for (size_t k = size_t(i) * n; k < size_t(i + 1) * n; ++k) last_end = std::max(last_end, recs[k].end_ns);
    gaps.push_back((double(recs[size_t(i + 1) * n].start_ns) - double(last_end)) * 1e-3);
  }
  std::sort(gaps.begin(), gaps.end());
  return gaps[gaps.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  int64_t ctx = 512, max_running = 160;
  cli::FlagSet f("gpu_profile", "per-op GPU time of decode and prefill steps against their floors");
  f.add_string("model-path", &model_path, "checkpoint folder");
  f.add_int("context", &ctx, "tokens already in each sequence's KV cache for decode steps", 1);
  f.add_int("max-running-requests", &max_running, "as for serve", 1);
  std::vector<int64_t> batch_sizes;
  f.add_int_list("batch-sizes", &batch_sizes, "decode batch sizes to profile (default 1,64,128)");
  bool prefill = true;
  f.add_bool("prefill", &prefill, "also profile prefill steps");
  std::vector<int64_t> mixed;
  f.add_int_list("mixed", &mixed,
                 "prompt tokens to add to each decode batch size (e.g. 0,256,512,1024): the served step of the mixed "
                 "batch (eager, as served) and its per-op table, or its kernel timeline with --trace; no plain decode "
                 "or prefill profile then");
  bool trace = false;
  f.add_bool("trace", &trace, "decode steps as a CUPTI kernel timeline instead of per-op events (no prefill)");
  std::string gemm_backend = "auto";
  f.add_string("gemm-backend", &gemm_backend, "as for serve (auto, cublas, cublaslt, gemv)");
  double mem_fraction = 0.0;
  f.add_double("mem-fraction-static", &mem_fraction,
               "as for serve (0: its default); a small value (e.g. 0.2) leaves ncu's kernel replay little device "
               "memory to back up",
               0.0, 0.95);
  std::string log_level = "info";
  f.add_string("log-level", &log_level, "debug, info, warning or error");
  try {
    if (!f.parse(std::vector<std::string>(argv + 1, argv + argc))) return 0;
    set_log_level(parse_log_level(log_level));
    if (batch_sizes.empty()) batch_sizes = {1, 64, 128};
    LaunchOptions lo;
    lo.model_path = model_path;
    lo.device = "cuda";
    lo.runner.chunked_prefill_size = 8192;
    lo.max_running_requests = max_running;
    lo.gemm_backend = gemm_backend;
    lo.mem_fraction_static = mem_fraction;
    bench::KernelTrace tracer;
    if (trace) {  // before the runner: its CUDA graphs are then instantiated with tracing on
      if (std::string why = tracer.start(); !why.empty()) throw std::runtime_error("--trace: " + why);
    }
    auto runner = make_runner(lo);
    ModelRunner& r = *runner;
    for (int64_t bs : batch_sizes) {
      for (int64_t P : mixed) {
        Batch b = make_mixed_batch(r, int(bs), ctx, P);
        const double us = served_step_us(r, b.fb, trace ? 3 : 20);
        if (trace) {
          tracer.take();
          constexpr int kSteps = 5;
          served_step_us(r, b.fb, kSteps);
          std::vector<bench::KernelRecord> recs = tracer.take();
          std::printf("\n== mixed, %lld decodes + %lld prompt tokens: kernel timeline (CUPTI) ==\n%s", (long long)bs,
                      (long long)P, bench::format_timeline(bench::step_timeline(recs, kWarmupSteps + kSteps)).c_str());
        } else {
          r.executor().profile_step(b.fb);  // warm-up
          std::printf("\n== mixed, %lld decodes + %lld prompt tokens ==\n%s", (long long)bs, (long long)P,
                      r.executor().profile_step(b.fb).c_str());
        }
        std::printf("mixed step %lld decodes + %lld prompt tokens, served: %.1f us\n", (long long)bs, (long long)P,
                    us);
        release(r, b);
      }
      if (!mixed.empty()) continue;
      Batch b = make_batch(r, int(bs), ctx, 1);
      if (trace) {
        constexpr int kSteps = 20;
        served_step_us(r, b.fb, 5);
        tracer.take();  // warm-up and graph capture
        const double us = served_step_us(r, b.fb, kSteps);
        std::vector<bench::KernelRecord> recs = tracer.take();
        std::printf("\n== decode, batch %lld, context %lld: kernel timeline (CUPTI) ==\n%s", (long long)bs,
                    (long long)ctx, bench::format_timeline(bench::step_timeline(recs, kWarmupSteps + kSteps)).c_str());
        std::printf("served decode step under tracing: %.1f us\n", us);
        overlapped_step_us(r, b.fb, 5);
        tracer.take();
        const double ous = overlapped_step_us(r, b.fb, kSteps);
        recs = tracer.take();
        std::printf("overlapped decode step under tracing: %.1f us; median gap between steps' kernels %.2f us\n", ous,
                    median_boundary_gap_us(recs, kWarmupSteps + kSteps + 1));
        release(r, b);
        continue;
      }
      r.executor().profile_step(b.fb);  // warm-up
      std::printf("\n== decode, batch %lld, context %lld ==\n%s", (long long)bs, (long long)ctx,
                  r.executor().profile_step(b.fb).c_str());
      std::printf("served decode step (graph replay, sampling, copies): %.1f us\n", served_step_us(r, b.fb, 50));
      std::printf("overlapped decode step (the next launched before collecting): %.1f us\n",
                  overlapped_step_us(r, b.fb, 50));
      release(r, b);
    }
    for (int seqs : {1, 16}) {
      if (!prefill || trace || !mixed.empty()) break;
      Batch b = make_batch(r, seqs, 0, 512);
      r.executor().profile_step(b.fb);
      std::printf("\n== prefill, %d x 512 tokens ==\n%s", seqs, r.executor().profile_step(b.fb).c_str());
      release(r, b);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

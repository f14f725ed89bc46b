// The GPU model against the CPU engine on the same BF16 checkpoint (a gen-model Qwen3-MoE with head_dim 64 and
// expert sizes the fused MoE kernels take): one mixed prefill batch of many sequences, each sequence alone,
// and graph-replayed decode steps. The CPU computes in f32, so differences are the GPU's BF16 arithmetic; a
// batch must not change a sequence's numbers beyond that. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>

#include "core/threadpool.h"
#include "kernels/sampling/sampling.h"
#include "launch/launch.h"
#include "model/arch/qwen3.h"
#include "model/model.h"
#include "model/gen_model.h"
#include "temp_dir.h"

using namespace moeserve;
namespace fs = std::filesystem;

namespace {

std::string make_model() {
  static const test_util::TempDir d("gpu_model");  // removed at exit
  static std::string dir;
  if (!dir.empty()) return dir;
  dir = d.string();
  GenModelSpec s;
  s.vocab_size = 4096;
  s.hidden_size = 512;
  s.num_layers = 2;
  s.num_heads = 8;
  s.num_kv_heads = 2;
  s.head_dim = 64;
  s.moe_intermediate_size = 256;
  s.num_experts = 16;
  s.num_experts_per_tok = 4;
  s.max_position_embeddings = 4096;
  s.seed = 5;
  ThreadPool pool(2);
  write_gen_model(s, dir, pool);
  return dir;
}

struct Runner {
  std::unique_ptr<ModelRunner> r;
  std::vector<std::vector<int32_t>> pages;
  Qwen3Model* cpu_model = nullptr;  // the CPU runner's model (its router hook), null on the GPU
};

Runner make(const std::string& device, bool graphs = true) {
  LaunchOptions lo;
  lo.disable_cuda_graph = !graphs;
  lo.model_path = make_model();
  lo.device = device;
  lo.runner.page_size = 16;
  lo.runner.chunked_prefill_size = 1024;
  lo.runner.max_total_tokens = 8192;
  lo.runner.threads = 2;
  lo.max_running_requests = 32;
  lo.mem_fraction_static = 0.2;
  lo.cuda_graph_max_bs = 32;
  if (device != "cpu") return {make_runner(lo), {}};
  std::unique_ptr<CausalLM> m = load_model(lo.model_path);  // as make_runner does for the CPU
  auto* q = dynamic_cast<Qwen3Model*>(m.get());
  return {std::make_unique<ModelRunner>(std::move(m), lo.runner), {}, q};
}

// log_softmax of one row.
std::vector<float> logprobs(const float* logits, int64_t V) {
  std::vector<float> lp(static_cast<size_t>(V));
  kernels::log_softmax(logits, V, lp.data());
  return lp;
}

// Largest |logprob difference| over the reference's top-8 tokens.
double top_diff(const float* ref_logits, const float* got_logits, int64_t V) {
  auto a = logprobs(ref_logits, V), b = logprobs(got_logits, V);
  auto top = kernels::top_logprobs(a.data(), V, 8);
  double worst = 0;
  for (auto& t : top) worst = std::max(worst, double(std::fabs(a[size_t(t.id)] - b[size_t(t.id)])));
  for (float x : b) EXPECT_TRUE(std::isfinite(x));
  return worst;
}

// One prefill step over `prompts` (each sequence's own pages, room for `room` more tokens), logits of every
// sequence's last token.
std::vector<float> prefill(Runner& R, const std::vector<std::vector<int32_t>>& prompts, int64_t room = 8) {
  ForwardBatch fb;
  R.pages.assign(prompts.size(), {});
  for (size_t s = 0; s < prompts.size(); ++s) {
    const int64_t n = int64_t(prompts[s].size());
    R.pages[s] = R.r->kv().allocator().allocate(R.r->kv().pages_for(n + room));
    const int64_t row = int64_t(fb.tokens.size());
    for (int64_t i = 0; i < n; ++i) fb.tokens.push_back(prompts[s][size_t(i)]), fb.positions.push_back(i);
    fb.seqs.push_back({R.pages[s].data(), 0, n, row});
    fb.logit_rows.push_back(row + n - 1);
  }
  std::vector<float> logits;
  R.r->forward(fb, logits);
  return logits;
}

// One decode step of every sequence (in R's pages) with a fixed next token, greedy with logprobs; specs draw from rng.
ForwardBatch fixed_token_step(const Runner& R, const std::vector<std::vector<int32_t>>& seqs, int step, int64_t V,
                              std::mt19937_64& rng, std::vector<SampleSpec>& specs) {
  ForwardBatch fb;
  specs.assign(seqs.size(), SampleSpec{});
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t pos = int64_t(seqs[s].size());
    fb.tokens.push_back(int32_t((s * 131 + size_t(step) * 17) % size_t(V)));  // a fixed next token
    fb.positions.push_back(pos);
    fb.seqs.push_back({R.pages[s].data(), pos, 1, int64_t(s)});
    fb.logit_rows.push_back(int64_t(s));
    specs[s].sampler.temperature = 0;
    specs[s].rng = &rng;
    specs[s].logprob = true;
  }
  return fb;
}

// `count` prompts of random ids below V (std::mt19937(seed)), prompt s of base + (s * step) % mod tokens.
std::vector<std::vector<int32_t>> random_prompts(int count, int64_t V, uint32_t seed, int base, int step, int mod) {
  std::mt19937 g(seed);
  std::vector<std::vector<int32_t>> seqs;
  for (int s = 0; s < count; ++s) {
    std::vector<int32_t> p(size_t(base + (s * step) % mod));
    for (auto& t : p) t = int32_t(g() % uint32_t(V));
    seqs.push_back(p);
  }
  return seqs;
}

void release(Runner& R) {
  for (auto& p : R.pages) R.r->kv().allocator().free(p);
  R.pages.clear();
}

}  // namespace

TEST(GpuModel, MixedBatchMatchesCpuAndSoloRuns) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  Runner cpu = make("cpu"), gpu = make("cuda");
  const int64_t V = cpu.r->config().vocab_size;
  std::mt19937 g(3);
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < 24; ++s) {
    std::vector<int32_t> p(size_t(1 + (s * 7) % 45));
    for (auto& t : p) t = int32_t(g() % uint32_t(V));
    prompts.push_back(p);
  }
  std::vector<float> want = prefill(cpu, prompts), got = prefill(gpu, prompts);
  double worst_cpu = 0, worst_solo = 0;
  for (size_t s = 0; s < prompts.size(); ++s) {
    const double d = top_diff(&want[s * V], &got[s * V], V);
    // gen-model weights give larger logits than the parity fixtures; BF16 activations move them by up to ~0.09
    // (measured on the H200). Batch invariance below is the tighter check.
    EXPECT_LT(d, 0.15) << "sequence " << s << " (" << prompts[s].size() << " tokens): batched GPU vs CPU";
    worst_cpu = std::max(worst_cpu, d);
  }
  release(gpu);
  // Each sequence alone must give the batch's numbers (up to BF16 reassociation).
  for (size_t s = 0; s < prompts.size(); ++s) {
    std::vector<float> solo = prefill(gpu, {prompts[s]});
    const double d = top_diff(&got[s * V], solo.data(), V);
    // Solo runs of up to 45 tokens take the tensor-core GEMV path, the 540-token batch cuBLAS: different
    // summation orders and BF16 output roundings (0.011 to 0.033 measured on the H200). BF16's tolerance.
    EXPECT_LT(d, 0.05) << "sequence " << s << ": solo vs batched on the GPU";
    worst_solo = std::max(worst_solo, d);
    release(gpu);
  }
  std::printf("[ info ] largest top-8 |logprob| difference: batched GPU vs CPU %.4f, solo vs batched GPU %.4f\n",
              worst_cpu, worst_solo);
  release(cpu);
}

// A mixed step as the scheduler builds them under load: sequences with cached context taking one token (decodes) or
// a chunk of several, interleaved, and new prompts - against the CPU (the prefill attention's work list over decode
// rows, chunks that start mid-page, new prompts). H100, session 64: largest difference 0.139 (also with branch
// next/moe-tma-evict-first's MOESERVE_ATTN_MIXED_SPLIT=1, which sends the decodes through the decode kernel).
TEST(GpuModel, MixedStepOfDecodesChunksAndNewPromptsMatchesCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  Runner cpu = make("cpu"), gpu = make("cuda");
  const int64_t V = cpu.r->config().vocab_size;
  const std::vector<std::vector<int32_t>> cached = random_prompts(14, V, 11, 20, 13, 70);
  const std::vector<std::vector<int32_t>> fresh = random_prompts(3, V, 12, 9, 17, 40);
  std::vector<float> want, got;
  for (Runner* R : {&cpu, &gpu}) {
    prefill(*R, cached, 16);
    std::mt19937 g(13);
    ForwardBatch fb;
    for (size_t s = 0; s < cached.size() + fresh.size(); ++s) {
      const bool is_new = s >= cached.size();
      const int64_t start = is_new ? 0 : int64_t(cached[s].size());
      const int64_t n = is_new ? int64_t(fresh[s - cached.size()].size()) : s % 3 == 1 ? 7 : 1;
      if (is_new) R->pages.push_back(R->r->kv().allocator().allocate(R->r->kv().pages_for(n)));
      const int64_t row = int64_t(fb.tokens.size());
      for (int64_t i = 0; i < n; ++i) {
        fb.tokens.push_back(is_new ? fresh[s - cached.size()][size_t(i)] : int32_t(g() % uint32_t(V)));
        fb.positions.push_back(start + i);
      }
      fb.seqs.push_back({R->pages[s].data(), start, n, row});
      fb.logit_rows.push_back(row + n - 1);
    }
    R->r->forward(fb, R == &cpu ? want : got);
  }
  ASSERT_EQ(want.size(), got.size());
  const size_t seqs = cached.size() + fresh.size();
  ASSERT_EQ(got.size(), seqs * size_t(V));
  double worst = 0;
  for (size_t s = 0; s < seqs; ++s) {
    const double d = top_diff(&want[s * size_t(V)], &got[s * size_t(V)], V);
    EXPECT_LT(d, 0.15) << "sequence " << s << ": the mixed step on the GPU vs the CPU";
    worst = std::max(worst, d);
  }
  std::printf("[ info ] largest top-8 |logprob| difference, mixed step GPU vs CPU: %.4f\n", worst);
  release(gpu);
  release(cpu);
}

// Graph-replayed decode steps of `count` sequences against the CPU's logits of the same steps; top_n > 0 asks for top
// logprobs (the general sampler), 0 leaves the steps all-greedy (at 32 rows on sm_90 the lm_head then runs inside the
// sampler: lmhead_argmax).
// Router margins of one CPU forward: margin[l][t] = token t's k-th minus (k+1)-th largest router logit in MoE layer l
// (how close its routing there is to a tie), recorded through the model's router hook.
struct RouterMargins {
  std::vector<std::vector<float>> margin;
  void record(Qwen3Model& m, int64_t layers, int64_t k) {
    margin.assign(size_t(layers), {});
    m.set_router_hook([this, k](int64_t layer, float* lg, int64_t T, int64_t E) {
      std::vector<float>& out = margin[size_t(layer)];
      out.assign(size_t(T), INFINITY);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<float> row(lg + t * E, lg + (t + 1) * E);
        std::nth_element(row.begin(), row.begin() + k, row.end(), std::greater<float>());
        const float kth1 = row[size_t(k)];  // the (k+1)-th largest
        out[size_t(t)] = *std::min_element(row.begin(), row.begin() + k) - kth1;
      }
    });
  }
};

// The CPU's logprobs of row `t` of `fb` with token t's k-th and (k+1)-th experts exchanged in MoE layer `layer` (what a
// BF16 near-tie flip on the GPU does). The forward rewrites this step's K / V rows; the caller runs the step again
// unflipped afterwards.
std::vector<float> cpu_logprobs_with_flip(Runner& cpu, const ForwardBatch& fb, int64_t t, int64_t layer, int64_t k) {
  const int64_t V = cpu.r->config().vocab_size;
  cpu.cpu_model->set_router_hook([&](int64_t l, float* lg, int64_t, int64_t E) {
    if (l != layer) return;
    float* row = lg + t * E;
    std::vector<int> order(static_cast<size_t>(E));
    for (int e = 0; e < int(E); ++e) order[size_t(e)] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
    std::swap(row[order[size_t(k - 1)]], row[order[size_t(k)]]);
  });
  std::vector<float> logits;
  cpu.r->forward(fb, logits);
  cpu.cpu_model->set_router_hook({});
  return logprobs(&logits[size_t(t) * size_t(V)], V);
}

// GPU decode steps against the CPU's: a sample must match the CPU's logprob of the GPU's token within BF16's
// tolerance (0.15) - or, where the CPU's routing of that token in some layer is a near-tie (its k-th and (k+1)-th
// router logits within kNearTie), match the CPU with that layer's boundary experts exchanged (the GPU's BF16
// activations picked the other one). H200, session 40: 1 of 192 samples of 32 sequences (step 3, sequence 25) was
// 0.35 off the CPU (-2.814 against -2.462); its layer-0 margin is 0.0166 (experts 2 / 10), and with those two
// exchanged the CPU gives -2.788 (found on the dev VM, session 41). At most a few such flips are allowed.
constexpr float kNearTie = 0.05f;

static void graph_decode_matches_cpu(int count, int top_n, int steps = 6) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  Runner cpu = make("cpu"), gpu = make("cuda");
  ASSERT_NE(cpu.cpu_model, nullptr);
  const int64_t V = cpu.r->config().vocab_size, L = cpu.r->config().num_layers;
  const int64_t K = cpu.r->config().num_experts_per_tok;
  // 13: lengths 5 + 3 s; 32: 736 tokens, one prefill step.
  std::vector<std::vector<int32_t>> seqs = random_prompts(count, V, 9, 5, 3, 37);
  prefill(cpu, seqs, steps + 2);
  prefill(gpu, seqs, steps + 2);
  double worst = 0;
  int flips = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<SampleSpec> specs;
    std::mt19937_64 rng(1);
    ForwardBatch fb = fixed_token_step(gpu, seqs, step, V, rng, specs);
    for (SampleSpec& sp : specs) sp.top_logprobs = top_n;
    // The GPU step (graph replay) against CPU logits of the same step.
    std::vector<Sampled> out;
    gpu.r->step(fb, specs, out);
    for (size_t s = 0; s < seqs.size(); ++s) fb.seqs[s].block_table = cpu.pages[s].data();
    std::vector<float> want;
    RouterMargins margins;
    margins.record(*cpu.cpu_model, L, K);
    cpu.r->forward(fb, want);
    cpu.cpu_model->set_router_hook({});
    bool reran = false;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const std::string where = "step " + std::to_string(step) + " sequence " + std::to_string(s);
      auto lp = logprobs(&want[s * V], V);
      double d = std::fabs(out[s].logprob - lp[size_t(out[s].token)]);
      if (d >= 0.15) {  // a routing near-tie the GPU resolved the other way?
        for (int64_t l = 0; l < L; ++l) {
          if (margins.margin[size_t(l)].empty() || !(margins.margin[size_t(l)][s] < kNearTie)) continue;
          std::vector<float> alt = cpu_logprobs_with_flip(cpu, fb, int64_t(s), l, K);
          reran = true;
          const double da = std::fabs(out[s].logprob - alt[size_t(out[s].token)]);
          std::printf("[ info ] %s: %.4f off the CPU; layer %lld's routing margin %.4f, with it flipped %.4f off\n",
                      where.c_str(), d, (long long)l, margins.margin[size_t(l)][s], da);
          if (da < 0.15) {
            lp = alt, d = da;
            ++flips;
            break;
          }
        }
      }
      auto top = kernels::top_logprobs(lp.data(), V, 2);
      if (top[0].logprob - top[1].logprob > 0.1) {
        EXPECT_EQ(out[s].token, top[0].id) << where;
      }
      EXPECT_LT(d, 0.15) << where << ": token " << out[s].token << " logprob " << out[s].logprob << ", the CPU's "
                         << lp[size_t(out[s].token)] << " (its top: " << top[0].id << " " << top[0].logprob << ", "
                         << top[1].id << " " << top[1].logprob << ")";
      worst = std::max(worst, d);
      seqs[s].push_back(fb.tokens[s]);
    }
    if (reran) {  // the flipped reruns rewrote this step's K / V rows: write the CPU's own again
      std::vector<float> again;
      cpu.r->forward(fb, again);
    }
  }
  // Near-ties are rare: the H200 (session 42) flipped 1 of 192 samples (32 sequences x 6 steps), 0 of 78 (13 x 6),
  // and 2 of 96 on the one-sequence path with the folded router (1 with MOESERVE_ROUTER_FOLD=0, a layer-0 margin of
  // 0.0093 that both take the other way). Allowed: about 3% of the samples, at least 3; more is a defect.
  EXPECT_LE(flips, std::max(3, count * steps / 32)) << "too many samples explained only by a flipped routing";
  std::printf("[ info ] graph decode of %d sequences, %d steps: largest |logprob| difference from the CPU %.4f (%d "
              "near-tie routing flips)\n", count, steps, worst, flips);
  release(cpu);
  release(gpu);
}

// 13 sequences: padded to the captured batch of 16.
TEST(GpuModel, GraphDecodeStepsMatchCpu) { graph_decode_matches_cpu(13, 3); }
// One sequence, greedy, 96 steps: the decode-at-one-request path (GEMVs with the residual fusion, the folded router,
// the 1-token MoE, the streaming lm_head and the all-greedy sampler) against the CPU; with the folded router's
// extra roundings any routing flip it causes shows up here as a near-tie flip (run with MOESERVE_ROUTER_FOLD=0 to
// compare).
TEST(GpuModel, OneSequenceGraphDecodeMatchesCpu) { graph_decode_matches_cpu(1, 0, 96); }
// 32 sequences, all greedy: at 32 rows on sm_90 the lm_head runs inside the sampler (lmhead_argmax). Disabled in
// session 40 for its one outlier, explained in session 41 as a layer-0 routing near-tie (see kNearTie).
TEST(GpuModel, GreedyGraphDecodeStepsOf32SequencesMatchCpu) { graph_decode_matches_cpu(32, 0); }

// A GPU runner made with the switch `name` set to 0 (the executor reads its switches when it is made).
static Runner make_switched_off(const char* name) {
  ::setenv(name, "0", 1);
  Runner r = make("cuda");
  ::unsetenv(name);
  return r;
}

// The same step (fb in a's pages) on GPU runners a and b (fb moved to b's pages): their samples, one a sequence each.
static bool step_both(Runner& a, Runner& b, ForwardBatch& fb, const std::vector<SampleSpec>& specs,
                      std::vector<Sampled>& got, std::vector<Sampled>& want) {
  a.r->step(fb, specs, got);
  for (size_t s = 0; s < fb.seqs.size(); ++s) fb.seqs[s].block_table = b.pages[s].data();
  b.r->step(fb, specs, want);
  return got.size() == fb.seqs.size() && want.size() == fb.seqs.size();
}

// All-greedy graph steps of 32 sequences (the lm_head inside the sampler, lmhead_argmax) against the same steps with
// the lm_head as a cuBLAS GEMM + the greedy sampler (MOESERVE_LMHEAD_ARGMAX=0, read when the executor is made): the
// same tokens, logprobs within f32 summation order.
TEST(GpuModel, LmheadArgmaxStepsMatchTheGemmAndGreedySampler) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  Runner gemm = make_switched_off("MOESERVE_LMHEAD_ARGMAX");
  Runner fused = make("cuda");
  const int64_t V = fused.r->config().vocab_size;
  std::vector<std::vector<int32_t>> seqs = random_prompts(32, V, 11, 3, 5, 29);
  prefill(gemm, seqs);
  prefill(fused, seqs);
  double worst = 0;
  for (int step = 0; step < 6; ++step) {
    std::vector<SampleSpec> specs;
    std::mt19937_64 rng(1);
    ForwardBatch fb = fixed_token_step(fused, seqs, step, V, rng, specs);
    std::vector<Sampled> got, want;
    ASSERT_TRUE(step_both(fused, gemm, fb, specs, got, want));
    for (size_t s = 0; s < seqs.size(); ++s) {
      EXPECT_EQ(got[s].token, want[s].token) << "step " << step << " sequence " << s;
      EXPECT_TRUE(std::isfinite(got[s].logprob)) << "step " << step << " sequence " << s;
      const double d = std::fabs(got[s].logprob - want[s].logprob);
      EXPECT_LT(d, 1e-3) << "step " << step << " sequence " << s;
      worst = std::max(worst, d);
      seqs[s].push_back(fb.tokens[s]);
    }
  }
  std::printf("[ info ] lmhead_argmax against cuBLAS + greedy: largest |logprob| difference %.2e\n", worst);
  release(gemm);
  release(fused);
}

// Greedy graph steps through the lm_head screen (the default at 1-64 rows without logprobs) against the same steps
// without it (MOESERVE_LMHEAD_SCREEN=0, read when the executor is made: the BF16 lm_head + greedy sampler, or
// lmhead_argmax): the same tokens, at 1 sequence (the 1-8-row form), 13 and 30 (padded to the graphs of 16 and 32:
// the 9-64-row form); then the same steps wanting a logprob, which take the greedy graphs without the screen: the same
// tokens and logprobs within f32 summation order.
TEST(GpuModel, LmheadScreenStepsMatchTheGemmAndGreedySampler) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  Runner plain = make_switched_off("MOESERVE_LMHEAD_SCREEN");
  Runner screened = make("cuda");
  const int64_t V = screened.r->config().vocab_size;
  int compared = 0;
  for (const int count : {1, 13, 30}) {
    for (const bool want_lp : {false, true}) {
      std::vector<std::vector<int32_t>> seqs = random_prompts(count, V, 21 + uint32_t(count), 4, 7, 31);
      prefill(plain, seqs);
      prefill(screened, seqs);
      for (int step = 0; step < 4; ++step) {
        std::vector<SampleSpec> specs;
        std::mt19937_64 rng(1);
        ForwardBatch fb = fixed_token_step(screened, seqs, step, V, rng, specs);
        for (SampleSpec& sp : specs) sp.logprob = want_lp;
        std::vector<Sampled> got, want;
        ASSERT_TRUE(step_both(screened, plain, fb, specs, got, want));
        for (size_t s = 0; s < seqs.size(); ++s) {
          const std::string where = std::to_string(count) + " sequences" + (want_lp ? " with logprobs" : "") +
                                    ", step " + std::to_string(step) + " sequence " + std::to_string(s);
          EXPECT_EQ(got[s].token, want[s].token) << where;
          if (want_lp) {
            EXPECT_TRUE(std::isfinite(got[s].logprob)) << where;
            EXPECT_LT(std::fabs(got[s].logprob - want[s].logprob), 1e-3) << where;
          }
          ++compared;
          seqs[s].push_back(fb.tokens[s]);
        }
      }
      release(plain);
      release(screened);
    }
  }
  std::printf("[ info ] lm_head screen against the BF16 lm_head + greedy: %d samples compared\n", compared);
}

// Sampled graph steps through the lm_head screen for sampled steps (lmhead_screen_topk, the default at 1-64 rows whose
// rows are greedy or take top_k <= 64 without logprobs) against the same steps without it
// (MOESERVE_LMHEAD_SCREEN_TOPK=0: the BF16 lm_head + sample()), the same random bits on both: the draw is the sampler's
// own, over logits that differ only in f32 summation order, so the tokens agree but where a draw lands within that
// noise of a boundary (allowed once, and once more every 200 draws). Rows mix temperature 0.8 / top_k 20 / top_p 0.95,
// greedy, and temperature 1.3 / top_k 5 / min_p 0.05, at 1, 3 (the graph of 4), 8, 13 (the graph of 16) and 32 sequences.
TEST(GpuModel, SampledScreenStepsMatchTheGemmAndSampler) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  Runner plain = make_switched_off("MOESERVE_LMHEAD_SCREEN_TOPK");
  Runner screened = make("cuda");
  const int64_t V = screened.r->config().vocab_size;
  int compared = 0, differ = 0, not_argmax = 0, high_t = 0;
  for (const int count : {1, 3, 8, 13, 32}) {  // 13 and 32: the 9-64-row form on sm_90 (13 in the graph of 16)
    std::vector<std::vector<int32_t>> seqs = random_prompts(count, V, 41 + uint32_t(count), 5, 7, 23);
    prefill(plain, seqs, 9);  // room for the 8 steps and the last one
    prefill(screened, seqs, 9);
    for (int step = 0; step < 8; ++step) {
      std::vector<SampleSpec> specs;
      std::mt19937_64 unused(1);
      ForwardBatch fb = fixed_token_step(screened, seqs, step, V, unused, specs);
      std::mt19937_64 ra(100 + uint64_t(step) + 1000 * uint64_t(count)), rb = ra;
      for (size_t s = 0; s < specs.size(); ++s) {
        SampleSpec& sp = specs[s];
        sp.logprob = false;
        const int form = int(s + size_t(step)) % 3;
        sp.sampler.temperature = form == 0 ? 0.8f : form == 1 ? 0.0f : 1.3f;
        sp.sampler.top_k = form == 0 ? 20 : form == 1 ? -1 : 5;
        sp.sampler.top_p = form == 0 ? 0.95f : 1.0f;
        sp.sampler.min_p = form == 2 ? 0.05f : 0.0f;
      }
      std::vector<SampleSpec> specs_b = specs;
      for (SampleSpec& sp : specs) sp.rng = &ra;
      for (SampleSpec& sp : specs_b) sp.rng = &rb;
      std::vector<Sampled> got, want;
      screened.r->step(fb, specs, got);
      for (size_t s = 0; s < fb.seqs.size(); ++s) fb.seqs[s].block_table = plain.pages[s].data();
      plain.r->step(fb, specs_b, want);
      ASSERT_EQ(got.size(), seqs.size());
      ASSERT_EQ(want.size(), seqs.size());
      for (size_t s = 0; s < seqs.size(); ++s) {
        ASSERT_GE(got[s].token, 0);
        ASSERT_LT(got[s].token, V);
        differ += got[s].token != want[s].token;
        ++compared;
        seqs[s].push_back(fb.tokens[s]);
      }
    }
    // The same sequences once more greedily through the plain runner: how often the sampled rows left the argmax.
    std::vector<SampleSpec> specs;
    std::mt19937_64 rng(1);
    ForwardBatch fb = fixed_token_step(plain, seqs, 8, V, rng, specs);
    for (SampleSpec& sp : specs) sp.logprob = false;
    std::vector<Sampled> greedy;
    plain.r->step(fb, specs, greedy);
    for (size_t s = 0; s < fb.seqs.size(); ++s) fb.seqs[s].block_table = screened.pages[s].data();
    for (SampleSpec& sp : specs) sp.sampler.temperature = 1.5f, sp.sampler.top_k = 40;
    std::vector<Sampled> drawn;
    screened.r->step(fb, specs, drawn);
    for (size_t s = 0; s < seqs.size(); ++s) not_argmax += drawn[s].token != greedy[s].token, ++high_t;
    release(plain);
    release(screened);
  }
  std::printf("[ info ] sampled screen steps against the BF16 lm_head + sample(): %d samples compared, %d differ; "
              "%d of %d draws at temperature 1.5 / top_k 40 off the argmax\n",
              compared, differ, not_argmax, high_t);
  EXPECT_LE(differ, 1 + compared / 200) << "of " << compared;
  EXPECT_GT(not_argmax, 0) << "temperature 1.5 / top_k 40 never left the argmax: the draw ignores its random bits?";
}

// A step launched with the masks of rows `later` to come (Executor::launch's later rows), then given them: its samples.
std::vector<Sampled> step_with_later_masks(Executor& e, const ForwardBatch& fb, const std::vector<SampleSpec>& specs,
                                           const std::vector<int32_t>& later, std::vector<std::vector<uint32_t>> masks) {
  std::vector<Sampled> out;
  e.launch(fb, specs, later);
  e.complete_launch(masks);
  e.collect(out);
  return out;
}

// The largest logit of the tokens `ok` allows.
float best_allowed(const float* row, const std::vector<uint8_t>& ok) {
  float best = -INFINITY;
  for (size_t t = 0; t < ok.size(); ++t)
    if (ok[t]) best = std::max(best, row[t]);
  return best;
}

// Decode steps whose rows carry grammar masks (SampleSpec::allowed), with graphs (the general sampler's) and without:
// every token is one its row's mask allows - a greedy row's best allowed token by the step's logits (its unmasked
// argmax left out, so it moves), a row with one allowed token drawn at temperature 1 that token - and unmasked rows
// beside them keep their argmax. The same step with some masks given after its launch (the overlap schedule's later
// masks: the forward's graph, then the sampler's) picks the same tokens.
TEST(GpuModel, GrammarMaskedDecodeStepsPickTheBestAllowedToken) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  for (const bool with_graphs : {true, false}) {
    SCOPED_TRACE(with_graphs ? "graph replay" : "eager steps");
    Runner gpu = make("cuda", with_graphs);
    const int64_t V = gpu.r->config().vocab_size;
    std::vector<std::vector<int32_t>> seqs = random_prompts(13, V, 77, 4, 5, 19);
    prefill(gpu, seqs, 6);
    std::mt19937 g(5);
    int moved = 0, sparse_differ = 0, sparse_sampled = 0;
    for (int step = 0; step < 4; ++step) {
      std::vector<SampleSpec> specs;
      std::mt19937_64 rng(1);
      ForwardBatch fb = fixed_token_step(gpu, seqs, step, V, rng, specs);
      std::vector<Sampled> plain, got, greedy_later;
      std::vector<float> logits;
      gpu.r->step(fb, specs, plain);  // unmasked (each run of the step rewrites the same K / V rows)
      gpu.r->forward(fb, logits);     // the step's logits, eager
      ASSERT_EQ(plain.size(), seqs.size());
      ASSERT_EQ(logits.size(), seqs.size() * size_t(V));
      std::vector<std::vector<uint8_t>> ok(seqs.size());
      for (size_t s = 0; s < seqs.size(); ++s) {
        if (s % 4 == 3) continue;  // unmasked
        ok[s].assign(size_t(V), 0);
        if (s % 4 == 2) {  // one token (not the argmax), drawn at temperature 1
          ok[s][size_t(plain[s].token + 1 + int32_t(g() % uint32_t(V - 1))) % size_t(V)] = 1;
          specs[s].sampler.temperature = 1.0f;
        } else {
          for (auto& o : ok[s]) o = uint8_t(g() % 3 == 0);
          ok[s][size_t(plain[s].token)] = 0;
        }
        specs[s].allowed.assign(size_t(V + 31) / 32, 0u);
        for (int64_t t = 0; t < V; ++t)
          if (ok[s][size_t(t)]) specs[s].allowed[size_t(t) / 32] |= 1u << (t % 32);
      }
      const std::mt19937_64 rng_before = rng;
      gpu.r->step(fb, specs, got);
      ASSERT_EQ(got.size(), seqs.size());
      {
        // The same step with the masks of every other masked row (and an empty one for an unmasked row) given after
        // the launch (Executor::launch's `later`, complete_launch): the forward's graph, then the sampler's, or
        // eager - the same tokens, draws included.
        rng = rng_before;
        std::vector<SampleSpec> held = specs;
        std::vector<int32_t> later;
        std::vector<std::vector<uint32_t>> masks;
        for (size_t s = 0; s < seqs.size(); ++s)
          if (s % 2 == 0 || s == 3) {
            later.push_back(int32_t(s));
            masks.push_back(std::move(held[s].allowed));
            held[s].allowed.clear();
          }
        const std::vector<Sampled> deferred = step_with_later_masks(gpu.r->executor(), fb, held, later, masks);
        ASSERT_EQ(deferred.size(), got.size());
        for (size_t s = 0; s < seqs.size(); ++s)
          EXPECT_EQ(deferred[s].token, got[s].token) << "step " << step << " sequence " << s << ": masks given later";
        // Every row greedy: the lm_head screen, then the masked rows' argmax over their allowed tokens
        // (lmhead_screen_masked) - checked below as the general sampler's tokens are.
        for (auto& sp : held) sp.sampler.temperature = 0.0f;
        greedy_later = step_with_later_masks(gpu.r->executor(), fb, held, later, masks);
        ASSERT_EQ(greedy_later.size(), got.size());
        // Every row greedy under a small mask (40 random tokens, on even rows the unmasked argmax too), half of them
        // given later: no screen, each row's argmax over its allowed tokens (lmhead_screen_masked without picks).
        std::vector<std::vector<uint8_t>> small(seqs.size(), std::vector<uint8_t>(size_t(V), 0));
        std::vector<SampleSpec> held_small = held;
        std::vector<int32_t> later_small;
        std::vector<std::vector<uint32_t>> masks_small;
        for (size_t s = 0; s < seqs.size(); ++s) {
          for (int i = 0; i < 40; ++i) small[s][g() % uint32_t(V)] = 1;
          if (s % 2 == 0) small[s][size_t(plain[s].token)] = 1;
          std::vector<uint32_t> words(size_t(V + 31) / 32, 0u);
          for (int64_t t = 0; t < V; ++t)
            if (small[s][size_t(t)]) words[size_t(t) / 32] |= 1u << (t % 32);
          held_small[s].allowed.clear();
          if (s % 3 == 0) {
            later_small.push_back(int32_t(s));
            masks_small.push_back(std::move(words));
          } else {
            held_small[s].allowed = std::move(words);
          }
        }
        const std::vector<Sampled> small_got =
            step_with_later_masks(gpu.r->executor(), fb, held_small, later_small, masks_small);
        ASSERT_EQ(small_got.size(), seqs.size());
        for (size_t s = 0; s < seqs.size(); ++s) {
          const int32_t tok = small_got[s].token;
          ASSERT_TRUE(tok >= 0 && tok < V && small[s][size_t(tok)])
              << "step " << step << " sequence " << s << " (small masks): token " << tok << " left out by the mask";
          const float* row = &logits[s * size_t(V)];
          const float best = best_allowed(row, small[s]);
          EXPECT_GE(row[tok], best - 0.05f) << "step " << step << " sequence " << s << " (small masks): token " << tok;
          if (s % 2 == 0) {
            EXPECT_EQ(tok, plain[s].token) << "step " << step << " sequence " << s << " (small masks): its argmax allowed";
          }
        }
        // The same small masks, sampled (temperature 0.8, top_k 5 on odd rows; the even rows greedy): the allowed
        // tokens' logits alone and the general sampler (lmhead_masked_logits), against the same step with the masks
        // given up front (the whole lm_head and the general sampler), the same random bits: the same tokens but where
        // the two summation orders split a draw's boundary.
        std::vector<SampleSpec> sampled_small = held_small;
        for (size_t s = 0; s < seqs.size(); ++s) {
          if (s % 2 == 1) sampled_small[s].sampler.temperature = 0.8f, sampled_small[s].sampler.top_k = 5;
          if (sampled_small[s].allowed.empty()) {  // (a later row: its mask as the up-front run has it)
            for (size_t i = 0; i < later_small.size(); ++i)
              if (size_t(later_small[i]) == s) sampled_small[s].allowed = masks_small[i];
          }
        }
        std::vector<SampleSpec> sparse_specs = sampled_small;
        std::vector<std::vector<uint32_t>> sparse_masks;
        for (int32_t r : later_small) {
          sparse_masks.push_back(std::move(sparse_specs[size_t(r)].allowed));
          sparse_specs[size_t(r)].allowed.clear();
        }
        const std::mt19937_64 rng_small = rng;
        std::vector<Sampled> upfront;
        gpu.r->step(fb, sampled_small, upfront);
        rng = rng_small;
        const std::vector<Sampled> sparse =
            step_with_later_masks(gpu.r->executor(), fb, sparse_specs, later_small, std::move(sparse_masks));
        ASSERT_EQ(sparse.size(), seqs.size());
        for (size_t s = 0; s < seqs.size(); ++s) {
          const int32_t tok = sparse[s].token;
          ASSERT_TRUE(tok >= 0 && tok < V && small[s][size_t(tok)])
              << "step " << step << " sequence " << s << " (small masks, sampled): token " << tok;
          sparse_differ += tok != upfront[s].token;
          sparse_sampled += s % 2 == 1;
        }
      }
      for (size_t s = 0; s < seqs.size(); ++s) {
        const std::string where = "step " + std::to_string(step) + " sequence " + std::to_string(s);
        for (const bool all_greedy : {false, true}) {
          const int32_t tok = (all_greedy ? greedy_later : got)[s].token;
          const std::string w = where + (all_greedy ? " (all greedy, masks given later)" : "");
          if (ok[s].empty()) {
            EXPECT_EQ(tok, plain[s].token) << w << ": an unmasked row moved";
            continue;
          }
          ASSERT_TRUE(tok >= 0 && tok < V && ok[s][size_t(tok)]) << w << ": token " << tok << " left out by the mask";
          if (!all_greedy) moved += tok != plain[s].token;
          if (!all_greedy && specs[s].sampler.temperature > 0.0f) continue;
          const float* row = &logits[s * size_t(V)];
          const float best = best_allowed(row, ok[s]);
          // The eager logits against the step's own (a padded graph batch may round differently): near-ties only.
          EXPECT_GE(row[tok], best - 0.05f) << w << ": token " << tok << " is not the best allowed one";
        }
      }
      for (size_t s = 0; s < seqs.size(); ++s) seqs[s].push_back(fb.tokens[s]);
    }
    EXPECT_EQ(moved, 4 * 10) << "every masked row should leave its unmasked argmax";
    EXPECT_LE(sparse_differ, 2) << "of " << 4 * seqs.size() << " small-mask rows, " << sparse_sampled << " sampled";
    release(gpu);
  }
}

// The overlap schedule's launches: step n + 1 is launched before step n is collected, its tokens the samples step n
// leaves on the device (previous_samples), its metadata uploaded and step n's samples copied back on side streams.
// Graph-replayed greedy steps, graph steps with the general sampler (top logprobs), and eager steps (graphs off)
// must give the tokens of the same steps run one at a time with the tokens known on the host.
TEST(GpuModel, LaunchedAheadStepsFeedSamplesOnTheDevice) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 g(21);
  for (bool graphs : {true, false}) {
    Runner gpu = make("cuda", graphs);
    const int64_t V = gpu.r->config().vocab_size;
    const int n = 13;  // padded to the graph of 16
    for (int top : {0, 2}) {
      std::vector<std::vector<int32_t>> seqs;
      for (int s = 0; s < n; ++s) {
        std::vector<int32_t> p(size_t(4 + s % 9));
        for (auto& t : p) t = int32_t(g() % uint32_t(V));
        seqs.push_back(p);
      }
      const int steps = 5;
      std::vector<std::vector<int32_t>> got[2];  // [0] one step at a time, [1] launched ahead
      for (int mode = 0; mode < 2; ++mode) {
        std::vector<float> logits = prefill(gpu, seqs);
        std::vector<int32_t> first(static_cast<size_t>(n));
        for (int s = 0; s < n; ++s) {  // greedy first tokens from the prefill logits
          const float* row = &logits[size_t(s) * size_t(V)];
          first[size_t(s)] = int32_t(std::max_element(row, row + V) - row);
        }
        std::mt19937_64 rng(1);
        std::vector<SampleSpec> specs(static_cast<size_t>(n));
        for (auto& sp : specs) sp.sampler.temperature = 0, sp.rng = &rng, sp.top_logprobs = top;
        auto batch = [&](int step, const std::vector<int32_t>& tokens) {
          ForwardBatch fb;
          for (int s = 0; s < n; ++s) {
            const int64_t pos = int64_t(seqs[size_t(s)].size()) + step;
            fb.tokens.push_back(tokens[size_t(s)]);
            fb.positions.push_back(pos);
            fb.seqs.push_back({gpu.pages[size_t(s)].data(), pos, 1, int64_t(s)});
            fb.logit_rows.push_back(s);
          }
          return fb;
        };
        got[mode].assign(size_t(steps), {});
        std::vector<Sampled> out;
        if (mode == 0) {
          std::vector<int32_t> tokens = first;
          for (int step = 0; step < steps; ++step) {
            gpu.r->step(batch(step, tokens), specs, out);
            for (int s = 0; s < n; ++s) tokens[size_t(s)] = out[size_t(s)].token;
            for (auto& o : out) got[mode][size_t(step)].push_back(o.token);
          }
        } else {
          gpu.r->launch(batch(0, first), specs);
          std::vector<int32_t> placeholders(static_cast<size_t>(n), 0);
          for (int step = 1; step <= steps; ++step) {
            if (step < steps) {
              ForwardBatch fb = batch(step, placeholders);  // wrong tokens on the host: the device has the right ones
              for (int s = 0; s < n; ++s) fb.previous_samples.push_back(s);
              gpu.r->launch(fb, specs);
            }
            gpu.r->collect(out);
            for (auto& o : out) got[mode][size_t(step - 1)].push_back(o.token);
          }
        }
        release(gpu);
      }
      for (int step = 0; step < steps; ++step)
        EXPECT_EQ(got[1][size_t(step)], got[0][size_t(step)]) << "graphs " << graphs << ", top " << top << ", step " << step;
    }
  }
}


// Prompt logprobs on the GPU: a step whose logit rows outnumber the lm_head's logits rows (at least 256, the
// executor's kMinHeadRows; this runner's 32 sequences make it 256) runs the lm_head and the sampler in slices. Every
// prompt position of three prompts (900 rows: slices of 256, 256, 256 and 132) through forward_logits against the same
// batch run as four steps of those rows (no slices: the same GEMM shapes, so the same numbers) and against the CPU;
// then the rows of all positions but
// each prompt's first three (gathered rows) sampled as the scheduler scores a prompt - the next prompt token forced
// (score_forced_rows), its logprob and the top 3 of the raw logits - against those logits; each prompt's last row
// is an ordinary greedy row among them (sample()).
TEST(GpuModel, StepsOfMoreLogitRowsThanTheLmHeadHoldsRunInSlices) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  Runner cpu = make("cpu"), gpu = make("cuda");
  const int64_t V = cpu.r->config().vocab_size;
  const std::vector<std::vector<int32_t>> prompts = random_prompts(3, V, 17, 150, 150, 400);  // 150, 300, 450
  const size_t total = 900, slice = 256;
  ASSERT_EQ(prompts[0].size() + prompts[1].size() + prompts[2].size(), total);
  // The prompts as one batch whose logit rows are the positions [first, end) of the 900 (all: in order, no gather)
  // or, with skip, each prompt's positions from `skip` on.
  auto batch = [&](Runner& R, int64_t first, int64_t end, int64_t skip = 0) {
    ForwardBatch fb;
    R.pages.assign(prompts.size(), {});
    for (size_t s = 0; s < prompts.size(); ++s) {
      const int64_t n = int64_t(prompts[s].size()), row = int64_t(fb.tokens.size());
      R.pages[s] = R.r->kv().allocator().allocate(R.r->kv().pages_for(n + 8));
      for (int64_t i = 0; i < n; ++i) fb.tokens.push_back(prompts[s][size_t(i)]), fb.positions.push_back(i);
      fb.seqs.push_back({R.pages[s].data(), 0, n, row});
    }
    for (int64_t s = 0, row = 0; s < int64_t(prompts.size()); row += int64_t(prompts[size_t(s)].size()), ++s)
      for (int64_t i = skip; i < int64_t(prompts[size_t(s)].size()); ++i)
        if (row + i >= first && row + i < end) fb.logit_rows.push_back(row + i);
    return fb;
  };
  auto logits_of = [&](Runner& R, const ForwardBatch& fb) {
    std::vector<float> l;
    R.r->forward(fb, l);
    release(R);
    return l;
  };
  const std::vector<float> got = logits_of(gpu, batch(gpu, 0, int64_t(total)));
  std::vector<float> want;
  for (size_t first = 0; first < total; first += slice) {
    const std::vector<float> part = logits_of(gpu, batch(gpu, int64_t(first), int64_t(std::min(first + slice, total))));
    want.insert(want.end(), part.begin(), part.end());
  }
  const std::vector<float> cpu_logits = logits_of(cpu, batch(cpu, 0, int64_t(total)));
  ASSERT_EQ(got.size(), total * size_t(V));
  ASSERT_EQ(want.size(), got.size());
  double worst = 0;
  int cpu_far = 0;
  for (size_t r = 0; r < total; ++r) {
    double d = 0;
    for (int64_t v = 0; v < V; ++v) d = std::max(d, double(std::fabs(got[r * size_t(V) + size_t(v)] -
                                                                     want[r * size_t(V) + size_t(v)])));
    EXPECT_LT(d, 2e-3) << "logit row " << r << ": sliced against two steps without slices";
    worst = std::max(worst, d);
    // Against the CPU (f32): MixedBatchMatchesCpuAndSoloRuns' tolerance, which a near-tie routing flip (BF16) can
    // exceed at a few positions (6 of 247 in a first form of this test); a wrong slice would move all of its rows.
    cpu_far += top_diff(&cpu_logits[r * size_t(V)], &got[r * size_t(V)], V) > 0.15;
  }
  EXPECT_LE(cpu_far, int(total / 20)) << "of " << total << " rows off the CPU's logprobs by more than 0.15";

  // Scored rows: row i of a prompt predicts prompt token i + 1 (each prompt's last row predicts nothing: a free
  // greedy pick).
  const int64_t skip = 3;
  ForwardBatch fb = batch(gpu, 0, int64_t(total), skip);
  std::mt19937_64 rng(1);
  std::vector<int32_t> forced;  // -1: the prompt's last row, sampled greedily
  std::vector<size_t> row_of;   // the logit row (of the 900) each scored row is
  for (size_t s = 0, base = 0; s < prompts.size(); base += prompts[s].size(), ++s)
    for (size_t i = size_t(skip); i < prompts[s].size(); ++i) {
      forced.push_back(i + 1 < prompts[s].size() ? prompts[s][i + 1] : -1);
      row_of.push_back(base + i);
    }
  ASSERT_EQ(fb.logit_rows.size(), row_of.size());
  std::vector<SampleSpec> specs(forced.size());
  for (size_t r = 0; r < specs.size(); ++r) {
    specs[r].sampler.temperature = 0;
    specs[r].rng = &rng;
    specs[r].forced_token = forced[r];
    specs[r].logprob = true;
    specs[r].top_logprobs = 3;
  }
  std::vector<Sampled> out;
  gpu.r->step(fb, specs, out);
  release(gpu);
  ASSERT_EQ(out.size(), specs.size());
  double worst_lp = 0;
  for (size_t r = 0; r < out.size(); ++r) {
    const float* row = &want[row_of[r] * size_t(V)];
    const std::vector<float> lp = logprobs(row, V);
    const int32_t best = int32_t(std::max_element(row, row + V) - row);
    EXPECT_EQ(out[r].token, forced[r] < 0 ? best : forced[r]) << "scored row " << r;
    ASSERT_GE(out[r].token, 0);
    ASSERT_LT(out[r].token, V);
    const double d = std::fabs(double(out[r].logprob) - double(lp[size_t(out[r].token)]));
    EXPECT_LT(d, 2e-3) << "scored row " << r << ": logprob " << out[r].logprob << ", want " << lp[size_t(out[r].token)];
    worst_lp = std::max(worst_lp, d);
    ASSERT_EQ(out[r].top.size(), 3u) << "scored row " << r;
    EXPECT_LT(std::fabs(double(out[r].top[0].logprob) - double(lp[size_t(best)])), 2e-3) << "scored row " << r;
    EXPECT_GE(lp[size_t(out[r].top[0].id)], lp[size_t(best)] - 2e-3f) << "scored row " << r;
  }
  std::printf("[ info ] %zu rows in slices: largest |logit| difference from steps without slices %.2g, %d rows off "
              "the CPU by > 0.15; %zu scored rows, largest |logprob - want| %.2g\n",
              total, worst, cpu_far, out.size(), worst_lp);
}

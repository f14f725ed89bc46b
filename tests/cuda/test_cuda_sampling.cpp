// GPU sampling against the CPU sampler (kernels/sampling) and the scheduler's penalty code: greedy ids,
// logprobs and top logprobs exactly as the CPU computes them; for random sampling, the kept set of top-k /
// top-p / min-p (ties split by id) and the drawn frequencies. Skipped on machines without a GPU.
// The timing table is a disabled test: run it with
//   tests/test_cuda_sampling --gtest_also_run_disabled_tests --gtest_filter='*Timing*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/dtype.h"
#include "cuda/device.h"
#include "cuda_test_util.h"
#include "cuda/sampling/sampling.h"
#include "cuda/sampling/score.h"
#include "kernels/sampling/sampling.h"

using namespace moeserve;
using cuda::SampleRowParams;

namespace {

using cuda_test::Dev;

// Rows with their parameters and penalty / ban lists, packed the way the executor packs them.
struct Batch {
  int V;
  std::vector<float> logits;
  std::vector<SampleRowParams> params;
  std::vector<int32_t> pen_ids, pen_counts, ban_ids;
  std::vector<float> ban_values;  // beside ban_ids: a logit bias, or -inf for a ban
  // Per row, for the CPU side.
  std::vector<std::vector<std::pair<int32_t, int32_t>>> pens;
  std::vector<std::vector<int32_t>> bans;
  std::vector<std::vector<std::pair<int32_t, float>>> biases;
  std::vector<uint32_t> allowed;  // the grammar masks, (V + 31) / 32 words each (SampleArgs::allowed)
  std::vector<std::vector<uint8_t>> mask_of;  // per row: 1 where the token may be picked; empty: every token

  explicit Batch(int vocab) : V(vocab) {}
  // Gives the last row a grammar mask: `ok` (V entries) 1 where the token may be picked.
  void mask_last(const std::vector<uint8_t>& ok) {
    const size_t W = (size_t(V) + 31) / 32, at = allowed.size();
    allowed.resize(at + W, 0u);
    for (int t = 0; t < V; ++t)
      if (ok[size_t(t)]) allowed[at + size_t(t) / 32] |= 1u << (t % 32);
    params.back().mask_row = int32_t(at / W);
    mask_of.back() = ok;
  }
  int rows() const { return int(params.size()); }
  const float* row(int r) const { return logits.data() + size_t(r) * V; }
  // `bias` and `ban` hold distinct tokens (as the executor merges them).
  void add(const std::vector<float>& lg, SampleRowParams p, const std::vector<std::pair<int32_t, int32_t>>& pen = {},
           const std::vector<int32_t>& ban = {}, const std::vector<std::pair<int32_t, float>>& bias = {}) {
    logits.insert(logits.end(), lg.begin(), lg.end());
    p.pen_begin = int32_t(pen_ids.size());
    for (auto [t, n] : pen) {
      pen_ids.push_back(t);
      pen_counts.push_back(n);
    }
    p.pen_end = int32_t(pen_ids.size());
    p.ban_begin = int32_t(ban_ids.size());
    for (auto [t, v] : bias) ban_ids.push_back(t), ban_values.push_back(v);
    for (int32_t t : ban) ban_ids.push_back(t), ban_values.push_back(-INFINITY);
    p.ban_end = int32_t(ban_ids.size());
    params.push_back(p);
    pens.push_back(pen);
    bans.push_back(ban);
    biases.push_back(bias);
    mask_of.emplace_back();
  }
};

struct Result {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  std::vector<int32_t> ranks;  // score_forced_rows' (with `score`)
};

// Runs sample() once (optionally recorded in a CUDA graph and replayed) on poisoned outputs; with `score`,
// score_forced_rows() first, as the executor runs them for steps with forced rows.
Result run_gpu(const Batch& b, int max_top, bool graph = false, bool score = false) {
  const int R = b.rows();
  Dev<float> logits(b.logits.size()), lps(R), top_lps(size_t(R) * max_top);
  Dev<SampleRowParams> params(R);
  Dev<int32_t> pen_ids(b.pen_ids.size()), pen_counts(b.pen_counts.size()), ban_ids(b.ban_ids.size()), ids(R),
      top_ids(size_t(R) * max_top), ranks(R);
  Dev<float> ban_values(b.ban_values.size());
  Dev<uint32_t> allowed(std::max<size_t>(b.allowed.size(), 1));
  Dev<uint8_t> ws(cuda::sample_workspace_bytes(R, b.V));
  allowed.upload(b.allowed);
  logits.upload(b.logits);
  params.upload(b.params);
  pen_ids.upload(b.pen_ids);
  pen_counts.upload(b.pen_counts);
  ban_ids.upload(b.ban_ids);
  ban_values.upload(b.ban_values);
  for (auto* d : {&lps, &top_lps}) d->poison();
  for (auto* d : {&ids, &top_ids, &ranks}) d->poison();
  ws.poison();
  cuda::SampleArgs a;
  a.logits = logits.p;
  a.rows = R;
  a.vocab = b.V;
  a.params = params.p;
  a.pen_ids = pen_ids.p;
  a.pen_counts = pen_counts.p;
  a.ban_ids = ban_ids.p;
  a.ban_values = ban_values.p;
  a.allowed = b.allowed.empty() ? nullptr : allowed.p;
  a.max_top = max_top;
  a.out_ids = ids.p;
  a.out_logprobs = lps.p;
  a.top_ids = max_top ? top_ids.p : nullptr;
  a.top_logprobs = max_top ? top_lps.p : nullptr;
  a.out_ranks = score ? ranks.p : nullptr;
  a.workspace = ws.p;
  cudaStream_t st;
  MS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  if (graph) {
    cudaGraph_t g;
    cudaGraphExec_t exec;
    MS_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    if (score) cuda::score_forced_rows(a, st);
    cuda::sample(a, st);
    MS_CUDA_CHECK(cudaStreamEndCapture(st, &g));
    MS_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    MS_CUDA_CHECK(cudaGraphLaunch(exec, st));
    MS_CUDA_CHECK(cudaStreamSynchronize(st));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
  } else {
    if (score) cuda::score_forced_rows(a, st);
    cuda::sample(a, st);
    MS_CUDA_CHECK(cudaStreamSynchronize(st));
  }
  cudaStreamDestroy(st);
  return Result{ids.download(), lps.download(), max_top ? top_ids.download() : std::vector<int32_t>{},
                max_top ? top_lps.download() : std::vector<float>{}, ranks.download()};
}

// sample_on_cpu's modifications: repetition penalty on tokens seen, presence / frequency on generated ones, then
// logit biases, then bans, then the grammar mask.
std::vector<float> cpu_modified(const Batch& b, int r) {
  std::vector<float> lg(b.row(r), b.row(r) + b.V);
  const SampleRowParams& p = b.params[r];
  if (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    if (p.repetition_penalty != 1.0f)
      for (auto [t, n] : b.pens[r]) lg[t] = lg[t] > 0 ? lg[t] / p.repetition_penalty : lg[t] * p.repetition_penalty;
    for (auto [t, n] : b.pens[r])
      if (n > 0) lg[t] -= p.presence_penalty + p.frequency_penalty * float(n);
  }
  for (auto [t, v] : b.biases[r]) lg[t] += v;
  for (int32_t t : b.bans[r]) lg[t] = -INFINITY;
  if (!b.mask_of[r].empty())
    for (int t = 0; t < b.V; ++t)
      if (!b.mask_of[r][size_t(t)]) lg[t] = -INFINITY;
  return lg;
}

// The kept tokens of kernels::sample_token (kernels::kept_set, the set it draws from) with their renormalised
// probabilities.
std::map<int32_t, double> cpu_kept(const std::vector<float>& lg, const SampleRowParams& p) {
  kernels::SamplerParams sp;
  sp.temperature = p.temperature;
  sp.top_k = p.top_k;
  sp.top_p = p.top_p;
  sp.min_p = p.min_p;
  const kernels::KeptSet k = kernels::kept_set(lg.data(), int64_t(lg.size()), sp);
  std::map<int32_t, double> r;
  for (size_t i = 0; i < k.ids.size(); ++i) r[k.ids[i]] = k.prob[i] / k.total;
  return r;
}

std::vector<float> normal_row(int V, std::mt19937& g, float sigma) {
  std::normal_distribution<float> n(0.0f, sigma);
  std::vector<float> r(V);
  for (auto& v : r) v = n(g);
  return r;
}

// Logits as a BF16 lm_head produces them: many exact ties.
std::vector<float> bf16_row(int V, std::mt19937& g, float sigma) {
  auto r = normal_row(V, g, sigma);
  for (auto& v : r) v = bf16_to_f32(f32_to_bf16(v));
  return r;
}

// The n largest logits' ids.
std::vector<int32_t> top_ids_of(const std::vector<float>& lg, int n) {
  std::vector<int32_t> order(lg.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t a, int32_t c) { return lg[a] > lg[c]; });
  order.resize(size_t(n));
  return order;
}

SampleRowParams greedy_params(int top_logprobs = 0) {
  SampleRowParams p;
  p.temperature = 0.0f;
  p.top_logprobs = top_logprobs;
  return p;
}

SampleRowParams forced_params(int top_logprobs, int32_t token = 3) {
  SampleRowParams p = greedy_params(top_logprobs);
  p.forced = token;
  return p;
}

SampleRowParams sampling_params(float T, int k, float top_p, float min_p, uint64_t random) {
  SampleRowParams p;
  p.temperature = T;
  p.top_k = k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.random = random;
  return p;
}

// The chosen token's logprob and the top list against kernels::log_softmax / top_logprobs of the RAW row.
void expect_logprobs(const Batch& b, const Result& res, int max_top, const std::string& what) {
  for (int r = 0; r < b.rows(); ++r) {
    std::vector<float> lp(b.V);
    kernels::log_softmax(b.row(r), b.V, lp.data());
    const int tok = res.ids[r];
    ASSERT_TRUE(tok >= 0 && tok < b.V) << what << " row " << r << ": id " << tok;
    ASSERT_NEAR(res.logprobs[r], lp[tok], 1e-4) << what << " row " << r << ": logprob of token " << tok;
    const int n = std::min(b.params[r].top_logprobs, max_top);
    const auto want = kernels::top_logprobs(lp.data(), b.V, n);
    for (int i = 0; i < max_top; ++i) {
      const int32_t id = res.top_ids[size_t(r) * max_top + i];
      const float got = res.top_logprobs[size_t(r) * max_top + i];
      if (i >= int(want.size())) {
        ASSERT_TRUE(id == -1 && got == -INFINITY) << what << " row " << r << ": unused top slot " << i << " holds id "
                                                  << id << " logprob " << got << " (want -1, -inf)";
        continue;
      }
      ASSERT_TRUE(id >= 0 && id < b.V) << what << " row " << r << " top " << i << ": id " << id;
      // Ids must agree exactly unless the CPU's own logprobs tie within float noise there.
      ASSERT_TRUE(id == want[i].id || std::fabs(lp[id] - want[i].logprob) <= 1e-6f)
          << what << " row " << r << " top " << i << ": id " << id << " (logprob " << lp[id] << "), CPU id "
          << want[i].id << " (logprob " << want[i].logprob << ")";
      ASSERT_NEAR(got, want[i].logprob, 1e-4) << what << " row " << r << " top " << i << " id " << id;
    }
  }
}

}  // namespace

TEST(CudaSampling, GreedyIdsAndLogprobsMatchCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 g(1);
  for (int V : {1, 7, 1000, 50257, 151936}) {
    Batch b(V);
    b.add(normal_row(V, g, 4.0f), greedy_params(5));
    b.add(bf16_row(V, g, 3.0f), greedy_params(20));  // ties everywhere, also inside the top list
    auto tied = normal_row(V, g, 2.0f);
    const float top = *std::max_element(tied.begin(), tied.end()) + 1.0f;
    for (int i = 0; i < 4; ++i) tied[g() % V] = top;  // several maxima: the lowest id wins
    b.add(tied, greedy_params(3));
    b.add(std::vector<float>(V, 0.5f), greedy_params(20));  // all equal
    if (V > 1) {  // -inf logits (a single -inf has no finite log-softmax)
      auto lowest = normal_row(V, g, 1.0f);
      for (int i = 0; i < V; i += 3) lowest[i] = -INFINITY;
      lowest[V - 1] = 7.0f;
      b.add(lowest, greedy_params(0));
    }
    SampleRowParams k1 = sampling_params(1.0f, 1, 1.0f, 0.0f, 0x9e3779b97f4a7c15ull);  // top_k = 1 is greedy
    k1.top_logprobs = 1;
    b.add(normal_row(V, g, 4.0f), k1);
    const int max_top = 20;
    const Result res = run_gpu(b, max_top);
    for (int r = 0; r < b.rows(); ++r)
      ASSERT_EQ(res.ids[r], kernels::argmax(b.row(r), V)) << "V=" << V << " row " << r;
    expect_logprobs(b, res, max_top, "V=" + std::to_string(V));
  }
}

// Forced rows (scored prompt positions) report their token, its raw logprob and the raw top list, from
// score_forced_rows; sample() leaves them alone and still samples the rows between them. Rows with ties, a flat row
// (more tied candidates than the kernel gathers: its exact fallback), -inf logits, vocabularies that are not a
// multiple of 4 (scalar loads) and smaller than a block.
TEST(CudaSampling, ForcedRowsReportTheirTokenAndTheRawTopLogprobs) {
  SKIP_WITHOUT_GPU();
  std::mt19937 g(12);
  for (int V : {1, 7, 1000, 4099, 151936}) {
    Batch b(V);
    std::vector<int32_t> forced;
    auto add = [&](const std::vector<float>& row, int top, int32_t tok) {
      SampleRowParams p = greedy_params(top);
      p.forced = tok;
      b.add(row, p);
      forced.push_back(tok);
    };
    add(normal_row(V, g, 4.0f), 5, int32_t(g() % V));
    add(bf16_row(V, g, 3.0f), 20, int32_t(g() % V));  // ties everywhere, also inside the top list
    b.add(normal_row(V, g, 4.0f), greedy_params(3)), forced.push_back(-1);  // an ordinary row between them
    auto tied = normal_row(V, g, 2.0f);
    const float top = *std::max_element(tied.begin(), tied.end()) + 1.0f;
    for (int i = 0; i < 4; ++i) tied[g() % V] = top;
    add(tied, 3, int32_t(g() % V));
    add(std::vector<float>(V, 0.5f), 20, int32_t(V - 1));  // flat: every token a candidate
    auto lowest = normal_row(V, g, 1.0f);
    for (int i = 0; i + 1 < V; i += 3) lowest[i] = -INFINITY;
    lowest[V - 1] = 7.0f;
    add(lowest, 1, int32_t(V - 1));
    add(normal_row(V, g, 4.0f), 0, 0);
    b.add(normal_row(V, g, 1.0f), sampling_params(1.0f, 2, 1.0f, 0.0f, 77)), forced.push_back(-1);
    const int max_top = 20;
    for (bool graph : {false, true}) {
      const Result res = run_gpu(b, max_top, graph, /*score=*/true);
      const std::string what = "V=" + std::to_string(V) + (graph ? " (graph)" : "");
      for (int r = 0; r < b.rows(); ++r) {
        if (forced[size_t(r)] >= 0) {
          ASSERT_EQ(res.ids[size_t(r)], forced[size_t(r)]) << what << " row " << r;
          const float x = b.row(r)[forced[size_t(r)]];
          ASSERT_EQ(res.ranks[size_t(r)], 1 + std::count_if(b.row(r), b.row(r) + V, [x](float v) { return v > x; }))
              << what << " row " << r << ": rank of token " << forced[size_t(r)];
        } else if (b.params[size_t(r)].temperature == 0.0f) {
          ASSERT_EQ(res.ids[size_t(r)], kernels::argmax(b.row(r), V)) << what << " row " << r;
        } else {  // top_k 2: one of the two largest
          const int32_t id = res.ids[size_t(r)];
          ASSERT_TRUE(id >= 0 && id < V) << what << " row " << r;
          ASSERT_LE(std::count_if(b.row(r), b.row(r) + V, [&](float x) { return x > b.row(r)[id]; }), 1)
              << what << " row " << r << ": id " << id;
        }
      }
      expect_logprobs(b, res, max_top, what);
    }
  }
}

TEST(CudaSampling, PenaltiesAndBansChangeTheArgmaxAsTheCpuDoes) {
  SKIP_WITHOUT_GPU();
  std::mt19937 g(2);
  for (int V : {1000, 151936}) {
    Batch b(V);
    int changed = 0;
    for (int r = 0; r < 24; ++r) {
      auto lg = normal_row(V, g, 2.0f);
      if (r % 4 == 3)
        for (auto& v : lg) v -= 40.0f;  // all negative: the repetition penalty multiplies
      // The five best tokens close together, so that penalties reorder them.
      std::vector<int32_t> order(V);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + 5, order.end(), [&](int a, int c) { return lg[a] > lg[c]; });
      for (int i = 1; i < 5; ++i) lg[order[i]] = lg[order[0]] - 0.1f * i;
      SampleRowParams p = greedy_params(4);
      p.repetition_penalty = r % 3 == 0 ? 1.0f : (r % 3 == 1 ? 1.3f : 0.8f);
      p.presence_penalty = r % 2 ? 0.25f : 0.0f;
      p.frequency_penalty = r % 5 == 0 ? 0.0f : 0.125f;
      std::vector<std::pair<int32_t, int32_t>> pen;
      std::set<int32_t> seen;
      for (int i = 0; i < 3; ++i) seen.insert(order[i]);
      for (int i = 0; i < 200 && int(seen.size()) < V; ++i) seen.insert(int32_t(g() % V));
      for (int32_t t : seen) pen.push_back({t, int32_t(g() % 4)});  // count 0: prompt only
      std::vector<int32_t> ban;
      if (r % 6 == 5) ban = {order[1], order[2], order[1]};  // duplicates are harmless
      b.add(lg, p, pen, ban);
    }
    const Result res = run_gpu(b, 4);
    for (int r = 0; r < b.rows(); ++r) {
      const auto mod = cpu_modified(b, r);
      const int want = kernels::argmax(mod.data(), V);
      changed += want != kernels::argmax(b.row(r), V);
      ASSERT_EQ(res.ids[r], want) << "V=" << V << " row " << r << ": GPU chose " << res.ids[r] << " (modified logit "
                                  << mod[res.ids[r]] << "), CPU " << want << " (" << mod[want] << ")";
    }
    EXPECT_GT(changed, 6) << "the rows should exercise penalties that move the argmax";
    expect_logprobs(b, res, 4, "penalised V=" + std::to_string(V));  // still the raw logits' logprobs
  }
}

struct FilterCase {
  const char* name;
  float T;
  int k;
  float top_p, min_p;
  bool ties;  // logits on a coarse grid: ties at the top-k / top-p boundaries
};

// Many draws of one row: every token in the CPU's kept set, frequencies close to its probabilities.
TEST(CudaSampling, FiltersKeepTheCpuSetAndDrawItsDistribution) {
  SKIP_WITHOUT_GPU();
  const FilterCase cases[] = {
      {"plain", 1.0f, -1, 1.0f, 0.0f, false},          {"top_k", 0.7f, 10, 1.0f, 0.0f, false},
      {"top_p", 1.0f, -1, 0.8f, 0.0f, false},          {"min_p", 1.5f, -1, 1.0f, 0.1f, false},
      {"all", 0.9f, 20, 0.9f, 0.02f, false},           {"top_k ties", 1.0f, 7, 1.0f, 0.0f, true},
      {"top_p ties", 1.0f, -1, 0.5f, 0.0f, true},      {"top_k+p ties", 2.0f, 9, 0.6f, 0.0f, true},
      {"top_p tiny", 1.0f, -1, 0.0f, 0.0f, false},     {"min_p > 1", 1.0f, -1, 1.0f, 1.5f, false},
  };
  const int V = 64, draws = 20000;
  std::mt19937 g(3);
  std::mt19937_64 bits(4);
  for (const FilterCase& c : cases) {
    std::vector<float> lg = normal_row(V, g, 1.5f);
    if (c.ties)
      for (auto& v : lg) v = std::round(v * 2.0f) / 2.0f;
    Batch b(V);
    for (int i = 0; i < draws; ++i) b.add(lg, sampling_params(c.T, c.k, c.top_p, c.min_p, bits()));
    const auto kept = cpu_kept(lg, b.params[0]);
    const Result res = run_gpu(b, 0);
    std::map<int32_t, int> count;
    for (int i = 0; i < draws; ++i) {
      ASSERT_TRUE(kept.count(res.ids[i])) << c.name << ": draw " << i << " chose token " << res.ids[i]
                                          << " (logit " << (res.ids[i] >= 0 && res.ids[i] < V ? lg[res.ids[i]] : NAN)
                                          << ") outside the CPU's kept set of " << kept.size() << " tokens";
      ++count[res.ids[i]];
    }
    for (auto [id, prob] : kept)
      EXPECT_NEAR(double(count[id]) / draws, prob, 0.02)
          << c.name << ": token " << id << " (logit " << lg[id] << ") drawn " << count[id] << " of " << draws;
  }
}

// The draw walks the kept tokens in vocabulary order: u = 0 takes the lowest kept id, u -> 1 the highest.
TEST(CudaSampling, ExtremeRandomValuesPickTheEndsOfTheKeptSet) {
  SKIP_WITHOUT_GPU();
  std::mt19937 g(5);
  for (int V : {1000, 50257, 151936}) {
    Batch b(V);
    const auto lg = normal_row(V, g, 3.0f);
    const SampleRowParams cfgs[] = {sampling_params(0.8f, 40, 1.0f, 0.0f, 0), sampling_params(1.0f, -1, 0.7f, 0.0f, 0),
                                    sampling_params(1.2f, 100, 0.9f, 0.05f, 0)};
    for (SampleRowParams p : cfgs)
      for (uint64_t r : {uint64_t(0), ~uint64_t(0)}) {
        p.random = r;
        b.add(lg, p);
      }
    const Result res = run_gpu(b, 0);
    for (int r = 0; r < b.rows(); ++r) {
      const auto kept = cpu_kept(lg, b.params[r]);
      const int32_t want = b.params[r].random == 0 ? kept.begin()->first : kept.rbegin()->first;
      EXPECT_EQ(res.ids[r], want) << "V=" << V << " row " << r << " (kept " << kept.size() << " tokens)";
    }
  }
}

TEST(CudaSampling, LargeVocabularyDrawsStayInTheKeptSetAndAreDeterministic) {
  SKIP_WITHOUT_GPU();
  const int V = 151936;
  std::mt19937 g(6);
  std::mt19937_64 bits(7);
  Batch b(V);
  const auto lg = bf16_row(V, g, 3.0f);
  const SampleRowParams cfgs[] = {sampling_params(0.8f, 50, 0.9f, 0.0f, 0), sampling_params(1.0f, -1, 0.95f, 0.0f, 0),
                                  sampling_params(1.0f, 1000, 1.0f, 0.01f, 0), sampling_params(0.6f, -1, 1.0f, 0.0f, 0)};
  const int per_cfg = 48;
  for (SampleRowParams p : cfgs)
    for (int i = 0; i < per_cfg; ++i) {
      p.random = bits();
      p.top_logprobs = i % 3 ? 0 : 5;
      b.add(lg, p);
    }
  const Result res = run_gpu(b, 5), again = run_gpu(b, 5), replay = run_gpu(b, 5, /*graph=*/true);
  std::vector<std::map<int32_t, double>> kept_of;
  for (const SampleRowParams& p : cfgs) kept_of.push_back(cpu_kept(lg, p));
  for (int r = 0; r < b.rows(); ++r) {
    const auto& kept = kept_of[r / per_cfg];
    ASSERT_TRUE(kept.count(res.ids[r])) << "row " << r << " (config " << r / per_cfg << "): token " << res.ids[r]
                                        << " outside the CPU's kept set of " << kept.size();
    ASSERT_EQ(res.ids[r], again.ids[r]) << "row " << r << ": same inputs, another token";
    ASSERT_EQ(res.ids[r], replay.ids[r]) << "row " << r << ": CUDA graph replay chose another token";
  }
  expect_logprobs(b, res, 5, "large vocabulary sampling");
}

TEST(CudaSampling, BannedTokensAreNeverDrawnAndPenaltiesApplyBeforeSampling) {
  SKIP_WITHOUT_GPU();
  const int V = 256, draws = 8000;
  std::mt19937 g(8);
  std::mt19937_64 bits(9);
  auto lg = normal_row(V, g, 2.0f);
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int c) { return lg[a] > lg[c]; });
  const std::vector<int32_t> ban = {order[0], order[2], order[5]};
  const std::vector<std::pair<int32_t, int32_t>> pen = {{order[1], 2}, {order[3], 0}, {order[4], 1}};
  Batch b(V);
  for (int i = 0; i < draws; ++i) {
    SampleRowParams p = sampling_params(1.0f, 12, 0.95f, 0.0f, bits());
    p.repetition_penalty = 1.2f;
    p.frequency_penalty = 0.3f;
    p.presence_penalty = 0.1f;
    b.add(lg, p, pen, ban);
  }
  const auto kept = cpu_kept(cpu_modified(b, 0), b.params[0]);
  const Result res = run_gpu(b, 0);
  std::map<int32_t, int> count;
  for (int i = 0; i < draws; ++i) {
    for (int32_t t : ban) ASSERT_NE(res.ids[i], t) << "draw " << i << " chose banned token " << t;
    ASSERT_TRUE(kept.count(res.ids[i])) << "draw " << i << ": token " << res.ids[i] << " outside the kept set";
    ++count[res.ids[i]];
  }
  for (auto [id, prob] : kept)
    EXPECT_NEAR(double(count[id]) / draws, prob, 0.03) << "token " << id << " drawn " << count[id] << " of " << draws;
}

TEST(CudaSampling, EmptyBatchAndWorkspaceSize) {
  SKIP_WITHOUT_GPU();
  EXPECT_GE(cuda::sample_workspace_bytes(3, 151936), size_t(3) * 151936 * 4);
  cuda::SampleArgs a;  // rows = 0: nothing to launch, nothing dereferenced
  cuda::sample(a, nullptr);
  MS_CUDA_CHECK(cudaDeviceSynchronize());
}

// Kept sets too large for the candidate path (a wide nucleus, top-k in the thousands, a tiny min-p, no
// filter) and ties spanning the cut (all-equal and coarse-grid rows): the kernel's histogram selection, its
// refinement to a single key and the vocabulary-order passes. u = 0 must take the lowest kept id and u -> 1
// the highest where the kept set does not depend on float rounding (ties, top-k); other draws stay inside.
TEST(CudaSampling, LargeKeptSetsAndWideTiesKeepTheCpuSet) {
  SKIP_WITHOUT_GPU();
  const int V = 151936;
  std::mt19937 g(11);
  std::mt19937_64 bits(12);
  struct Row {
    std::vector<float> lg;
    SampleRowParams p;
    bool exact_ends;
  };
  std::vector<Row> cfgs;
  auto grid = normal_row(V, g, 3.0f);
  for (auto& v : grid) v = std::round(v * 2.0f) / 2.0f;
  cfgs.push_back({normal_row(V, g, 2.0f), sampling_params(1.0f, -1, 0.95f, 0.0f, 0), false});    // ~50k kept
  cfgs.push_back({std::vector<float>(V, 0.25f), sampling_params(1.0f, 5000, 1.0f, 0.0f, 0), true});  // one key
  cfgs.push_back({std::vector<float>(V, 0.25f), sampling_params(1.0f, 9, 0.5f, 0.0f, 0), true});
  cfgs.push_back({bf16_row(V, g, 3.0f), sampling_params(1.0f, 3000, 1.0f, 0.0f, 0), true});
  cfgs.push_back({grid, sampling_params(1.0f, 2500, 1.0f, 0.0f, 0), true});  // the cut inside a tie group
  cfgs.push_back({grid, sampling_params(0.7f, -1, 0.5f, 0.0f, 0), false});
  cfgs.push_back({normal_row(V, g, 3.0f), sampling_params(1.0f, -1, 1.0f, 1e-6f, 0), false});  // tiny min-p
  cfgs.push_back({bf16_row(V, g, 3.0f), sampling_params(1.3f, -1, 1.0f, 0.0f, 0), false});     // no filter
  Batch b(V);
  for (const Row& r : cfgs)
    for (int i = 0; i < 6; ++i) {
      SampleRowParams p = r.p;
      p.random = i == 0 ? 0 : i == 1 ? ~uint64_t(0) : bits();
      p.top_logprobs = i == 2 ? 20 : 0;
      b.add(r.lg, p);
    }
  const Result res = run_gpu(b, 20), replay = run_gpu(b, 20, /*graph=*/true);
  for (int r = 0; r < b.rows(); ++r) {
    const Row& cfg = cfgs[size_t(r / 6)];
    const auto kept = cpu_kept(cfg.lg, b.params[r]);
    const int32_t id = res.ids[r];
    ASSERT_TRUE(kept.count(id)) << "row " << r << " (config " << r / 6 << "): token " << id << " outside the CPU's kept set of "
                                << kept.size();
    if (cfg.exact_ends && r % 6 < 2) {
      EXPECT_EQ(id, r % 6 == 0 ? kept.begin()->first : kept.rbegin()->first) << "row " << r << " (config " << r / 6 << ")";
    }
    ASSERT_EQ(id, replay.ids[r]) << "row " << r << ": CUDA graph replay chose another token";
  }
  expect_logprobs(b, res, 20, "large kept sets");
}

// One launch mixing greedy rows, sampled rows of every filter, penalised and banned rows, rows with and
// without top logprobs and vocabulary sizes that are not a multiple of four: each row as the CPU does it.
TEST(CudaSampling, MixedRowsInOneCallMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 g(13);
  std::mt19937_64 bits(14);
  for (int V : {50257, 151936}) {
    Batch b(V);
    for (int r = 0; r < 40; ++r) {
      auto lg = r % 3 == 0 ? bf16_row(V, g, 3.0f) : normal_row(V, g, 2.5f);
      SampleRowParams p;
      switch (r % 8) {
        case 0: p = greedy_params(r % 16 == 0 ? 20 : 0); break;
        case 1: p = sampling_params(0.8f, 40, 0.9f, 0.0f, bits()); break;
        case 2: p = sampling_params(1.0f, -1, 0.9f, 0.0f, bits()); break;
        case 3: p = sampling_params(1.0f, -1, 1.0f, 0.05f, bits()); break;
        case 4: p = sampling_params(1.0f, -1, 1.0f, 0.0f, bits()); break;
        case 5: p = sampling_params(0.6f, 500, 0.95f, 0.02f, bits()); break;
        case 6: p = sampling_params(1.2f, 7, 1.0f, 0.0f, bits()); break;
        default: p = greedy_params(5); break;
      }
      p.top_logprobs = r % 5 == 0 ? 20 : r % 5 == 1 ? 3 : p.top_logprobs;
      std::vector<std::pair<int32_t, int32_t>> pen;
      std::vector<int32_t> ban;
      if (r % 4 == 1 || r % 8 == 7) {
        p.repetition_penalty = 1.2f;
        p.frequency_penalty = 0.25f;
        p.presence_penalty = 0.5f;
        std::set<int32_t> seen;
        for (int i = 0; i < 300; ++i) seen.insert(int32_t(g() % V));
        seen.insert(int32_t(std::max_element(lg.begin(), lg.end()) - lg.begin()));  // the argmax moves
        for (int32_t t : seen) pen.push_back({t, int32_t(g() % 3)});
        ban = {int32_t(g() % V), int32_t(g() % V)};
      }
      // Logit biases on a third of the rows (some penalised too): a large one on a random token (the argmax moves
      // to it when greedy), small ones on others, a negative one on the argmax; none on a banned token.
      std::vector<std::pair<int32_t, float>> bias;
      if (r % 3 == 2) {
        std::set<int32_t> taken(ban.begin(), ban.end());
        auto fresh = [&](int32_t t) { return taken.insert(t).second; };
        const int32_t top = int32_t(std::max_element(lg.begin(), lg.end()) - lg.begin());
        if (fresh(top)) bias.push_back({top, -7.5f});
        for (int i = 0; i < 40; ++i)
          if (int32_t t = int32_t(g() % V); fresh(t)) bias.push_back({t, i == 0 ? 30.0f : float(int(g() % 13) - 6) * 0.25f});
      }
      b.add(lg, p, pen, ban, bias);
    }
    const Result res = run_gpu(b, 20), replay = run_gpu(b, 20, /*graph=*/true);
    for (int r = 0; r < b.rows(); ++r) {
      const auto mod = cpu_modified(b, r);
      const SampleRowParams& p = b.params[r];
      if (p.temperature <= 0.0f) {
        ASSERT_EQ(res.ids[r], kernels::argmax(mod.data(), V)) << "V=" << V << " greedy row " << r;
      } else {
        const auto kept = cpu_kept(mod, p);
        ASSERT_TRUE(kept.count(res.ids[r])) << "V=" << V << " row " << r << ": token " << res.ids[r]
                                            << " outside the CPU's kept set of " << kept.size();
      }
      for (int32_t t : b.bans[r]) ASSERT_NE(res.ids[r], t) << "V=" << V << " row " << r << " chose a banned token";
      ASSERT_EQ(res.ids[r], replay.ids[r]) << "V=" << V << " row " << r << ": graph replay differs";
    }
    expect_logprobs(b, res, 20, "mixed V=" + std::to_string(V));
  }
}

// Grammar masks (SampleArgs::allowed) beside unmasked rows, penalties, bans and biases: each row's token is the CPU's
// choice over the masked logits (greedy) or inside its kept set (sampled), never a token the mask leaves out, the same
// in a graph replay; the logprobs stay the raw logits'. Vocabulary sizes whose slices start off a 32-token boundary
// (50257, 1000) make the kernel join two mask words a bitmap word.
TEST(CudaSampling, GrammarMasksLimitTheChoiceAsTheCpuDoes) {
  SKIP_WITHOUT_GPU();
  std::mt19937 g(21);
  std::mt19937_64 bits(22);
  for (int V : {1000, 50257, 151936}) {
    Batch b(V);
    int moved = 0;
    for (int r = 0; r < 36; ++r) {
      auto lg = r % 2 ? bf16_row(V, g, 3.0f) : normal_row(V, g, 2.5f);
      const int32_t top = int32_t(std::max_element(lg.begin(), lg.end()) - lg.begin());
      SampleRowParams p = r % 3 == 0   ? greedy_params(r % 9 == 0 ? 5 : 0)
                          : r % 3 == 1 ? sampling_params(0.8f, 40, 0.95f, 0.0f, bits())
                                       : sampling_params(1.0f, -1, 1.0f, 0.0f, bits());
      std::vector<std::pair<int32_t, int32_t>> pen;
      std::vector<int32_t> ban;
      std::vector<std::pair<int32_t, float>> bias;
      if (r % 5 == 4) {
        p.repetition_penalty = 1.3f;
        for (int i = 0; i < 50; ++i) pen.push_back({int32_t((i * 7919 + r) % V), i % 2});
        ban = {int32_t(g() % V)};
        bias = {{int32_t((r * 31 + 5) % V), 4.0f}};
        if (bias[0].first == ban[0]) bias.clear();
      }
      b.add(lg, p, pen, ban, bias);
      if (r % 6 == 5) continue;  // unmasked rows in between
      std::vector<uint8_t> ok(size_t(V), 0);
      switch (r % 6) {
        case 0:  // a few tokens, the argmax not among them
          for (int i = 0; i < 3; ++i) ok[g() % V] = 1;
          ok[size_t(top)] = 0;
          ok[size_t((top + 1) % V)] = 1;
          break;
        case 1:  // everything but the best tokens
          ok.assign(size_t(V), 1);
          for (int32_t t : top_ids_of(lg, 10)) ok[size_t(t)] = 0;
          break;
        case 2:  // a random half
          for (auto& o : ok) o = uint8_t(g() & 1);
          break;
        case 3:  // tokens on either side of each block's slice boundary
          for (int k = 1; k < 8; ++k)
            for (int d = -40; d < 40; d += 3) {
              const int t = k * ((V + 7) / 8) + d;
              if (t >= 0 && t < V) ok[size_t(t)] = 1;
            }
          break;
        default:  // one token: every sampler mode must pick it
          ok[size_t((top + V / 2) % V)] = 1;
          break;
      }
      if (!std::count(ok.begin(), ok.end(), uint8_t(1))) ok[0] = 1;
      b.mask_last(ok);
    }
    const Result res = run_gpu(b, 5), replay = run_gpu(b, 5, /*graph=*/true);
    for (int r = 0; r < b.rows(); ++r) {
      const auto mod = cpu_modified(b, r);
      const SampleRowParams& p = b.params[r];
      const int32_t id = res.ids[size_t(r)];
      ASSERT_TRUE(id >= 0 && id < V) << "V=" << V << " row " << r;
      if (!b.mask_of[r].empty()) {
        ASSERT_TRUE(b.mask_of[r][size_t(id)]) << "V=" << V << " row " << r << " chose " << id << ", left out by its mask";
        moved += id != kernels::argmax(b.row(r), V);
      }
      if (p.temperature <= 0.0f) {
        ASSERT_EQ(id, kernels::argmax(mod.data(), V)) << "V=" << V << " greedy row " << r;
      } else {
        const auto kept = cpu_kept(mod, p);
        ASSERT_TRUE(kept.count(id)) << "V=" << V << " row " << r << ": token " << id << " outside the CPU's kept set of "
                                    << kept.size();
      }
      ASSERT_EQ(id, replay.ids[size_t(r)]) << "V=" << V << " row " << r << ": graph replay differs";
    }
    EXPECT_GT(moved, 15) << "V=" << V << ": the masks should move most masked rows off their argmax";
    expect_logprobs(b, res, 5, "masked V=" + std::to_string(V));
  }
}

// Microseconds per launch for a 151936-token vocabulary, by batch size and filter; prints a table.
TEST(CudaSamplingBench, DISABLED_Timing) {
  SKIP_WITHOUT_GPU();
  const int V = 151936;
  struct Cfg {
    const char* name;
    SampleRowParams p;
  };
  SampleRowParams lp20 = greedy_params(20), pen = sampling_params(0.7f, 20, 0.8f, 0.0f, 1);
  pen.repetition_penalty = 1.1f;
  const Cfg cfgs[] = {{"greedy", greedy_params()},
                      {"greedy + 20 top logprobs", lp20},
                      {"T=1 (no filter)", sampling_params(1.0f, -1, 1.0f, 0.0f, 1)},
                      {"top_p 0.9", sampling_params(1.0f, -1, 0.9f, 0.0f, 1)},
                      {"top_k 50 + top_p 0.95", sampling_params(0.8f, 50, 0.95f, 0.0f, 1)},
                      {"top_k 20 + top_p 0.8 + penalties", pen},
                      {"min_p 0.05", sampling_params(1.0f, -1, 1.0f, 0.05f, 1)},
                      {"scoring: greedy, 1 bias, 1 top logprob", greedy_params(1)},
                      {"forced: score_forced_rows, 1 top logprob", forced_params(1)},
                      {"forced: score_forced_rows, 5 top logprobs", forced_params(5)}};
  std::mt19937 g(10);
  const auto lg = bf16_row(V, g, 3.0f);
  std::printf("%-40s %10s %10s %10s %10s %10s\n", "config", "rows=1", "rows=32", "rows=128", "rows=160", "rows=512");
  for (const Cfg& c : cfgs) {
    std::printf("%-40s", c.name);
    const bool scoring = std::string(c.name).rfind("scoring", 0) == 0;  // a prompt position's forced token
    for (int rows : {1, 32, 128, 160, 512}) {
      std::vector<std::pair<int32_t, int32_t>> pens;
      for (int i = 0; i < 300; ++i) pens.push_back({int32_t(i * 97 % V), i % 3});
      Batch b(V);
      for (int r = 0; r < rows; ++r)
        b.add(lg, c.p, c.p.repetition_penalty != 1.0f ? pens : decltype(pens){}, {},
              scoring ? std::vector<std::pair<int32_t, float>>{{int32_t(r * 7919 % V), 1e9f}}
                      : std::vector<std::pair<int32_t, float>>{});
      Dev<float> logits(b.logits.size()), lps(rows), top_lps(size_t(rows) * 20);
      Dev<SampleRowParams> params(rows);
      Dev<int32_t> pen_ids(b.pen_ids.size()), pen_counts(b.pen_counts.size()), ids(rows), top_ids(size_t(rows) * 20);
      Dev<int32_t> ban_ids(b.ban_ids.size());
      Dev<float> ban_values(b.ban_values.size());
      ban_ids.upload(b.ban_ids);
      ban_values.upload(b.ban_values);
      Dev<uint8_t> ws(cuda::sample_workspace_bytes(rows, V));
      logits.upload(b.logits);
      params.upload(b.params);
      pen_ids.upload(b.pen_ids);
      pen_counts.upload(b.pen_counts);
      cuda::SampleArgs a;
      a.logits = logits.p;
      a.rows = rows;
      a.vocab = V;
      a.params = params.p;
      a.pen_ids = pen_ids.p;
      a.pen_counts = pen_counts.p;
      a.ban_ids = b.ban_ids.empty() ? nullptr : ban_ids.p;
      a.ban_values = b.ban_values.empty() ? nullptr : ban_values.p;
      a.max_top = 20;
      a.out_ids = ids.p;
      a.out_logprobs = lps.p;
      a.top_ids = top_ids.p;
      a.top_logprobs = top_lps.p;
      a.workspace = ws.p;
      cudaEvent_t t0, t1;
      MS_CUDA_CHECK(cudaEventCreate(&t0));
      MS_CUDA_CHECK(cudaEventCreate(&t1));
      const bool forced = c.p.forced >= 0;  // every row forced: only score_forced_rows, as the executor runs it
      auto run = [&] { forced ? cuda::score_forced_rows(a, nullptr) : cuda::sample(a, nullptr); };
      for (int i = 0; i < 3; ++i) run();
      const int reps = 20;
      MS_CUDA_CHECK(cudaEventRecord(t0));
      for (int i = 0; i < reps; ++i) run();
      MS_CUDA_CHECK(cudaEventRecord(t1));
      MS_CUDA_CHECK(cudaEventSynchronize(t1));
      float ms = 0;
      MS_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
      std::printf(" %10.1f", 1e3 * ms / reps);
      cudaEventDestroy(t0);
      cudaEventDestroy(t1);
    }
    std::printf("\n");
  }
}

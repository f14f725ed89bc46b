// The lm_head screen (cuda/sampling/lmhead_screen.h): its bound on the CPU (no GPU needed: the candidate set of a
// host emulation always holds the double-precision argmax, and stays small on q30b8l-like rows), then the kernels
// against the CPU's double argmax, against gemv_stream + the greedy sampler on the full q30b8l vocabulary, on
// near-ties and non-finite inputs, and inside a CUDA graph, in both forms (1-8 rows on mma.sync, 9-64 on wgmma);
// DISABLED_Timing reports the screen against the served path at 1-64 rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda/gemm/backends.h"
#include "cuda/gemm/gemm.h"
#include "cuda/sampling/greedy.h"
#include "cuda/sampling/lmhead_argmax.h"
#include "cuda/sampling/lmhead_screen.h"
#include "cuda/sampling/lmhead_screen_math.h"
#include "cuda/sampling/sampling.h"
#include "cuda_test_util.h"

using namespace moeserve;
using cuda_test::Dev;
namespace screen = moeserve::cuda::screen;

namespace {

// gen-model's weights: 256 uniform levels in [-hw, hw] (bf16), hw = gain sqrt(3 / K).
std::vector<uint16_t> level_rows(size_t n, float hw, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> lev(0, 255);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = f32_to_bf16(hw * ((2.0f * float(lev(g)) + 1.0f) / 256.0f - 1.0f));
  return v;
}
// A final norm's rows: Gaussian times gains around 1.
std::vector<uint16_t> token_rows(int M, int K, uint32_t seed, float sd = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::uniform_real_distribution<float> gain(0.9f, 1.1f);
  std::vector<uint16_t> v(size_t(M) * K);
  for (auto& e : v) e = f32_to_bf16(nd(g) * gain(g));
  return v;
}

float bf(uint16_t b) { return bf16_to_f32(b); }

// The screen emulated on the host with the kernels' formulas (lmhead_screen_math.h): per token, the candidate rows
// and the double-precision argmax.
struct HostScreen {
  std::vector<int> candidates;
  int argmax = -1;
  double top = 0, second = 0;
  std::vector<float> lo, hi;   // every row's a - B and a + B
  std::vector<double> exact;   // every row's double logit
};
HostScreen host_screen(const std::vector<uint16_t>& x, int K, const std::vector<uint16_t>& w, int V) {
  std::vector<screen::RowMeta> meta(static_cast<size_t>(V));
  std::vector<int8_t> q(size_t(V) * K);
  float amax_all = 0;
  for (int r = 0; r < V; ++r) {
    float amax = 0;
    for (int k = 0; k < K; ++k) amax = std::max(amax, std::fabs(bf(w[size_t(r) * K + k])));
    const float s = screen::row_scale(amax);
    float e = 0;
    for (int k = 0; k < K; ++k) {
      const float v = bf(w[size_t(r) * K + k]);
      const int qi = screen::quantize(v, s);
      q[size_t(r) * K + k] = int8_t(qi);
      e = std::max(e, screen::quant_error(v, s, qi, amax));
    }
    meta[size_t(r)] = {s, screen::row_coefficient(e, amax, K)};
    amax_all = std::max(amax_all, amax);
  }
  float x1 = 0;
  for (int k = 0; k < K; ++k) x1 += std::fabs(bf(x[size_t(k)]));
  x1 = screen::round_up_l1(x1, K);
  const float exk = screen::ex_term(0.0f, K, amax_all);  // bf16 -> fp16 is exact for these rows
  std::vector<float> lo(static_cast<size_t>(V)), hi(static_cast<size_t>(V));
  HostScreen h;
  h.exact.resize(static_cast<size_t>(V));
  h.top = -INFINITY, h.second = -INFINITY;
  float L = -INFINITY;
  for (int r = 0; r < V; ++r) {
    float acc = 0;
    double exact = 0;
    for (int k = 0; k < K; ++k) {
      acc += bf(x[size_t(k)]) * float(q[size_t(r) * K + k]);
      exact += double(bf(x[size_t(k)])) * double(bf(w[size_t(r) * K + k]));
    }
    const float a = meta[size_t(r)].scale * acc, b = screen::bound(a, meta[size_t(r)].c, x1, exk);
    lo[size_t(r)] = a - b, hi[size_t(r)] = a + b;
    h.exact[size_t(r)] = exact;
    L = std::max(L, a - b);
    if (exact > h.top) h.second = h.top, h.top = exact, h.argmax = r;
    else if (exact > h.second) h.second = exact;
  }
  for (int r = 0; r < V; ++r)
    if (hi[size_t(r)] >= L) h.candidates.push_back(r);
  h.lo = std::move(lo);
  h.hi = std::move(hi);
  return h;
}

bool gpu_usable(int rows, int K, int V) {
  return !cuda::list_devices().empty() && cuda::lmhead_screen_supported(rows, K, V);
}

struct Screen {
  int V, K;
  Dev<char> q;
  float amax = 0;
  Screen(const Dev<uint16_t>& w, int V_, int K_) : V(V_), K(K_), q(cuda::lmhead_screen_weight_bytes(V_, K_)) {
    q.poison();
    cuda::lmhead_screen_quantize(reinterpret_cast<const cuda::bf16*>(w.p), V, K, q.p, nullptr);
    amax = cuda::lmhead_screen_amax(q.p, V, K, nullptr);
  }
};

std::vector<int32_t> run_screen(const Dev<uint16_t>& x, int M, const Dev<uint16_t>& w, const Screen& s,
                                cudaStream_t stream = nullptr, cuda::LmheadScreenLists* lists = nullptr) {
  Dev<char> ws(cuda::lmhead_screen_workspace_bytes(s.V, s.K));
  ws.poison();  // everything but the grid state, which lmhead_screen_workspace_init sets up once
  cuda::lmhead_screen_workspace_init(ws.p, s.V, s.K, nullptr);
  Dev<int32_t> ids(static_cast<size_t>(M));
  ids.poison();
  cuda::lmhead_screen(reinterpret_cast<const cuda::bf16*>(x.p), M, s.K, reinterpret_cast<const cuda::bf16*>(w.p),
                      s.q.p, s.amax, s.V, ids.p, ws.p, stream);
  MS_CUDA_CHECK(cudaDeviceSynchronize());
  if (lists != nullptr && M > 8) *lists = cuda::lmhead_screen_wide_lists(ws.p, M, s.K, s.V);
  return ids.download();
}

// Double logits of token m over every row; the argmax and whether it is clear of the runner-up by more than f32
// summation noise.
struct Exact {
  std::vector<double> lg;
  int arg = 0;
  bool clear = true;
};
Exact exact_logits(const std::vector<uint16_t>& hx, int m, int K, const std::vector<uint16_t>& hw, int V) {
  Exact e;
  e.lg.resize(static_cast<size_t>(V));
  double mx = -INFINITY, second = -INFINITY, scale = 0;
  for (int v = 0; v < V; ++v) {
    double s = 0;
    for (int k = 0; k < K; ++k) s += double(bf(hx[size_t(m) * K + k])) * double(bf(hw[size_t(v) * K + k]));
    e.lg[size_t(v)] = s;
    scale = std::max(scale, std::fabs(s));
    if (s > mx) second = mx, mx = s, e.arg = v;
    else if (s > second) second = s;
  }
  e.clear = mx - second > 1e-5 * scale + 1e-6;
  return e;
}

// Wall time of f in microseconds: the mean of 50 back-to-back calls after 3 (the timing reports' measure).
template <class F>
double time_us(F&& f) {
  for (int i = 0; i < 3; ++i) f();
  MS_CUDA_CHECK(cudaDeviceSynchronize());
  const int n = 50;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  MS_CUDA_CHECK(cudaDeviceSynchronize());
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
}

// sample() over rows x V logits with the rows' parameters, ids only.
void sample_ids(const float* logits, int rows, int V, const cuda::SampleRowParams* params, int32_t* ids, void* ws,
                cudaStream_t stream) {
  cuda::SampleArgs a;
  a.logits = logits;
  a.rows = rows;
  a.vocab = V;
  a.params = params;
  a.out_ids = ids;
  a.workspace = ws;
  cuda::sample(a, stream);
}

}  // namespace

// No GPU: the bound of lmhead_screen_math.h keeps the exact argmax among the candidates of a host emulation, on
// gen-model-like rows (q30b8l's lm_head gain) and on rows built to be near-ties, and keeps few rows.
TEST(LmheadScreenBound, KeepsTheArgmaxAndFewRows) {
  const int K = 2048, V = 6000;
  const float hw = 4.0f * std::sqrt(3.0f / float(K));
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::vector<uint16_t> w = level_rows(size_t(V) * K, hw, 100 + seed);
    const std::vector<uint16_t> x = token_rows(1, K, 200 + seed);
    const HostScreen h = host_screen(x, K, w, V);
    ASSERT_NE(std::find(h.candidates.begin(), h.candidates.end(), h.argmax), h.candidates.end()) << "seed " << seed;
    // ~0.26 standard deviations of the logits a side: a small share of 6,000 Gaussian-like logits.
    EXPECT_LT(h.candidates.size(), size_t(V / 50)) << "seed " << seed;
    EXPECT_GE(h.candidates.size(), size_t(1));
  }
  // Near-ties: the best row copied 40 times with one element moved by one bf16 step up or down.
  std::vector<uint16_t> w = level_rows(size_t(V) * K, hw, 7);
  const std::vector<uint16_t> x = token_rows(1, K, 8);
  const HostScreen first = host_screen(x, K, w, V);
  std::mt19937 g(9);
  for (int c = 0; c < 40; ++c) {
    const int r = int(g() % uint32_t(V));
    std::copy(w.begin() + size_t(first.argmax) * K, w.begin() + size_t(first.argmax + 1) * K, w.begin() + size_t(r) * K);
    uint16_t& e = w[size_t(r) * K + g() % uint32_t(K)];
    e = uint16_t(e + ((g() & 1) ? 1 : -1));
  }
  const HostScreen h = host_screen(x, K, w, V);
  ASSERT_NE(std::find(h.candidates.begin(), h.candidates.end(), h.argmax), h.candidates.end());
  EXPECT_GE(h.candidates.size(), size_t(40));  // every near-copy stays a candidate
}

// No GPU: the top-k rule of the screen for sampled steps (lmhead_screen_math.h's groups, as lmhead_screen_topk's pick
// applies it over the 1-8-row screen's blocks: 264 blocks of 16-row runs, as on a 132-SM GPU): at least k rows lie at
// or above the threshold, every row of the double top k (clear of the k-th by more than f32 noise) reaches it, and it
// keeps a small share of the rows.
TEST(LmheadScreenBound, TopKThresholdKeepsTheTopK) {
  const int K = 2048, V = 6000, S = 264, kGroups = 128;
  const float hw = 4.0f * std::sqrt(3.0f / float(K));
  for (uint32_t seed : {1u, 2u, 3u}) {
    const std::vector<uint16_t> w = level_rows(size_t(V) * K, hw, 100 + seed);
    const HostScreen h = host_screen(token_rows(1, K, 200 + seed), K, w, V);
    const int row_blocks = (V + 15) / 16;
    std::vector<float> block_lo(static_cast<size_t>(S), -INFINITY);
    for (int b = 0; b < S; ++b)
      for (int r = b * row_blocks / S * 16; r < std::min(V, (b + 1) * row_blocks / S * 16); ++r)
        block_lo[size_t(b)] = std::max(block_lo[size_t(b)], h.lo[size_t(r)]);
    std::vector<double> sorted = h.exact;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    const double tol = 1e-5 * std::max(std::fabs(sorted.front()), std::fabs(sorted.back())) + 1e-6;
    for (const int k : {1, 2, 5, 20, 64}) {
      const int G = screen::topk_group_count(k, S, kGroups);
      std::vector<float> gmax(static_cast<size_t>(G), -INFINITY);
      for (int g = 0; g < G; ++g)
        for (int b = screen::topk_group_begin(g, G, S); b < screen::topk_group_begin(g + 1, G, S); ++b)
          gmax[size_t(g)] = std::max(gmax[size_t(g)], block_lo[size_t(b)]);
      std::sort(gmax.begin(), gmax.end(), std::greater<float>());
      ASSERT_GE(G, k) << "seed " << seed << " k " << k;
      const float L = gmax[size_t(k - 1)];
      int at_or_above = 0, kept = 0;
      for (int r = 0; r < V; ++r) {
        at_or_above += h.lo[size_t(r)] >= L;
        kept += h.hi[size_t(r)] >= L;
        if (h.exact[size_t(r)] > sorted[size_t(k - 1)] + tol) {
          EXPECT_GE(h.hi[size_t(r)], L) << "seed " << seed << " k " << k << ": row " << r << " of the top k dropped";
        }
      }
      EXPECT_GE(at_or_above, k) << "seed " << seed << " k " << k;
      EXPECT_LT(kept, V / 5) << "seed " << seed << " k " << k;
      if (seed == 1) std::printf("[ info ] %d rows, top_k %d: %d groups, %d rows kept\n", V, k, G, kept);
    }
  }
}

TEST(LmheadScreen, MatchesDoubleArgmax) {
  // Vocabularies of one row, fewer rows than a row block, and several blocks' runs; K of one slice and more; 1-8
  // rows; a second pass with every logit negative (x positive, weights shifted below zero).
  // (100,000 rows, the wide form's many units and blocks, only at K = 128 and 1 / 64 rows: the CPU's double sums.)
  for (const int V : {1, 17, 5000, 100000}) {
    for (const int K : {128, 384, 2048}) {
      for (const int M : {1, 3, 8, 9, 40, 64}) {  // 9-64: the wgmma form (sm_90)
        if (V == 100000 && (K != 128 || (M != 1 && M != 64))) continue;
        for (const bool negative : {false, true}) {
          if (!gpu_usable(M, K, V)) GTEST_SKIP() << "needs a GPU with mma.sync f16 (and sm_90 for 9-64 rows)";
          const uint32_t seed = uint32_t(V * 131 + K * 7 + M + (negative ? 99 : 0));
          std::vector<uint16_t> hx = token_rows(M, K, seed), hw = level_rows(size_t(V) * K, 0.1f, seed + 1);
          if (negative) {
            for (auto& e : hx) e = f32_to_bf16(std::fabs(bf(e)) + 0.5f);
            for (auto& e : hw) e = f32_to_bf16(bf(e) - 0.2f);
          }
          Dev<uint16_t> x(hx), w(hw);
          const Screen s(w, V, K);
          const std::vector<int32_t> ids = run_screen(x, M, w, s);
          const std::string where = "V " + std::to_string(V) + " K " + std::to_string(K) + " M " + std::to_string(M) +
                                    (negative ? " negative" : "");
          for (int m = 0; m < M; ++m) {
            const Exact e = exact_logits(hx, m, K, hw, V);
            ASSERT_GE(ids[size_t(m)], 0) << where << " row " << m;
            ASSERT_LT(ids[size_t(m)], V) << where << " row " << m;
            if (e.clear) {
              ASSERT_EQ(ids[size_t(m)], e.arg) << where << " row " << m;
            } else {
              EXPECT_NEAR(e.lg[size_t(ids[size_t(m)])], e.lg[size_t(e.arg)], 1e-4 * std::fabs(e.lg[size_t(e.arg)]));
            }
          }
        }
      }
    }
  }
}

// Greedy rows under grammar masks (lmhead_screen_masked after the screen): each masked row's id is the double argmax
// over its allowed tokens - masks that allow the screen's pick (kept), random ones that leave it out, a single token,
// a mask with stray bits past the vocabulary (never read: no weight row there) - and unmasked rows and a row whose
// mask allows nothing keep the screen's pick; a second launch on the same workspace gives the same ids (it is left
// zeroed); without the screen's picks, every masked row its allowed argmax; and the masked rows' logits
// (lmhead_masked_logits) against the double sums, -inf outside the masks.
TEST(LmheadScreen, MaskedRowsTakeTheArgmaxOfTheirAllowedTokens) {
  for (const int V : {17, 5000, 40001}) {
    for (const int K : {128, 2048}) {
      for (const int M : {1, 5, 13, 64}) {
        if (!gpu_usable(M, K, V)) GTEST_SKIP() << "needs a GPU with mma.sync f16 (and sm_90 for 9-64 rows)";
        const uint32_t seed = uint32_t(V * 17 + K * 3 + M);
        std::vector<uint16_t> hx = token_rows(M, K, seed), hw = level_rows(size_t(V) * K, 0.1f, seed + 1);
        Dev<uint16_t> x(hx), w(hw);
        const Screen sc(w, V, K);
        const std::vector<int32_t> picks = run_screen(x, M, w, sc);
        const size_t words = size_t(V + 31) / 32;
        std::vector<uint32_t> masks;
        std::vector<cuda::SampleRowParams> params(static_cast<size_t>(M));
        std::vector<std::vector<uint8_t>> ok(static_cast<size_t>(M));
        std::mt19937 g(seed);
        int refused = 0;
        for (int m = 0; m < M; ++m) {
          const int kind = m % 5;
          if (kind == 0) continue;  // unmasked
          auto& a = ok[size_t(m)];
          a.assign(size_t(V), 0);
          const int pick = picks[size_t(m)];
          if (kind == 1) {  // random, the pick allowed
            for (auto& o : a) o = uint8_t(g() % 4 == 0);
            a[size_t(pick)] = 1;
          } else if (kind == 2) {  // random, the pick left out
            for (auto& o : a) o = uint8_t(g() % 3 == 0);
            a[size_t(pick)] = 0;
          } else if (kind == 3) {  // one token
            a[size_t(pick + 1 + int(g() % uint32_t(std::max(V - 1, 1)))) % size_t(V)] = uint8_t(V > 1);
          }  // kind 4: nothing allowed
          params[size_t(m)].mask_row = int32_t(masks.size() / words);
          const size_t base = masks.size();
          masks.resize(base + words, 0u);
          for (int t = 0; t < V; ++t)
            if (a[size_t(t)]) masks[base + size_t(t) / 32] |= 1u << (t % 32);
          if (kind == 2 && V % 32) masks[base + words - 1] |= ~((1u << (V % 32)) - 1u);  // stray bits past V
          refused += !a[size_t(pick)] && kind != 4;
        }
        Dev<uint32_t> dmasks(masks);
        Dev<cuda::SampleRowParams> dparams(params);
        Dev<char> ws(cuda::lmhead_screen_masked_workspace_bytes(M));
        MS_CUDA_CHECK(cudaMemset(ws.p, 0, ws.n));
        Dev<int32_t> ids(picks);
        const std::string where = "V " + std::to_string(V) + " K " + std::to_string(K) + " M " + std::to_string(M);
        std::vector<Exact> exact(static_cast<size_t>(M));  // computed once a row, when needed
        auto exact_of = [&](int m) -> const Exact& {
          if (exact[size_t(m)].lg.empty()) exact[size_t(m)] = exact_logits(hx, m, K, hw, V);
          return exact[size_t(m)];
        };
        for (int pass = 0; pass < 2; ++pass) {
          ids.upload(picks);
          cuda::lmhead_screen_masked(reinterpret_cast<const cuda::bf16*>(x.p), M, K,
                                     reinterpret_cast<const cuda::bf16*>(w.p), V, dmasks.p, dparams.p, ids.p, ws.p,
                                     nullptr);
          MS_CUDA_CHECK(cudaDeviceSynchronize());
          const std::vector<int32_t> got = ids.download();
          for (int m = 0; m < M; ++m) {
            const auto& a = ok[size_t(m)];
            const int id = got[size_t(m)];
            if (a.empty() || a[size_t(picks[size_t(m)])] || std::count(a.begin(), a.end(), 1) == 0) {
              EXPECT_EQ(id, picks[size_t(m)]) << where << " row " << m << " pass " << pass << ": kept its pick";
              continue;
            }
            ASSERT_TRUE(id >= 0 && id < V && a[size_t(id)]) << where << " row " << m << ": token " << id;
            const Exact& e = exact_of(m);
            double best = -INFINITY, scale = 0;
            for (int t = 0; t < V; ++t)
              if (a[size_t(t)]) best = std::max(best, e.lg[size_t(t)]), scale = std::max(scale, std::fabs(e.lg[size_t(t)]));
            EXPECT_GE(e.lg[size_t(id)], best - (1e-5 * scale + 1e-6)) << where << " row " << m << ": token " << id
                                                                      << " is not the best allowed one";
          }
        }
        if (M >= 5 && V > 1) {
          EXPECT_GT(refused, 0) << where;
        }
        // Without the screen's picks (picked = false): every masked row its allowed tokens' argmax (token 0 when none
        // is allowed), the unmasked rows' ids untouched.
        std::vector<int32_t> marks(static_cast<size_t>(M), -7);
        ids.upload(marks);
        cuda::lmhead_screen_masked(reinterpret_cast<const cuda::bf16*>(x.p), M, K,
                                   reinterpret_cast<const cuda::bf16*>(w.p), V, dmasks.p, dparams.p, ids.p, ws.p,
                                   nullptr, /*picked=*/false);
        MS_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<int32_t> unpicked = ids.download();
        for (int m = 0; m < M; ++m) {
          const auto& a = ok[size_t(m)];
          const int id = unpicked[size_t(m)];
          if (a.empty()) {
            EXPECT_EQ(id, -7) << where << " row " << m << ": an unmasked row written without picks";
          } else if (std::count(a.begin(), a.end(), 1) == 0) {
            EXPECT_EQ(id, 0) << where << " row " << m << ": a mask allowing nothing, without picks";
          } else {
            ASSERT_TRUE(id >= 0 && id < V && a[size_t(id)]) << where << " row " << m << ": token " << id << " (no picks)";
            const Exact& e = exact_of(m);
            double best = -INFINITY, scale = 0;
            for (int t = 0; t < V; ++t)
              if (a[size_t(t)]) best = std::max(best, e.lg[size_t(t)]), scale = std::max(scale, std::fabs(e.lg[size_t(t)]));
            EXPECT_GE(e.lg[size_t(id)], best - (1e-5 * scale + 1e-6)) << where << " row " << m << " (no picks)";
          }
        }
        // The masked rows' logits for the general sampler (lmhead_masked_logits): every allowed token's logit, -inf
        // elsewhere and on unmasked rows; each row's largest is the pick above (the same evaluation).
        Dev<float> lg(size_t(M) * size_t(V));
        lg.poison();
        cuda::lmhead_masked_logits(reinterpret_cast<const cuda::bf16*>(x.p), M, K,
                                   reinterpret_cast<const cuda::bf16*>(w.p), V, dmasks.p, dparams.p, lg.p, nullptr);
        MS_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> hl = lg.download();
        for (int m = 0; m < M; ++m) {
          const auto& a = ok[size_t(m)];
          const float* row = &hl[size_t(m) * size_t(V)];
          int arg = -1;
          for (int t = 0; t < V; ++t) {
            const bool allowed = !a.empty() && a[size_t(t)];
            if (!allowed) {
              ASSERT_TRUE(std::isinf(row[t]) && row[t] < 0) << where << " row " << m << " token " << t << ": " << row[t];
              continue;
            }
            const Exact& e = exact_of(m);
            ASSERT_NEAR(row[t], e.lg[size_t(t)], 1e-4 * (1.0 + std::fabs(e.lg[size_t(t)]))) << where << " row " << m;
            if (arg < 0 || row[t] > row[arg]) arg = t;
          }
          if (arg >= 0) {
            EXPECT_EQ(arg, unpicked[size_t(m)]) << where << " row " << m << ": the logits' argmax against the pick";
          }
        }
      }
    }
  }
}

// The full q30b8l lm_head (gen-model's level weights, gain 4) against the served path at these rows: gemv_stream's
// f32 logits and the greedy sampler. The same ids but for near-ties of the two summation orders.
TEST(LmheadScreen, MatchesGemvStreamAndGreedyOnTheFullVocabulary) {
  constexpr int V = 151936, K = 2048;
  if (!gpu_usable(1, K, V) || !cuda::gemv_stream_fits(8, K)) GTEST_SKIP() << "needs a GPU with mma.sync f16";
  const std::vector<uint16_t> hw = level_rows(size_t(V) * K, 4.0f * std::sqrt(3.0f / float(K)), 7);
  Dev<uint16_t> w(hw);
  const Screen s(w, V, K);
  for (const int M : {1, 2, 8, 16, 33, 64}) {
    if (!gpu_usable(M, K, V)) continue;
    const std::vector<uint16_t> hx = token_rows(M, K, 500 + uint32_t(M));
    Dev<uint16_t> x(hx);
    cuda::LmheadScreenLists lists;
    const std::vector<int32_t> got = run_screen(x, M, w, s, nullptr, &lists);
    if (M > 8) {
      // The wide form's per-block lists stay far below their capacity (an overflow is correct but makes the pick
      // evaluate a whole block's rows: milliseconds).
      std::printf("[ info ] %d rows: longest list of a (token, block) %d, overflowed %d\n", M, lists.longest,
                  lists.overflowed);
      EXPECT_EQ(lists.overflowed, 0) << "M " << M;
      EXPECT_LE(lists.longest, 80) << "M " << M;
    }
    Dev<float> logits(static_cast<size_t>(M) * V);
    for (int m0 = 0; m0 < M; m0 += 8)  // gemv_stream takes up to 8 rows
      cuda::gemv_stream(reinterpret_cast<const cuda::bf16*>(x.p) + size_t(m0) * K, K, std::min(8, M - m0), K,
                        reinterpret_cast<const cuda::bf16*>(w.p), V, logits.p + size_t(m0) * V, V, cuda::OutType::F32,
                        nullptr);
    Dev<int32_t> ids(static_cast<size_t>(M));
    Dev<float> lp(static_cast<size_t>(M));
    cuda::sample_greedy(logits.p, M, V, ids.p, lp.p, nullptr);
    MS_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> want = ids.download();
    const std::vector<float> hl = logits.download();
    for (int m = 0; m < M; ++m) {
      const float* row = hl.data() + size_t(m) * V;
      if (got[size_t(m)] != want[size_t(m)]) {
        EXPECT_NEAR(row[got[size_t(m)]], row[want[size_t(m)]], 1e-4f * std::fabs(row[want[size_t(m)]]) + 1e-5f)
            << "M " << M << " row " << m << ": " << got[size_t(m)] << " against " << want[size_t(m)];
      }
    }
  }
}

// The screen for sampled steps (lmhead_screen_topk): on the full q30b8l vocabulary and on a small one, rows of greedy,
// top_k 1 / 2 / 5 / 20 / 33 / 40 / 64 with temperatures, top_p and min_p, six draws each: every candidate's logit
// against the double sum, every row clearly inside a row's top k among its candidates, and each drawn token equal to
// the one sample() draws, with the same parameters and random bits, from a logit row that holds the candidates'
// values (and -inf elsewhere) - the same filters, masses and walk, which also checks that nothing outside the
// candidates could have been drawn. Eagerly and replayed in a CUDA graph.
struct TopkCase {
  float T;
  int k;
  float p, min_p;
};
constexpr TopkCase kTopkCases[] = {{0.6f, 20, 0.95f, 0.0f}, {1.0f, 64, 1.0f, 0.0f}, {0.0f, -1, 1.0f, 0.0f},
                                   {1.5f, 5, 0.8f, 0.1f},   {0.3f, 1, 1.0f, 0.0f},  {2.0f, 40, 0.5f, 0.0f},
                                   {1.0f, 2, 1.0f, 0.0f},   {0.8f, 33, 1.0f, 0.02f}};

// flat: every weight row the same (every logit of a row tied, every row a candidate: the 9-64-row pick's overflow path
// where a slice holds more rows than its list).
void check_topk(int V, int K, int M, bool graph, bool flat = false) {
  std::vector<uint16_t> hw = level_rows(size_t(flat ? 1 : V) * K, 4.0f * std::sqrt(3.0f / float(K)), 11 + uint32_t(V));
  if (flat) {
    hw.resize(size_t(V) * K);
    for (int r = 1; r < V; ++r) std::copy(hw.begin(), hw.begin() + K, hw.begin() + size_t(r) * K);
  }
  const std::vector<uint16_t> hx = token_rows(M, K, 900 + uint32_t(M) + uint32_t(V));
  Dev<uint16_t> w(hw), x(hx);
  const Screen sc(w, V, K);
  Dev<char> ws(cuda::lmhead_screen_workspace_bytes(V, K));
  ws.poison();
  cuda::lmhead_screen_workspace_init(ws.p, V, K, nullptr);
  Dev<cuda::SampleRowParams> params(static_cast<size_t>(M));
  Dev<int32_t> ids(static_cast<size_t>(M)), want(static_cast<size_t>(M));
  Dev<float> full(size_t(M) * V);
  Dev<char> sws(cuda::sample_workspace_bytes(M, V));
  cudaStream_t st = nullptr;
  MS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraphExec_t exec = nullptr;
  auto launch = [&] {
    cuda::lmhead_screen_topk(reinterpret_cast<const cuda::bf16*>(x.p), M, K, reinterpret_cast<const cuda::bf16*>(w.p),
                             sc.q.p, sc.amax, V, params.p, ids.p, ws.p, st);
  };
  if (graph) {
    cudaGraph_t g = nullptr;
    MS_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    launch();
    MS_CUDA_CHECK(cudaStreamEndCapture(st, &g));
    MS_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    cudaGraphDestroy(g);
  }
  std::vector<Exact> ex;
  for (int m = 0; m < M; ++m) ex.push_back(exact_logits(hx, m, K, hw, V));
  int drawn_not_argmax = 0;
  for (int round = 0; round < 6; ++round) {
    std::vector<cuda::SampleRowParams> hp(static_cast<size_t>(M));
    for (int m = 0; m < M; ++m) {
      const TopkCase& c = kTopkCases[(m + round) % 8];
      hp[size_t(m)].temperature = c.T;
      hp[size_t(m)].top_k = c.k;
      hp[size_t(m)].top_p = c.p;
      hp[size_t(m)].min_p = c.min_p;
      hp[size_t(m)].random = 0x9e3779b97f4a7c15ull * uint64_t(round * 16 + m + 1) ^ 0x1234567ull;
    }
    params.upload(hp);
    ids.poison();
    if (graph) MS_CUDA_CHECK(cudaGraphLaunch(exec, st));
    else launch();
    MS_CUDA_CHECK(cudaStreamSynchronize(st));
    const std::vector<int32_t> got = ids.download();
    const auto cands = cuda::lmhead_screen_topk_candidates(ws.p, M, V, K);
    std::vector<float> hfull(size_t(M) * V, -INFINITY);
    for (int m = 0; m < M; ++m) {
      const TopkCase& c = kTopkCases[(m + round) % 8];
      const bool greedy = c.T <= 0.0f || c.k == 1;
      const int k = greedy ? 1 : c.k;
      std::vector<double> sorted = ex[size_t(m)].lg;
      std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<double>());
      const double kth = sorted[size_t(k - 1)];
      double scale = 0;
      for (double v : ex[size_t(m)].lg) scale = std::max(scale, std::fabs(v));
      const double tol = 1e-5 * scale + 1e-6;
      std::vector<char> listed(static_cast<size_t>(V), 0);
      for (const auto& [id, v] : cands[size_t(m)]) {
        ASSERT_TRUE(id >= 0 && id < V) << "row " << m << " candidate " << id;
        EXPECT_FALSE(listed[size_t(id)]) << "row " << m << " lists " << id << " twice";
        listed[size_t(id)] = 1;
        EXPECT_NEAR(v, ex[size_t(m)].lg[size_t(id)], tol) << "row " << m << " candidate " << id;
        hfull[size_t(m) * V + id] = v;
      }
      EXPECT_GE(int(cands[size_t(m)].size()), std::min(k, V)) << "row " << m;
      for (int v = 0; v < V; ++v) {
        if (ex[size_t(m)].lg[size_t(v)] > kth + tol) {
          EXPECT_TRUE(listed[size_t(v)]) << "row " << m << ": row " << v << " of the top " << k << " not a candidate";
        }
      }
      if (round == 0 && V > 100000)
        std::printf("[ info ] V %d, %d rows, row %d (top_k %d): %zu candidates\n", V, M, m, c.k, cands[size_t(m)].size());
      drawn_not_argmax += got[size_t(m)] != ex[size_t(m)].arg;
    }
    full.upload(hfull);
    want.poison();
    sample_ids(full.p, M, V, params.p, want.p, sws.p, st);
    MS_CUDA_CHECK(cudaStreamSynchronize(st));
    const std::vector<int32_t> w2 = want.download();
    for (int m = 0; m < M; ++m)
      EXPECT_EQ(got[size_t(m)], w2[size_t(m)]) << "V " << V << " row " << m << " round " << round << " ("
                                               << kTopkCases[(m + round) % 8].T << ", top_k "
                                               << kTopkCases[(m + round) % 8].k << ")";
  }
  // Sampling at temperatures 0.6-2 does draw beyond the argmax (the test would not see a draw that ignores the
  // random bits otherwise).
  if (M >= 3) {
    EXPECT_GT(drawn_not_argmax, 0);
  }
  if (exec) cudaGraphExecDestroy(exec);
  MS_CUDA_CHECK(cudaStreamDestroy(st));
}

TEST(LmheadScreenTopK, DrawsWhatTheSamplerDrawsFromTheCandidates) {
  if (!gpu_usable(1, 256, 3001) || !cuda::lmhead_screen_topk_supported(1, 256, 3001))
    GTEST_SKIP() << "needs a GPU with mma.sync f16";
  for (const int M : {1, 3, 8}) check_topk(3001, 256, M, false);
  check_topk(151936, 2048, 8, false);
  check_topk(151936, 2048, 1, true);
}

// 9-64 rows (sm_90): the wide stream writing every row's a + B, a pick block a (slice, token), the same draw.
TEST(LmheadScreenTopK, WideRowsDrawWhatTheSamplerDraws) {
  if (!gpu_usable(9, 256, 3001) || !cuda::lmhead_screen_topk_supported(9, 256, 3001))
    GTEST_SKIP() << "needs an sm_90 GPU";
  for (const int M : {9, 33, 64}) check_topk(3001, 256, M, false);
  check_topk(151936, 2048, 16, false);
  check_topk(20000, 512, 24, true);
  check_topk(40000, 256, 64, false, /*flat=*/true);  // 8 slices of 5,000 rows (132 SMs), each over its list of 2,048
}

// Every row the same: the screen keeps them all and the exact pass takes the lowest id (row 0 holds a NaN, so row 1);
// rows one bf16 step apart in one element: the larger wins; and an infinite x (the bound infinite): a valid id, no
// hang.
void check_ties(int M) {
  const int V = 3000, K = 256;
  std::vector<uint16_t> row = level_rows(size_t(K), 0.1f, 3), hw(size_t(V) * K);
  for (int r = 0; r < V; ++r) std::copy(row.begin(), row.end(), hw.begin() + size_t(r) * K);
  std::vector<uint16_t> hx(size_t(M) * K, f32_to_bf16(1.0f));  // positive x: a larger weight, a larger logit
  hw[size_t(0) * K + 9] = f32_to_bf16(NAN);  // row 0 NaN: a candidate whose NaN logit never wins, so row 1 does
  {
    Dev<uint16_t> x(hx), w(hw);
    const Screen s(w, V, K);
    const std::vector<int32_t> ids = run_screen(x, M, w, s);
    for (int m = 0; m < M; ++m) EXPECT_EQ(ids[size_t(m)], 1) << "M " << M << " row " << m;
  }
  // Row 2,345 one bf16 step larger in element 17 (x there 1.0): its logit is larger by that step.
  uint16_t& e = hw[size_t(2345) * K + 17];
  e = bf(e) > 0 ? uint16_t(e + 1) : uint16_t(e - 1);
  {
    Dev<uint16_t> x(hx), w(hw);
    const Screen s(w, V, K);
    const std::vector<int32_t> ids = run_screen(x, M, w, s);
    for (int m = 0; m < M; ++m) EXPECT_EQ(ids[size_t(m)], 2345) << "M " << M << " row " << m;
  }
  hx[5] = f32_to_bf16(INFINITY);
  {
    Dev<uint16_t> x(hx), w(hw);
    const Screen s(w, V, K);
    const std::vector<int32_t> ids = run_screen(x, M, w, s);
    EXPECT_GE(ids[0], 0);
    EXPECT_LT(ids[0], V);
    for (int m = 1; m < M; ++m) EXPECT_EQ(ids[size_t(m)], 2345) << "M " << M << " row " << m;
  }
}
TEST(LmheadScreen, TiesNearTiesAndNonFiniteInputs) {
  for (const int M : {2, 12}) {  // both forms
    if (!gpu_usable(M, 256, 3000)) GTEST_SKIP() << "needs a GPU with mma.sync f16 (and sm_90 for 12 rows)";
    check_ties(M);
  }
}

// Captured once, replayed with new token rows in the same buffers (both forms).
void check_graph_replay(int M) {
  const int V = 20000, K = 512;
  const std::vector<uint16_t> hw = level_rows(size_t(V) * K, 0.1f, 11);
  Dev<uint16_t> w(hw), x(size_t(M) * K);
  const Screen s(w, V, K);
  Dev<char> ws(cuda::lmhead_screen_workspace_bytes(V, K));
  cuda::lmhead_screen_workspace_init(ws.p, V, K, nullptr);
  Dev<int32_t> ids(static_cast<size_t>(M));
  cudaStream_t st;
  MS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  MS_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  cuda::lmhead_screen(reinterpret_cast<const cuda::bf16*>(x.p), M, K, reinterpret_cast<const cuda::bf16*>(w.p), s.q.p,
                      s.amax, V, ids.p, ws.p, st);
  MS_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  MS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    const std::vector<uint16_t> hx = token_rows(M, K, 70 + uint32_t(replay));
    x.upload(hx);
    ids.poison();
    MS_CUDA_CHECK(cudaGraphLaunch(exec, st));
    MS_CUDA_CHECK(cudaStreamSynchronize(st));
    const std::vector<int32_t> got = ids.download();
    for (int m = 0; m < M; ++m) {
      const Exact e = exact_logits(hx, m, K, hw, V);
      if (e.clear) {
        EXPECT_EQ(got[size_t(m)], e.arg) << "replay " << replay << " row " << m;
      }
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}
TEST(LmheadScreen, ReplaysInACudaGraph) {
  for (const int M : {4, 24}) {  // both forms
    if (!gpu_usable(M, 512, 20000)) GTEST_SKIP() << "needs a GPU with mma.sync f16 (and sm_90 for 24 rows)";
    check_graph_replay(M);
  }
}

// One workspace through launches of both forms and changing row counts (as the executor's steps use it): each launch
// finds what it needs as the one before left it (the folded picks: the grid state put back to zero).
TEST(LmheadScreen, OneWorkspaceAcrossLaunchesOfBothForms) {
  const int V = 7000, K = 384;
  if (!gpu_usable(1, K, V)) GTEST_SKIP() << "needs a GPU with mma.sync f16";
  const std::vector<uint16_t> hw = level_rows(size_t(V) * K, 0.1f, 21);
  Dev<uint16_t> w(hw);
  const Screen s(w, V, K);
  Dev<char> ws(cuda::lmhead_screen_workspace_bytes(V, K));
  cuda::lmhead_screen_workspace_init(ws.p, V, K, nullptr);
  int launches = 0;
  for (const int M : {1, 12, 8, 64, 3, 40, 1, 9, 2}) {
    if (!gpu_usable(M, K, V)) continue;
    const std::vector<uint16_t> hx = token_rows(M, K, 300 + uint32_t(launches));
    Dev<uint16_t> x(hx);
    Dev<int32_t> ids(static_cast<size_t>(M));
    ids.poison();
    cuda::lmhead_screen(reinterpret_cast<const cuda::bf16*>(x.p), M, K, reinterpret_cast<const cuda::bf16*>(w.p),
                        s.q.p, s.amax, V, ids.p, ws.p, nullptr);
    MS_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> got = ids.download();
    for (int m = 0; m < M; ++m) {
      const Exact e = exact_logits(hx, m, K, hw, V);
      if (e.clear) {
        EXPECT_EQ(got[size_t(m)], e.arg) << "launch " << launches << " (" << M << " rows) row " << m;
      }
    }
    ++launches;
  }
}

// q30b8l's lm_head (gen-model's level weights, gain 4) on the device with its int8 screen copy and an initialized
// screen workspace: the timing and profile reports'.
struct Q30bLmHead {
  static constexpr int V = 151936, K = 2048;
  Dev<uint16_t> w{level_rows(size_t(V) * K, 4.0f * std::sqrt(3.0f / float(K)), 7)};
  Screen s{w, V, K};
  Dev<char> ws{cuda::lmhead_screen_workspace_bytes(V, K)};
  Q30bLmHead() { cuda::lmhead_screen_workspace_init(ws.p, V, K, nullptr); }
};

// Timing on q30b8l's lm_head: the screen against gemv_stream + the greedy sampler (the served path at 1-8 rows).
TEST(LmheadScreen, DISABLED_Timing) {
  constexpr int V = 151936, K = 2048;
  if (!gpu_usable(1, K, V)) GTEST_SKIP() << "needs a GPU with mma.sync f16";
  const Q30bLmHead lm;
  const Dev<uint16_t>& w = lm.w;
  const Screen& s = lm.s;
  const Dev<char>& ws = lm.ws;
  Dev<float> logits(size_t(8) * V), lp(8);
  Dev<int32_t> ids(8);
  Dev<char> aws(cuda::lmhead_argmax_workspace_bytes(64, V));
  Dev<int32_t> aids(64);
  Dev<float> alp(64);
  for (const int M : {1, 2, 4, 5, 6, 7, 8, 16, 32, 64}) {
    if (!gpu_usable(M, K, V)) continue;
    Dev<uint16_t> x(token_rows(M, K, 900 + uint32_t(M)));
    const double screen_us = time_us([&] {
      cuda::lmhead_screen(reinterpret_cast<const cuda::bf16*>(x.p), M, K, reinterpret_cast<const cuda::bf16*>(w.p),
                          s.q.p, s.amax, V, ids.p, ws.p, nullptr);
    });
    // The served path at these rows: gemv_stream + the greedy sampler up to 8, lmhead_argmax from 16.
    const double served_us = time_us([&] {
      if (M <= 8) {
        cuda::gemv_stream(reinterpret_cast<const cuda::bf16*>(x.p), K, M, K, reinterpret_cast<const cuda::bf16*>(w.p),
                          V, logits.p, V, cuda::OutType::F32, nullptr);
        cuda::sample_greedy(logits.p, M, V, ids.p, lp.p, nullptr);
      } else {
        cuda::lmhead_argmax(reinterpret_cast<const cuda::bf16*>(x.p), M, K, reinterpret_cast<const cuda::bf16*>(w.p), V,
                            aids.p, alp.p, aws.p, nullptr);
      }
    });
    std::printf("[ info ] lm_head %d x %d, %d rows: screen %.1f us (int8 %.0f MB), %s %.1f us\n", V, K, M, screen_us,
                double(V) * K / 1e6, M <= 8 ? "gemv_stream + greedy" : "lmhead_argmax", served_us);
  }
}

// The masked pick without the screen (lmhead_screen_masked, picked = false) and the masked logits (lmhead_masked_logits)
// by how many tokens every row's mask allows, beside the screen they replace, at 1 and 16 rows of the q30b8l lm_head:
// where the executor's kMaskedOnlyTokens bound should sit. Masks of evenly spread random tokens.
TEST(LmheadScreen, DISABLED_MaskedTiming) {
  constexpr int V = 151936, K = 2048;
  if (!gpu_usable(16, K, V)) GTEST_SKIP() << "needs a GPU with the screen";
  const Q30bLmHead lm;
  const Dev<uint16_t>& w = lm.w;
  const Screen& s = lm.s;
  const Dev<char>& ws = lm.ws;
  Dev<char> mws(cuda::lmhead_screen_masked_workspace_bytes(64));
  MS_CUDA_CHECK(cudaMemset(mws.p, 0, mws.n));
  Dev<int32_t> ids(64);
  Dev<float> logits(size_t(16) * V);
  const size_t words = size_t(V + 31) / 32;
  const auto* wb = reinterpret_cast<const cuda::bf16*>(w.p);
  for (const int M : {1, 16}) {
    Dev<uint16_t> x(token_rows(M, K, 900 + uint32_t(M)));
    const auto* xb = reinterpret_cast<const cuda::bf16*>(x.p);
    const double screen_us = time_us([&] { cuda::lmhead_screen(xb, M, K, wb, s.q.p, s.amax, V, ids.p, ws.p, nullptr); });
    std::printf("[ info ] %d rows: the screen %.1f us\n", M, screen_us);
    for (const int allowed : {16, 256, 1024, 4096, 16384, 65536}) {
      std::mt19937 g(uint32_t(allowed + M));
      std::vector<uint32_t> masks(size_t(M) * words, 0u);
      std::vector<cuda::SampleRowParams> params(static_cast<size_t>(M));
      for (int m = 0; m < M; ++m) {
        params[size_t(m)].mask_row = m;
        for (int i = 0; i < allowed; ++i) {
          const int t = int(g() % uint32_t(V));
          masks[size_t(m) * words + size_t(t) / 32] |= 1u << (t % 32);
        }
      }
      Dev<uint32_t> dm(masks);
      Dev<cuda::SampleRowParams> dp(params);
      const double pick_us = time_us([&] {
        cuda::lmhead_screen_masked(xb, M, K, wb, V, dm.p, dp.p, ids.p, mws.p, nullptr, /*picked=*/false);
      });
      const double logits_us = time_us([&] { cuda::lmhead_masked_logits(xb, M, K, wb, V, dm.p, dp.p, logits.p, nullptr); });
      std::printf("[ info ] %d rows, ~%d tokens allowed each: masked pick alone %.1f us, masked logits %.1f us\n", M,
                  allowed, pick_us, logits_us);
    }
  }
}

// The screen for sampled steps against the served path it replaces at 1-8 rows (gemv_stream + sample()), at Qwen3's
// default sampling (temperature 0.6, top_k 20, top_p 0.95), and the greedy screen beside: back-to-back launches.
TEST(LmheadScreenTopK, DISABLED_Timing) {
  constexpr int V = 151936, K = 2048;
  if (!gpu_usable(1, K, V) || !cuda::lmhead_screen_topk_supported(1, K, V)) GTEST_SKIP() << "needs a GPU";
  const Q30bLmHead lm;
  const Dev<uint16_t>& w = lm.w;
  const Screen& s = lm.s;
  const Dev<char>& ws = lm.ws;
  Dev<char> sws(cuda::sample_workspace_bytes(64, V));
  Dev<float> logits(size_t(64) * V);
  Dev<int32_t> ids(64);
  std::vector<cuda::SampleRowParams> hp(64);
  for (int m = 0; m < 64; ++m) {
    hp[size_t(m)].temperature = 0.6f, hp[size_t(m)].top_k = 20, hp[size_t(m)].top_p = 0.95f;
    hp[size_t(m)].random = 0x9e3779b97f4a7c15ull * uint64_t(m + 1);
  }
  Dev<cuda::SampleRowParams> params(hp);
  // 9-64 rows: the lm_head on cuBLASLt (the GEMM backend's usual pick at these sizes) before sample().
  auto lt = cuda::make_cublaslt_backend(true);
  std::string code;
  const bool have_lt = lt->prepare(cuda::list_devices().at(0), code).empty();
  for (const int M : {1, 2, 4, 8, 16, 32, 64}) {
    if (!cuda::lmhead_screen_topk_supported(M, K, V) || (M > 8 && !have_lt)) continue;
    Dev<uint16_t> x(token_rows(M, K, 900 + uint32_t(M)));
    const auto* xb = reinterpret_cast<const cuda::bf16*>(x.p);
    const auto* wb = reinterpret_cast<const cuda::bf16*>(w.p);
    const double greedy_us = time_us([&] { cuda::lmhead_screen(xb, M, K, wb, s.q.p, s.amax, V, ids.p, ws.p, nullptr); });
    const double topk_us = time_us(
        [&] { cuda::lmhead_screen_topk(xb, M, K, wb, s.q.p, s.amax, V, params.p, ids.p, ws.p, nullptr); });
    auto head = [&] {
      if (M <= 8) cuda::gemv_stream(xb, K, M, K, wb, V, logits.p, V, cuda::OutType::F32, nullptr);
      else lt->run(xb, K, M, K, wb, V, logits.p, V, cuda::OutType::F32, nullptr);
    };
    const double gemv_us = time_us(head);
    const double served_us = time_us([&] {
      head();
      sample_ids(logits.p, M, V, params.p, ids.p, sws.p, nullptr);
    });
    std::printf("[ info ] %d rows, temperature 0.6 / top_k 20 / top_p 0.95: screen for sampled steps %.1f us; "
                "%s + sample() %.1f us (%s %.1f); greedy screen %.1f us\n",
                M, topk_us, M <= 8 ? "gemv_stream" : "cuBLASLt", served_us, M <= 8 ? "gemv_stream" : "cuBLASLt",
                gemv_us, greedy_us);
  }
}

// For ncu (per-kernel times: the screen, the top-k pick, the draw): the screen for sampled steps at 1 and 8 rows,
// twice each, and nothing else on the GPU after the int8 copy is made.
TEST(LmheadScreenTopK, DISABLED_Profile) {
  constexpr int V = 151936, K = 2048;
  if (!gpu_usable(1, K, V) || !cuda::lmhead_screen_topk_supported(1, K, V)) GTEST_SKIP() << "needs a GPU";
  const Q30bLmHead lm;
  const Dev<uint16_t>& w = lm.w;
  const Screen& s = lm.s;
  const Dev<char>& ws = lm.ws;
  Dev<int32_t> ids(64);
  std::vector<cuda::SampleRowParams> hp(64);
  for (auto& p : hp) p.temperature = 0.6f, p.top_k = 20, p.top_p = 0.95f, p.random = 12345;
  Dev<cuda::SampleRowParams> params(hp);
  for (const int M : {1, 8, 64}) {
    if (!cuda::lmhead_screen_topk_supported(M, K, V)) continue;
    Dev<uint16_t> x(token_rows(M, K, 900 + uint32_t(M)));
    for (int i = 0; i < 2; ++i)
      cuda::lmhead_screen_topk(reinterpret_cast<const cuda::bf16*>(x.p), M, K, reinterpret_cast<const cuda::bf16*>(w.p),
                               s.q.p, s.amax, V, params.p, ids.p, ws.p, nullptr);
    MS_CUDA_CHECK(cudaDeviceSynchronize());
    const auto c = cuda::lmhead_screen_topk_candidates(ws.p, M, V, K);
    std::printf("[ info ] %d rows: %zu candidates in the draw's lists for row 0\n", M, c[0].size());
  }
}

// Every CPU kernel against a naive reference written here, on random inputs of several (odd) shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "core/threadpool.h"
#include "kernels/activation/activation.h"
#include "kernels/attention/attention.h"
#include "kernels/gemm/linear.h"
#include "kernels/moe/moe.h"
#include "kernels/norm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/sampling/sampling.h"
#include "kv/kv_pool.h"

using namespace moeserve;
using namespace moeserve::kernels;

namespace {

std::mt19937 rng_for(int seed) { return std::mt19937(seed); }

std::vector<float> randn(size_t n, std::mt19937& g, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

Tensor weight_tensor(const std::vector<float>& v, Shape shape, DType dt) {
  Tensor f = Tensor::empty(DType::F32, shape);
  std::copy(v.begin(), v.end(), f.ptr<float>());
  return dt == DType::F32 ? f : convert(f, dt);
}

// Poisoned output: NaN everywhere, so anything the kernel forgets to write fails the comparison.
std::vector<float> poisoned(size_t n) { return std::vector<float>(n, std::nanf("")); }

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << " NaN at " << i;
    ASSERT_NEAR(got[i], want[i], tol * (1.0f + std::fabs(want[i]))) << what << " at " << i;
  }
}

}  // namespace

TEST(Kernels, LinearAllDtypesOddShapes) {
  ThreadPool pool(2);
  auto g = rng_for(1);
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (auto [T, K, N] : std::vector<std::tuple<int, int, int>>{{1, 7, 5}, {3, 64, 33}, {5, 130, 17}, {37, 96, 70}}) {
      auto x = randn(size_t(T) * K, g), wv = randn(size_t(N) * K, g, 0.3f), b = randn(N, g);
      LinearWeight w;
      w.weight = weight_tensor(wv, {N, K}, dt);
      w.bias = weight_tensor(b, {N}, DType::F32);
      auto y = poisoned(size_t(T) * N), want = poisoned(size_t(T) * N);
      linear(x.data(), T, K, w, y.data(), N, pool);
      linear_reference(x.data(), T, K, w, want.data(), N);
      expect_close(y, want, 1e-5f, "linear");
      // The reference itself against a plain loop over the widened weights.
      Tensor wf = to_f32(w.weight);
      for (int t = 0; t < T; ++t)
        for (int n = 0; n < N; ++n) {
          double acc = b[n];
          for (int k = 0; k < K; ++k) acc += double(wf.ptr<float>()[n * K + k]) * x[t * K + k];
          ASSERT_NEAR(want[t * N + n], acc, 1e-4 * (1 + std::fabs(acc)));
        }
    }
}

TEST(Kernels, GroupedLinearEqualsSeparateLinears) {
  ThreadPool pool(2);
  auto g = rng_for(2);
  std::vector<LinearWeight> ws(3);
  std::vector<std::vector<float>> xs, ys, want;
  std::vector<LinearGroup> groups;
  int Ts[3] = {1, 4, 0}, Ns[3] = {9, 40, 3};
  const int K = 24;
  for (int i = 0; i < 3; ++i) {
    ws[i].weight = weight_tensor(randn(size_t(Ns[i]) * K, g), {Ns[i], K}, DType::BF16);
    xs.push_back(randn(size_t(Ts[i]) * K, g));
    ys.push_back(poisoned(size_t(Ts[i]) * Ns[i]));
    want.push_back(poisoned(size_t(Ts[i]) * Ns[i]));
  }
  for (int i = 0; i < 3; ++i) groups.push_back({xs[i].data(), Ts[i], K, &ws[i], ys[i].data(), Ns[i]});
  grouped_linear(groups, pool);
  for (int i = 0; i < 3; ++i) {
    linear_reference(xs[i].data(), Ts[i], K, ws[i], want[i].data(), Ns[i]);
    expect_close(ys[i], want[i], 1e-5f, "grouped_linear");
  }
}

TEST(Kernels, RmsNormAndFusedAdd) {
  auto g = rng_for(3);
  for (int dim : {1, 7, 64, 129}) {
    const int rows = 3;
    auto x = randn(size_t(rows) * dim, g, 3.0f), w = randn(dim, g), r = randn(size_t(rows) * dim, g);
    auto out = poisoned(x.size());
    rmsnorm(x.data(), w.data(), 1e-6f, rows, dim, out.data());
    std::vector<float> want(x.size());
    for (int i = 0; i < rows; ++i) {
      double ss = 0;
      for (int j = 0; j < dim; ++j) ss += double(x[i * dim + j]) * x[i * dim + j];
      double inv = 1.0 / std::sqrt(ss / dim + 1e-6);
      for (int j = 0; j < dim; ++j) want[i * dim + j] = float(w[j] * x[i * dim + j] * inv);
    }
    expect_close(out, want, 1e-5f, "rmsnorm");
    auto res = r;
    add_rmsnorm(res.data(), x.data(), w.data(), 1e-6f, rows, dim, out.data());
    std::vector<float> sum(x.size());
    for (size_t i = 0; i < x.size(); ++i) sum[i] = r[i] + x[i];
    expect_close(res, sum, 1e-6f, "add_rmsnorm residual");
    auto want2 = poisoned(x.size());
    rmsnorm(sum.data(), w.data(), 1e-6f, rows, dim, want2.data());
    expect_close(out, want2, 1e-6f, "add_rmsnorm");
  }
}

TEST(Kernels, RopeIsAComplexRotation) {
  auto g = rng_for(4);
  RopeTable table;
  const int D = 12, heads = 3, T = 4, rot = 8;  // partial rotary: last 4 dims untouched
  for (int i = 0; i < rot / 2; ++i) table.inv_freq.push_back(std::pow(10000.0f, -2.0f * i / rot));
  table.attention_scaling = 1.25f;
  auto x = randn(size_t(T) * heads * D, g);
  auto y = x;
  std::vector<int64_t> pos = {0, 5, 17, 1000};
  apply_rope(y.data(), T, heads * D, heads, D, pos.data(), table);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < heads; ++h) {
      const float* a = &x[(t * heads + h) * D];
      const float* b = &y[(t * heads + h) * D];
      for (int i = 0; i < rot / 2; ++i) {
        double ang = double(table.inv_freq[i]) * pos[t];
        double re = a[i] * std::cos(ang) - a[i + rot / 2] * std::sin(ang);
        double im = a[i + rot / 2] * std::cos(ang) + a[i] * std::sin(ang);
        EXPECT_NEAR(b[i], 1.25 * re, 2e-3);
        EXPECT_NEAR(b[i + rot / 2], 1.25 * im, 2e-3);
      }
      for (int i = rot; i < D; ++i) EXPECT_EQ(b[i], a[i]);
    }
}

TEST(Kernels, PagedAttentionEqualsDenseCausalAttention) {
  ThreadPool pool(2);
  auto g = rng_for(5);
  const int heads = 6, kv_heads = 2, D = 20, page = 3;
  // Two sequences: one prefilling 7 tokens after 4 cached, one decoding 1 token after 9 cached.
  struct S {
    int start, n;
  } seqs_def[2] = {{4, 7}, {9, 1}};
  KVPool pool_kv({1, 16, page, kv_heads, D});
  std::vector<std::vector<float>> K(2), V(2);
  std::vector<BlockTable> tables(2);
  std::vector<AttnSeq> seqs;
  int rows = 0;
  for (int s = 0; s < 2; ++s) {
    int total = seqs_def[s].start + seqs_def[s].n;
    tables[s].pages = pool_kv.allocator().allocate(pool_kv.pages_for(total));
    std::reverse(tables[s].pages.begin(), tables[s].pages.end());  // pages out of order on purpose
    K[s] = randn(size_t(total) * kv_heads * D, g);
    V[s] = randn(size_t(total) * kv_heads * D, g);
    // The cached prefix goes in first, as earlier steps would have written it.
    AttnSeq prefix{tables[s].pages.data(), 0, seqs_def[s].start, 0};
    write_kv(pool_kv.layer(0), {prefix}, K[s].data(), kv_heads * D, V[s].data(), kv_heads * D);
    seqs.push_back({tables[s].pages.data(), seqs_def[s].start, seqs_def[s].n, rows});
    rows += seqs_def[s].n;
  }
  // New tokens' k/v as one batch.
  std::vector<float> k_new, v_new;
  for (int s = 0; s < 2; ++s) {
    k_new.insert(k_new.end(), K[s].begin() + seqs_def[s].start * kv_heads * D, K[s].end());
    v_new.insert(v_new.end(), V[s].begin() + seqs_def[s].start * kv_heads * D, V[s].end());
  }
  write_kv(pool_kv.layer(0), seqs, k_new.data(), kv_heads * D, v_new.data(), kv_heads * D);
  auto q = randn(size_t(rows) * heads * D, g);
  auto out = poisoned(q.size());
  const float scale = 1.0f / std::sqrt(float(D));
  paged_attention(q.data(), heads * D, heads, pool_kv.layer(0), seqs, scale, out.data(), heads * D, pool);
  std::vector<float> want(q.size());
  for (int s = 0; s < 2; ++s)
    for (int i = 0; i < seqs_def[s].n; ++i) {
      int row = int(seqs[s].row) + i, ctx = seqs_def[s].start + i + 1;
      for (int h = 0; h < heads; ++h) {
        int kh = h / (heads / kv_heads);
        std::vector<double> sc(ctx);
        double mx = -1e300, sum = 0;
        for (int j = 0; j < ctx; ++j) {
          double d = 0;
          for (int e = 0; e < D; ++e) d += double(q[(row * heads + h) * D + e]) * K[s][(j * kv_heads + kh) * D + e];
          sc[j] = d * scale;
          mx = std::max(mx, sc[j]);
        }
        for (auto& v : sc) sum += v = std::exp(v - mx);
        for (int e = 0; e < D; ++e) {
          double acc = 0;
          for (int j = 0; j < ctx; ++j) acc += sc[j] / sum * V[s][(j * kv_heads + kh) * D + e];
          want[(row * heads + h) * D + e] = float(acc);
        }
      }
    }
  expect_close(out, want, 1e-5f, "paged_attention");
}

TEST(Kernels, RouteTopKMatchesSoftmaxTopK) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f};  // a tie: lower index first, as torch.topk
  int32_t ids[3];
  float w[3];
  route_topk(logits.data(), 1, 5, 3, false, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 3);
  EXPECT_EQ(ids[2], 4);
  double z = 0;
  for (float l : logits) z += std::exp(l);
  EXPECT_NEAR(w[0], std::exp(2.0) / z, 1e-6);
  EXPECT_NEAR(w[2], std::exp(0.5) / z, 1e-6);
  route_topk(logits.data(), 1, 5, 3, true, ids, w);
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.0, 1e-6);
  EXPECT_NEAR(w[2] / w[0], std::exp(0.5 - 2.0), 1e-6);
}

TEST(Kernels, MoEEqualsPerTokenLoop) {
  ThreadPool pool(2);
  auto g = rng_for(6);
  const int T = 9, H = 24, I = 10, E = 5, K = 2;
  MoEWeights m;
  m.top_k = K;
  m.norm_topk_prob = true;
  m.router.weight = weight_tensor(randn(size_t(E) * H, g), {E, H}, DType::F32);
  std::vector<std::vector<float>> gw, uw, dw;
  for (int e = 0; e < E; ++e) {
    gw.push_back(randn(size_t(I) * H, g, 0.3f));
    uw.push_back(randn(size_t(I) * H, g, 0.3f));
    dw.push_back(randn(size_t(H) * I, g, 0.3f));
    ExpertWeights ew;
    ew.gate.weight = weight_tensor(gw[e], {I, H}, DType::BF16);
    ew.up.weight = weight_tensor(uw[e], {I, H}, DType::BF16);
    ew.down.weight = weight_tensor(dw[e], {H, I}, DType::BF16);
    m.experts.push_back(ew);
  }
  auto x = randn(size_t(T) * H, g);
  auto out = poisoned(x.size());
  moe_forward(x.data(), T, H, m, out.data(), pool);
  for (int t = 0; t < T; ++t) {
    std::vector<float> logits(E);
    for (int e = 0; e < E; ++e) {
      double acc = 0;
      for (int h = 0; h < H; ++h) acc += double(m.router.weight.ptr<float>()[e * H + h]) * x[t * H + h];
      logits[e] = float(acc);
    }
    int32_t ids[K];
    float w[K];
    route_topk(logits.data(), 1, E, K, true, ids, w);
    std::vector<double> want(H, 0.0);
    for (int k = 0; k < K; ++k) {
      int e = ids[k];
      Tensor gf = to_f32(m.experts[e].gate.weight), uf = to_f32(m.experts[e].up.weight), df = to_f32(m.experts[e].down.weight);
      std::vector<double> act(I);
      for (int i = 0; i < I; ++i) {
        double a = 0, b = 0;
        for (int h = 0; h < H; ++h) {
          a += double(gf.ptr<float>()[i * H + h]) * x[t * H + h];
          b += double(uf.ptr<float>()[i * H + h]) * x[t * H + h];
        }
        act[i] = a / (1 + std::exp(-a)) * b;
      }
      for (int h = 0; h < H; ++h) {
        double d = 0;
        for (int i = 0; i < I; ++i) d += double(df.ptr<float>()[h * I + i]) * act[i];
        want[h] += w[k] * d;
      }
    }
    for (int h = 0; h < H; ++h) ASSERT_NEAR(out[t * H + h], want[h], 1e-4 * (1 + std::fabs(want[h]))) << t << "," << h;
  }
}

TEST(Kernels, LogSoftmaxAndTopLogprobs) {
  std::vector<float> l = {1.0f, 3.0f, 3.0f, -2.0f}, lp(4);
  log_softmax(l.data(), 4, lp.data());
  double s = 0;
  for (float v : lp) s += std::exp(double(v));
  EXPECT_NEAR(s, 1.0, 1e-6);
  auto top = top_logprobs(lp.data(), 4, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].id, 1);
  EXPECT_EQ(top[1].id, 2);
  EXPECT_EQ(top[2].id, 0);
  EXPECT_EQ(argmax(l.data(), 4), 1);
}

TEST(Kernels, SamplingFiltersAndDistribution) {
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  std::mt19937_64 rng(7);
  auto counts = [&](SamplerParams p, int n) {
    std::map<int, int> c;
    for (int i = 0; i < n; ++i) c[sample_token(logits.data(), 4, p, rng)]++;
    return c;
  };
  SamplerParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(counts(greedy, 10)[0], 10);
  SamplerParams topk;
  topk.top_k = 2;
  auto c = counts(topk, 4000);
  EXPECT_EQ(c[2] + c[3], 0);
  EXPECT_NEAR(double(c[0]) / 4000, 0.5 / 0.8, 0.03);
  SamplerParams topp;
  topp.top_p = 0.85f;  // keeps 0.5 + 0.3 + 0.15
  c = counts(topp, 4000);
  EXPECT_EQ(c[3], 0);
  EXPECT_GT(c[2], 0);
  SamplerParams minp;
  minp.min_p = 0.4f;  // keeps p >= 0.2: tokens 0 and 1
  c = counts(minp, 2000);
  EXPECT_EQ(c[2] + c[3], 0);
  SamplerParams plain;
  c = counts(plain, 8000);
  EXPECT_NEAR(double(c[3]) / 8000, 0.05, 0.012);
  // Same seed, same draws.
  std::mt19937_64 a(3), b(3);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sample_token(logits.data(), 4, plain, a), sample_token(logits.data(), 4, plain, b));
}

TEST(Kernels, SiluMul) {
  float g[3] = {-2.0f, 0.0f, 3.0f}, u[3] = {1.5f, 2.0f, -1.0f}, o[3];
  silu_mul(g, u, o, 3);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(o[i], g[i] / (1 + std::exp(-g[i])) * u[i], 1e-6);
}

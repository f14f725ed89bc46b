// The MoE's routing on the GPU (part of test_cuda_moe, tests/cuda/CMakeLists.txt): the route top-k against the
// CPU (ties included), the fused router and norm-router, batched decode's static-slot tile table on skewed routings
// and the GEMMs' inline routing bitwise against the prep launch. Skipped cleanly on machines without a GPU.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "moe_test_support.h"

using namespace moeserve;
using namespace moeserve::cuda;
using namespace moeserve::cuda::moe_test;

namespace {

TEST(CudaMoe, RouteTopkMatchesCpuIncludingTies) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  Stream st;
  std::mt19937 g(7);
  std::normal_distribution<float> n(0, 2);
  for (int E : {8, 60, 128, 512})
    for (int k : {1, 2, 8, 16}) {
      if (k > E) continue;
      for (bool renorm : {false, true}) {
        const int T = 301;
        std::vector<float> logits(size_t(T) * E);
        for (auto& l : logits) l = n(g);
        // Ties: a row of equal logits, a row with a tied top group, rows of coarsely quantised logits.
        for (int e = 0; e < E; ++e) logits[e] = 0.5f;
        for (int e = 0; e < E; ++e) logits[E + e] = e % 3 == 0 ? 2.0f : -1.0f;
        for (int t = 2; t < 40; ++t)
          for (int e = 0; e < E; ++e) logits[size_t(t) * E + e] = std::round(logits[size_t(t) * E + e]);
        std::vector<int32_t> want_ids(size_t(T) * k);
        std::vector<float> want_w(size_t(T) * k);
        kernels::route_topk(logits.data(), T, E, k, renorm, want_ids.data(), want_w.data());
        DevBuf<float> d_logits(logits.size()), d_w(want_w.size());
        DevBuf<int32_t> d_ids(want_ids.size());
        d_logits.upload(logits);
        MS_CUDA_CHECK(cudaMemset(d_ids.p, 0xff, d_ids.n * 4));
        MS_CUDA_CHECK(cudaMemset(d_w.p, 0xff, d_w.n * 4));
        moe_route_topk(d_logits.p, T, E, k, renorm, d_ids.p, d_w.p, st.s);
        MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
        auto ids = d_ids.download(want_ids.size());
        auto w = d_w.download(want_w.size());
        for (int i = 0; i < T * k; ++i) {
          ASSERT_EQ(ids[i], want_ids[i]) << "E " << E << " k " << k << " renorm " << renorm << " token " << i / k
                                         << " slot " << i % k;
          ASSERT_FALSE(std::isnan(w[i]));
          ASSERT_NEAR(w[i], want_w[i], 1e-6f * std::max(1.0f, std::fabs(want_w[i])))
              << "E " << E << " k " << k << " token " << i / k << " slot " << i % k;
        }
      }
    }
}

// The fused router (GEMV + routing in one launch, T <= 128 in groups of 8 tokens, each group routed by its last
// block): logits against an f64 reference, the routing exactly as the CPU routes the GPU's own logits; called twice
// per shape so that the group counters it leaves behind are shown to be reset, with a graph replay of a third input.
TEST(CudaMoe, FusedRouterMatchesCpu) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  Stream st;
  struct Shape {
    int E, k, H;
  };
  EXPECT_TRUE(moe_router_topk_fits(128, 2048, 128, 8));
  EXPECT_FALSE(moe_router_topk_fits(129, 2048, 128, 8));
  EXPECT_FALSE(moe_router_topk_fits(1, 2048 + 4, 128, 8));
  EXPECT_FALSE(moe_router_topk_fits(1, 8192, 128, 8));
  DevBuf<int> counter(kRouterTopkMaxGroups);
  MS_CUDA_CHECK(cudaMemset(counter.p, 0, counter.n * 4));
  uint64_t seed = 900;
  for (const Shape sh : {Shape{128, 8, 2048}, Shape{60, 4, 520}, Shape{8, 2, 72}, Shape{512, 10, 4096}})
    for (int T : {1, 2, 5, 8, 9, 20, 64, 128})
      for (bool renorm : {true, false}) {
        if (sh.E == 512 && T > 20) continue;  // (the f64 reference's time)
        ASSERT_TRUE(moe_router_topk_fits(T, sh.H, sh.E, sh.k));
        const auto w = random_bf16(size_t(sh.E) * sh.H, std::sqrt(3.0f / sh.H), seed++);
        DevBuf<uint16_t> d_w(w.size()), d_x(size_t(T) * sh.H);
        d_w.upload(w);
        DevBuf<float> d_logits(size_t(T) * sh.E), d_weights(size_t(T) * sh.k);
        DevBuf<int32_t> d_ids(size_t(T) * sh.k);
        for (int call = 0; call < 3; ++call) {
          const auto x = random_bf16(size_t(T) * sh.H, 2.0f, seed++);
          d_x.upload(x);
          MS_CUDA_CHECK(cudaMemset(d_ids.p, 0xff, d_ids.n * 4));
          MS_CUDA_CHECK(cudaMemset(d_weights.p, 0xff, d_weights.n * 4));
          MS_CUDA_CHECK(cudaMemset(d_logits.p, 0xff, d_logits.n * 4));
          auto run = [&] {
            moe_router_topk(reinterpret_cast<const bf16*>(d_x.p), reinterpret_cast<const bf16*>(d_w.p), T, sh.H,
                            sh.E, sh.k, renorm, d_logits.p, counter.p, d_ids.p, d_weights.p, st.s);
          };
          if (call < 2) {
            run();
          } else {  // captured and replayed
            cudaGraph_t graph{};
            MS_CUDA_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
            run();
            MS_CUDA_CHECK(cudaStreamEndCapture(st.s, &graph));
            cudaGraphExec_t exec{};
            MS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
            MS_CUDA_CHECK(cudaGraphLaunch(exec, st.s));
            MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
          }
          MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
          const auto logits = d_logits.download(d_logits.n);
          const std::string where = fmt::format("E{} k{} H{} T{} renorm {} call {}", sh.E, sh.k, sh.H, T, renorm, call);
          for (int t = 0; t < T; ++t)
            for (int e = 0; e < sh.E; ++e) {
              double want = 0;
              for (int h = 0; h < sh.H; ++h)
                want += double(bf16_to_f32(x[size_t(t) * sh.H + h])) * double(bf16_to_f32(w[size_t(e) * sh.H + h]));
              ASSERT_NEAR(logits[size_t(t) * sh.E + e], want, 1e-4 * (1 + std::fabs(want))) << where;
            }
          std::vector<int32_t> want_ids(size_t(T) * sh.k);
          std::vector<float> want_w(size_t(T) * sh.k);
          kernels::route_topk(logits.data(), T, sh.E, sh.k, renorm, want_ids.data(), want_w.data());
          const auto ids = d_ids.download(want_ids.size());
          const auto wts = d_weights.download(want_w.size());
          for (size_t i = 0; i < ids.size(); ++i) {
            ASSERT_EQ(ids[i], want_ids[i]) << where << " pair " << i;
            ASSERT_NEAR(wts[i], want_w[i], 1e-6f * std::max(1.0f, std::fabs(want_w[i]))) << where << " pair " << i;
          }
        }
        for (int c : counter.download(counter.n)) EXPECT_EQ(c, 0) << "the group counters are left at zero";
      }
}

// The post-attention residual add + RMSNorm fused in front of the router (T <= 4): the normalized rows it
// writes for the experts against the CPU's (within one bf16 step: the sum of squares is ordered differently),
// the residual updated exactly once, logits against an f64 dot product of those rows, the routing as the CPU
// routes the GPU's logits.
TEST(CudaMoe, FusedNormRouterMatchesCpu) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  Stream st;
  EXPECT_FALSE(moe_norm_router_topk_fits(5, 2048, 128, 8));
  DevBuf<int> counter(1);
  MS_CUDA_CHECK(cudaMemset(counter.p, 0, 4));
  uint64_t seed = 1900;
  struct Shape {
    int E, k, H;
  };
  for (const Shape sh : {Shape{128, 8, 2048}, Shape{8, 2, 64}, Shape{60, 3, 72}})
    for (int T : {1, 3, 4})
      for (int call = 0; call < 2; ++call) {
        const std::string where = fmt::format("E{} k{} H{} T{} call {}", sh.E, sh.k, sh.H, T, call);
        const auto w = random_bf16(size_t(sh.E) * sh.H, std::sqrt(3.0f / sh.H), seed++);
        const auto delta = random_bf16(size_t(T) * sh.H, 1.0f, seed++);
        const auto nw = random_bf16(size_t(sh.H), 1.5f, seed++);
        std::vector<float> res(size_t(T) * sh.H);
        std::mt19937 g(uint32_t(seed++));
        std::normal_distribution<float> nd(0, 2);
        for (auto& v : res) v = nd(g);
        DevBuf<uint16_t> d_w(w.size()), d_delta(delta.size()), d_nw(nw.size()), d_xn(size_t(T) * sh.H);
        DevBuf<float> d_res(res.size()), d_logits(size_t(T) * sh.E), d_weights(size_t(T) * sh.k);
        DevBuf<int32_t> d_ids(size_t(T) * sh.k);
        d_w.upload(w), d_delta.upload(delta), d_nw.upload(nw), d_res.upload(res);
        MS_CUDA_CHECK(cudaMemset(d_xn.p, 0xff, d_xn.n * 2));
        MS_CUDA_CHECK(cudaMemset(d_ids.p, 0xff, d_ids.n * 4));
        moe_norm_router_topk(d_res.p, reinterpret_cast<const bf16*>(d_delta.p), reinterpret_cast<const bf16*>(d_nw.p),
                             1e-6f, reinterpret_cast<bf16*>(d_xn.p), reinterpret_cast<const bf16*>(d_w.p), T, sh.H,
                             sh.E, sh.k, true, d_logits.p, counter.p, d_ids.p, d_weights.p, st.s);
        MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
        const auto xn = d_xn.download(d_xn.n);
        const auto res_out = d_res.download(d_res.n);
        const auto logits = d_logits.download(d_logits.n);
        for (int t = 0; t < T; ++t) {
          double ss = 0;
          std::vector<float> x(sh.H);
          for (int h = 0; h < sh.H; ++h) {
            x[h] = res[size_t(t) * sh.H + h] + bf16_to_f32(delta[size_t(t) * sh.H + h]);
            ss += double(x[h]) * x[h];
            ASSERT_EQ(res_out[size_t(t) * sh.H + h], x[h]) << where << " residual t " << t << " h " << h;
          }
          const double inv = 1.0 / std::sqrt(ss / sh.H + 1e-6);
          for (int h = 0; h < sh.H; ++h) {
            const double want = double(bf16_to_f32(nw[h])) * x[h] * inv;
            const float got = bf16_to_f32(xn[size_t(t) * sh.H + h]);
            ASSERT_NEAR(got, want, std::fabs(want) * (1.0 / 128) + 1e-6) << where << " xn t " << t << " h " << h;
          }
          for (int e = 0; e < sh.E; ++e) {
            double want = 0;
            for (int h = 0; h < sh.H; ++h)
              want += double(bf16_to_f32(xn[size_t(t) * sh.H + h])) * double(bf16_to_f32(w[size_t(e) * sh.H + h]));
            ASSERT_NEAR(logits[size_t(t) * sh.E + e], want, 1e-4 * (1 + std::fabs(want))) << where << " e " << e;
          }
        }
        std::vector<int32_t> want_ids(size_t(T) * sh.k);
        std::vector<float> want_w(size_t(T) * sh.k);
        kernels::route_topk(logits.data(), T, sh.E, sh.k, true, want_ids.data(), want_w.data());
        EXPECT_EQ(d_ids.download(want_ids.size()), want_ids) << where;
        EXPECT_EQ(counter.download(1)[0], 0) << where << ": the grid counter is left at zero";
      }
}

// Batched decode's warp-specialized configuration (12 at 3-12 tokens an expert) walks a tile table in static slots
// and issues its first weight slices before the prep has run (GemmParams::static_slots): skewed routings reach
// its corners - experts with more tokens than a tile (overflow slots after the E static ones), experts without
// pairs among every CTA's first units (the slices issued for them drained without MMAs), dropped pairs - and each
// result is compared with the CPU reference and repeated bitwise.
TEST(CudaMoe, SkewedRoutingsOnStaticSlots) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  const Case c{128, 8, 2048, 768};
  Layer L(c, 4711);
  const MoeShape shape = L.shape(192);
  StepBuffers buf(c, 192);
  Stream st;
  std::vector<Step> steps;
  for (int T : {40, 64, 192}) {
    for (int kind = 0; kind < 4; ++kind) {
      Step s = make_step(c, T, 31 * T + kind);
      for (int t = 0; t < T; ++t)
        for (int j = 0; j < c.k; ++j) {
          int& id = s.ids[size_t(t) * c.k + j];
          if (kind == 0) id = j;                             // experts 0-7 take every token: overflow tiles
          if (kind == 1) id = c.E - 1 - ((t + j) % 24);      // only the last 24 experts: the first slots empty
          if (kind == 2 && t % 3 == 0) id = (j * 16 + t) % c.E;  // random, a third of the tokens spread
          if (kind == 3 && (t + j) % 5 == 0) id = -1;        // random with dropped pairs
        }
      steps.push_back(std::move(s));
    }
  }
  for (auto& b : make_moe_backends()) {
    if (b->spec().name == "cublas_ref") continue;  // no tiles
    if (!prepared_here(*b, shape)) continue;
    DevBuf<char> ws(b->workspace_bytes(shape));
    for (const Step& s : steps) {
      const auto want = reference(L, s);
      EXPECT_EQ(check_step(*b, L, s, want, buf, ws.p, st.s), "")
          << "fused tile configuration " << fused_config_for(shape, s.T);
      const auto first = buf.out.download(size_t(s.T) * c.H);
      EXPECT_EQ(check_step(*b, L, s, want, buf, ws.p, st.s), "");
      EXPECT_TRUE(buf.out.download(size_t(s.T) * c.H) == first)
          << b->spec().name << " T=" << s.T << ": not bitwise repeatable";
    }
  }
}

// Inline routing (the default; MOESERVE_MOE_INLINE_ROUTE=0 for the prep launch; GemmParams::inline_ids): the batched-decode GEMMs build the prep's
// tile table in every CTA instead of reading the prep launch's, with the rows of an expert in token order instead of
// the prep's atomic order. Each output row is computed from its own row alone, so the outputs must be bitwise those
// of the prep path - on skewed routings too (overflow tiles, empty static slots, dropped pairs) - and within the
// reference's tolerance. (Configuration 12 always has T x top_k >= E, so static slots: gpu-check runs this test again
// with MOESERVE_MOE_GU_PREWAIT=0 for the table without them.)
TEST(CudaMoe, InlineRoutingMatchesThePrepBitwise) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  const Case c{128, 8, 2048, 768};
  Layer L(c, 4712);
  const MoeShape shape = L.shape(256);
  StepBuffers buf(c, 256);
  Stream st;
  std::vector<Step> steps;
  for (int T : {16, 33, 48, 64, 96, 128, 256}) {
    for (int kind = 0; kind < 4; ++kind) {
      Step s = make_step(c, T, 57 * T + kind);
      for (int t = 0; t < T; ++t)
        for (int j = 0; j < c.k; ++j) {
          int& id = s.ids[size_t(t) * c.k + j];
          if (kind == 1) id = j;                               // experts 0-7 take every token: overflow tiles
          if (kind == 2) id = c.E - 1 - ((t + j) % 24);        // only the last 24 experts: the first slots empty
          if (kind == 3 && (t + 2 * j) % 7 == 0) id = -1;      // dropped pairs
        }
      steps.push_back(std::move(s));
    }
  }
  int inline_steps = 0;
  const char* kVar = "MOESERVE_MOE_INLINE_ROUTE";
  const char* given = std::getenv(kVar);
  const std::string was = given ? given : "";
  auto restore = [&] { given ? (void)::setenv(kVar, was.c_str(), 1) : (void)::unsetenv(kVar); };
  for (auto& b : make_moe_backends()) {
    if (b->spec().name == "cublas_ref") continue;  // no tiles
    if (!prepared_here(*b, shape)) continue;
    DevBuf<char> ws(b->workspace_bytes(shape));
    for (const Step& s : steps) {
      const auto want = reference(L, s);
      ::setenv(kVar, "0", 1);
      ASSERT_EQ(check_step(*b, L, s, want, buf, ws.p, st.s), "");
      const auto prep = buf.out.download(size_t(s.T) * c.H);
      ::setenv(kVar, "1", 1);
      const FusedLayout l = fused_layout(shape, s.T, true);
      inline_steps += fused_inline_route_for(shape, s.T, l) ? 1 : 0;
      const std::string r = check_step(*b, L, s, want, buf, ws.p, st.s);
      restore();
      ASSERT_EQ(r, "") << "inline routing, configuration " << l.config;
      EXPECT_TRUE(buf.out.download(size_t(s.T) * c.H) == prep)
          << b->spec().name << " T=" << s.T << ": inline routing differs from the prep's bits";
    }
  }
  // 33-128 tokens (2.1-8 tokens an expert) take configuration 12 and fit the tables: 5 x 4 steps a fused backend;
  // 16 (configuration 0) and 256 (16 an expert: configuration 8) keep the prep.
  EXPECT_GE(inline_steps, 20) << "the inline path was hardly taken";
}

}  // namespace

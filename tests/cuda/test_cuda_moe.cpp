// MoE on the GPU against the CPU reference: every backend on several shapes and token counts (each tile
// configuration of the fused kernels is reached), CUDA graph replay with fresh routings, the residual and norm
// epilogues, the sm_100a-only build refused on Hopper, the JIT disk cache and a JIT compile failure; the routing
// tests (router, top-k, the GEMMs' own routing) are in moe_routing_tests.cpp, linked into the same binary.
// Skipped cleanly on machines without a GPU.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "cuda/device.h"
#include "cuda/moe/moe.h"
#include "cuda/moe/moe_internal.h"
#include "kernels/moe/moe.h"

#include "moe_test_support.h"

using namespace moeserve;
using namespace moeserve::cuda;
using namespace moeserve::cuda::moe_test;

namespace {

TEST(CudaMoe, BackendListAndClaims) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  auto all = make_moe_backends();
  std::vector<std::string> names;
  for (auto& b : all) {
    names.push_back(b->spec().name);
    EXPECT_EQ(b->spec().family, OpFamily::Moe);
    EXPECT_EQ(b->spec().formats, std::vector<std::string>{"bf16"});
  }
  EXPECT_EQ(names, (std::vector<std::string>{"cublas_ref", "fused_sm90", "jit", "fused_sm100_build"}));
  EXPECT_FALSE(all[0]->spec().capturable);
  EXPECT_NE(all[0]->spec().summary.find("host sync per call; not capturable"), std::string::npos);
  EXPECT_TRUE(all[0]->spec().archs.empty());
  EXPECT_EQ(all[1]->spec().archs, std::vector<int>{90});
  EXPECT_TRUE(all[1]->spec().capturable && all[2]->spec().capturable);
  EXPECT_TRUE(all[2]->spec().jit && all[2]->spec().archs.empty());
}

class CudaMoeShapes : public ::testing::TestWithParam<Case> {};

TEST_P(CudaMoeShapes, EveryRunnableBackendMatchesCpuReference) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  const Case c = GetParam();
  const std::vector<int> token_counts = {1, 3, 64, 128, 300};
  Layer L(c, 1000 + c.E * 7 + c.H);
  const MoeShape shape = L.shape(300);
  StepBuffers buf(c, 300);
  Stream st;
  std::vector<Step> steps;
  std::vector<std::vector<float>> want;
  for (int T : token_counts) {
    steps.push_back(make_step(c, T, 17 * T + c.k));
    want.push_back(reference(L, steps.back()));
  }
  for (auto& b : make_moe_backends()) {
    std::string code;
    const std::string reason = b->prepare(device(), shape, code);
    std::cout << "[   info   ] " << b->spec().name << " on " << case_name(c) << ": code '" << code << "', "
              << (reason.empty() ? "runnable" : "not runnable: " + reason) << "\n";
    if (!reason.empty()) {
      EXPECT_FALSE(must_run_here(*b)) << b->spec().name << " refused " << case_name(c) << ": " << reason;
      continue;
    }
    DevBuf<char> ws(b->workspace_bytes(shape));
    for (size_t i = 0; i < steps.size(); ++i)
      EXPECT_EQ(check_step(*b, L, steps[i], want[i], buf, ws.p, st.s), "")
          << "(fused tile configuration " << fused_config_for(shape, steps[i].T) << ")";
  }
}

// Shapes: the test model (256/128), Qwen3-30B-A3B (2048/768, 128 experts, top-8) and odd multiples of 64
// (partial M tiles and a partial last K slice in the fused kernels). With T in {1, 3, 64, 128, 300}, the default
// configurations of an sm_90a table are E128/k8: 0, 0, 12, 12, 8 and E8/k2: 0, 0, 8, 8, 8 (the graph test's 1,100
// tokens at E8/k2 reach 10); with MOESERVE_MOE_WS=0 (scripts/gpu-check.sh runs both) E128/k8 takes 1, 1, 5 for 64,
// 128, 300 and E8/k2 5, 5, 6; MOESERVE_MOE_WS_MID=5 / 9 / 10 / 12 / 13 / 14 picks the 12-40 tokens an expert configuration (E128/k8
// at 300, E8/k2 at 64 and 128); MOESERVE_MOE_WGMMA=0 / 1 / 2 give the mma.sync tiles 2 and 3, 2 and 4, 5 and 4.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaMoeShapes,
                         ::testing::Values(Case{8, 2, 256, 128}, Case{128, 8, 256, 128}, Case{8, 2, 2048, 768},
                                           Case{128, 8, 2048, 768}, Case{5, 3, 320, 192}, Case{6, 6, 64, 64}),
                         [](const auto& info) { return case_name(info.param); });

TEST(CudaMoe, CapturedGraphReplaysWithNewRoutings) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  for (const Case c : {Case{128, 8, 512, 256}, Case{8, 2, 320, 192}})
    // 1 and 3 (E8/k2) / 1 (E128/k8): the direct small-T path; 600 and 1,100 (E128/k8: 4,800 and 8,800 pairs, more
    // than one prep chunk): the two-launch prep over 2 and 3 CTAs, whose counters each replay must find at zero.
    for (int T : {1, 3, 5, 64, 200, 600, 1100}) {
      Layer L(c, 555 + T);
      const MoeShape shape = L.shape(T);
      for (auto& b : make_moe_backends()) {
        if (!b->spec().capturable) continue;
        if (!prepared_here(*b, shape)) continue;
        StepBuffers buf(c, T);
        DevBuf<char> ws(b->workspace_bytes(shape));
        Stream st;
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        MS_CUDA_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
        b->run(reinterpret_cast<const bf16*>(buf.x.p), T, buf.ids.p, buf.w.p, L.weights(),
               reinterpret_cast<bf16*>(buf.out.p), ws.p, st.s);
        MS_CUDA_CHECK(cudaStreamEndCapture(st.s, &graph));
        MS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        for (int replay = 0; replay < 3; ++replay) {
          const Step s = make_step(c, T, 9000 + 31 * replay + T);
          buf.upload(s);  // new activations and routing in the captured buffers; output poisoned
          MS_CUDA_CHECK(cudaGraphLaunch(exec, st.s));
          MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
          auto got = buf.out.download(size_t(T) * c.H);
          auto want = reference(L, s);
          double err = 0;
          EXPECT_EQ(moe_compare(got.data(), want.data(), T, c.H, kMoeSelfTestTolerance, err), "")
              << b->spec().name << " " << case_name(c) << " T=" << T << " graph replay " << replay;
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      }
    }
}
// Which T take the direct (prep-less, one pair per tile, PDL-chained) path of the fused kernels. Host only.
TEST(CudaMoe, SmallTokenCountsTakeTheDirectPath) {
  MoeShape s;
  s.num_experts = 8, s.top_k = 2, s.hidden = 320, s.inter = 192, s.max_tokens = 300;
  for (int T = 0; T <= 8; ++T) {
    const FusedLayout l = fused_layout(s, T);
    EXPECT_EQ(l.direct, T >= 1 && T <= 4) << "E8/k2 T=" << T;
    EXPECT_EQ(fused_direct_for(s, T), l.direct) << "E8/k2 T=" << T;
    if (l.direct) {
      EXPECT_EQ(l.num_slots, T * s.top_k) << "E8/k2 T=" << T;
      EXPECT_EQ(l.config, 0) << "E8/k2 T=" << T;
    }
    if (T > 0) {
      EXPECT_LE(l.total, fused_layout(s, T + 1).total) << "the workspace only grows with T";
    }
  }
  s.num_experts = 128, s.top_k = 8, s.hidden = 2048, s.inter = 768;
  EXPECT_TRUE(fused_layout(s, 1).direct);
  EXPECT_EQ(fused_layout(s, 1).num_slots, 8);
  for (int T : {0, 2, 3, 7, 64}) EXPECT_FALSE(fused_layout(s, T).direct) << "E128/k8 T=" << T;
  s.num_experts = 32, s.top_k = 16;  // T = 1 is direct for any top_k
  EXPECT_TRUE(fused_layout(s, 1).direct);
  EXPECT_FALSE(fused_layout(s, 2).direct);
}

// The two small-T cases (E8/k2: T <= 4 direct; E128/k8: T = 1 direct, up to 7 tokens) with every backend that
// prepares here (those that must run here and do not fail the test).
template <typename Fn>
void for_each_small_case_backend(uint64_t seed, Fn fn) {
  for (const Case c : {Case{8, 2, 320, 192}, Case{128, 8, 512, 256}}) {
    Layer L(c, seed + uint64_t(c.E));
    const MoeShape shape = L.shape(7);
    StepBuffers buf(c, 7);
    Stream st;
    for (auto& b : make_moe_backends()) {
      if (!prepared_here(*b, shape)) continue;
      fn(c, L, shape, buf, st, *b);
    }
  }
}

// Small T on both sides of the direct-path bound, with dropped pairs (id -1) for the fused backends, and
// bitwise-repeatable results.
TEST(CudaMoe, SmallTokenCountsMatchCpuReference) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  for_each_small_case_backend(4242, [](const Case& c, const Layer& L, const MoeShape& shape, StepBuffers& buf,
                                       Stream& st, MoeBackend& b) {
    const bool fused = b.spec().name != "cublas_ref";
    DevBuf<char> ws(b.workspace_bytes(shape));
    for (int T : {1, 2, 3, 7}) {
      for (int drop = 0; drop < (fused ? 2 : 1); ++drop) {
        Step s = make_step(c, T, 777 + 13 * T + drop);
        if (drop) {
          s.ids[0] = -1;  // one dropped slot
          if (T >= 3) std::fill_n(s.ids.begin() + 2 * c.k, c.k, -1);  // a token with every slot dropped
        }
        const auto want = reference(L, s);
        EXPECT_EQ(check_step(b, L, s, want, buf, ws.p, st.s), "")
            << "direct path " << fused_direct_for(shape, T) << ", dropped pairs " << drop;
        const auto first = buf.out.download(size_t(T) * c.H);
        EXPECT_EQ(check_step(b, L, s, want, buf, ws.p, st.s), "");
        EXPECT_TRUE(buf.out.download(size_t(T) * c.H) == first)
            << b.spec().name << " " << case_name(c) << " T=" << T << ": not bitwise repeatable";
      }
    }
  });
}

// The residual epilogue of the direct-mode down GEMV (MoeBackend::run_residual): out bitwise as run() gives it,
// residual += float(out) exactly, and each part's sum of squares of the updated residual over its 16 rows; the
// backends without it say so (residual_parts 0), and so do token counts outside the direct path.
TEST(CudaMoe, ResidualEpilogueMatchesRunAndCpu) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  for_each_small_case_backend(5151, [](const Case& c, const Layer& L, const MoeShape& shape, StepBuffers& buf,
                                       Stream& st, MoeBackend& b) {
    if (b.spec().name == "cublas_ref") {
      EXPECT_EQ(b.residual_parts(1), 0);
      return;
    }
    DevBuf<char> ws(b.workspace_bytes(shape));
    for (int T : {1, 2, 4, 7}) {
      const int parts = b.residual_parts(T);
      if (!fused_direct_for(shape, T)) {
        EXPECT_EQ(parts, 0) << b.spec().name << " T=" << T;
        continue;
      }
      const char* gemv_env = std::getenv("MOESERVE_MOE_DOWN_GEMV");
      if (gemv_env != nullptr && std::string(gemv_env) == "0") {  // the down GEMM: no epilogue
        EXPECT_EQ(parts, 0) << b.spec().name << " T=" << T;
        continue;
      }
      ASSERT_EQ(parts, c.H / 16) << b.spec().name << " " << case_name(c) << " T=" << T;
      const Step s = make_step(c, T, 8080 + T);
      ASSERT_EQ(check_step(b, L, s, reference(L, s), buf, ws.p, st.s), "");
      const auto want_out = buf.out.download(size_t(T) * c.H);
      std::mt19937 g{uint32_t(T)};
      std::normal_distribution<float> nd(0, 2);
      std::vector<float> res(size_t(T) * c.H);
      for (auto& v : res) v = nd(g);
      DevBuf<float> d_res(res.size()), d_part(size_t(T) * parts);
      d_res.upload(res);
      MS_CUDA_CHECK(cudaMemset(d_part.p, 0xff, d_part.n * sizeof(float)));
      buf.upload(s);
      b.run_residual(reinterpret_cast<const bf16*>(buf.x.p), T, buf.ids.p, buf.w.p, L.weights(),
                      reinterpret_cast<bf16*>(buf.out.p), d_res.p, d_part.p, ws.p, st.s);
      MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
      const std::string where = fmt::format("{} {} T={}", b.spec().name, case_name(c), T);
      EXPECT_TRUE(buf.out.download(size_t(T) * c.H) == want_out) << where << ": out differs from run()";
      const auto res_out = d_res.download(res.size());
      const auto part = d_part.download(d_part.n);
      for (int t = 0; t < T; ++t)
        for (int p = 0; p < parts; ++p) {
          double ss = 0;
          for (int r = 16 * p; r < 16 * p + 16; ++r) {
            const size_t i = size_t(t) * c.H + r;
            ASSERT_EQ(res_out[i], res[i] + bf16_to_f32(want_out[i])) << where << " residual t " << t << " row " << r;
            ss += double(res_out[i]) * res_out[i];
          }
          ASSERT_NEAR(part[size_t(t) * parts + p], ss, 1e-5 * ss + 1e-6) << where << " part " << p;
        }
    }
  });
}

// The next RMSNorm in the combine launch (MoeBackend::run_combine_norm) where the MoE ends in one (not the direct
// path): out bitwise as run() gives it, residual += float(out) exactly, xn against the CPU norm of that residual.
TEST(CudaMoe, CombineNormMatchesRunAndCpu) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  for_each_small_case_backend(6161, [](const Case& c, const Layer& L, const MoeShape& shape, StepBuffers& buf,
                                       Stream& st, MoeBackend& b) {
    if (b.spec().name == "cublas_ref") {
      EXPECT_FALSE(b.combine_norm_supported(7));
      return;
    }
    DevBuf<char> ws(b.workspace_bytes(shape));
    for (int T : {1, 5, 7}) {
      ASSERT_EQ(b.combine_norm_supported(T), !fused_direct_for(shape, T)) << b.spec().name << " T=" << T;
      if (!b.combine_norm_supported(T)) continue;
      const Step s = make_step(c, T, 9090 + T);
      ASSERT_EQ(check_step(b, L, s, reference(L, s), buf, ws.p, st.s), "");
      const auto want_out = buf.out.download(size_t(T) * c.H);
      std::mt19937 g{uint32_t(T + 100)};
      std::normal_distribution<float> nd(0, 2);
      std::vector<float> res(size_t(T) * c.H);
      for (auto& v : res) v = nd(g);
      const auto nw = random_bf16(size_t(c.H), 1.5f, 31337);
      DevBuf<float> d_res(res.size());
      DevBuf<uint16_t> d_nw(nw.size()), d_xn(res.size());
      d_res.upload(res);
      d_nw.upload(nw);
      MS_CUDA_CHECK(cudaMemset(d_xn.p, 0xff, d_xn.n * sizeof(uint16_t)));
      buf.upload(s);
      b.run_combine_norm(reinterpret_cast<const bf16*>(buf.x.p), T, buf.ids.p, buf.w.p, L.weights(),
                         reinterpret_cast<bf16*>(buf.out.p), d_res.p, reinterpret_cast<const bf16*>(d_nw.p), 1e-6f,
                         reinterpret_cast<bf16*>(d_xn.p), ws.p, st.s);
      MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
      const std::string where = fmt::format("{} {} T={}", b.spec().name, case_name(c), T);
      EXPECT_TRUE(buf.out.download(size_t(T) * c.H) == want_out) << where << ": out differs from run()";
      const auto res_out = d_res.download(res.size());
      const auto xn = d_xn.download(res.size());
      for (int t = 0; t < T; ++t) {
        double ss = 0;
        for (int h = 0; h < c.H; ++h) {
          const size_t i = size_t(t) * c.H + h;
          ASSERT_EQ(res_out[i], res[i] + bf16_to_f32(want_out[i])) << where << " residual t " << t << " h " << h;
          ss += double(res_out[i]) * res_out[i];
        }
        const float inv = float(1.0 / std::sqrt(ss / c.H + 1e-6));
        for (int h = 0; h < c.H; ++h) {
          const size_t i = size_t(t) * c.H + h;
          const float want = bf16_to_f32(f32_to_bf16(bf16_to_f32(nw[size_t(h)]) * (res_out[i] * inv)));
          ASSERT_NEAR(bf16_to_f32(xn[i]), want, std::fabs(want) * 1e-2 + 1e-6) << where << " xn t " << t << " h " << h;
        }
      }
    }
  });
}

TEST(CudaMoe, Sm100BuildIsRefusedOnHopperBeforeAnyLaunch) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  if (!is_hopper()) GTEST_SKIP() << "the refusal under test is the one on sm_90";
  auto b = make_fused_sm100_build_backend();
  EXPECT_EQ(b->spec().archs, (std::vector<int>{90, 100}));
  MoeShape shape;
  shape.num_experts = 8, shape.hidden = 256, shape.inter = 128, shape.top_k = 2, shape.max_tokens = 16;
  std::string code;
  EXPECT_EQ(b->prepare(device(), shape, code), "no code for sm_90 in this binary");
  EXPECT_EQ(code, "absent");
  // run() after a refused prepare throws instead of launching code that does not exist for this GPU.
  EXPECT_THROW(b->run(nullptr, 1, nullptr, nullptr, MoeWeights{}, nullptr, nullptr, nullptr), InternalError);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudaMoe, UnsupportedShapesAreRefusedWithAReason) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  MoeShape bad;
  bad.num_experts = 8, bad.hidden = 200, bad.inter = 128, bad.top_k = 2, bad.max_tokens = 4;
  MoeShape fp8 = bad;
  fp8.hidden = 256, fp8.format = WeightFormat::FP8Block128;
  for (auto& b : make_moe_backends()) {
    if (b->spec().name == "cublas_ref" || !must_run_here(*b)) continue;
    std::string code;
    EXPECT_NE(b->prepare(device(), bad, code).find("multiples of 64"), std::string::npos) << b->spec().name;
    EXPECT_NE(b->prepare(device(), fp8, code).find("bf16 only"), std::string::npos) << b->spec().name;
  }
}

// With steps of up to 8,192 tokens the self-test runs every tile configuration the fused backends pick for these
// shapes (direct, 0, 9, 5, 8 and 10 on sm_90a).
TEST(CudaMoe, SelfTestPassesOnQwen3Shapes) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  MoeShape shape;
  shape.num_experts = 128, shape.hidden = 2048, shape.inter = 768, shape.top_k = 8, shape.max_tokens = 8192;
  for (auto& b : make_moe_backends()) {
    std::string code;
    if (!prepared_here(*b, shape, &code)) continue;
    double err = -1;
    EXPECT_EQ(moe_self_test(*b, shape, err), "") << b->spec().name;
    EXPECT_GE(err, 0.0);
    EXPECT_LT(err, kMoeSelfTestTolerance) << b->spec().name;
    std::cout << "[   info   ] " << b->spec().name << " (" << code << ") self-test max err " << err << "\n";
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// A temporary MOESERVE_CACHE for one test; the previous value comes back afterwards.
struct TempCacheDir {
  std::string dir, old;
  bool had_old = false;
  TempCacheDir() {
    char tmpl[] = "/tmp/moeserve_jit_test_XXXXXX";
    dir = mkdtemp(tmpl);
    if (const char* o = getenv("MOESERVE_CACHE")) had_old = true, old = o;
    setenv("MOESERVE_CACHE", dir.c_str(), 1);
  }
  ~TempCacheDir() {
    if (had_old)
      setenv("MOESERVE_CACHE", old.c_str(), 1);
    else
      unsetenv("MOESERVE_CACHE");
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

TEST(CudaMoe, JitSecondPrepareHitsTheDiskCache) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  TempCacheDir cache;
  const std::string arch = jit_arch_for(device());
  Layer L(Case{8, 2, 256, 128}, 42);
  const MoeShape shape = L.shape(16);
  auto first = make_jit_backend();
  std::string code;
  ASSERT_EQ(first->prepare(device(), shape, code), "");
  EXPECT_TRUE(code.starts_with("JIT " + arch + " in ")) << code;
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(cache.dir + "/jit")) {
    EXPECT_EQ(e.path().extension(), ".cubin") << e.path();  // no temporary left behind
    ++files;
  }
  EXPECT_EQ(files, 1);

  auto second = make_jit_backend();
  ASSERT_EQ(second->prepare(device(), shape, code), "");
  EXPECT_EQ(code, "JIT " + arch + " from disk cache");
  // The cached cubin computes the same thing.
  StepBuffers buf(L.c, 16);
  DevBuf<char> ws(second->workspace_bytes(shape));
  Stream st;
  const Step s = make_step(L.c, 16, 3);
  EXPECT_EQ(check_step(*second, L, s, reference(L, s), buf, ws.p, st.s), "");
}

// NVRTC needs no GPU: the embedded JIT source must compile for sm_90a on any machine (CI included), so that a
// kernel change that nvcc accepts but NVRTC does not (no CUDA headers there) fails here, not at a server's start.
TEST(CudaMoe, JitSourceCompilesForSm90aWithoutAGpu) {
  std::string cubin;
  MoeShape shape;
  shape.hidden = 2048;
  shape.inter = 768;
  // With the optional down GEMV depths too (compiled only when the shape or MOESERVE_MOE_DOWN_GEMV_STAGES takes one).
  const std::vector<std::string> options = jit_options("sm_90a", shape, /*depth_variants=*/true);
  const std::string r = jit_compile(jit_embedded_source(), options, cubin);
  EXPECT_EQ(r, "");
  EXPECT_GT(cubin.size(), size_t(10000));
  // Every kernel the JIT table looks up is in it.
  for (const char* name : {"moe_prep", "moe_combine", "moe_down_gemv", "moe_down_gemv_s2", "moe_down_gemv_s3",
                           "moe_down_gemv_s4", "moe_gemm_0_gu", "moe_gemm_0_dn", "moe_gemm_10_dn",
                           "moe_gemm_14_gu", "moe_gemm_14_dn"})
    EXPECT_NE(cubin.find(name), std::string::npos) << name;
}

// The fused backend's tile configuration by tokens an expert (no GPU needed) at Qwen3-30B-A3B's 128 experts / top-8
// (T x 8 / 128 tokens an expert), for a kernel table with sm_90a code (warp-specialized configurations allowed) and
// one without, under the default switches (the A/B runs of scripts/gpu-check.sh set some: skipped then).
TEST(CudaMoe, TileConfigurationBands) {
  for (const char* v : {"MOESERVE_MOE_WS", "MOESERVE_MOE_WS_MID", "MOESERVE_MOE_WS_DECODE", "MOESERVE_MOE_WS_PREFILL",
                        "MOESERVE_MOE_WS_PREFILL_MIN", "MOESERVE_MOE_SMALL_TILE_MAX", "MOESERVE_MOE_WGMMA"})
    if (std::getenv(v) != nullptr) GTEST_SKIP() << v << " is set";
  MoeShape s;
  s.num_experts = 128;
  s.top_k = 8;
  s.hidden = 2048;
  s.inter = 768;
  s.max_tokens = 8192;
  struct Row {
    int T, sm90a, other;
  };
  // Tokens an expert: 1 token direct; 1 (at most 2: the 32 x 16 tiles); 4, 8 (batched decode); 12.5, 32 (12-40: a
  // 512-token prompt); 64, 256 (40-256); 512 (an 8,192-token prompt step).
  for (const Row r : {Row{1, 0, 0}, Row{16, 0, 0}, Row{64, 12, 1}, Row{128, 12, 1}, Row{200, 8, 5}, Row{512, 8, 5},
                      Row{1024, 8, 6}, Row{4096, 8, 6}, Row{8192, 14, 6}}) {
    EXPECT_EQ(fused_layout(s, r.T, true).config, r.sm90a) << r.T << " tokens, sm_90a table";
    EXPECT_EQ(fused_layout(s, r.T, false).config, r.other) << r.T << " tokens, no sm_90a code";
  }
}

// The 1-token down GEMV's ring depth by shape (no GPU needed): the default 8 stages (143,872 B a CTA at inter 768:
// one CTA an SM of 228 KiB) where hidden / 16 CTAs fit one wave, else the 4-stage ring (78,336 B: two an SM), which
// keeps hidden 4,096's 256 CTAs one wave on 132 SMs; a forced depth as it is.
TEST(CudaMoe, DownGemvDepthKeepsTheGridOneWave) {
  using namespace moe_kernels;
  EXPECT_EQ(down_gemv_smem_bytes(768, 8), 143872);
  EXPECT_EQ(down_gemv_smem_bytes(768, 4), 78336);
  EXPECT_EQ(down_gemv_ctas_per_sm(768, 8), 1);
  EXPECT_EQ(down_gemv_ctas_per_sm(768, 4), 2);
  EXPECT_EQ(kDownGemvStageVariants[0], 8);
  EXPECT_EQ(kDownGemvStageVariants[kDownGemvFallbackVariant], 4);
  EXPECT_EQ(down_gemv_variant_for(2048, 768, 132, -1), 0);   // q30b: 128 CTAs
  EXPECT_EQ(down_gemv_variant_for(2112, 768, 132, -1), 0);   // 132 CTAs: still one wave
  EXPECT_EQ(down_gemv_variant_for(2128, 768, 132, -1), kDownGemvFallbackVariant);  // 133
  EXPECT_EQ(down_gemv_variant_for(4096, 768, 132, -1), kDownGemvFallbackVariant);  // 256 CTAs
  EXPECT_EQ(down_gemv_variant_for(4096, 768, 132, 0), 0);    // forced
  EXPECT_EQ(down_gemv_variant_for(2048, 768, 132, 1), 1);
  // Small rows: several 8-stage CTAs an SM (inter 64: 8 x (64 + 16,384 + 128) B = 132,608 B: still one).
  EXPECT_EQ(down_gemv_ctas_per_sm(64, 8), 1);
  EXPECT_EQ(down_gemv_ctas_per_sm(64, 2), 6);  // 34,304 B
}

TEST(CudaMoe, JitCompileFailureReturnsTheNvrtcLog) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  TempCacheDir cache;
  auto b = make_jit_backend("__global__ void moe_prep(int x) { this_is_not_declared(x); }\n");
  MoeShape shape;
  shape.num_experts = 8, shape.hidden = 256, shape.inter = 128, shape.top_k = 2, shape.max_tokens = 4;
  std::string code;
  const std::string reason = b->prepare(device(), shape, code);
  EXPECT_NE(reason.find("NVRTC compile failed"), std::string::npos) << reason;
  EXPECT_NE(reason.find("this_is_not_declared"), std::string::npos) << reason;  // the log itself
  EXPECT_LE(reason.size(), 2200u);
  EXPECT_EQ(code, "JIT " + jit_arch_for(device()) + " failed");
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace

// Not a test: a timing report for the Qwen3-30B-A3B MoE layer (E 128, top-8, hidden 2048, inter 768), printed
// for docs/PERF.md. Run with --gtest_also_run_disabled_tests --gtest_filter='*TimingReport*'. Eight layers' weights
// cycle so that L2 (60 MB) cannot hold them. The weights are random (one layer's, copied to the others): with
// constant weights (a memset, as before session 37) the tensor cores draw less power, and the compute-bound steps
// (prompts of thousands of tokens) ran faster than in a model - configuration 14's gain over 10 at 8,192 tokens
// was 8-11% here and ~2% in gpu_profile's prefill step (session 37). MOESERVE_TIMING_MEMSET=1: the memset form.
TEST(CudaMoe, DISABLED_TimingReport) {
  if (moeserve::cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  const Case c{128, 8, 2048, 768};
  constexpr int kLayers = 8, kRunsPerGraph = 16, kGraphLaunches = 5;
  constexpr double kNominalCopyBandwidth = 4.3e12;  // ../shared/GUIDE.md's H200 figure, bytes/s
  // The target's floor is the active weights read at the device's measured copy bandwidth: measured here, in the
  // same process, as a device-to-device copy of 1 GiB (bytes read + bytes written over the time, best of 10).
  const double copy_bandwidth = [] {
    const size_t n = size_t(1) << 30;
    DevBuf<char> a(n), b(n);
    MS_CUDA_CHECK(cudaMemset(a.p, 1, n));
    Stream st;
    cudaEvent_t e0, e1;
    MS_CUDA_CHECK(cudaEventCreate(&e0));
    MS_CUDA_CHECK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int i = 0; i < 11; ++i) {
      MS_CUDA_CHECK(cudaEventRecord(e0, st.s));
      MS_CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, n, cudaMemcpyDeviceToDevice, st.s));
      MS_CUDA_CHECK(cudaEventRecord(e1, st.s));
      MS_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      MS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (i > 0) best = std::min(best, ms);  // the first copy warms up
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 2.0 * double(n) / (best * 1e-3);
  }();
  std::cout << fmt::format("[   info   ] measured device copy bandwidth {:.2f} TB/s (GUIDE.md: {:.2f})\n",
                           copy_bandwidth * 1e-12, kNominalCopyBandwidth * 1e-12);
  std::vector<std::unique_ptr<DevBuf<uint16_t>>> gu, dn;
  const bool memset_weights = std::getenv("MOESERVE_TIMING_MEMSET") != nullptr;
  for (int l = 0; l < kLayers; ++l) {
    gu.push_back(std::make_unique<DevBuf<uint16_t>>(size_t(c.E) * 2 * c.I * c.H));
    dn.push_back(std::make_unique<DevBuf<uint16_t>>(size_t(c.E) * c.H * c.I));
    if (memset_weights) {
      MS_CUDA_CHECK(cudaMemset(gu.back()->p, 0x3c, gu.back()->n * 2));
      MS_CUDA_CHECK(cudaMemset(dn.back()->p, 0x3c, dn.back()->n * 2));
    } else if (l == 0) {  // the scale of a checkpoint's expert weights (~1 / sqrt(fan-in))
      const std::vector<uint16_t> w = random_bf16(gu[0]->n, 0.03f, 1234);
      MS_CUDA_CHECK(cudaMemcpy(gu[0]->p, w.data(), gu[0]->n * 2, cudaMemcpyHostToDevice));
      MS_CUDA_CHECK(cudaMemcpy(dn[0]->p, w.data(), dn[0]->n * 2, cudaMemcpyHostToDevice));  // dn is the smaller
    } else {
      MS_CUDA_CHECK(cudaMemcpy(gu.back()->p, gu[0]->p, gu[0]->n * 2, cudaMemcpyDeviceToDevice));
      MS_CUDA_CHECK(cudaMemcpy(dn.back()->p, dn[0]->p, dn[0]->n * 2, cudaMemcpyDeviceToDevice));
    }
  }
  std::cout << "[   info   ] " << device().name << ", MoE layer E128 top-8 H2048 I768, bf16\n";
  // MOESERVE_TIMING_T=N times only T = N (for ncu).
  std::vector<int> Ts = {1, 4, 16, 64, 128, 512, 2048, 8192};
  if (const char* e = std::getenv("MOESERVE_TIMING_T"); e != nullptr && std::atoi(e) > 0) Ts = {std::atoi(e)};
  for (int T : Ts) {
    MoeShape shape;
    shape.num_experts = c.E, shape.hidden = c.H, shape.inter = c.I, shape.top_k = c.k, shape.max_tokens = T;
    const Step s = make_step(c, T, 77 + T);
    std::vector<bool> active(c.E);
    for (int id : s.ids) active[id] = true;
    const double bytes = double(std::count(active.begin(), active.end(), true)) * 3.0 * c.H * c.I * 2;
    const double floor_us = bytes / copy_bandwidth * 1e6, nominal_floor_us = bytes / kNominalCopyBandwidth * 1e6;
    const double flops = 2.0 * T * c.k * 3.0 * c.H * c.I;
    StepBuffers buf(c, T);
    buf.upload(s);
    for (auto& b : make_moe_backends()) {
      std::string code;
      if (!b->prepare(device(), shape, code).empty()) continue;
      DevBuf<char> ws(b->workspace_bytes(shape));
      Stream st;
      auto run = [&](int i) {
        MoeWeights w;
        w.gate_up = gu[i % kLayers]->p;
        w.down = dn[i % kLayers]->p;
        b->run(reinterpret_cast<const bf16*>(buf.x.p), T, buf.ids.p, buf.w.p, w, reinterpret_cast<bf16*>(buf.out.p),
               ws.p, st.s);
      };
      cudaEvent_t e0, e1;
      MS_CUDA_CHECK(cudaEventCreate(&e0));
      MS_CUDA_CHECK(cudaEventCreate(&e1));
      float ms = 0;
      int runs = 0;
      if (b->spec().capturable) {
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        MS_CUDA_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < kRunsPerGraph; ++i) run(i);
        MS_CUDA_CHECK(cudaStreamEndCapture(st.s, &graph));
        MS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        MS_CUDA_CHECK(cudaGraphLaunch(exec, st.s));  // warm-up
        MS_CUDA_CHECK(cudaEventRecord(e0, st.s));
        for (int i = 0; i < kGraphLaunches; ++i) MS_CUDA_CHECK(cudaGraphLaunch(exec, st.s));
        MS_CUDA_CHECK(cudaEventRecord(e1, st.s));
        MS_CUDA_CHECK(cudaEventSynchronize(e1));
        runs = kRunsPerGraph * kGraphLaunches;
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      } else {
        run(0);
        MS_CUDA_CHECK(cudaEventRecord(e0, st.s));
        for (int i = 0; i < kRunsPerGraph; ++i) run(i);
        MS_CUDA_CHECK(cudaEventRecord(e1, st.s));
        MS_CUDA_CHECK(cudaEventSynchronize(e1));
        runs = kRunsPerGraph;
      }
      MS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      const double us = 1e3 * ms / runs;
      std::cout << fmt::format("[   info   ] T={:5d} {:18s} {:9.1f} us  {:7.0f} GB/s  {:6.1f} TFLOP/s  "
                               "floor {:7.1f} us (x{:.2f}; x{:.2f} at 4.3 TB/s), tile config {}\n",
                               T, b->spec().name, us, bytes / us * 1e-3, flops / us * 1e-6, floor_us, us / floor_us,
                               us / nominal_floor_us, fused_config_for(shape, T, is_hopper()));
    }
  }
}

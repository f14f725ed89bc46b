// The fused lm_head + argmax (cuda/sampling/lmhead_argmax.h) against the CPU
// (double sums: ids wherever the top two logits are apart by more than the f32 summation error, logprobs closely) and
// against cuBLAS + the greedy sampler on the full q30b8l vocabulary; DISABLED_Timing reports both forms at 16-64 rows.
// Skipped without an sm_90 GPU.
#include <gtest/gtest.h>
#include <cublas_v2.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda/model/backends.h"
#include "cuda/sampling/greedy.h"
#include "cuda/sampling/lmhead_argmax.h"
#include "cuda_test_util.h"

using namespace moeserve;
using cuda_test::Dev;

namespace {

std::vector<uint16_t> random_bf16(size_t n, float scale, uint32_t seed, float shift = 0.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = f32_to_bf16(d(g) + shift);
  return v;
}

bool usable(int rows, int K, int V) {
  if (cuda::list_devices().empty()) return false;
  return cuda::lmhead_argmax_supported(rows, K, V);
}

struct Result {
  std::vector<int32_t> ids;
  std::vector<float> lp;
};

Result run_fused(const Dev<uint16_t>& x, int M, int K, const Dev<uint16_t>& w, int V) {
  Dev<char> ws(cuda::lmhead_argmax_workspace_bytes(M, V));
  Dev<int32_t> ids(static_cast<size_t>(M));
  Dev<float> lp(static_cast<size_t>(M));
  ids.poison();
  lp.poison();
  cuda::lmhead_argmax(reinterpret_cast<const cuda::bf16*>(x.p), M, K, reinterpret_cast<const cuda::bf16*>(w.p), V, ids.p, lp.p,
                      ws.p, nullptr);
  MS_CUDA_CHECK(cudaDeviceSynchronize());
  return Result{ids.download(), lp.download()};
}

}  // namespace

TEST(LmheadArgmax, MatchesCpuArgmaxAndLogprob) {
  // Vocabularies that end inside a unit (192 rows), K of one slice and of several, 1-64 rows; the second half of the
  // cases has every logit negative (weights shifted below zero, x positive), so a unit's rows past V - read as
  // zeros - would win if they were not masked.
  for (const int V : {1, 190, 5000}) {
    for (const int K : {64, 320}) {
      for (const int M : {1, 3, 16, 64}) {
        for (const bool negative : {false, true}) {
          if (!usable(M, K, V)) GTEST_SKIP() << "needs an sm_90 GPU";
          const uint32_t seed = uint32_t(V * 131 + K * 7 + M + (negative ? 99 : 0));
          const std::vector<uint16_t> hx = negative ? random_bf16(size_t(M) * K, 0.5f, seed, 1.0f)
                                                    : random_bf16(size_t(M) * K, 1.0f, seed);
          const std::vector<uint16_t> hw = negative ? random_bf16(size_t(V) * K, 0.05f, seed + 1, -0.1f)
                                                    : random_bf16(size_t(V) * K, 0.1f, seed + 1);
          Dev<uint16_t> x(hx), w(hw);
          const Result r = run_fused(x, M, K, w, V);
          const std::string where = "V " + std::to_string(V) + " K " + std::to_string(K) + " M " + std::to_string(M) +
                                    (negative ? " negative" : "");
          for (int m = 0; m < M; ++m) {
            std::vector<double> lg(static_cast<size_t>(V));
            double mx = -INFINITY, second = -INFINITY, scale = 0;
            int arg = 0;
            for (int v = 0; v < V; ++v) {
              double s = 0;
              for (int k = 0; k < K; ++k)
                s += double(bf16_to_f32(hx[size_t(m) * K + k])) * double(bf16_to_f32(hw[size_t(v) * K + k]));
              lg[size_t(v)] = s;
              scale = std::max(scale, std::fabs(s));
              if (s > mx) second = mx, mx = s, arg = v;
              else if (s > second) second = s;
            }
            double sum = 0;
            for (double l : lg) sum += std::exp(l - mx);
            if (mx - second > 1e-5 * scale + 1e-6) {
              ASSERT_EQ(r.ids[size_t(m)], arg) << where << " row " << m;
            } else {
              ASSERT_GE(r.ids[size_t(m)], 0) << where << " row " << m;
              ASSERT_LT(r.ids[size_t(m)], V) << where << " row " << m;
            }
            ASSERT_NEAR(r.lp[size_t(m)], -std::log(sum), 2e-3) << where << " row " << m;
          }
        }
      }
    }
  }
}

// The full q30b8l lm_head against cuBLAS's f32 logits and the greedy sampler (the served path): the same ids but
// for near-ties of the two summation orders, the same logprobs within f32 noise.
TEST(LmheadArgmax, MatchesCublasAndGreedyOnTheFullVocabulary) {
  constexpr int V = 151936, K = 2048;
  for (const int M : {1, 16, 64}) {
    if (!usable(M, K, V)) GTEST_SKIP() << "needs an sm_90 GPU";
    const std::vector<uint16_t> hx = random_bf16(size_t(M) * K, 1.7f, 500 + uint32_t(M));
    const std::vector<uint16_t> hw = random_bf16(size_t(V) * K, 0.03f, 7);
    Dev<uint16_t> x(hx), w(hw);
    const Result r = run_fused(x, M, K, w, V);
    Dev<float> logits(static_cast<size_t>(M) * V);
    cublasHandle_t h;
    ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    const float one = 1.0f, zero = 0.0f;
    ASSERT_EQ(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, V, M, K, &one, w.p, CUDA_R_16BF, K, x.p, CUDA_R_16BF, K, &zero,
                           logits.p, CUDA_R_32F, V, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    cublasDestroy(h);
    Dev<int32_t> ids(static_cast<size_t>(M));
    Dev<float> lp(static_cast<size_t>(M));
    cuda::sample_greedy(logits.p, M, V, ids.p, lp.p, nullptr);
    MS_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> want = ids.download();
    const std::vector<float> want_lp = lp.download();
    const std::vector<float> hl = logits.download();
    for (int m = 0; m < M; ++m) {
      const float* row = hl.data() + size_t(m) * V;
      if (r.ids[size_t(m)] != want[size_t(m)]) {  // only a near-tie may differ
        EXPECT_NEAR(row[r.ids[size_t(m)]], row[want[size_t(m)]], 1e-4f * std::fabs(row[want[size_t(m)]]) + 1e-5f)
            << "M " << M << " row " << m << ": " << r.ids[size_t(m)] << " against " << want[size_t(m)];
      }
      EXPECT_NEAR(r.lp[size_t(m)], want_lp[size_t(m)], 1e-3f) << "M " << M << " row " << m;
    }
  }
}

// The backend report (what `moeserve backends` prints and the executor consults): on sm_90 the fast path is runnable
// and passes its startup self-test at the q30b8l hidden size; elsewhere it says why not and is never chosen.
TEST(LmheadArgmax, BackendReportSelfTestsIt) {
  if (cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  const cuda::DeviceInfo dev = cuda::list_devices().at(0);
  cuda::BackendRequest req;
  req.timed_trials = false;
  const cuda::SelectedBackends sel = cuda::select_backends(dev, cuda::ModelShapes{}, req);
  const cuda::BackendReport* rep = nullptr;
  for (const auto& r : sel.reports)
    if (r.spec.name == "lmhead_argmax") rep = &r;
  ASSERT_NE(rep, nullptr) << "no lmhead_argmax report";
  if (cuda::sm_version(dev) != 90) {
    EXPECT_FALSE(rep->status.runnable);
    EXPECT_FALSE(sel.lmhead_argmax);
    GTEST_SKIP() << "not sm_90: " << rep->status.reason;
  }
  ASSERT_TRUE(rep->status.runnable) << rep->status.reason;
  EXPECT_TRUE(rep->status.self_test_passed) << rep->status.self_test;
  EXPECT_EQ(rep->status.self_test.rfind("pass", 0), 0u) << rep->status.self_test;
  EXPECT_EQ(sel.lmhead_argmax, rep->status.self_test_passed);
}

// us a call of both forms (CUDA events over 50 back-to-back calls after a warm-up; the weights 622 MB, far beyond L2).
TEST(LmheadArgmax, DISABLED_Timing) {
  constexpr int V = 151936, K = 2048;
  if (!usable(64, K, V)) GTEST_SKIP() << "needs an sm_90 GPU";
  const std::vector<uint16_t> hw = random_bf16(size_t(V) * K, 0.03f, 7);
  Dev<uint16_t> w(hw);
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  void* gws = nullptr;
  MS_CUDA_CHECK(cudaMalloc(&gws, cuda::greedy_workspace_bytes()));
  MS_CUDA_CHECK(cudaMemset(gws, 0, cuda::greedy_workspace_bytes()));
  for (const int M : {1, 16, 32, 64}) {
    Dev<uint16_t> x(random_bf16(size_t(M) * K, 1.7f, 900 + uint32_t(M)));
    Dev<float> logits(static_cast<size_t>(M) * V);
    Dev<int32_t> ids(static_cast<size_t>(M));
    Dev<char> ws(cuda::lmhead_argmax_workspace_bytes(M, V));
    const float one = 1.0f, zero = 0.0f;
    auto cublas_form = [&] {
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, V, M, K, &one, w.p, CUDA_R_16BF, K, x.p, CUDA_R_16BF, K, &zero,
                   logits.p, CUDA_R_32F, V, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      cuda::sample_greedy(logits.p, M, V, ids.p, nullptr, nullptr, gws);
    };
    auto fused_form = [&] {
      cuda::lmhead_argmax(reinterpret_cast<const cuda::bf16*>(x.p), M, K, reinterpret_cast<const cuda::bf16*>(w.p), V, ids.p,
                          nullptr, ws.p, nullptr);
    };
    auto time_us = [&](auto&& f) {
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      for (int i = 0; i < 5; ++i) f();
      cudaEventRecord(e0);
      for (int i = 0; i < 50; ++i) f();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      return 1e3 * ms / 50;
    };
    const double c = time_us(cublas_form), f = time_us(fused_form);
    std::printf("[   info   ] M=%3d cublas+greedy %8.1f us (%.2f TB/s of weights)  fused %8.1f us (%.2f TB/s)\n", M, c,
                double(V) * K * 2 / c * 1e-6, f, double(V) * K * 2 / f * 1e-6);
    MS_CUDA_CHECK(cudaGetLastError());
  }
  cudaFree(gws);
  cublasDestroy(h);
}

// WsLinear (a dense linear layer on the MoE's warp-specialized decode tiles, split-K parts summed by the combine
// launch) against the CPU: odd token counts, one to several parts, the add + RMSNorm in the combine, outputs
// poisoned before each run, bitwise repeatable runs and CUDA graph replay. Skipped without an sm_90 GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/device.h"
#include "cuda/moe/moe.h"
#include "cuda/moe/moe_internal.h"

using namespace moeserve;
using namespace moeserve::cuda;

namespace {

template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { MS_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count * sizeof(T), 16))); }
  DevBuf(const DevBuf&) = delete;
  ~DevBuf() { cudaFree(p); }
  void upload(const std::vector<T>& v) {
    MS_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> v(n);
    MS_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  void poison() { MS_CUDA_CHECK(cudaMemset(p, 0xff, n * sizeof(T))); }  // bf16 / f32 NaN
};

std::vector<uint16_t> random_bf16(size_t n, float scale, uint64_t seed) {
  std::vector<uint16_t> v(n);
  uint64_t s = seed;
  for (auto& e : v) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    e = f32_to_bf16(scale * float(double(z >> 11) * 0x1.0p-53 * 2.0 - 1.0));
  }
  return v;
}

struct Case {
  int T, N, K, parts;
  bool norm;
};

// A blocking stream: ordered with the cudaMemcpy / cudaMemset of the legacy default stream.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { MS_CUDA_CHECK(cudaStreamCreate(&s)); }
  ~Stream() { cudaStreamDestroy(s); }
};

// Prepared on this GPU, or the reason to skip.
std::string prepared(WsLinear& ws) {
  if (list_devices().empty()) return "no CUDA device";
  const DeviceInfo dev = list_devices().at(0);
  if (sm_version(dev) != 90) return "the warp-specialized tiles are sm_90a code";
  return ws.prepare(dev);
}

TEST(CudaWsLinear, MatchesCpuAcrossTokenCountsAndParts) {
  WsLinear ws;
  if (std::string why = prepared(ws); !why.empty()) GTEST_SKIP() << why;
  const Case cases[] = {{1, 128, 64, 1, false},    {9, 256, 512, 1, false},   {37, 512, 1024, 2, true},
                        {64, 2048, 4096, 8, true}, {100, 640, 2048, 4, false}, {128, 1024, 2048, 2, true},
                        {77, 384, 4096, 16, false}, {70, 640, 2048, 1, true}};
  Stream st;
  for (const Case& c : cases) {
    const std::string where = fmt::format("T={} N={} K={} parts={} norm={}", c.T, c.N, c.K, c.parts, c.norm);
    ASSERT_EQ(ws.check(c.T, c.N, c.K, c.parts, c.norm), "") << where;
    const auto x = random_bf16(size_t(c.T) * c.K, 1.5f, 11 + c.T);
    const auto w = random_bf16(size_t(c.N) * c.K, std::sqrt(3.0f / float(c.K)), 97 + c.N);
    DevBuf<uint16_t> dx(x.size()), dw(w.size()), dout(size_t(c.T) * c.N), dxn(size_t(c.T) * c.N);
    DevBuf<char> dws(WsLinear::workspace_bytes(c.T, c.N, c.parts));
    dx.upload(x);
    dw.upload(w);
    // The reference: f32 products of the bf16 values, summed in double.
    std::vector<float> want(size_t(c.T) * c.N);
    for (int t = 0; t < c.T; ++t)
      for (int n = 0; n < c.N; ++n) {
        double acc = 0;
        for (int k = 0; k < c.K; ++k)
          acc += double(bf16_to_f32(x[size_t(t) * c.K + k])) * bf16_to_f32(w[size_t(n) * c.K + k]);
        want[size_t(t) * c.N + n] = float(acc);
      }
    std::vector<float> res(c.norm ? size_t(c.T) * c.N : 0);
    for (size_t i = 0; i < res.size(); ++i) res[i] = float(int(i * 7919 % 2001) - 1000) * 1e-3f;
    const auto nw = random_bf16(size_t(c.N), 1.5f, 4242);
    DevBuf<float> dres(std::max<size_t>(res.size(), 1));
    DevBuf<uint16_t> dnw(nw.size());
    dnw.upload(nw);
    auto run = [&](cudaStream_t s) {
      const CombineNorm norm{dres.p, reinterpret_cast<const bf16*>(dnw.p), 1e-6f, reinterpret_cast<bf16*>(dxn.p)};
      ws.run(reinterpret_cast<const bf16*>(dx.p), c.T, c.K, reinterpret_cast<const bf16*>(dw.p), c.N, c.parts, dws.p,
             reinterpret_cast<bf16*>(dout.p), c.norm ? &norm : nullptr, s);
    };
    auto fresh = [&] {
      dout.poison();
      dxn.poison();
      dws.poison();
      if (c.norm) dres.upload(res);
    };
    fresh();
    run(st.s);
    MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
    const auto got = dout.download();
    double err = 0;
    ASSERT_EQ(moe_compare(got.data(), want.data(), c.T, c.N, 1e-2, err), "") << where;
    if (c.norm) {
      const auto res_out = dres.download();
      const auto xn = dxn.download();
      for (int t = 0; t < c.T; ++t) {
        double ss = 0;
        for (int n = 0; n < c.N; ++n) {
          const size_t i = size_t(t) * c.N + n;
          ASSERT_EQ(res_out[i], res[i] + bf16_to_f32(got[i])) << where << " residual t " << t << " n " << n;
          ss += double(res_out[i]) * res_out[i];
        }
        const float inv = float(1.0 / std::sqrt(ss / c.N + 1e-6));
        for (int n = 0; n < c.N; ++n) {
          const size_t i = size_t(t) * c.N + n;
          const float want_xn = bf16_to_f32(f32_to_bf16(bf16_to_f32(nw[size_t(n)]) * (res_out[i] * inv)));
          ASSERT_NEAR(bf16_to_f32(xn[i]), want_xn, std::fabs(want_xn) * 1e-2 + 1e-6) << where << " xn t " << t;
        }
      }
    }
    // Bitwise repeatable, and the same bits from a replayed CUDA graph.
    fresh();
    run(st.s);
    MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
    EXPECT_TRUE(dout.download() == got) << where << ": a second run differs";
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    MS_CUDA_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
    run(st.s);
    MS_CUDA_CHECK(cudaStreamEndCapture(st.s, &graph));
    MS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    fresh();
    MS_CUDA_CHECK(cudaGraphLaunch(exec, st.s));
    MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
    EXPECT_TRUE(dout.download() == got) << where << ": the graph replay differs";
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

// The lm_head form: one part, f32 rows written by the GEMM (no combine); token counts of one and two tiles.
TEST(CudaWsLinear, F32RowsMatchCpu) {
  WsLinear ws;
  if (std::string why = prepared(ws); !why.empty()) GTEST_SKIP() << why;
  Stream st;
  for (const int T : {16, 100, 128}) {
    const int N = 1152, K = 2048;
    const auto x = random_bf16(size_t(T) * K, 1.5f, 5 + T);
    const auto w = random_bf16(size_t(N) * K, std::sqrt(3.0f / float(K)), 77);
    DevBuf<uint16_t> dx(x.size()), dw(w.size());
    DevBuf<float> dout(size_t(T) * N);
    dx.upload(x);
    dw.upload(w);
    dout.poison();
    ws.run_f32(reinterpret_cast<const bf16*>(dx.p), T, K, reinterpret_cast<const bf16*>(dw.p), N, dout.p, st.s);
    MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
    const auto got = dout.download();
    double scale = 0, worst = 0;
    std::vector<double> want(got.size());
    for (int t = 0; t < T; ++t)
      for (int n = 0; n < N; ++n) {
        double acc = 0;
        for (int k = 0; k < K; ++k)
          acc += double(bf16_to_f32(x[size_t(t) * K + k])) * bf16_to_f32(w[size_t(n) * K + k]);
        want[size_t(t) * N + n] = acc;
        scale = std::max(scale, std::fabs(acc));
      }
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << "T=" << T << " element " << i;
      worst = std::max(worst, std::fabs(got[i] - want[i]) / scale);
    }
    EXPECT_LT(worst, 1e-4) << "T=" << T << ": f32 accumulation of bf16 products";
  }
}

TEST(CudaWsLinear, UnsupportedSizesAreRefusedWithAReason) {
  WsLinear ws;
  EXPECT_NE(ws.check(64, 2048, 4096, 8, false), "");  // not prepared
  if (std::string why = prepared(ws); !why.empty()) GTEST_SKIP() << why;
  EXPECT_EQ(ws.check(64, 2048, 4096, 8, true), "");
  EXPECT_NE(ws.check(64, 2000, 4096, 8, false), "");  // rows not a multiple of 128
  EXPECT_NE(ws.check(64, 2048, 4096, 3, false), "");  // K not in equal parts
  EXPECT_NE(ws.check(64, 2048, 4096, 128, false), "");  // parts of 32 columns
  EXPECT_NE(ws.check(0, 2048, 4096, 8, false), "");
  EXPECT_NE(ws.check(64, 16384, 4096, 8, true), "");  // too wide for the combine's norm
}

}  // namespace

// Dense GEMM backends on the GPU: self-tests against the CPU reference, the gemv kernel against cuBLAS on
// the model's decode shapes, and CUDA-graph capture/replay. Skipped on machines without a GPU.
// The bandwidth table is a disabled test: run it with
//   tests/test_cuda_gemm --gtest_also_run_disabled_tests --gtest_filter='*Bandwidth*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/dtype.h"
#include "cuda/device.h"
#include "cuda_test_util.h"
#include "cuda/gemm/backends.h"
#include "cuda/gemm/gemm.h"

using namespace moeserve;
using cuda::OutType;

namespace {

using cuda_test::Dev;

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { MS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<uint16_t> r(n);
  for (auto& v : r) v = f32_to_bf16(u(g));
  return r;
}

std::unique_ptr<cuda::GemmBackend> prepared(std::unique_ptr<cuda::GemmBackend> b) {
  std::string code;
  const std::string why = b->prepare(cuda::list_devices().at(0), code);
  EXPECT_EQ(why, "") << b->spec().name << " cannot run here";
  return why.empty() ? std::move(b) : nullptr;
}

const cuda::bf16* as_bf16(const Dev<uint16_t>& d) { return reinterpret_cast<const cuda::bf16*>(d.p); }

// y [M, N] of two backends (f32 or bf16 as `out`) agree: two f32 accumulations in different orders, which a BF16
// output may round to neighbours; the tolerance scales with the row's largest |y|.
::testing::AssertionResult same_products(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, int M,
                                         int N, OutType out, const std::string& what) {
  auto at = [&](const std::vector<uint8_t>& v, size_t i) {
    if (out == OutType::F32) {
      float f;
      std::memcpy(&f, &v[i * 4], 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, &v[i * 2], 2);
    return bf16_to_f32(h);
  };
  for (int m = 0; m < M; ++m) {
    float scale = 1e-6f;
    for (int n = 0; n < N; ++n) scale = std::max(scale, std::fabs(at(want, size_t(m) * N + n)));
    for (int n = 0; n < N; ++n) {
      const size_t i = size_t(m) * N + n;
      const float g = at(got, i), r = at(want, i);
      const float tol = out == OutType::F32 ? 1e-4f * scale : 8e-3f * std::fabs(r) + 1e-4f * scale;
      if (!(std::isfinite(g) && std::fabs(g - r) <= tol))
        return ::testing::AssertionFailure() << what << " out=" << (out == OutType::F32 ? "f32" : "bf16") << ": y["
                                             << m << ", " << n << "] " << g << " against " << r << " (tolerance "
                                             << tol << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

TEST(CudaGemm, EveryBackendPassesItsSelfTest) {
  SKIP_WITHOUT_GPU();
  auto backends = cuda::make_gemm_backends();
  ASSERT_GE(backends.size(), 2u);
  for (auto& b : backends) {
    std::string code;
    const std::string why = b->prepare(cuda::list_devices().at(0), code);
    ASSERT_EQ(why, "") << b->spec().name << " cannot run here (" << code << ")";
    EXPECT_EQ(b->spec().family, cuda::OpFamily::Gemm);
    EXPECT_TRUE(b->spec().capturable);
    double max_err = -1;
    const std::string fail = cuda::gemm_self_test(*b, max_err);
    EXPECT_EQ(fail, "") << b->spec().name;
    std::printf("  %-9s %-40s max err %.3g (relative to the row's largest |y|)\n", b->spec().name.c_str(),
                code.c_str(), max_err);
  }
}

// The kernels for every M (the all-tokens kernel up to M = 128, the token-group loop above) instead of only
// M <= 64.
TEST(CudaGemm, GemvKernelPassesTheSelfTestForEveryTokenCount) {
  SKIP_WITHOUT_GPU();
  auto b = prepared(cuda::make_gemv_backend(1 << 20));
  ASSERT_TRUE(b);
  double max_err = -1;
  EXPECT_EQ(cuda::gemm_self_test(*b, max_err), "");
}

// The lm_head and projection shapes of the served models, M = decode batch sizes, against cuBLAS. The
// threshold is raised to 128 so that M = 128 runs the kernel too (M <= 64 runs as with the default).
TEST(CudaGemm, GemvMatchesCublasOnDecodeShapes) {
  SKIP_WITHOUT_GPU();
  auto gemv = prepared(cuda::make_gemv_backend(128));
  auto ref = prepared(std::move(cuda::make_gemm_backends().at(0)));  // cublas
  ASSERT_TRUE(gemv && ref);
  Stream st;
  struct Shape {
    int N, K;
  };
  for (Shape s : {Shape{151936, 2048}, Shape{4096, 2048}, Shape{5120, 2048}, Shape{2048, 4096}, Shape{512, 2048},
                  Shape{128, 2048}, Shape{4096, 4096}, Shape{8, 4096}, Shape{100, 264}}) {
    Dev<uint16_t> w(size_t(s.N) * s.K), x(size_t(128) * s.K);
    w.upload(random_bf16(w.n, 7 + s.N));
    x.upload(random_bf16(x.n, 11 + s.K));
    for (int M : {1, 2, 3, 5, 8, 9, 16, 33, 64, 128}) {
      for (OutType out : {OutType::F32, OutType::BF16}) {
        const size_t elt = out == OutType::F32 ? 4 : 2;
        Dev<uint8_t> y(size_t(M) * s.N * elt), y_ref(size_t(M) * s.N * elt);
        y.poison();
        y_ref.poison();
        gemv->run(as_bf16(x), s.K, M, s.K, as_bf16(w), s.N, y.p, s.N, out, st.s);
        ref->run(as_bf16(x), s.K, M, s.K, as_bf16(w), s.N, y_ref.p, s.N, out, st.s);
        MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
        ASSERT_TRUE(same_products(y.download(), y_ref.download(), M, s.N, out,
                                  fmt::format("N={} K={} M={} gemv against cuBLAS", s.N, s.K, M)));
      }
    }
  }
}

// The skinny wgmma GEMM (9-128 tokens) called directly against cuBLAS with row strides above K and N (an odd ldy:
// the scalar stores), N not a multiple of its 64-row tiles, K not a multiple of its 64-k slices, token counts on
// both sides of each token tile (16, 32, 64, 128), and the split counts these shapes pick (1 to 8 CTAs a cluster).
TEST(CudaGemm, SkinnyGemmMatchesCublasWithStrides) {
  SKIP_WITHOUT_GPU();
  if (!cuda::skinny_gemm_supported(cuda::list_devices().at(0))) GTEST_SKIP() << "no sm_90a wgmma here";
  auto ref = prepared(std::move(cuda::make_gemm_backends().at(0)));  // cublas
  ASSERT_TRUE(ref);
  EXPECT_FALSE(cuda::skinny_gemm_fits(129, 2048, 2048, nullptr, nullptr));
  EXPECT_FALSE(cuda::skinny_gemm_fits(64, 2044, 2048, nullptr, nullptr));
  Stream st;
  struct Shape {
    int N, K;
  };
  for (Shape s : {Shape{5120, 2048}, Shape{2048, 4096}, Shape{77, 136}, Shape{130, 8}, Shape{1000, 520}}) {
    const int ldx = s.K + 8, ldy = s.N + 3;
    Dev<uint16_t> w(size_t(s.N) * s.K), x(size_t(128) * ldx);
    w.upload(random_bf16(w.n, 17 + s.N));
    x.upload(random_bf16(x.n, 19 + s.K));
    for (int M : {9, 16, 17, 32, 33, 64, 100, 128}) {
      for (OutType out : {OutType::F32, OutType::BF16}) {
        const size_t elt = out == OutType::F32 ? 4 : 2;
        Dev<uint8_t> y(size_t(M) * ldy * elt), y_ref(size_t(M) * ldy * elt);
        y.poison();
        y_ref.poison();
        cuda::skinny_gemm(as_bf16(x), ldx, M, s.K, as_bf16(w), s.N, y.p, ldy, out, st.s);
        ref->run(as_bf16(x), ldx, M, s.K, as_bf16(w), s.N, y_ref.p, ldy, out, st.s);
        MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
        // Compare the N columns of every row (the padding past N is neither's).
        auto pack = [&](const std::vector<uint8_t>& v) {
          std::vector<uint8_t> r(size_t(M) * s.N * elt);
          for (int m = 0; m < M; ++m) std::memcpy(&r[size_t(m) * s.N * elt], &v[size_t(m) * ldy * elt], s.N * elt);
          return r;
        };
        ASSERT_TRUE(same_products(pack(y.download()), pack(y_ref.download()), M, s.N, out,
                                  fmt::format("N={} K={} M={} skinny against cuBLAS", s.N, s.K, M)));
      }
    }
  }
}

// The streaming kernel for vocabulary-sized W (gemv_stream: persistent warps, rings across row blocks) against
// cuBLAS: the lm_head shapes of the served models, shapes whose row blocks do not split evenly over the warps, with
// fewer row blocks than warps, a last row block cut short and K not a multiple of the 64-k slice; x with a row
// stride above K; every token count of one group, both output types; outputs poisoned first.
TEST(CudaGemm, StreamingGemvMatchesCublas) {
  SKIP_WITHOUT_GPU();
  auto ref = prepared(std::move(cuda::make_gemm_backends().at(0)));  // cublas
  ASSERT_TRUE(ref);
  EXPECT_FALSE(cuda::gemv_stream_fits(9, 2048));
  EXPECT_FALSE(cuda::gemv_stream_fits(1, 2044));
  EXPECT_TRUE(cuda::gemv_stream_fits(8, 4096));
  Stream st;
  struct Shape {
    int N, K;
  };
  for (Shape s : {Shape{151936, 2048}, Shape{151936, 4096}, Shape{100003, 2056}, Shape{37, 72}, Shape{2000, 264}}) {
    const int ldx = s.K + 8;
    Dev<uint16_t> w(size_t(s.N) * s.K), x(size_t(8) * ldx);
    w.upload(random_bf16(w.n, 5 + s.N));
    x.upload(random_bf16(x.n, 3 + s.K));
    for (int M = 1; M <= 8; ++M) {
      for (OutType out : {OutType::F32, OutType::BF16}) {
        const size_t elt = out == OutType::F32 ? 4 : 2;
        Dev<uint8_t> y(size_t(M) * s.N * elt), y_ref(size_t(M) * s.N * elt);
        y.poison();
        y_ref.poison();
        cuda::gemv_stream(as_bf16(x), ldx, M, s.K, as_bf16(w), s.N, y.p, s.N, out, st.s);
        ref->run(as_bf16(x), ldx, M, s.K, as_bf16(w), s.N, y_ref.p, s.N, out, st.s);
        MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
        ASSERT_TRUE(same_products(y.download(), y_ref.download(), M, s.N, out,
                                  fmt::format("N={} K={} M={} streaming gemv against cuBLAS", s.N, s.K, M)));
      }
    }
  }
}

// gemv_stream_norm_in (a decode step's final norm inside the lm_head launch) computes bitwise what gemv_stream
// computes on the rows gemv_norm_in normalizes from the same residual and partial sums (those rows are checked
// against the CPU in ResidualGemvsMatchCpu, gemv_stream against cuBLAS above): every M of one group, H with a last
// part of fewer than 16 rows, both output types, y poisoned first.
TEST(CudaGemm, StreamingGemvNormInMatchesNormInRows) {
  SKIP_WITHOUT_GPU();
  Stream st;
  uint32_t seed = 4242;
  for (auto [H, N] : {std::pair{2048, 151936}, std::pair{520, 1001}}) {
    const int parts = cuda::residual_gemv_parts(H);
    std::mt19937 g(seed++);
    std::normal_distribution<float> nd(0, 1);
    std::vector<float> res(size_t(8) * H), part(size_t(8) * parts, 0.f);
    for (auto& v : res) v = nd(g) * 3.0f;
    for (int t = 0; t < 8; ++t)
      for (int n = 0; n < H; ++n) part[size_t(t) * parts + n / 16] += res[size_t(t) * H + n] * res[size_t(t) * H + n];
    const auto nw = random_bf16(size_t(H), seed++, 1.5f);
    const auto w = random_bf16(size_t(N) * H, seed++, 0.05f);
    const auto w2 = random_bf16(size_t(16) * H, seed++, 0.05f);
    Dev<float> d_res(res), d_part(part), d_y2(size_t(8) * 16);
    Dev<uint16_t> d_nw(nw), d_w(w), d_w2(w2), d_xn(size_t(8) * H);
    for (int M = 1; M <= 8; ++M) {
      for (OutType out : {OutType::F32, OutType::BF16}) {
        const size_t elt = out == OutType::F32 ? 4 : 2;
        Dev<uint8_t> y(size_t(M) * N * elt), y_rows(size_t(M) * N * elt);
        y.poison();
        y_rows.poison();
        d_xn.poison();
        cuda::gemv_norm_in(d_res.p, d_part.p, parts, as_bf16(d_nw), 1e-6f, M, H, as_bf16(d_w2), 16, d_y2.p, 16,
                           OutType::F32, reinterpret_cast<cuda::bf16*>(d_xn.p), st.s);
        cuda::gemv_stream(as_bf16(d_xn), H, M, H, as_bf16(d_w), N, y_rows.p, N, out, st.s);
        cuda::gemv_stream_norm_in(d_res.p, d_part.p, parts, as_bf16(d_nw), 1e-6f, M, H, as_bf16(d_w), N, y.p, N, out,
                                  st.s);
        MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
        const auto got = y.download(), want = y_rows.download();
        size_t first_bad = got.size();
        for (size_t i = 0; i < got.size() && first_bad == got.size(); ++i)
          if (got[i] != want[i]) first_bad = i;
        ASSERT_EQ(first_bad, got.size()) << "H " << H << " N " << N << " M " << M << " out "
                                         << (out == OutType::F32 ? "f32" : "bf16") << ": byte " << first_bad
                                         << " differs from gemv_stream on gemv_norm_in's rows";
      }
    }
    // The rows are not all zero (the comparison above would then prove little).
    const auto xn = d_xn.download();
    EXPECT_TRUE(std::any_of(xn.begin(), xn.end(), [](uint16_t v) { return (v & 0x7fff) != 0; }));
  }
}

// cuBLASLt with token buckets (above 256 tokens one algorithm per bucket of 256, chosen for the bucket's largest M
// and checked with cublasLtMatmulAlgoCheck for each exact M): token counts that share a bucket, first seen in either
// order, and the bucket's own M, against cuBLAS (cublasGemmEx, its own algorithm choice) on a mixed step's q/k/v and
// o_proj shapes.
TEST(CudaGemm, CublasLtTokenBucketsMatchCublas) {
  SKIP_WITHOUT_GPU();
  auto ref = prepared(cuda::make_cublas_backend());
  auto lt = prepared(cuda::make_cublaslt_backend(true));
  ASSERT_TRUE(ref && lt);
  Stream st;
  for (auto [N, K] : {std::pair{5120, 2048}, std::pair{2048, 4096}}) {
    const int max_m = 8448;
    Dev<uint16_t> w(size_t(N) * K), x(size_t(max_m) * K);
    w.upload(random_bf16(w.n, 3 + N));
    x.upload(random_bf16(x.n, 5 + K));
    for (int M : {300, 257, 512, 511, 513, 1000, 8209, 8448, 256}) {
      for (OutType out : {OutType::F32, OutType::BF16}) {
        const size_t elt = out == OutType::F32 ? 4 : 2;
        Dev<uint8_t> y(size_t(M) * N * elt), y_ref(size_t(M) * N * elt);
        y.poison();
        y_ref.poison();
        lt->run(as_bf16(x), K, M, K, as_bf16(w), N, y.p, N, out, st.s);
        ref->run(as_bf16(x), K, M, K, as_bf16(w), N, y_ref.p, N, out, st.s);
        MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
        ASSERT_TRUE(same_products(y.download(), y_ref.download(), M, N, out,
                                  fmt::format("N={} K={} M={} cuBLASLt against cuBLAS", N, K, M)));
      }
    }
  }
}

// The startup warm-up's token counts (no GPU needed): with buckets, every count up to max_m has its algorithm's
// count in the list - itself up to 256, else its bucket's top (a multiple of 256, or max_m for the last bucket) -
// each once and none above max_m; without buckets, 1..256. The gemv backend warms what its cuBLASLt serves.
TEST(CudaGemm, WarmUpTokensCoverEveryTokenCount) {
  for (int max_m : {1, 100, 256, 257, 1000, 8192, 8209}) {
    const std::vector<int> ms = cuda::make_cublaslt_backend(true)->warm_up_tokens(max_m);
    std::set<int> have(ms.begin(), ms.end());
    EXPECT_EQ(have.size(), ms.size()) << "duplicates at max_m " << max_m;
    EXPECT_LE(*have.rbegin(), max_m);
    for (int M = 1; M <= max_m; ++M) {
      const int rep = M <= 256 ? M : std::min((M + 255) / 256 * 256, max_m);
      ASSERT_TRUE(have.count(rep)) << "M " << M << " (its algorithm's count " << rep << ") at max_m " << max_m;
    }
    std::set<int> needed;
    for (int M = 1; M <= max_m; ++M) needed.insert(M <= 256 ? M : std::min((M + 255) / 256 * 256, max_m));
    EXPECT_EQ(have, needed) << "max_m " << max_m;
    const std::vector<int> exact = cuda::make_cublaslt_backend(false)->warm_up_tokens(max_m);
    ASSERT_EQ(int(exact.size()), std::min(max_m, 256));
    for (size_t i = 0; i < exact.size(); ++i) EXPECT_EQ(exact[i], int(i) + 1);
  }
  EXPECT_EQ(cuda::make_gemv_backend()->warm_up_tokens(1000), cuda::make_cublaslt_backend()->warm_up_tokens(1000));
  EXPECT_TRUE(cuda::make_cublas_backend()->warm_up_tokens(1000).empty());
}

// A GEMM recorded in a CUDA graph and replayed gives bit-identical results to the eager call; the second
// shape is first seen during capture (cuBLASLt then plans it inside the capture). M pairs: gemv's small-M
// kernel, its all-tokens kernel split-K (K = 264: 5 splits on 132 SMs, through the scratch and the reduction
// kernel) and, with the threshold raised to 128, M = 128 and 9 (16 and 2 token tiles).
// The decode-step fusion of the residual add + RMSNorm into the GEMV: y against an f64 reference of
// bf16(rmsnorm(residual + delta) * w) . W (the normalized row rounded to bf16 on the CPU the same way), the
// residual updated exactly once, and the counter left at zero (each shape runs twice on one counter).
TEST(CudaGemm, NormGemvMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Stream st;
  EXPECT_FALSE(cuda::norm_gemv_fits(5, 2048));
  EXPECT_FALSE(cuda::norm_gemv_fits(1, 4100));
  EXPECT_FALSE(cuda::norm_gemv_fits(1, 8192));
  Dev<int> counter(1);
  MS_CUDA_CHECK(cudaMemset(counter.p, 0, 4));
  uint32_t seed = 77;
  for (auto [M, K, N] : {std::tuple{1, 2048, 5120}, {2, 512, 37}, {3, 4096, 1000}, {4, 64, 16}, {4, 2048, 129}})
    for (bool with_delta : {true, false})
      for (int call = 0; call < 2; ++call) {
        const std::string where = fmt::format("M {} K {} N {} delta {} call {}", M, K, N, with_delta, call);
        std::mt19937 g(seed++);
        std::normal_distribution<float> nd(0, 1);
        std::vector<float> res(size_t(M) * K);
        for (auto& v : res) v = nd(g) * 3.0f;
        const auto delta = random_bf16(size_t(M) * K, seed++, 2.0f);
        const auto nw = random_bf16(size_t(K), seed++, 1.5f);
        const auto w = random_bf16(size_t(N) * K, seed++, 0.05f);
        Dev<float> d_res(res.size());
        Dev<uint16_t> d_delta(delta.size()), d_nw(nw.size()), d_w(w.size()), d_y(size_t(M) * N);
        d_res.upload(res);
        d_delta.upload(delta);
        d_nw.upload(nw);
        d_w.upload(w);
        d_y.poison();
        cuda::norm_gemv(d_res.p, with_delta ? as_bf16(d_delta) : nullptr, as_bf16(d_nw), 1e-6f, M, K, as_bf16(d_w), N,
                        reinterpret_cast<cuda::bf16*>(d_y.p), N, counter.p, st.s);
        MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
        const auto y = d_y.download();
        const auto res_out = d_res.download();
        int bad = 0;
        for (int t = 0; t < M; ++t) {
          std::vector<float> x(K);
          double ss = 0;
          for (int k = 0; k < K; ++k) {
            x[k] = res[size_t(t) * K + k] + (with_delta ? bf16_to_f32(delta[size_t(t) * K + k]) : 0.0f);
            ss += double(x[k]) * x[k];
            const float want_res = with_delta ? x[k] : res[size_t(t) * K + k];
            ASSERT_EQ(res_out[size_t(t) * K + k], want_res) << where << " residual t " << t << " k " << k;
          }
          const float inv = float(1.0 / std::sqrt(ss / K + 1e-6));
          std::vector<float> xn(K);
          for (int k = 0; k < K; ++k) xn[k] = bf16_to_f32(f32_to_bf16(bf16_to_f32(nw[k]) * (x[k] * inv)));
          for (int n = 0; n < N; ++n) {
            double want = 0, mag = 0;
            for (int k = 0; k < K; ++k) {
              const double p = double(xn[k]) * bf16_to_f32(w[size_t(n) * K + k]);
              want += p;
              mag += std::fabs(p);
            }
            const float got = bf16_to_f32(y[size_t(t) * N + n]);
            // bf16 output (2^-8 relative) plus a rounding flip of a normalized input element.
            const double tol = 8e-3 * std::fabs(want) + 2e-2 * mag / std::sqrt(double(K)) + 1e-3;
            if (!(std::fabs(got - want) <= tol) && ++bad <= 5)
              ADD_FAILURE() << where << " t " << t << " n " << n << ": got " << got << ", want " << want;
          }
        }
        ASSERT_EQ(bad, 0) << where << ": outputs out of tolerance";
        EXPECT_EQ(counter.download()[0], 0) << where << ": the counter is left at zero";
      }
}

// The residual fusion's pair of GEMVs, as a decode step chains them: gemv_residual_out (o_proj: y, residual += y,
// the partial sums of squares) then gemv_norm_in (q/k/v or the router: the RMSNorm from those partials) against
// the CPU: the residual update exactly, the partials and the normalized rows to f32 / bf16 rounding, y as the
// other GEMV tests.
TEST(CudaGemm, ResidualGemvsMatchCpu) {
  SKIP_WITHOUT_GPU();
  Stream st;
  EXPECT_FALSE(cuda::residual_gemv_fits(9, 2048));
  EXPECT_FALSE(cuda::residual_gemv_fits(1, 4100));
  EXPECT_EQ(cuda::residual_gemv_parts(2048), 128);
  EXPECT_EQ(cuda::residual_gemv_parts(520), 33);
  uint32_t seed = 991;
  struct Case {
    int M, K1, H, N2;
    bool f32_out, xn_out;
  };
  for (const Case c : {Case{1, 4096, 2048, 5120, false, false}, Case{3, 512, 520, 37, false, true},
                       Case{8, 64, 2048, 128, true, true}, Case{1, 2048, 2048, 128, true, true}}) {
    const std::string where = fmt::format("M {} K1 {} H {} N2 {}", c.M, c.K1, c.H, c.N2);
    const int parts = cuda::residual_gemv_parts(c.H);
    std::mt19937 g(seed++);
    std::normal_distribution<float> nd(0, 1);
    std::vector<float> res(size_t(c.M) * c.H);
    for (auto& v : res) v = nd(g) * 3.0f;
    const auto x = random_bf16(size_t(c.M) * c.K1, seed++, 1.0f);
    const auto w1 = random_bf16(size_t(c.H) * c.K1, seed++, 0.05f);
    const auto nw = random_bf16(size_t(c.H), seed++, 1.5f);
    const auto w2 = random_bf16(size_t(c.N2) * c.H, seed++, 0.05f);
    Dev<float> d_res(res.size()), d_part(size_t(c.M) * parts), d_y2f(size_t(c.M) * c.N2);
    Dev<uint16_t> d_x(x.size()), d_w1(w1.size()), d_nw(nw.size()), d_w2(w2.size()), d_y(size_t(c.M) * c.H),
        d_y2(size_t(c.M) * c.N2), d_xn(size_t(c.M) * c.H);
    d_res.upload(res);
    d_x.upload(x);
    d_w1.upload(w1);
    d_nw.upload(nw);
    d_w2.upload(w2);
    d_y.poison();
    d_y2.poison();
    d_y2f.poison();
    d_xn.poison();
    d_part.poison();
    cuda::gemv_residual_out(as_bf16(d_x), c.K1, c.M, c.K1, as_bf16(d_w1), c.H, reinterpret_cast<cuda::bf16*>(d_y.p),
                            c.H, d_res.p, d_part.p, st.s);
    void* y2 = c.f32_out ? static_cast<void*>(d_y2f.p) : static_cast<void*>(d_y2.p);
    cuda::gemv_norm_in(d_res.p, d_part.p, parts, as_bf16(d_nw), 1e-6f, c.M, c.H, as_bf16(d_w2), c.N2, y2, c.N2,
                       c.f32_out ? OutType::F32 : OutType::BF16,
                       c.xn_out ? reinterpret_cast<cuda::bf16*>(d_xn.p) : nullptr, st.s);
    MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
    const auto y = d_y.download();
    const auto res_out = d_res.download();
    const auto part = d_part.download();
    const auto xn_gpu = d_xn.download();
    const auto y2b = d_y2.download();
    const auto y2f = d_y2f.download();
    int bad = 0;
    for (int t = 0; t < c.M; ++t) {
      // o_proj: y against the CPU, the residual exactly res + float(y), the partials from that residual.
      for (int n = 0; n < c.H; ++n) {
        double want = 0, mag = 0;
        for (int k = 0; k < c.K1; ++k) {
          const double p = double(bf16_to_f32(x[size_t(t) * c.K1 + k])) * bf16_to_f32(w1[size_t(n) * c.K1 + k]);
          want += p;
          mag += std::fabs(p);
        }
        const float got = bf16_to_f32(y[size_t(t) * c.H + n]);
        if (!(std::fabs(got - want) <= 8e-3 * std::fabs(want) + 1e-3 * mag + 1e-4) && ++bad <= 5)
          ADD_FAILURE() << where << " o_proj t " << t << " n " << n << ": got " << got << ", want " << want;
        ASSERT_EQ(res_out[size_t(t) * c.H + n], res[size_t(t) * c.H + n] + got) << where << " residual " << n;
      }
      double ss = 0;
      for (int b = 0; b < parts; ++b) {
        double want = 0;
        for (int n = 16 * b; n < std::min(c.H, 16 * b + 16); ++n)
          want += double(res_out[size_t(t) * c.H + n]) * res_out[size_t(t) * c.H + n];
        ss += want;
        ASSERT_NEAR(part[size_t(t) * parts + b], want, 1e-5 * want + 1e-6) << where << " part " << b;
      }
      // The norm from the partials, then the second GEMV.
      const float inv = float(1.0 / std::sqrt(ss / c.H + 1e-6));
      std::vector<float> xn(size_t(c.H));
      for (int k = 0; k < c.H; ++k) {
        xn[k] = bf16_to_f32(f32_to_bf16(bf16_to_f32(nw[k]) * (res_out[size_t(t) * c.H + k] * inv)));
        if (c.xn_out) {
          const float got = bf16_to_f32(xn_gpu[size_t(t) * c.H + k]);
          ASSERT_NEAR(got, xn[k], std::fabs(xn[k]) * 1e-2 + 1e-6) << where << " xn t " << t << " k " << k;
        }
      }
      for (int n = 0; n < c.N2; ++n) {
        double want = 0, mag = 0;
        for (int k = 0; k < c.H; ++k) {
          const double p = double(xn[k]) * bf16_to_f32(w2[size_t(n) * c.H + k]);
          want += p;
          mag += std::fabs(p);
        }
        const float got = c.f32_out ? y2f[size_t(t) * c.N2 + n] : bf16_to_f32(y2b[size_t(t) * c.N2 + n]);
        const double tol = (c.f32_out ? 1e-4 : 8e-3) * std::fabs(want) + 2e-2 * mag / std::sqrt(double(c.H)) + 1e-3;
        if (!(std::fabs(got - want) <= tol) && ++bad <= 5)
          ADD_FAILURE() << where << " norm_in t " << t << " n " << n << ": got " << got << ", want " << want;
      }
    }
    ASSERT_EQ(bad, 0) << where << ": outputs out of tolerance";
  }
}

TEST(CudaGemm, CudaGraphReplayMatchesEagerRun) {
  SKIP_WITHOUT_GPU();
  auto backends = cuda::make_gemm_backends();
  backends.push_back(cuda::make_gemv_backend(128));
  for (auto& backend : backends) {
    auto b = prepared(std::move(backend));
    ASSERT_TRUE(b);
    const std::string name = b->spec().name;
    for (auto [M1, M2] : {std::pair{7, 3}, std::pair{64, 33}, std::pair{128, 9}}) {
      const int N = 513, K = 264;
      Dev<uint16_t> w(size_t(N) * K), x(size_t(M1) * K);
      w.upload(random_bf16(w.n, 3));
      x.upload(random_bf16(x.n, 5));
      Dev<float> y1(size_t(M1) * N), y2(size_t(M2) * N), e1(size_t(M1) * N), e2(size_t(M2) * N);
      Stream st;
      e1.poison();
      e2.poison();
      b->run(as_bf16(x), K, M1, K, as_bf16(w), N, e1.p, N, OutType::F32, st.s);
      MS_CUDA_CHECK(cudaStreamSynchronize(st.s));

      cudaGraph_t graph = nullptr;
      MS_CUDA_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
      try {
        b->run(as_bf16(x), K, M1, K, as_bf16(w), N, y1.p, N, OutType::F32, st.s);
        b->run(as_bf16(x), K, M2, K, as_bf16(w), N, y2.p, N, OutType::F32, st.s);
      } catch (const std::exception& e) {
        cudaStreamEndCapture(st.s, &graph);
        if (graph) cudaGraphDestroy(graph);
        FAIL() << name << " M=" << M1 << ", " << M2 << ": GEMM failed while capturing: " << e.what();
      }
      MS_CUDA_CHECK(cudaStreamEndCapture(st.s, &graph));
      cudaGraphExec_t exec = nullptr;
      MS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      y1.poison();
      y2.poison();
      MS_CUDA_CHECK(cudaGraphLaunch(exec, st.s));
      MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
      b->run(as_bf16(x), K, M2, K, as_bf16(w), N, e2.p, N, OutType::F32, st.s);
      MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
      MS_CUDA_CHECK(cudaGraphExecDestroy(exec));
      MS_CUDA_CHECK(cudaGraphDestroy(graph));
      for (auto [got, want, M] : {std::tuple{&y1, &e1, M1}, std::tuple{&y2, &e2, M2}}) {
        const auto g = got->download(), e = want->download();
        for (size_t i = 0; i < g.size(); ++i)
          ASSERT_TRUE(std::memcmp(&g[i], &e[i], 4) == 0 && std::isfinite(g[i]))
              << name << " M=" << M << ": replayed y[" << i / N << ", " << i % N << "] = " << g[i] << ", eager "
              << e[i];
      }
    }
  }
}

// The skinny GEMM against cuBLASLt on the batched-decode shapes, with its launch plan; prints a table (no
// assertion). Under ncu: --kernel-name regex:skinny.
TEST(CudaGemmBench, DISABLED_SkinnyTiming) {
  SKIP_WITHOUT_GPU();
  if (!cuda::skinny_gemm_supported(cuda::list_devices().at(0))) GTEST_SKIP() << "no sm_90a wgmma here";
  auto lt = prepared(std::move(cuda::make_gemm_backends().at(1)));  // cublaslt
  ASSERT_TRUE(lt);
  Stream st;
  for (auto [N, K] : {std::pair{5120, 2048}, std::pair{2048, 4096}, std::pair{128, 2048}, std::pair{151936, 2048}}) {
    Dev<uint16_t> w(size_t(N) * K), x(size_t(128) * K);
    w.upload(random_bf16(w.n, 1));
    x.upload(random_bf16(x.n, 2));
    Dev<uint16_t> y(size_t(128) * N * 2);
    for (int M : {16, 64, 128}) {
      double us[2];
      for (int v = 0; v < 2; ++v) {
        us[v] = cuda::event_time_us(st.s, N > 100000 ? 10 : 50, [&] {
          if (v == 0) cuda::skinny_gemm(as_bf16(x), K, M, K, as_bf16(w), N, y.p, N, OutType::BF16, st.s);
          else lt->run(as_bf16(x), K, M, K, as_bf16(w), N, y.p, N, OutType::BF16, st.s);
        }, 3);
      }
      std::printf("skinny N %6d K %5d M %3d: %7.1f us (%4.0f GB/s), cuBLASLt %7.1f us; %s\n", N, K, M, us[0],
                  double(N) * K * 2 / (us[0] * 1e3), us[1],
                  cuda::skinny_gemm_describe(M, N, K, OutType::BF16).c_str());
    }
  }
}

// Bytes of W per second for the decode shapes, every backend; prints a table (no assertion). The last
// column is gemv with its threshold raised to 128 (the default sends M = 128 to cuBLAS).
TEST(CudaGemmBench, DISABLED_Bandwidth) {
  SKIP_WITHOUT_GPU();
  std::vector<std::unique_ptr<cuda::GemmBackend>> bs;
  std::vector<std::string> names;
  auto all = cuda::make_gemm_backends();
  all.push_back(cuda::make_gemv_backend(128));
  for (auto& b : all) {
    names.push_back(names.size() + 1 == all.size() ? "gemv128" : b->spec().name);
    bs.push_back(prepared(std::move(b)));
    ASSERT_TRUE(bs.back());
  }
  Stream st;
  std::printf("%8s %6s %3s", "N", "K", "M");
  for (const auto& n : names) std::printf(" %18s", (n + " GB/s (us)").c_str());
  std::printf("\n");
  for (auto [N, K] : {std::pair{151936, 2048}, std::pair{151936, 4096}, std::pair{4096, 2048}, std::pair{5120, 2048},
                      std::pair{2048, 4096}, std::pair{512, 2048}, std::pair{128, 2048}, std::pair{4096, 4096},
                      std::pair{512, 4096}}) {
    Dev<uint16_t> w(size_t(N) * K), x(size_t(128) * K);
    w.upload(random_bf16(w.n, 1));
    x.upload(random_bf16(x.n, 2));
    Dev<uint16_t> y(size_t(128) * N);
    for (int M : {1, 2, 4, 8, 16, 64, 128}) {
      std::printf("%8d %6d %3d", N, K, M);
      for (auto& b : bs) {
        const double us = cuda::event_time_us(
            st.s, 50, [&] { b->run(as_bf16(x), K, M, K, as_bf16(w), N, y.p, N, OutType::BF16, st.s); }, 3);
        std::printf(" %8.0f (%5.1fus)", double(N) * K * 2 / (us * 1e-6) / 1e9, us);
      }
      std::printf("\n");
    }
  }
}

// The lm_head over a prompt-logprob step's slices of logit rows (151936 x 2048, F32 logits, as GpuQwen3::head_chunk
// runs it): microseconds a slice and a row by slice size, every backend; prints a table (no assertion).
TEST(CudaGemmBench, DISABLED_LmHeadSlices) {
  SKIP_WITHOUT_GPU();
  const int N = 151936, K = 2048;
  std::vector<std::unique_ptr<cuda::GemmBackend>> bs;
  for (auto& b : cuda::make_gemm_backends()) bs.push_back(prepared(std::move(b)));
  Stream st;
  Dev<uint16_t> w(size_t(N) * K), x(size_t(1024) * K);
  w.upload(random_bf16(w.n, 1));
  x.upload(random_bf16(x.n, 2));
  Dev<float> y(size_t(1024) * N);
  std::printf("%5s", "M");
  for (auto& b : bs) std::printf(" %24s", (b->spec().name + " us (us a row)").c_str());
  std::printf("\n");
  for (int M : {128, 160, 256, 512, 1024}) {
    std::printf("%5d", M);
    for (auto& b : bs) {
      const double us = cuda::event_time_us(
          st.s, 10, [&] { b->run(as_bf16(x), K, M, K, as_bf16(w), N, y.p, N, OutType::F32, st.s); }, 2);
      std::printf(" %15.1f (%5.2f)", us, us / M);
    }
    std::printf("\n");
  }
}

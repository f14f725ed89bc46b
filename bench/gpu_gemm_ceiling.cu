// What cuBLAS reaches on the prefill step's expert GEMMs, as a ceiling to set the MoE backend's figure beside
// (test_cuda_moe's DISABLED_TimingReport at MOESERVE_TIMING_T=8192): before building a faster grouped GEMM, find
// out whether the library's kernels do better on these shapes at all. For q30b8l's MoE layer (128 experts, hidden
// 2,048, moe_intermediate 768) at T tokens an expert (512 in an 8,192-token prefill step with top-8):
//   gate/up  y[T, 1536] = x[T, 2048] . W[1536, 2048]^T, 128 experts
//   down     y[T, 2048] = a[T, 768]  . W[2048, 768]^T,  128 experts
// each as cublasGemmStridedBatchedEx (equal counts), as cublasGemmGroupedBatchedEx (128 groups of one, the form
// a MoE with uneven counts would take) and, for scale, as one dense GEMM of 128 T rows against one expert's
// weights. BF16 in and out, f32 accumulation (as the MoE kernels). Inputs are random (weights uniform in
// +-sqrt(3 / k), activations in +-1.7, as test_cuda_moe's TimingReport): a tensor core's power follows its operands'
// bit activity, and at the H200's 700 W limit constant operands run at full clock where a model's data throttles
// (docs/PERF.md, session 37); --memset fills 0x3c3c everywhere, the form of sessions 22-37. Weights of 8 layers
// cycle so that L2 holds none of them between runs.
//   gpu_gemm_ceiling [--tokens 256,512,1024] [--reps 10] [--memset]
// Prints one line a (form, GEMM, T): us a layer and TFLOP/s. A benchmark, not a test: the figures go to
// docs/PERF.md.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "bench_ptx.cuh"
#include "core/error.h"
#include "cuda/common.h"
#include "gpu_timer.h"

namespace {

constexpr int kExperts = 128, kHidden = 2048, kInter = 768, kLayers = 8;

void check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + " failed: " + cublasGetStatusString(st));
}

struct Gemm {
  const char* name;
  int n, k;  // y[T, n] = x[T, k] . W[n, k]^T
};

__nv_bfloat16* dev_alloc(size_t n) {
  __nv_bfloat16* p = nullptr;
  MS_CUDA_CHECK(cudaMalloc(&p, n * sizeof(__nv_bfloat16)));
  return p;
}

// An input of n values, random in +-scale (or all 0x3c3c ~ 0.011 with memset: finite, never denormal).
__nv_bfloat16* dev_input(size_t n, bool memset, float scale, unsigned seed) {
  __nv_bfloat16* p = dev_alloc(n);
  if (memset) {
    MS_CUDA_CHECK(cudaMemset(p, 0x3c, n * sizeof(__nv_bfloat16)));
  } else {
    bench_ptx::fill_bf16_kernel<<<1024, 256>>>(p, n, scale, seed);  // the benchmarks' hashed uniform fill
    MS_CUDA_CHECK(cudaGetLastError());
  }
  return p;
}

}  // namespace

static int run(int argc, char** argv) {
  std::vector<int> tokens = {256, 512, 1024};
  int reps = 10;
  bool memset = false;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--tokens" && i + 1 < argc) {
      tokens.clear();
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');) tokens.push_back(std::atoi(t.c_str()));
    } else if (s == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (s == "--memset") {
      memset = true;
    } else {
      std::fprintf(stderr, "usage: gpu_gemm_ceiling [--tokens 256,512,1024] [--reps 10] [--memset]\n");
      return 2;
    }
  }
  for (int t : tokens)
    if (t < 1 || t > 4096) {
      std::fprintf(stderr, "--tokens: each 1..4096\n");
      return 2;
    }
  if (reps < 1) return 2;
  cudaStream_t st;
  MS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cublasHandle_t h;
  check(cublasCreate(&h), "cublasCreate");
  check(cublasSetStream(h, st), "cublasSetStream");
  void* ws = nullptr;
  const size_t ws_bytes = size_t(64) << 20;
  MS_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  check(cublasSetWorkspace(h, ws, ws_bytes), "cublasSetWorkspace");
  cudaDeviceProp prop{};
  MS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s: cuBLAS on the MoE layer's expert GEMMs (128 experts, hidden 2048, inter 768), BF16, %s inputs, "
              "best of %d\n",
              prop.name, memset ? "memset" : "random", reps);
  std::printf("%-10s %-8s %6s %10s %9s\n", "form", "gemm", "T", "us", "TFLOP/s");

  const Gemm gemms[2] = {{"gate/up", 2 * kInter, kHidden}, {"down", kHidden, kInter}};
  int max_t = 0;
  for (int t : tokens) max_t = std::max(max_t, t);
  moeserve::bench::GpuTimer timer;
  const float alpha = 1.0f, beta = 0.0f;
  for (const Gemm& g : gemms) {
    std::vector<__nv_bfloat16*> w(kLayers);
    unsigned seed = 1;
    for (auto& p : w) p = dev_input(size_t(kExperts) * g.n * g.k, memset, std::sqrt(3.0f / g.k), seed++);
    __nv_bfloat16* x = dev_input(size_t(kExperts) * max_t * g.k, memset, 1.7f, seed++);
    __nv_bfloat16* y = dev_alloc(size_t(kExperts) * max_t * g.n);  // written by every GEMM (beta 0)
    MS_CUDA_CHECK(cudaDeviceSynchronize());
    // Pointer arrays of the grouped form, one set a layer.
    std::vector<const void**> a_dev(kLayers), b_dev(kLayers);
    std::vector<void**> c_dev(kLayers);
    for (int l = 0; l < kLayers; ++l) {
      MS_CUDA_CHECK(cudaMalloc(&a_dev[l], kExperts * sizeof(void*)));
      MS_CUDA_CHECK(cudaMalloc(&b_dev[l], kExperts * sizeof(void*)));
      MS_CUDA_CHECK(cudaMalloc(&c_dev[l], kExperts * sizeof(void*)));
    }
    for (int T : tokens) {
      const double flops = 2.0 * kExperts * T * double(g.n) * g.k;
      auto row = [&](const char* form, double s) {
        std::printf("%-10s %-8s %6d %10.1f %9.1f\n", form, g.name, T, s * 1e6, flops / s * 1e-12);
      };
      int layer = 0;
      // Column-major view: y^T[n, T] = W[n, k] (stored k x n, op T) . x^T (k x T, op N).
      auto strided = [&] {
        check(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, g.n, T, g.k, &alpha, w[layer++ % kLayers],
                                         CUDA_R_16BF, g.k, int64_t(g.n) * g.k, x, CUDA_R_16BF, g.k, int64_t(T) * g.k,
                                         &beta, y, CUDA_R_16BF, g.n, int64_t(T) * g.n, kExperts, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT),
              "cublasGemmStridedBatchedEx");
      };
      row("strided", timer.best(reps, strided, st));
      for (int l = 0; l < kLayers; ++l) {
        std::vector<const void*> a(kExperts), b(kExperts);
        std::vector<void*> c(kExperts);
        for (int e = 0; e < kExperts; ++e) {
          a[e] = w[l] + size_t(e) * g.n * g.k;
          b[e] = x + size_t(e) * T * g.k;
          c[e] = y + size_t(e) * T * g.n;
        }
        MS_CUDA_CHECK(cudaMemcpy(a_dev[l], a.data(), kExperts * sizeof(void*), cudaMemcpyHostToDevice));
        MS_CUDA_CHECK(cudaMemcpy(b_dev[l], b.data(), kExperts * sizeof(void*), cudaMemcpyHostToDevice));
        MS_CUDA_CHECK(cudaMemcpy(c_dev[l], c.data(), kExperts * sizeof(void*), cudaMemcpyHostToDevice));
      }
      std::vector<cublasOperation_t> ta(kExperts, CUBLAS_OP_T), tb(kExperts, CUBLAS_OP_N);
      std::vector<int> m(kExperts, g.n), n(kExperts, T), k(kExperts, g.k), lda(kExperts, g.k), ldb(kExperts, g.k),
          ldc(kExperts, g.n), size(kExperts, 1);
      std::vector<float> al(kExperts, 1.0f), be(kExperts, 0.0f);
      auto grouped = [&] {
        const int l = layer++ % kLayers;
        check(cublasGemmGroupedBatchedEx(h, ta.data(), tb.data(), m.data(), n.data(), k.data(), al.data(), a_dev[l],
                                         CUDA_R_16BF, lda.data(), b_dev[l], CUDA_R_16BF, ldb.data(), be.data(),
                                         c_dev[l], CUDA_R_16BF, ldc.data(), kExperts, size.data(),
                                         CUBLAS_COMPUTE_32F),
              "cublasGemmGroupedBatchedEx");
      };
      row("grouped", timer.best(reps, grouped, st));
      // One dense GEMM with all 128 T rows against one expert's weights (same flops, weights read once).
      auto dense = [&] {
        check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, g.n, kExperts * T, g.k, &alpha, w[layer++ % kLayers],
                           CUDA_R_16BF, g.k, x, CUDA_R_16BF, g.k, &beta, y, CUDA_R_16BF, g.n, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
      };
      row("dense", timer.best(reps, dense, st));
    }
    for (int l = 0; l < kLayers; ++l) {
      cudaFree(a_dev[l]);
      cudaFree(b_dev[l]);
      cudaFree(c_dev[l]);
    }
    for (auto* p : w) cudaFree(p);
    cudaFree(x);
    cudaFree(y);
  }
  cublasDestroy(h);
  cudaFree(ws);
  cudaStreamDestroy(st);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_gemm_ceiling: %s\n", e.what());
    return 1;
  }
}

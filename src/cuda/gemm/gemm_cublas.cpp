// The cuBLAS and cuBLASLt backends. Row-major y[M, N] = x[M, K] . W[N, K]^T is, seen column-major,
// y^T[N, M] = W^T' . x^T where W's storage is the column-major [K, N] matrix (op T) and x's the [K, M] one
// (op N): no copies, the checkpoint layout is used as is.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "core/env.h"
#include "core/log.h"
#include "cuda/gemm/backends.h"

namespace moeserve::cuda {
namespace {

// Fixed at prepare(): cuBLAS must not allocate while a CUDA graph is being captured. 32 MiB covers the
// split-K and stream-K workspaces cuBLAS asks for on Hopper.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

const char* out_name(OutType t) { return t == OutType::BF16 ? "bf16" : "f32"; }

std::string shape_text(int M, int N, int K, int64_t ldx, int64_t ldy, OutType out) {
  return fmt::format("M={} N={} K={} ldx={} ldy={} out={}", M, N, K, ldx, ldy, out_name(out));
}

std::string status_text(cublasStatus_t st) {
  return fmt::format("{} ({})", cublasGetStatusName(st), cublasGetStatusString(st));
}

void check_cublas(cublasStatus_t st, const char* what, const std::string& shape) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw InternalError(fmt::format("{} failed for {}: {}", what, shape, status_text(st)));
}

void check_args(int M, int K, int N, int64_t ldx, int64_t ldy) {
  MS_CHECK(M >= 0 && N >= 0 && K >= 0, "negative GEMM size M={} N={} K={}", M, N, K);
  MS_CHECK(ldx >= K && ldy >= N, "GEMM strides too small: ldx={} < K={} or ldy={} < N={}", ldx, K, ldy, N);
}

// K = 0 makes y zero; the libraries reject zero-sized layouts, so this path never reaches them.
void zero_output(void* y, int64_t ldy, int M, int N, OutType out, cudaStream_t stream) {
  const size_t elt = out == OutType::BF16 ? 2 : 4;
  MS_CUDA_CHECK(cudaMemset2DAsync(y, size_t(ldy) * elt, 0, size_t(N) * elt, size_t(M), stream));
}

// The fixed workspace a library backend takes in prepare() (run() must not allocate: graph capture). "" or why not.
std::string allocate_workspace(const char* lib, void*& ws) {
  if (cudaError_t e = cudaMalloc(&ws, kWorkspaceBytes); e != cudaSuccess) {
    cudaGetLastError();
    ws = nullptr;
    return fmt::format("cannot allocate the {} MiB {} workspace: {}", kWorkspaceBytes >> 20, lib,
                       cudaGetErrorString(e));
  }
  return "";
}

class CublasBackend final : public GemmBackend {
 public:
  CublasBackend() {
    spec_.name = "cublas";
    spec_.family = OpFamily::Gemm;
    spec_.formats = {"bf16"};
    spec_.capturable = true;
    spec_.summary = "cublasGemmEx, BF16 inputs, f32 accumulation, BF16 or F32 output";
  }
  ~CublasBackend() override {
    if (workspace_) cudaFree(workspace_);
    if (handle_) cublasDestroy(handle_);
  }
  const BackendSpec& spec() const override { return spec_; }

  std::string prepare(const DeviceInfo& dev, std::string& code) override {
    int major = 0, minor = 0, patch = 0;
    cublasGetProperty(MAJOR_VERSION, &major);
    cublasGetProperty(MINOR_VERSION, &minor);
    cublasGetProperty(PATCH_LEVEL, &patch);
    code = fmt::format("cuBLAS {}.{}.{}", major, minor, patch);
    if (handle_) return "";
    if (std::string why = check_arch_claim(spec_, dev); !why.empty()) return why;
    cublasHandle_t h = nullptr;
    if (cublasStatus_t st = cublasCreate(&h); st != CUBLAS_STATUS_SUCCESS)
      return "cublasCreate failed: " + status_text(st);
    // f32 accumulation all the way: split-K partial sums must not be reduced in BF16.
    cublasSetMathMode(h, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    void* ws = nullptr;
    if (std::string why = allocate_workspace("cuBLAS", ws); !why.empty()) {
      cublasDestroy(h);
      return why;
    }
    handle_ = h;
    workspace_ = ws;
    return "";
  }

  void run(const bf16* x, int64_t ldx, int M, int K, const bf16* W, int N, void* y, int64_t ldy, OutType out,
           cudaStream_t stream) override {
    MS_CHECK(handle_ != nullptr, "GEMM backend cublas used before prepare()");
    check_args(M, K, N, ldx, ldy);
    if (M == 0 || N == 0) return;
    if (K == 0) return zero_output(y, ldy, M, N, out, stream);
    if (!bound_ || stream != stream_) {
      // cublasSetStream resets the workspace to cuBLAS's own pool, which allocates during capture: set ours
      // again after it.
      const std::string shape = shape_text(M, N, K, ldx, ldy, out);
      check_cublas(cublasSetStream(handle_, stream), "cublasSetStream", shape);
      check_cublas(cublasSetWorkspace(handle_, workspace_, kWorkspaceBytes), "cublasSetWorkspace", shape);
      stream_ = stream;
      bound_ = true;
    }
    const float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t st = cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, W, CUDA_R_16BF, K, x,
                                     CUDA_R_16BF, int(ldx), &beta, y,
                                     out == OutType::BF16 ? CUDA_R_16BF : CUDA_R_32F, int(ldy), CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
      throw InternalError(fmt::format("cublasGemmEx failed for {}: {}", shape_text(M, N, K, ldx, ldy, out),
                                      status_text(st)));
  }

 private:
  BackendSpec spec_;
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool bound_ = false;
};

// Largest power of two (<= 256) dividing the address: cuBLASLt's heuristic assumes 256-byte aligned
// buffers unless told otherwise, and an algorithm chosen under that assumption may reject a row view.
uint32_t pointer_alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  return uint32_t(std::min<uintptr_t>(256, a & (~a + 1)));
}

class CublasLtBackend final : public GemmBackend {
 public:
  explicit CublasLtBackend(bool m_buckets) : m_buckets_(m_buckets) {
    spec_.name = "cublaslt";
    spec_.family = OpFamily::Gemm;
    spec_.formats = {"bf16"};
    spec_.capturable = true;
    spec_.summary = m_buckets ? "cublasLtMatmul, BF16 inputs, f32 accumulation, heuristic algorithm cached per shape "
                                "(above 256 tokens per bucket of 256)"
                              : "cublasLtMatmul, BF16 inputs, f32 accumulation, heuristic algorithm cached per shape";
  }
  ~CublasLtBackend() override {
    for (auto& [key, p] : plans_) destroy(p);
    if (workspace_) cudaFree(workspace_);
    if (handle_) cublasLtDestroy(handle_);
  }
  const BackendSpec& spec() const override { return spec_; }

  std::string prepare(const DeviceInfo& dev, std::string& code) override {
    const size_t v = cublasLtGetVersion();
    code = fmt::format("cuBLASLt {}.{}.{}", v / 10000, v / 100 % 100, v % 100);
    if (handle_) return "";
    if (std::string why = check_arch_claim(spec_, dev); !why.empty()) return why;
    cublasLtHandle_t h = nullptr;
    if (cublasStatus_t st = cublasLtCreate(&h); st != CUBLAS_STATUS_SUCCESS)
      return "cublasLtCreate failed: " + status_text(st);
    void* ws = nullptr;
    if (std::string why = allocate_workspace("cuBLASLt", ws); !why.empty()) {
      cublasLtDestroy(h);
      return why;
    }
    handle_ = h;
    workspace_ = ws;
    return "";
  }

  void run(const bf16* x, int64_t ldx, int M, int K, const bf16* W, int N, void* y, int64_t ldy, OutType out,
           cudaStream_t stream) override {
    MS_CHECK(handle_ != nullptr, "GEMM backend cublaslt used before prepare()");
    check_args(M, K, N, ldx, ldy);
    if (M == 0 || N == 0) return;
    if (K == 0) return zero_output(y, ldy, M, N, out, stream);
    const Key key{M, N, K, ldx, ldy, int(out), pointer_alignment(x), pointer_alignment(W), pointer_alignment(y)};
    auto it = plans_.find(key);
    if (it == plans_.end()) it = plans_.emplace(key, make_plan(key)).first;
    Plan& p = it->second;
    const float alpha = 1.0f, beta = 0.0f;
    auto matmul = [&] {
      return cublasLtMatmul(handle_, p.op, &alpha, W, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace_,
                            kWorkspaceBytes, stream);
    };
    cublasStatus_t st = matmul();
    if (st != CUBLAS_STATUS_SUCCESS && p.from_bucket) {
      // The M bucket's algorithm passed cublasLtMatmulAlgoCheck but the library refused it here: the heuristic for
      // this exact shape from now on.
      log_debug("cuBLASLt: the M bucket's algorithm failed for {} ({}); choosing one for this shape",
                shape_text(M, N, K, ldx, ldy, out), status_text(st));
      p.algo = heuristic(key, p);
      p.from_bucket = false;
      st = matmul();
    }
    if (st != CUBLAS_STATUS_SUCCESS)
      throw InternalError(fmt::format("cublasLtMatmul failed for {}: {}", shape_text(M, N, K, ldx, ldy, out),
                                      status_text(st)));
  }

 private:
  // Shape, strides, output type and buffer alignments: everything the heuristic's choice depends on.
  using Key = std::tuple<int, int, int, int64_t, int64_t, int, uint32_t, uint32_t, uint32_t>;
  // FP8 / NVFP4 plans will add the A/B scale-pointer attributes (CUBLASLT_MATMUL_DESC_A_SCALE_POINTER...)
  // to `op`; the scale pointers then become part of run()'s arguments, not of the key.
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool from_bucket = false;  // algo is the M bucket's (bucket_m), checked for this shape
  };

  // Every count up to kExactM, then one a bucket (its largest, or max_m): with buckets, the algorithms of every
  // count up to max_m; without, those up to kExactM only (each larger count has an algorithm of its own).
  std::vector<int> warm_up_tokens(int max_m) const override {
    std::vector<int> ms;
    for (int m = 1; m <= std::min(max_m, kExactM); ++m) ms.push_back(m);
    if (m_buckets_)
      for (int b = kExactM + kBucketM; b - kBucketM < max_m; b += kBucketM) ms.push_back(std::min(b, max_m));
    return ms;
  }

  // With m_buckets_, token counts above kExactM share one algorithm per bucket of kBucketM (rounded up): the
  // heuristic (cublasLtMatmulAlgoGetHeuristic, a host call on the launching thread) then runs once per bucket and
  // shape instead of once per distinct token count, which mixed prompt + decode steps vary at every step. The
  // decode-sized counts CUDA graphs capture keep their own.
  static constexpr int kExactM = 256, kBucketM = 256;
  int bucket_m(int M) const { return !m_buckets_ || M <= kExactM ? M : (M + kBucketM - 1) / kBucketM * kBucketM; }

  static void destroy(Plan& p) {
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.op) cublasLtMatmulDescDestroy(p.op);
    p = Plan{};
  }

  // The operation and the three layouts of `key`'s shape (destroyed by the caller, also when this throws).
  static void describe(const Key& key, Plan& p) {
    const auto [M, N, K, ldx, ldy, out_i, align_x, align_w, align_y] = key;
    const OutType out = OutType(out_i);
    const std::string shape = shape_text(M, N, K, ldx, ldy, out);
    check_cublas(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate", shape);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    check_cublas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
                 "cublasLtMatmulDescSetAttribute(TRANSA)", shape);
    check_cublas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
                 "cublasLtMatmulDescSetAttribute(TRANSB)", shape);
    check_cublas(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, uint64_t(K), uint64_t(N), int64_t(K)),
                 "cublasLtMatrixLayoutCreate(W)", shape);
    check_cublas(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, uint64_t(K), uint64_t(M), ldx),
                 "cublasLtMatrixLayoutCreate(x)", shape);
    check_cublas(cublasLtMatrixLayoutCreate(&p.c, out == OutType::BF16 ? CUDA_R_16BF : CUDA_R_32F, uint64_t(N),
                                            uint64_t(M), ldy),
                 "cublasLtMatrixLayoutCreate(y)", shape);
  }

  // The heuristic's first algorithm for `key` described by `p`.
  cublasLtMatmulAlgo_t heuristic(const Key& key, const Plan& p) {
    const auto [M, N, K, ldx, ldy, out_i, align_x, align_w, align_y] = key;
    const std::string shape = shape_text(M, N, K, ldx, ldy, OutType(out_i));
    const auto t0 = std::chrono::steady_clock::now();
    cublasLtMatmulPreference_t pref = nullptr;
    check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", shape);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    try {
      const uint64_t ws = kWorkspaceBytes;
      // Split-K partial sums reduced in f32 only, never in the BF16 output type.
      const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      const auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, const void* v, size_t n) {
        check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, attr, v, n), "cublasLtMatmulPreferenceSetAttribute",
                     shape);
      };
      set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
      set_pref(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof(reduction));
      set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_w, sizeof(align_w));
      set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_x, sizeof(align_x));
      set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_y, sizeof(align_y));
      set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_y, sizeof(align_y));
      check_cublas(cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found),
                   "cublasLtMatmulAlgoGetHeuristic", shape);
    } catch (...) {
      cublasLtMatmulPreferenceDestroy(pref);
      throw;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0)
      throw InternalError(fmt::format("cuBLASLt has no algorithm for {} (buffer alignment x {} W {} y {} bytes)",
                                      shape, align_x, align_w, align_y));
    log_debug("cuBLASLt: algorithm for {} chosen in {:.2f} ms", shape,
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    return result.algo;
  }

  Plan make_plan(const Key& key) {
    Plan p;
    try {
      describe(key, p);
      const int M = std::get<0>(key), bm = bucket_m(M);
      if (bm != M) {
        Key bk = key;
        std::get<0>(bk) = bm;
        auto it = bucket_algos_.find(bk);
        if (it == bucket_algos_.end()) {
          Plan rep;  // the bucket's representative shape (its largest M)
          try {
            describe(bk, rep);
            it = bucket_algos_.emplace(bk, heuristic(bk, rep)).first;
          } catch (...) {
            destroy(rep);
            throw;
          }
          destroy(rep);
        }
        cublasLtMatmulHeuristicResult_t check{};
        if (cublasLtMatmulAlgoCheck(handle_, p.op, p.a, p.b, p.c, p.c, &it->second, &check) == CUBLAS_STATUS_SUCCESS &&
            check.workspaceSize <= kWorkspaceBytes) {
          p.algo = it->second;
          p.from_bucket = true;
          return p;
        }
      }
      p.algo = heuristic(key, p);
    } catch (...) {
      destroy(p);
      throw;
    }
    return p;
  }

  BackendSpec spec_;
  const bool m_buckets_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  // Filled on first use of a shape (a host-only call, so also allowed while capturing); never evicted: a
  // model has a handful of shapes times the token counts its steps take (layouts only, a few hundred bytes each;
  // the algorithm comes from bucket_algos_ above kExactM).
  std::map<Key, Plan> plans_;
  std::map<Key, cublasLtMatmulAlgo_t> bucket_algos_;  // key with M = bucket_m(M)
};

}  // namespace

std::unique_ptr<GemmBackend> make_cublas_backend() { return std::make_unique<CublasBackend>(); }
std::unique_ptr<GemmBackend> make_cublaslt_backend(bool m_buckets) {
  return std::make_unique<CublasLtBackend>(m_buckets);
}
std::unique_ptr<GemmBackend> make_cublaslt_backend() {
  static const bool m_buckets = env_flag("MOESERVE_CUBLASLT_M_BUCKETS", true);
  return make_cublaslt_backend(m_buckets);
}

std::vector<std::unique_ptr<GemmBackend>> make_gemm_backends() {
  std::vector<std::unique_ptr<GemmBackend>> r;
  r.push_back(make_cublas_backend());
  r.push_back(make_cublaslt_backend());
  r.push_back(make_gemv_backend());
  return r;
}

}  // namespace moeserve::cuda

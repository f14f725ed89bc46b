// The "gemv" backend: decode-sized GEMMs (M <= 8 tokens) are bound by reading W once, so the kernel streams
// W with 16-byte loads and lets tensor cores do the (nearly free) math: mma.m16n8k16 with 16 weight rows as
// the MMA's M dimension and up to 8 tokens as its N dimension. Larger M (prefill) goes to cuBLAS, which is
// compute-bound there and better at it.
//
// The reduction order over k does not matter, so each lane feeds the MMA the k values it loaded itself
// (8 consecutive ones per 16-byte load) instead of the canonical fragment layout: lane (g = lane/4,
// q = lane%4) loads W rows g and g+8 and token g at k = base + 8q .. base + 8q + 7; the first MMA of the pair
// takes elements 0-3 of that chunk as its virtual k {2q, 2q+1, 2q+8, 2q+9}, the second elements 4-7. A and B
// agree on the mapping (it depends on q only), so the products pair up exactly.
#include <fmt/format.h>

#include "cuda/gemm/backends.h"

namespace moeserve::cuda {
namespace {

constexpr int kWarps = 8;            // per block; they split K
constexpr int kRows = 16;            // W rows per block: the MMA's M
constexpr int kTokens = 8;           // tokens per block: the MMA's N
constexpr int kKPerIteration = 64;   // per warp and iteration: two 16-byte chunks per lane and row

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// W is read exactly once: stream it past L1. x is re-read by every block: keep it cached.
__device__ __forceinline__ uint4 load_weight(const bf16* p) { return __ldcs(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ uint4 load_token(const bf16* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// Block (blockIdx.x, blockIdx.y) computes rows [16 bx, 16 bx + 16) for tokens [8 by, 8 by + 8). Needs
// K % 8 == 0, ldx % 8 == 0 and 16-byte aligned x and W (checked on the host).
template <typename OutT>
__global__ void __launch_bounds__(kWarps * 32) gemv_bf16_kernel(const bf16* __restrict__ x, int64_t ldx, int M,
                                                                 int K, const bf16* __restrict__ W, int N,
                                                                 OutT* __restrict__ y, int64_t ldy) {
  __shared__ float partial[kWarps][kRows][kTokens];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;
  const int n0 = blockIdx.x * kRows, t0 = blockIdx.y * kTokens;
  const int tokens = min(kTokens, M - t0);
  // Rows past N read row N-1 (valid memory) and are never stored: no branch in the streaming loop.
  const bf16* w_lo = W + int64_t(min(n0 + g, N - 1)) * K + 8 * q;
  const bf16* w_hi = W + int64_t(min(n0 + g + 8, N - 1)) * K + 8 * q;
  const bool has_token = g < tokens;
  const bf16* xt = x + int64_t(t0 + (has_token ? g : 0)) * ldx + 8 * q;

  float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
  for (int k0 = warp * kKPerIteration; k0 < K; k0 += kWarps * kKPerIteration) {
    uint4 a_lo[2], a_hi[2], b[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int k = k0 + 32 * h;
      const bool in = k + 8 * q < K;
      a_lo[h] = in ? load_weight(w_lo + k) : make_uint4(0, 0, 0, 0);
      a_hi[h] = in ? load_weight(w_hi + k) : make_uint4(0, 0, 0, 0);
      b[h] = in && has_token ? load_token(xt + k) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mma_bf16(c, a_lo[h].x, a_hi[h].x, a_lo[h].y, a_hi[h].y, b[h].x, b[h].y);
      mma_bf16(c, a_lo[h].z, a_hi[h].z, a_lo[h].w, a_hi[h].w, b[h].z, b[h].w);
    }
  }
  // c[0], c[1]: row g, tokens 2q, 2q+1; c[2], c[3]: row g+8, same tokens.
  partial[warp][g][2 * q] = c[0];
  partial[warp][g][2 * q + 1] = c[1];
  partial[warp][g + 8][2 * q] = c[2];
  partial[warp][g + 8][2 * q + 1] = c[3];
  __syncthreads();
  if (threadIdx.x < kRows * kTokens) {
    const int r = threadIdx.x % kRows, t = threadIdx.x / kRows;  // consecutive threads: consecutive y addresses
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][r][t];
    if (t < tokens && n0 + r < N) store(y + int64_t(t0 + t) * ldy + n0 + r, sum);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

class GemvBackend final : public GemmBackend {
 public:
  explicit GemvBackend(int kernel_max_m) : kernel_max_m_(kernel_max_m), fallback_(make_cublas_backend()) {
    spec_.name = "gemv";
    spec_.family = OpFamily::Gemm;
    spec_.formats = {"bf16"};
    spec_.capturable = true;
    spec_.summary = fmt::format(
        "bandwidth-bound tensor-core kernel for M <= {} (W read once with 16-byte loads), cuBLAS above",
        kernel_max_m);
  }
  const BackendSpec& spec() const override { return spec_; }

  std::string prepare(const DeviceInfo& dev, std::string& code) override {
    std::string lib;
    if (std::string why = fallback_->prepare(dev, lib); !why.empty()) return "its cuBLAS fallback: " + why;
    code = "kernel " + sm_name(sm_version(dev)) + " in binary, " + lib + " for larger M";
    if (std::string why = check_arch_claim(spec_, dev); !why.empty()) return why;
    for (const void* k : {reinterpret_cast<const void*>(gemv_bf16_kernel<bf16>),
                          reinterpret_cast<const void*>(gemv_bf16_kernel<float>)})
      if (std::string why = check_kernel_present(k, dev); !why.empty()) return why;
    prepared_ = true;
    return "";
  }

  void run(const bf16* x, int64_t ldx, int M, int K, const bf16* W, int N, void* y, int64_t ldy, OutType out,
           cudaStream_t stream) override {
    MS_CHECK(prepared_, "GEMM backend gemv used before prepare()");
    MS_CHECK(M >= 0 && N >= 0 && K >= 0 && ldx >= K && ldy >= N, "bad GEMM arguments M={} N={} K={} ldx={} ldy={}",
             M, N, K, ldx, ldy);
    if (M == 0 || N == 0) return;
    const int64_t token_groups = ceil_div(M, kTokens);
    const bool kernel_fits = M <= kernel_max_m_ && K > 0 && K % 8 == 0 && ldx % 8 == 0 && aligned16(x) &&
                             aligned16(W) && token_groups <= 65535;
    if (!kernel_fits) return fallback_->run(x, ldx, M, K, W, N, y, ldy, out, stream);
    const dim3 grid(unsigned(ceil_div(N, kRows)), unsigned(token_groups));
    if (out == OutType::BF16)
      gemv_bf16_kernel<bf16><<<grid, kWarps * 32, 0, stream>>>(x, ldx, M, K, W, N, static_cast<bf16*>(y), ldy);
    else
      gemv_bf16_kernel<float><<<grid, kWarps * 32, 0, stream>>>(x, ldx, M, K, W, N, static_cast<float*>(y), ldy);
    MS_CUDA_LAUNCH_CHECK();
  }

 private:
  BackendSpec spec_;
  int kernel_max_m_;
  std::unique_ptr<GemmBackend> fallback_;
  bool prepared_ = false;
};

}  // namespace

std::unique_ptr<GemmBackend> make_gemv_backend(int kernel_max_m) {
  return std::make_unique<GemvBackend>(kernel_max_m);
}

}  // namespace moeserve::cuda

// "cublas_ref": the plain MoE path, the GPU baseline the fused kernels must beat. Token counts per expert go
// to the host (a stream sync: not capturable), then per active expert one cublasGemmEx for gate/up and one for
// down (BF16 in, f32 out and compute), with small kernels for the gather, SwiGLU and the weighted combine.
#include <cublas_v2.h>
#include <fmt/format.h>

#include <vector>

#include "core/error.h"
#include "cuda/moe/moe_internal.h"

namespace moeserve::cuda {

namespace {

// rank[i] = position of pair i among its expert's pairs; -1 for ids outside [0, E).
__global__ void ref_count_kernel(const int32_t* ids, int P, int E, int* counts, int* rank) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= P) return;
  const int e = ids[i];
  rank[i] = (e >= 0 && e < E) ? atomicAdd(&counts[e], 1) : -1;
}

// Exclusive scan of the counts; E is small, one thread is plenty (and keeps the host copy read-only).
__global__ void ref_offsets_kernel(const int* counts, int E, int* offsets) {
  int s = 0;
  for (int e = 0; e < E; ++e) offsets[e] = s, s += counts[e];
  offsets[E] = s;
}

// One block per pair: copy the token's row to its expert-sorted position.
__global__ void ref_gather_kernel(const bf16* x, const int32_t* ids, const int* rank, const int* offsets, int k, int H,
                                  bf16* xg, int* pos_of_pair) {
  const int i = blockIdx.x;
  const int r = rank[i];
  const int pos = r < 0 ? -1 : offsets[ids[i]] + r;
  if (threadIdx.x == 0) pos_of_pair[i] = pos;
  if (pos < 0) return;
  const bf16* src = x + size_t(i / k) * H;
  bf16* dst = xg + size_t(pos) * H;
  for (int h = threadIdx.x; h < H; h += blockDim.x) dst[h] = src[h];
}

// act = bf16(silu(gate) * up), gate/up f32 rows of [rows, 2I].
__global__ void ref_swiglu_kernel(const float* gu, int64_t rows, int I, bf16* act) {
  const int64_t n = rows * I;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < n; j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = j / I, i = j % I;
    const float g = gu[r * 2 * I + i], u = gu[r * 2 * I + I + i];
    act[j] = __float2bfloat16(g / (1.0f + expf(-g)) * u);
  }
}

// out[t, h] = bf16(sum_j w[t, j] * down[pos(t, j), h]), slots in order.
__global__ void ref_combine_kernel(const float* down, const int* pos_of_pair, const float* w, int k, int H, bf16* out) {
  const int t = blockIdx.x;
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    float s = 0;
    for (int j = 0; j < k; ++j) {
      const int pos = pos_of_pair[t * k + j];
      if (pos >= 0) s += w[t * k + j] * down[size_t(pos) * H + h];
    }
    out[size_t(t) * H + h] = __float2bfloat16(s);
  }
}

const char* cublas_status_text(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "error";
  }
}

#define MS_CUBLAS_CHECK(call)                                                                              \
  do {                                                                                                     \
    cublasStatus_t st_ = (call);                                                                           \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                      \
      throw InternalError(fmt::format("cuBLAS {} ({}) in {} at {}:{}", int(st_), cublas_status_text(st_), \
                                      #call, __FILE__, __LINE__));                                         \
  } while (0)

size_t align_up(size_t v) { return (v + 255) / 256 * 256; }

struct RefLayout {
  size_t counts, offsets, rank, pos, xg, gu, act, down, total;
};
// Laid out for T tokens (like the fused path): a workspace for max_tokens serves every smaller T.
RefLayout ref_layout(const MoeShape& s, int T) {
  const size_t P = size_t(T) * s.top_k;
  RefLayout l{};
  size_t off = 0;
  l.counts = off, off = align_up(off + size_t(s.num_experts) * 4);
  l.offsets = off, off = align_up(off + size_t(s.num_experts + 1) * 4);
  l.rank = off, off = align_up(off + P * 4);
  l.pos = off, off = align_up(off + P * 4);
  l.xg = off, off = align_up(off + P * s.hidden * 2);
  l.gu = off, off = align_up(off + P * 2 * s.inter * 4);
  l.act = off, off = align_up(off + P * s.inter * 2);
  l.down = off, off = align_up(off + P * s.hidden * 4);
  l.total = off;
  return l;
}

class CublasRefBackend final : public MoeBackend {
 public:
  CublasRefBackend() {
    spec_.name = "cublas_ref";
    spec_.family = OpFamily::Moe;
    spec_.archs = {};
    spec_.formats = {"bf16"};
    spec_.capturable = false;
    spec_.summary = "per-expert cublasGemmEx (BF16, f32 compute) + small kernels; host sync per call; not capturable";
  }
  ~CublasRefBackend() override {
    if (handle_) cublasDestroy(handle_);
    if (host_counts_) cudaFreeHost(host_counts_);
  }
  const BackendSpec& spec() const override { return spec_; }

  std::string prepare(const DeviceInfo& dev, const MoeShape& shape, std::string& code) override {
    ready_ = false;
    code = "absent";
    if (std::string r = check_arch_claim(spec_, dev); !r.empty()) return r;
    for (const void* k : {reinterpret_cast<const void*>(&ref_count_kernel),
                          reinterpret_cast<const void*>(&ref_offsets_kernel),
                          reinterpret_cast<const void*>(&ref_gather_kernel),
                          reinterpret_cast<const void*>(&ref_swiglu_kernel),
                          reinterpret_cast<const void*>(&ref_combine_kernel)})
      if (std::string r = check_kernel_present(k, dev); !r.empty()) return r;
    int version = 0;
    if (!handle_) {
      if (cublasStatus_t st = cublasCreate(&handle_); st != CUBLAS_STATUS_SUCCESS) {
        handle_ = nullptr;
        return fmt::format("cublasCreate failed: {}", cublas_status_text(st));
      }
    }
    cublasGetVersion(handle_, &version);
    code = fmt::format("sm_90a in binary + cuBLAS {}", version);
    if (shape.format != WeightFormat::BF16)
      return fmt::format("weight format {} is not supported (bf16 only)", weight_format_name(shape.format));
    if (shape.num_experts < 1 || shape.top_k < 1 || shape.top_k > shape.num_experts || shape.hidden < 1 ||
        shape.inter < 1 || shape.max_tokens < 1)
      return fmt::format("bad MoE shape: {} experts, top_k {}, hidden {}, inter {}, max_tokens {}", shape.num_experts,
                         shape.top_k, shape.hidden, shape.inter, shape.max_tokens);
    if (host_counts_) cudaFreeHost(host_counts_), host_counts_ = nullptr;
    if (cudaError_t e = cudaMallocHost(&host_counts_, size_t(shape.num_experts + 1) * 2 * sizeof(int));
        e != cudaSuccess) {
      cudaGetLastError();
      host_counts_ = nullptr;
      return fmt::format("cudaMallocHost failed: {}", cudaGetErrorString(e));
    }
    shape_ = shape;
    ready_ = true;
    return "";
  }

  size_t workspace_bytes(const MoeShape& shape) const override { return ref_layout(shape, shape.max_tokens).total; }

  void run(const bf16* x, int T, const int32_t* topk_ids, const float* topk_weights, const MoeWeights& w, bf16* out,
           void* workspace, cudaStream_t stream) override {
    MS_CHECK(ready_, "moe backend cublas_ref used without a successful prepare()");
    MS_CHECK(T >= 0 && T <= shape_.max_tokens, "moe: {} tokens, prepared for at most {}", T, shape_.max_tokens);
    MS_CHECK(w.format == WeightFormat::BF16, "moe: bf16 weights expected");
    if (T == 0) return;
    const int E = shape_.num_experts, k = shape_.top_k, H = shape_.hidden, I = shape_.inter, P = T * k;
    const RefLayout l = ref_layout(shape_, T);
    char* ws = static_cast<char*>(workspace);
    int* counts = reinterpret_cast<int*>(ws + l.counts);
    int* offsets = reinterpret_cast<int*>(ws + l.offsets);
    int* rank = reinterpret_cast<int*>(ws + l.rank);
    int* pos = reinterpret_cast<int*>(ws + l.pos);
    bf16* xg = reinterpret_cast<bf16*>(ws + l.xg);
    float* gu = reinterpret_cast<float*>(ws + l.gu);
    bf16* act = reinterpret_cast<bf16*>(ws + l.act);
    float* down = reinterpret_cast<float*>(ws + l.down);

    MS_CUDA_CHECK(cudaMemsetAsync(counts, 0, size_t(E) * 4, stream));
    ref_count_kernel<<<unsigned(ceil_div(P, 256)), 256, 0, stream>>>(topk_ids, P, E, counts, rank);
    MS_CUDA_LAUNCH_CHECK();
    int* host_counts = host_counts_;
    int* host_offsets = host_counts_ + E + 1;
    MS_CUDA_CHECK(cudaMemcpyAsync(host_counts, counts, size_t(E) * 4, cudaMemcpyDeviceToHost, stream));
    MS_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host needs the counts to issue per-expert GEMMs
    host_offsets[0] = 0;
    for (int e = 0; e < E; ++e) host_offsets[e + 1] = host_offsets[e] + host_counts[e];
    const int rows = host_offsets[E];
    ref_offsets_kernel<<<1, 1, 0, stream>>>(counts, E, offsets);
    MS_CUDA_LAUNCH_CHECK();
    ref_gather_kernel<<<unsigned(P), 256, 0, stream>>>(x, topk_ids, rank, offsets, k, H, xg, pos);
    MS_CUDA_LAUNCH_CHECK();

    MS_CUBLAS_CHECK(cublasSetStream(handle_, stream));
    const float one = 1.0f, zero = 0.0f;
    const auto* wgu = static_cast<const bf16*>(w.gate_up);
    const auto* wdn = static_cast<const bf16*>(w.down);
    // Row-major Y[n, M] = X[n, K] W[M, K]^T is column-major Y^T = W^T(op T of the [K, M] view) * X^T.
    for (int e = 0; e < E; ++e) {
      const int n = host_counts[e];
      if (!n) continue;
      MS_CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, 2 * I, n, H, &one,
                                   wgu + size_t(e) * 2 * I * H, CUDA_R_16BF, H, xg + size_t(host_offsets[e]) * H,
                                   CUDA_R_16BF, H, &zero, gu + size_t(host_offsets[e]) * 2 * I, CUDA_R_32F, 2 * I,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    if (rows > 0) {
      ref_swiglu_kernel<<<unsigned(std::min<int64_t>(ceil_div(int64_t(rows) * I, 256), 65535)), 256, 0, stream>>>(
          gu, rows, I, act);
      MS_CUDA_LAUNCH_CHECK();
    }
    for (int e = 0; e < E; ++e) {
      const int n = host_counts[e];
      if (!n) continue;
      MS_CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, H, n, I, &one, wdn + size_t(e) * H * I,
                                   CUDA_R_16BF, I, act + size_t(host_offsets[e]) * I, CUDA_R_16BF, I, &zero,
                                   down + size_t(host_offsets[e]) * H, CUDA_R_32F, H, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    }
    ref_combine_kernel<<<unsigned(T), 256, 0, stream>>>(down, pos, topk_weights, k, H, out);
    MS_CUDA_LAUNCH_CHECK();
  }

 private:
  BackendSpec spec_;
  MoeShape shape_;
  cublasHandle_t handle_ = nullptr;
  int* host_counts_ = nullptr;  // pinned: [E + 1] counts, then [E + 1] offsets (host use only)
  bool ready_ = false;
};

}  // namespace

std::unique_ptr<MoeBackend> make_cublas_ref_backend() { return std::make_unique<CublasRefBackend>(); }

}  // namespace moeserve::cuda

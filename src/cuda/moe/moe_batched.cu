// The fused backends' prefill path on cuBLAS (moe_internal.h, BatchedPrefill). bench/gpu_gemm_ceiling on the H200
// (session 22): cuBLAS's strided batched BF16 kernels run q30b8l's expert GEMMs at 512 tokens an expert at 817
// (gate/up) and 720 (down) TFLOP/s, where the fused kernels' 8,192-token step reaches ~445 for the whole layer. A
// strided batch needs one row count for all experts, so the step pads every expert's pairs to the largest count,
// which comes back to the host once a layer (a stream sync: not capturable, prefill steps only):
//   count + rank (one atomic a pair) -> counts to the host -> C = the largest, rounded up -> x rows gathered to
//   [E, C, H] -> gate/up GEMM -> [E, C, 2I] bf16 -> SwiGLU -> [E, C, I] bf16 -> down GEMM -> [E, C, H] bf16 ->
//   combine (f32 sum of the k weighted rows of each token) -> out [T, H] bf16.
// The gate and up outputs are rounded to BF16 before the SwiGLU (transformers' Linear outputs BF16 there too); the
// fused path keeps them in f32. Rows past an expert's count hold whatever the buffers held: their outputs are
// never read (every GEMM row depends on its own input row only).
#include <cublas_v2.h>

#include <algorithm>

#include <fmt/format.h>

#include "core/env.h"
#include "core/error.h"
#include "cuda/moe/moe_internal.h"

namespace moeserve::cuda {

namespace {

constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
constexpr int kRowAlign = 32;  // C rounded up to this (cuBLAS tiles)

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

struct BatchedLayout {
  int capacity = 0;  // the largest C the buffers hold
  size_t counts = 0, rank = 0, pair_pos = 0, xg = 0, y1 = 0, act = 0, total = 0;  // y2 aliases xg
};

BatchedLayout batched_layout(const MoeShape& s, int T) {
  BatchedLayout l;
  const int64_t P = int64_t(T) * s.top_k;
  const int64_t mean = (P + s.num_experts - 1) / s.num_experts;
  l.capacity = int((mean * 3 / 2 + 64 + kRowAlign - 1) / kRowAlign * kRowAlign);
  const size_t rows = size_t(s.num_experts) * size_t(l.capacity);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t o = at;
    at += align256(bytes);
    return o;
  };
  l.counts = take(size_t(s.num_experts) * sizeof(int));
  l.rank = take(size_t(P) * sizeof(int));
  l.pair_pos = take(size_t(P) * sizeof(int));
  l.xg = take(rows * size_t(s.hidden) * sizeof(bf16));
  l.y1 = take(rows * size_t(2 * s.inter) * sizeof(bf16));
  l.act = take(rows * size_t(s.inter) * sizeof(bf16));
  l.total = at;
  return l;
}

// rank[i] = position of pair i among its expert's pairs (arrival order), -1 for ids outside [0, E).
__global__ void batched_count_kernel(const int32_t* ids, int P, int E, int* counts, int* rank) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= P) return;
  const int e = ids[i];
  rank[i] = e >= 0 && e < E ? atomicAdd(counts + e, 1) : -1;
}

// One block a pair: the token's row to row e C + rank of xg; pair_pos[i] = that row (-1: skipped).
__global__ void batched_gather_kernel(const bf16* x, const int32_t* ids, const int* rank, int k, int H, int C,
                                      bf16* xg, int* pair_pos) {
  const int i = int(blockIdx.x);
  const int r = rank[i];
  const int64_t pos = r < 0 ? -1 : int64_t(ids[i]) * C + r;
  if (threadIdx.x == 0) pair_pos[i] = int(pos);
  if (pos < 0) return;
  const uint4* src = reinterpret_cast<const uint4*>(x + int64_t(i / k) * H);
  uint4* dst = reinterpret_cast<uint4*>(xg + pos * H);
  for (int c = int(threadIdx.x); c < H / 8; c += int(blockDim.x)) dst[c] = src[c];
}

__device__ __forceinline__ float silu_f(float g) { return g / (1.0f + __expf(-g)); }

// act[r, j] = bf16(silu(y1[r, j]) * y1[r, I + j]) over rows r < rows, two columns a thread.
__global__ void batched_swiglu_kernel(const bf16* y1, int64_t rows, int I, bf16* act) {
  const int64_t half = I / 2, n = rows * half;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / half, j = 2 * (idx - r * half);
    const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(y1 + r * 2 * I + j));
    const float2 u = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(y1 + r * 2 * I + I + j));
    *reinterpret_cast<__nv_bfloat162*>(act + r * I + j) = __floats2bfloat162_rn(silu_f(g.x) * u.x, silu_f(g.y) * u.y);
  }
}

// One block a token: out[t] = bf16(sum over j < k of w[t, j] * y2[pair_pos[t k + j]]), f32 sums in slot order.
__global__ void batched_combine_kernel(const bf16* y2, const int* pair_pos, const float* w, int k, int H, bf16* out) {
  const int t = int(blockIdx.x);
  for (int c = int(threadIdx.x); c < H / 8; c += int(blockDim.x)) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int j = 0; j < k; ++j) {
      const int pos = pair_pos[t * k + j];
      if (pos < 0) continue;
      const float wt = w[t * k + j];
      const uint4 v = *reinterpret_cast<const uint4*>(y2 + int64_t(pos) * H + c * 8);
      const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = __bfloat1622float2(b[q]);
        acc[2 * q] += wt * f.x;
        acc[2 * q + 1] += wt * f.y;
      }
    }
    uint4 o;
    __nv_bfloat162* ob = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int q = 0; q < 4; ++q) ob[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
    *reinterpret_cast<uint4*>(out + int64_t(t) * H + c * 8) = o;
  }
}

void check_cublas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw InternalError(fmt::format("moe prefill (cuBLAS): {} failed: {} ({})", what, cublasGetStatusName(st),
                                    cublasGetStatusString(st)));
}

}  // namespace

bool batched_prefill_enabled() {
  static const bool on = env_flag("MOESERVE_MOE_PREFILL_CUBLAS", false);
  return on;
}

int batched_prefill_min_tokens() {
  static const int t = int(env_int("MOESERVE_MOE_PREFILL_CUBLAS_MIN", 4096, 1, 1 << 20));
  return t;
}

bool batched_prefill_shape_ok(const MoeShape& s) {
  return s.format == WeightFormat::BF16 && s.hidden % 8 == 0 && s.inter % 2 == 0 && s.num_experts > 0 &&
         s.top_k > 0;
}

size_t batched_workspace_bytes(const MoeShape& s, int T) {
  return T > 0 && batched_prefill_shape_ok(s) ? batched_layout(s, T).total : 0;
}

BatchedPrefill::~BatchedPrefill() {
  if (event_) cudaEventDestroy(event_);
  if (host_counts_) cudaFreeHost(host_counts_);
  if (cublas_ws_) cudaFree(cublas_ws_);
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

bool BatchedPrefill::wanted(const MoeShape& s, int T, cudaStream_t stream) {
  if (!batched_prefill_enabled() || T < batched_prefill_min_tokens() || !batched_prefill_shape_ok(s)) return false;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusNone;
}

void BatchedPrefill::ensure(int E) {
  if (handle_ == nullptr) {
    cublasHandle_t h = nullptr;
    check_cublas(cublasCreate(&h), "cublasCreate");
    handle_ = h;
    MS_CUDA_CHECK(cudaMalloc(&cublas_ws_, kCublasWorkspaceBytes));
    MS_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  if (E > host_counts_n_) {
    if (host_counts_) MS_CUDA_CHECK(cudaFreeHost(host_counts_));
    host_counts_ = nullptr;
    MS_CUDA_CHECK(cudaMallocHost(&host_counts_, size_t(E) * sizeof(int)));
    host_counts_n_ = E;
  }
}

bool BatchedPrefill::run(const MoeShape& s, const bf16* x, int T, const int32_t* topk_ids, const float* topk_weights,
                         const MoeWeights& w, bf16* out, void* workspace, cudaStream_t stream) {
  MS_CHECK(batched_prefill_shape_ok(s) && w.format == WeightFormat::BF16 && w.gate_up && w.down,
           "moe prefill (cuBLAS): bf16 weights, hidden % 8 == 0 and inter % 2 == 0 expected");
  MS_CHECK(T >= 1 && T <= s.max_tokens, "moe prefill (cuBLAS): {} tokens, prepared for at most {}", T, s.max_tokens);
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  MS_CHECK(aligned(x) && aligned(out) && aligned(workspace), "moe prefill (cuBLAS): 16-byte aligned x, out, workspace");
  const int E = s.num_experts, H = s.hidden, I = s.inter, k = s.top_k, P = T * k;
  ensure(E);
  const BatchedLayout l = batched_layout(s, T);
  char* ws = static_cast<char*>(workspace);
  int* counts = reinterpret_cast<int*>(ws + l.counts);
  int* rank = reinterpret_cast<int*>(ws + l.rank);
  int* pair_pos = reinterpret_cast<int*>(ws + l.pair_pos);
  bf16* xg = reinterpret_cast<bf16*>(ws + l.xg);
  bf16* y1 = reinterpret_cast<bf16*>(ws + l.y1);
  bf16* act = reinterpret_cast<bf16*>(ws + l.act);
  bf16* y2 = xg;  // xg is dead once the gate/up GEMM has read it

  MS_CUDA_CHECK(cudaMemsetAsync(counts, 0, size_t(E) * sizeof(int), stream));
  batched_count_kernel<<<unsigned((P + 255) / 256), 256, 0, stream>>>(topk_ids, P, E, counts, rank);
  MS_CUDA_LAUNCH_CHECK();
  MS_CUDA_CHECK(cudaMemcpyAsync(host_counts_, counts, size_t(E) * sizeof(int), cudaMemcpyDeviceToHost, stream));
  MS_CUDA_CHECK(cudaEventRecord(event_, stream));
  MS_CUDA_CHECK(cudaEventSynchronize(event_));
  const int most = *std::max_element(host_counts_, host_counts_ + E);
  const int C = std::max(kRowAlign, (most + kRowAlign - 1) / kRowAlign * kRowAlign);
  if (C > l.capacity) return false;  // a skewed routing: the fused path serves it

  batched_gather_kernel<<<unsigned(P), 128, 0, stream>>>(x, topk_ids, rank, k, H, C, xg, pair_pos);
  MS_CUDA_LAUNCH_CHECK();
  cublasHandle_t h = static_cast<cublasHandle_t>(handle_);
  check_cublas(cublasSetStream(h, stream), "cublasSetStream");
  // cublasSetStream resets the workspace to cuBLAS's own pool: ours again, after it.
  check_cublas(cublasSetWorkspace(h, cublas_ws_, kCublasWorkspaceBytes), "cublasSetWorkspace");
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major y[C, n] = a[C, kk] . W[n, kk]^T per expert is, column-major, y^T[n, C] = W^T' . a^T (W op T).
  auto batched = [&](const void* W, int n, int kk, const bf16* a, bf16* y, const char* what) {
    check_cublas(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, C, kk, &alpha, W, CUDA_R_16BF, kk,
                                            int64_t(n) * kk, a, CUDA_R_16BF, kk, int64_t(C) * kk, &beta, y,
                                            CUDA_R_16BF, n, int64_t(C) * n, E, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT),
                 what);
  };
  batched(w.gate_up, 2 * I, H, xg, y1, "gate/up cublasGemmStridedBatchedEx");
  const int64_t rows = int64_t(E) * C;
  const int64_t work = rows * (I / 2);
  batched_swiglu_kernel<<<unsigned(std::min<int64_t>((work + 255) / 256, 4096)), 256, 0, stream>>>(y1, rows, I, act);
  MS_CUDA_LAUNCH_CHECK();
  batched(w.down, H, I, act, y2, "down cublasGemmStridedBatchedEx");
  batched_combine_kernel<<<unsigned(T), 128, 0, stream>>>(y2, pair_pos, topk_weights, k, H, out);
  MS_CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace moeserve::cuda

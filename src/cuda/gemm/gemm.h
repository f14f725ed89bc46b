// Dense GEMM on the GPU: y[M, N] = x[M, K] . W[N, K]^T, x and W BF16 row-major (W as stored in the
// checkpoint: [out_features, in_features]), y BF16 or F32, f32 accumulation. Backends: cuBLAS (cublasGemmEx),
// cuBLASLt (heuristic algorithm per shape, cached) and gemv (bandwidth-bound tensor-core kernels for decode:
// M <= 8 on mma.sync, 9-128 tokens of router-sized W on sm_90a wgmma (the skinny GEMM), cuBLASLt for the rest).
// Graph-capturable: workspaces are fixed in prepare(). FP8 / NVFP4 weights will join as further formats whose run()
// also takes scale pointers (cuBLASLt's A/B scale attributes).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cuda/common.h"
#include "cuda/registry.h"

namespace moeserve::cuda {

enum class OutType { BF16, F32 };

class GemmBackend {
 public:
  virtual ~GemmBackend() = default;
  virtual const BackendSpec& spec() const = 0;
  // "" when usable here, else why not; `code` says what was found (library version).
  virtual std::string prepare(const DeviceInfo& dev, std::string& code) = 0;
  // y = x W^T. Strides in elements (ldx >= K, ldy >= N). Never synchronizes.
  virtual void run(const bf16* x, int64_t ldx, int M, int K, const bf16* W, int N, void* y, int64_t ldy,
                   OutType out, cudaStream_t stream) = 0;
  // Token counts (each <= max_m) whose runs, once each per shape, make every later run of up to max_m tokens use
  // kernels that have run before. The first launch of a library kernel loads its module, which waits for the
  // device to drain (H200, q30b8l served with step traces: one prompt step's launch in each benchmark run blocked
  // for 20-30 ms behind the step in flight); the executor runs these at startup. Empty: nothing to warm up.
  virtual std::vector<int> warm_up_tokens(int /*max_m*/) const { return {}; }
};

std::vector<std::unique_ptr<GemmBackend>> make_gemm_backends();
// The gemv backend with another threshold: its kernels serve M <= kernel_max_m (M <= 8: one token group per
// block; 8 < M <= 128: all tokens per block with split-K; above 128, only when a test raises the threshold:
// the first kernel's token-group loop), cuBLASLt serves the rest and the shapes the kernels cannot take.
// The default, 8, keeps the one-group kernel only: on the H200 the split-K kernel lost to cuBLASLt from M = 16
// (q/k/v 5120 x 2048 at M = 64: 19.6 us against 6.8; test_cuda_gemm's Bandwidth table).
std::unique_ptr<GemmBackend> make_gemv_backend(int kernel_max_m = 8);

// y = x W^T for one token group (1 <= M <= 8, K % 8 == 0, ldx % 8 == 0, 16-byte aligned x and W) by a persistent
// kernel whose warps stream W through cp.async rings that run on across row blocks: for vocabulary-sized W (the
// lm_head at decode), which the gemv backend sends here instead of to cuBLASLt unless MOESERVE_GEMV_STREAM=0.
bool gemv_stream_fits(int M, int K);
bool gemv_stream_enabled();  // MOESERVE_GEMV_STREAM (default on)
void gemv_stream(const bf16* x, int64_t ldx, int M, int K, const bf16* W, int N, void* y, int64_t ldy, OutType out,
                 cudaStream_t stream);
// The same with x = bf16(rmsnorm(residual) * norm_w) from the residual fusion's partial sums (as gemv_norm_in below,
// K % 4 == 0, 16-byte aligned residual, 8-byte aligned norm_w): a decode step's final norm inside the lm_head launch.
void gemv_stream_norm_in(const float* residual, const float* partials, int nparts, const bf16* norm_w, float eps,
                         int M, int K, const bf16* W, int N, void* y, int64_t ldy, OutType out, cudaStream_t stream);

// y = x W^T for 9-128 tokens on sm_90a warpgroup MMA (gemm_skinny.cu): weight rows as the MMA's M, the tokens as
// its N, the weight slices issued before the programmatic wait, split-K over a thread-block cluster reduced through
// distributed shared memory. The gemv backend sends 8 < M <= kSkinnyMaxM with N <= kSkinnyMaxN here (the router's
// shapes; MOESERVE_GEMM_SKINNY=0: cuBLASLt as before). Wider W stays on cuBLASLt: with 64-row tiles every tile
// re-reads the token rows from L2 (as many bytes as W at 64 tokens, twice W at 128) and the short split-K CTAs pay
// their latencies per few slices (H200, session 26: q/k/v 5120 x 2048 at 64 tokens 19.6 us against 8.7, o_proj 16.2
// against 13.7, lm_head 205 against 161; the router 128 x 2048 4.9 against 9.6). Needs K % 8 == 0, ldx % 8 == 0 and
// 16-byte aligned x and W; supported: the device is sm_90 and the binary holds the kernels' code.
constexpr int kSkinnyMaxM = 128;
constexpr int kSkinnyMaxN = 512;
bool skinny_gemm_enabled();
bool skinny_gemm_supported(const DeviceInfo& dev);
bool skinny_gemm_fits(int M, int K, int64_t ldx, const void* x, const void* W);
void skinny_gemm(const bf16* x, int64_t ldx, int M, int K, const bf16* W, int N, void* y, int64_t ldy, OutType out,
                 cudaStream_t stream);
std::string skinny_gemm_describe(int M, int N, int K, OutType out);  // its launch plan, for measurements

// A decode step's residual add + RMSNorm fused into the GEMV that consumes it (M <= kNormGemvMaxM tokens,
// K <= 4096, K % 8 == 0):
// x = bf16(rmsnorm(residual + delta) * norm_w) (f32 norm, as add_rmsnorm), y = x W^T (BF16 out); residual +=
// delta afterwards (delta == nullptr: the residual is the input as is and is not written). `counter`: one int
// of device memory, zero before the first call, left at zero. Every block normalizes the rows itself (a few KB
// from L2), so the norm costs no launch. A fixed kernel, not a GemmBackend: it serves the decode graphs only.
constexpr int kNormGemvMaxM = 4;
bool norm_gemv_fits(int M, int K);
void norm_gemv(float* residual, const bf16* delta, const bf16* norm_w, float eps, int M, int K, const bf16* W, int N,
               bf16* y, int64_t ldy, int* counter, cudaStream_t stream);

// The residual fusion of the decode graphs (on by default, MOESERVE_RESIDUAL_FUSION=0 off; one token group:
// M <= 8, K <= 4096, K % 8 == 0): the residual stream is the f32 residual plus, per token, partial sums of squares of it over parts of
// 16 rows, written by the kernel that updates the residual, so that the next GEMV applies the RMSNorm itself
// without a norm launch or a block-wide reduction.
// gemv_residual_out: y = x W^T (bf16), residual[m, :] += float(y[m, :]) (N = the residual's width) and
//   partials[m, b] = the sum of squares of the updated residual[m, 16 b .. 16 b + 15], b < residual_gemv_parts(N).
// gemv_norm_in: x = bf16(rmsnorm(residual) * norm_w) with the sum of squares over the nparts partials (summed in a
//   fixed order), y = x W^T (bf16 or f32), and x also to xn_out when non-null. The residual is only read.
constexpr int kResidualGemvMaxM = 8;
bool residual_gemv_fits(int M, int K);
int residual_gemv_parts(int N);
// Both take `ext`: W has ext.rows more rows after its N (N a multiple of 16), whose products go to ext.out[m, i]
// (f32, row stride ext.ld) instead of y and leave the residual alone: another small GEMV over the same input rides
// in the same launch (the folded router, gpu_model.cpp).
struct GemvExtraRows {
  int rows = 0;
  float* out = nullptr;
  int64_t ld = 0;
};
void gemv_norm_in(const float* residual, const float* partials, int nparts, const bf16* norm_w, float eps, int M,
                  int K, const bf16* W, int N, void* y, int64_t ldy, OutType out, bf16* xn_out, cudaStream_t stream,
                  const GemvExtraRows& ext = {});
void gemv_residual_out(const bf16* x, int64_t ldx, int M, int K, const bf16* W, int N, bf16* y, int64_t ldy,
                       float* residual, float* partials, cudaStream_t stream, const GemvExtraRows& ext = {});

// Against a CPU reference on random shapes (odd M, N, K included). "" on pass.
std::string gemm_self_test(GemmBackend& b, double& max_err);

}  // namespace moeserve::cuda

// Dense GEMM on the GPU: y[M, N] = x[M, K] . W[N, K]^T, x and W BF16 row-major (W as stored in the
// checkpoint: [out_features, in_features]), y BF16 or F32, f32 accumulation. Backends: cuBLAS (cublasGemmEx),
// cuBLASLt (heuristic algorithm per shape, cached) and gemv (bandwidth-bound tensor-core kernels for decode,
// M <= 64, cuBLAS above). Graph-capturable: workspaces are fixed in prepare(). FP8 / NVFP4 weights will join
// as further formats whose run() also takes scale pointers (cuBLASLt's A/B scale attributes).
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
};

std::vector<std::unique_ptr<GemmBackend>> make_gemm_backends();
// The gemv backend with another threshold: its kernels serve M <= kernel_max_m (M <= 8: one token group per
// block; 8 < M <= 128: all tokens per block with split-K; above 128, only when a test raises the threshold:
// the first kernel's token-group loop), cuBLAS serves the rest and the shapes the kernels cannot take.
std::unique_ptr<GemmBackend> make_gemv_backend(int kernel_max_m = 64);

// Against a CPU reference on random shapes (odd M, N, K included). "" on pass.
std::string gemm_self_test(GemmBackend& b, double& max_err);

}  // namespace moeserve::cuda

#include "cuda/model/model_kernels.h"

#include <algorithm>

#include "cuda/launch.h"
#include "cuda/pdl.cuh"

namespace moeserve::cuda {

namespace {
// One block per output row, 16-byte copies when the row allows.
__global__ void gather_rows_kernel(const bf16* src, int64_t src_stride, const int32_t* rows, int H, bf16* dst) {
  pdl_enter();
  const bf16* s = src + int64_t(rows[blockIdx.x]) * src_stride;
  bf16* d = dst + int64_t(blockIdx.x) * H;
  if ((H % 8) == 0 && (src_stride % 8) == 0) {
    const uint4* s4 = reinterpret_cast<const uint4*>(s);
    uint4* d4 = reinterpret_cast<uint4*>(d);
    for (int i = threadIdx.x; i < H / 8; i += blockDim.x) d4[i] = s4[i];
  } else {
    for (int i = threadIdx.x; i < H; i += blockDim.x) d[i] = s[i];
  }
}
constexpr int kFoldRowsPerBlock = 8;  // experts a block of fold_o_kernel
constexpr int kFoldThreads = 256;     // o_proj columns a block
constexpr int kFoldKChunk = 256;

__global__ void fold_in_kernel(const bf16* router, const bf16* g_in, const bf16* g_post, int E, int H, bf16* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(E) * H) return;
  const int k = int(i % H);
  out[i] = __float2bfloat16_rn(__bfloat162float(router[i]) * __bfloat162float(g_post[k]) /
                               __bfloat162float(g_in[k]));
}

// Block (bx, by): columns j = 256 bx + thread of experts 8 by .. 8 by + 7; W_r g_post for those experts staged a
// k-chunk at a time in shared memory, W_o read a row at a time (coalesced over j).
__global__ void __launch_bounds__(kFoldThreads)
    fold_o_kernel(const bf16* router, const bf16* g_post, const bf16* w_o, int E, int H, int QD, bf16* out) {
  __shared__ float rg[kFoldRowsPerBlock][kFoldKChunk];
  const int j = blockIdx.x * kFoldThreads + threadIdx.x, e0 = blockIdx.y * kFoldRowsPerBlock;
  float acc[kFoldRowsPerBlock] = {};
  for (int k0 = 0; k0 < H; k0 += kFoldKChunk) {
    __syncthreads();
    for (int i = threadIdx.x; i < kFoldRowsPerBlock * kFoldKChunk; i += kFoldThreads) {
      const int r = i / kFoldKChunk, kk = i % kFoldKChunk, e = e0 + r, k = k0 + kk;
      rg[r][kk] = e < E && k < H ? __bfloat162float(router[int64_t(e) * H + k]) * __bfloat162float(g_post[k]) : 0.f;
    }
    __syncthreads();
    if (j < QD) {
      const int kn = min(kFoldKChunk, H - k0);
      for (int kk = 0; kk < kn; ++kk) {
        const float w = __bfloat162float(w_o[int64_t(k0 + kk) * QD + j]);
#pragma unroll
        for (int r = 0; r < kFoldRowsPerBlock; ++r) acc[r] = fmaf(rg[r][kk], w, acc[r]);
      }
    }
  }
  if (j < QD)
    for (int r = 0; r < kFoldRowsPerBlock && e0 + r < E; ++r) out[int64_t(e0 + r) * QD + j] = __float2bfloat16_rn(acc[r]);
}
}  // namespace

void fold_router_weights(const bf16* router, const bf16* g_in, const bf16* g_post, const bf16* w_o, int E, int H,
                         int QD, bf16* in_rows, bf16* o_rows, cudaStream_t stream) {
  MS_CHECK(E > 0 && H > 0 && QD > 0, "fold_router_weights: E {} H {} QD {}", E, H, QD);
  const int64_t n = int64_t(E) * H;
  fold_in_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(router, g_in, g_post, E, H, in_rows);
  MS_CUDA_LAUNCH_CHECK();
  fold_o_kernel<<<dim3(unsigned((QD + kFoldThreads - 1) / kFoldThreads),
                       unsigned((E + kFoldRowsPerBlock - 1) / kFoldRowsPerBlock)),
                  kFoldThreads, 0, stream>>>(router, g_post, w_o, E, H, QD, o_rows);
  MS_CUDA_LAUNCH_CHECK();
}

void gather_rows(const bf16* src, int64_t src_stride, const int32_t* rows, int R, int H, bf16* dst,
                 cudaStream_t stream) {
  if (R <= 0) return;
  launch_pdl(gather_rows_kernel, dim3(R), dim3(256), 0, stream, src, src_stride, rows, H, dst);
}

}  // namespace moeserve::cuda

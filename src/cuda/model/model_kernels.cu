#include "cuda/model/model_kernels.h"

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
}  // namespace

void gather_rows(const bf16* src, int64_t src_stride, const int32_t* rows, int R, int H, bf16* dst,
                 cudaStream_t stream) {
  if (R <= 0) return;
  launch_pdl(gather_rows_kernel, dim3(R), dim3(256), 0, stream, src, src_stride, rows, H, dst);
}

}  // namespace moeserve::cuda

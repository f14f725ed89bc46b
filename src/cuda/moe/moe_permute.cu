// The gate/up GEMM's token rows in sorted-position order (MOESERVE_MOE_GU_TMA_X=1, opt-in, session 22): xp[pos] =
// x[perm_pair[pos] / top_k], so that the warp-specialized gate/up loads its token tiles by TMA like its weights
// (GemmParams::src_tma) instead of gathering them by cp.async in every producer thread.
#include "core/error.h"
#include "cuda/launch.h"
#include "cuda/moe/moe_internal.h"
#include "cuda/pdl.cuh"

namespace moeserve::cuda {

namespace {
// One block a position; positions whose perm_pair entry is not a pair of this call (none, when every id is valid)
// are left as they are: they lie past every tile's rows.
__global__ void permute_rows_kernel(const uint4* x, const int* perm_pair, int P, int top_k, int chunks, uint4* xp) {
  pdl_enter();  // perm_pair comes from the prep, x from the kernels before it
  const int pos = int(blockIdx.x);
  const int pair = perm_pair[pos];
  if (pair < 0 || pair >= P) return;
  const uint4* src = x + int64_t(pair / top_k) * chunks;
  uint4* dst = xp + int64_t(pos) * chunks;
  for (int c = int(threadIdx.x); c < chunks; c += int(blockDim.x)) dst[c] = src[c];
}
}  // namespace

void moe_permute_rows(const void* x, const int* perm_pair, int P, int top_k, int H, void* xp, cudaStream_t stream) {
  MS_CHECK(H % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0 && (reinterpret_cast<uintptr_t>(xp) & 15) == 0,
           "moe_permute_rows: 16-byte aligned rows of a multiple of 8 elements (H {})", H);
  if (P <= 0) return;
  launch_pdl(permute_rows_kernel, dim3(unsigned(P)), dim3(128), 0, stream, static_cast<const uint4*>(x), perm_pair, P,
             top_k, H / 8, static_cast<uint4*>(xp));
}

}  // namespace moeserve::cuda

// GPU sampling: one thread-block cluster of kClusterBlocks blocks per logit row (each block a slice of the
// row), all rows in one launch, no host synchronisation. The algorithm is in sampling_kernel.cuh.
#include <algorithm>

#include "cuda/sampling/sampling.h"
#include "cuda/sampling/sampling_kernel.cuh"

namespace moeserve::cuda {
namespace {

using namespace sampling_detail;

__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kThreads, 1)
    sample_kernel(SampleArgs a, float* overrides) {
  extern __shared__ __align__(16) char smem[];
  sample_cluster(a, overrides, smem);
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

size_t sample_workspace_bytes(int rows, int vocab) {
  // One f32 slot per token and row; only the penalised and banned tokens' slots are ever written.
  return align256(size_t(std::max(rows, 0)) * size_t(std::max(vocab, 0)) * sizeof(float));
}

void sample(const SampleArgs& a, cudaStream_t stream) {
  MS_CHECK(a.rows >= 0, "sample: rows = {}", a.rows);
  if (a.rows == 0) return;
  MS_CHECK(a.vocab > 0 && a.vocab < (1 << 24), "sample: vocabulary size {} outside 1 .. 2^24 - 1", a.vocab);
  MS_CHECK(a.logits && a.params && a.out_ids && a.workspace, "sample: logits, params, out_ids and workspace are required");
  MS_CHECK(a.max_top >= 0 && a.max_top <= kMaxTop, "sample: max_top {} outside 0 .. {}", a.max_top, kMaxTop);
  MS_CHECK(a.max_top == 0 || (a.top_ids && a.top_logprobs), "sample: max_top {} without top_ids / top_logprobs",
           a.max_top);
  MS_CHECK(int64_t(a.rows) * kClusterBlocks <= INT32_MAX, "sample: {} rows are too many for one launch", a.rows);
  const size_t smem = smem_bytes(a.vocab);
  // Hopper: 227 KiB of shared memory per block; the slice's bitmap grows with the vocabulary.
  MS_CHECK(smem <= 227 * 1024, "sample: vocabulary size {} too large for the override bitmap", a.vocab);
  MS_CUDA_CHECK(cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  sample_kernel<<<a.rows * kClusterBlocks, kThreads, smem, stream>>>(a, static_cast<float*>(a.workspace));
  MS_CUDA_LAUNCH_CHECK();
}

}  // namespace moeserve::cuda

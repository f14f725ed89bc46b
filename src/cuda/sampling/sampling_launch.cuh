// The sampler's kernel and its launch for one block size: the includer defines MOESERVE_SAMPLING_THREADS,
// MOESERVE_SAMPLING_NS and MOESERVE_SAMPLING_BLOCKS_PER_SM (the blocks an SM the kernel's registers are capped for)
// first, or takes the defaults (512 threads, sampling_detail, 1). One thread-block cluster of kClusterBlocks blocks
// per logit row (each block a slice of the row), all rows in one launch, no host synchronisation; the algorithm is in
// sampling_kernel.cuh.
#pragma once

#include <algorithm>

#include "cuda/sampling/sampling.h"
#include "cuda/sampling/sampling_kernel.cuh"

#ifndef MOESERVE_SAMPLING_BLOCKS_PER_SM
#define MOESERVE_SAMPLING_BLOCKS_PER_SM 1
#endif

namespace moeserve::cuda::MOESERVE_SAMPLING_NS {

__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kThreads, MOESERVE_SAMPLING_BLOCKS_PER_SM)
    sample_kernel(SampleArgs a, float* overrides) {
  extern __shared__ __align__(16) char smem[];
  sample_cluster(a, overrides, smem);
}

// sample()'s launch, its arguments checked by sample().
inline void launch_sample(const SampleArgs& a, cudaStream_t stream) {
  MS_CHECK(int64_t(a.rows) * kClusterBlocks <= INT32_MAX, "sample: {} rows are too many for one launch", a.rows);
  const size_t smem = smem_bytes(a.vocab);
  // Hopper: 227 KiB of shared memory per block; the slice's bitmap grows with the vocabulary.
  MS_CHECK(smem <= 227 * 1024, "sample: vocabulary size {} too large for the override bitmap", a.vocab);
  MS_CUDA_CHECK(cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  sample_kernel<<<a.rows * kClusterBlocks, kThreads, smem, stream>>>(a, static_cast<float*>(a.workspace));
  MS_CUDA_LAUNCH_CHECK();
}

}  // namespace moeserve::cuda::MOESERVE_SAMPLING_NS

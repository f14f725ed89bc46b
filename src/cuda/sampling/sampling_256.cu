// The sampler compiled a second time with 256-thread blocks, two an SM (registers capped at 128 as the 512-thread
// form's), for batches of more rows than one wave of the 512-thread form holds (sample() picks).
#define MOESERVE_SAMPLING_THREADS 256
#define MOESERVE_SAMPLING_NS sampling_detail_256
#define MOESERVE_SAMPLING_BLOCKS_PER_SM 2
#include "cuda/sampling/sampling_launch.cuh"

namespace moeserve::cuda {

void sample_in_256_thread_blocks(const SampleArgs& a, cudaStream_t stream) {
  sampling_detail_256::launch_sample(a, stream);
}

}  // namespace moeserve::cuda

// Token selection on the GPU: only the sampled ids (and logprobs when asked) go back to the host each step.
// The math matches the CPU sampler (kernels/sampling): penalties, then greedy or temperature + top-k + top-p +
// min-p sampling; logprobs are log_softmax of the raw logits (before penalties and temperature).
#pragma once

#include "cuda/common.h"
#include "cuda/sampling/sampling_types.h"

namespace moeserve::cuda {

// rows * vocab f32 slots, of which only the penalised and banned tokens' are written (a sparse copy of
// the modified logits; the rest of each row is read from `logits`).
size_t sample_workspace_bytes(int rows, int vocab);
// One launch for all rows (a thread-block cluster of 8 blocks per row: 512-thread blocks up to SMs / 8 rows, beyond
// that 256-thread blocks, two an SM; rows with SampleRowParams::forced >= 0 are skipped), no host synchronisation, no
// allocation: capturable in a CUDA graph. The sampled token is drawn in vocabulary order (see
// sampling_kernel.cuh): the same distribution as the CPU sampler, not the same token for the same random
// bits; the same row and random bits always give the same token. vocab < 2^24 (and the shared-memory
// bitmap of a slice limits it to about 9 million); max_top <= 64; ids in pen_ids / ban_ids outside
// [0, vocab) are ignored.
void sample(const SampleArgs& a, cudaStream_t stream);

}  // namespace moeserve::cuda

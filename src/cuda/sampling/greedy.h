// The fast path of the sampler for batches where every row is plain greedy (temperature 0 or top_k 1, no
// penalties, bans or top logprobs): one block per row (a cluster of 8 blocks for batches of up to 16 rows) reads
// the logits once with 16-byte loads and returns the argmax (lowest id on ties, as the CPU) and its raw logprob.
// Graph-capturable, a programmatic dependent of the kernel before; the executor captures decode graphs with this
// sampler and with the general one and replays whichever the batch needs.
#pragma once

#include "cuda/common.h"

namespace moeserve::cuda {

// workspace: greedy_workspace_bytes() of device memory, zeroed once and kept for the process (graphs capture it);
// with it, batches of up to 128 rows take the grid form (fewer blocks a row as rows grow, ~256 blocks in all, at most
// 64 a row; the row's last block merges; one stream at a time may use a workspace): MOESERVE_GREEDY_GRID=2, the
// default; =1 up to 4 rows, =0 never. Without a workspace, and above 128 rows, the cluster form.
size_t greedy_workspace_bytes();
void sample_greedy(const float* logits, int rows, int vocab, int32_t* out_ids, float* out_logprobs,
                   cudaStream_t stream, void* workspace = nullptr);

}  // namespace moeserve::cuda

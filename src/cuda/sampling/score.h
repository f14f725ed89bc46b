// Scored prompt positions on the GPU (prompt logprobs): rows whose token is given (SampleRowParams::forced >= 0)
// need no sampling, only that token's logprob and the top-n logprobs of the raw logits. One block a row, one read
// of the row (a second for top-n > 1); sample() skips these rows, so a step runs both over the same arguments.
#pragma once

#include "cuda/common.h"
#include "cuda/sampling/sampling_types.h"

namespace moeserve::cuda {

// For every row r with a.params[r].forced >= 0: out_ids[r] = forced, out_logprobs[r] (when non-null) = its raw
// logprob, out_ranks[r] (when non-null) = 1 + the tokens whose raw logit is larger (vLLM's rank), top_ids / top_logprobs[r, 0 .. n) the n = min(top_logprobs, max_top, vocab) largest raw logprobs, most
// likely first, ties to the lower id (as sample()), the rest of the row's max_top entries -1 / -inf. Other rows are
// not touched. Needs no workspace; capturable; forced ids must lie in [0, vocab) (the host checks them).
void score_forced_rows(const SampleArgs& a, cudaStream_t stream);

}  // namespace moeserve::cuda

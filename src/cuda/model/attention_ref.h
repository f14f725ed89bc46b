// The plain attention backend: one warp per (query row, head), any head_dim up to 256, any page size. Slow
// on long contexts but obviously right; it serves the shapes the tensor-core kernels do not cover (tiny test
// models with head_dim 16..48) and is graph-capturable.
#pragma once

#include "cuda/kernels/ops.h"

namespace moeserve::cuda {

void paged_attention_reference(const bf16* q, int64_t q_stride, const bf16* k_cache, const bf16* v_cache,
                               const AttnMeta& meta, const AttnShape& shape, int max_new_lens, bf16* out,
                               int64_t out_stride, cudaStream_t stream);

}  // namespace moeserve::cuda

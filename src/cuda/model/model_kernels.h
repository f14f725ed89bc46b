// Small glue kernels of the model pass.
#pragma once

#include "cuda/common.h"

namespace moeserve::cuda {

// dst[i, :] = src[rows[i], :] for i < R (H elements per row, src row stride src_stride).
void gather_rows(const bf16* src, int64_t src_stride, const int32_t* rows, int R, int H, bf16* dst,
                 cudaStream_t stream);

}  // namespace moeserve::cuda

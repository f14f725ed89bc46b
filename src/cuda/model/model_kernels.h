// Small glue kernels of the model pass.
#pragma once

#include "cuda/common.h"

namespace moeserve::cuda {

// dst[i, :] = src[rows[i], :] for i < R (H elements per row, src row stride src_stride).
void gather_rows(const bf16* src, int64_t src_stride, const int32_t* rows, int R, int H, bf16* dst,
                 cudaStream_t stream);

// The folded router's weights (moe_route_folded), computed once at load from the router W_r [E, H], the RMSNorm
// weights g_in (input) and g_post (post-attention) [H] and o_proj's W_o [H, QD], all bf16, products in f32:
// in_rows[e, k] = W_r[e, k] g_post[k] / g_in[k] (every g_in[k] != 0), o_rows[e, j] = sum_k W_r[e, k] g_post[k] W_o[k, j].
void fold_router_weights(const bf16* router, const bf16* g_in, const bf16* g_post, const bf16* w_o, int E, int H,
                         int QD, bf16* in_rows, bf16* o_rows, cudaStream_t stream);

}  // namespace moeserve::cuda

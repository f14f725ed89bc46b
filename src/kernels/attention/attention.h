// Causal grouped-query attention over a paged KV cache (CPU). Query token i of a sequence sits at position
// start + i and sees keys 0 .. start + i. Chunked prefill is the same call with start > 0.
#pragma once

#include <cstdint>
#include <vector>

namespace moeserve {
class ThreadPool;
}

namespace moeserve::kernels {

// One layer's K and V pages: page p holds [page_size, kv_heads, head_dim] f32 at base + p * page_stride.
struct PagedKV {
  float* k = nullptr;
  float* v = nullptr;
  int64_t page_stride = 0;
  int64_t page_size = 0, kv_heads = 0, head_dim = 0;
};

struct AttnSeq {
  const int32_t* block_table = nullptr;  // pages holding positions 0 .. start + num_tokens - 1
  int64_t start = 0;                     // tokens already in the cache before this step
  int64_t num_tokens = 0;                // new tokens in this step
  int64_t row = 0;                       // first row of this sequence in q / k / v / out
};

// Stores the new tokens' keys and values (rows seq.row ..) at positions start .. start + num_tokens - 1.
void write_kv(const PagedKV& kv, const std::vector<AttnSeq>& seqs, const float* k, int64_t k_stride, const float* v,
              int64_t v_stride);

// out[row, h, :] = softmax(q[row, h] . K^T * scale) V, heads sharing KV heads in groups of heads / kv_heads.
void paged_attention(const float* q, int64_t q_stride, int64_t heads, const PagedKV& kv,
                     const std::vector<AttnSeq>& seqs, float scale, float* out, int64_t out_stride, ThreadPool& pool);

}  // namespace moeserve::kernels

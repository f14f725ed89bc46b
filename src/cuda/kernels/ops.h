// The CUDA kernels of a transformer layer other than GEMM and MoE, with BF16 activations, an f32 residual
// stream and a BF16 paged KV cache. Every function launches on `stream`, never synchronizes, never allocates:
// all of them can be captured in a CUDA graph. Pointers are device pointers unless a comment says otherwise.
#pragma once

#include "cuda/common.h"

namespace moeserve::cuda {

// residual[t, :] = float(table[id of t, :]) for t < T. The id of t is ids[t] (checked by the host before the step),
// or, where prev_rows[t] >= 0, prev_ids[prev_rows[t]]: a token the step before sampled and left on the device.
// partials (H % 16 == 0): also partials[t, j] = the sum of squares of residual[t, 16 j .. 16 j + 15], the residual
// fusion's form (gemv_norm_in).
void embedding(const int32_t* ids, const bf16* table, int T, int H, float* residual, cudaStream_t stream,
               const int32_t* prev_rows = nullptr, const int32_t* prev_ids = nullptr, float* partials = nullptr);

// out[r, :] = bf16(x[r, :] * rsqrt(mean(x[r]^2) + eps) * w), the norm computed in f32. inv_out (optional, [rows]):
// each row's factor rsqrt(mean(x[r]^2) + eps) (the folded router of mid-sized decode steps divides by it).
void rmsnorm(const float* x, const bf16* w, float eps, int rows, int dim, bf16* out, cudaStream_t stream,
             float* inv_out = nullptr);

// Fused residual add then norm: residual[r] += float(x[r]); out[r] = bf16(rmsnorm(residual[r]) * w).
// x may be bf16 (the o_proj / MoE outputs). inv_out as for rmsnorm.
void add_rmsnorm(float* residual, const bf16* x, const bf16* w, float eps, int rows, int dim, bf16* out,
                 cudaStream_t stream, float* inv_out = nullptr);

// SwiGLU for dense MLPs: out[t, i] = bf16(silu(g) * u) with g = gate_up[t, i], u = gate_up[t, I + i].
void silu_mul(const bf16* gate_up, int T, int I, bf16* out, cudaStream_t stream);

// Rotary embedding tables (rotate-half form, as transformers' Qwen models): inv_freq[rotary_dim / 2] on the
// device; cos/sin are computed per position in f32 as (position * inv_freq) then * attention_scaling.
struct RopeArgs {
  const float* inv_freq = nullptr;
  int rotary_dim = 0;  // <= head_dim, even
  float attention_scaling = 1.0f;
};

// The attention input stage, fused. qkv: [T, (heads + 2 * kv_heads) * head_dim] rows (q heads, then k heads,
// then v heads), row stride qkv_stride elements. For each token t:
//  - q heads: per-head RMSNorm with q_norm (skipped when q_norm == nullptr), then RoPE at positions[t]; in place;
//  - k heads: the same with k_norm, in place, and also stored into the cache;
//  - v heads: stored into the cache unchanged.
// The cache slot of token t is slots[t] = page * page_size + offset (slots[t] < 0: not stored). Caches are
// [num_pages, page_size, kv_heads, head_dim] bf16 for one layer.
void qk_norm_rope_store_kv(bf16* qkv, int64_t qkv_stride, int T, int heads, int kv_heads, int head_dim,
                           const bf16* q_norm, const bf16* k_norm, float eps, const int32_t* positions,
                           const RopeArgs& rope, const int32_t* slots, bf16* k_cache, bf16* v_cache,
                           cudaStream_t stream);

// Paged attention metadata for one step, built on the host and copied to the device before the step (for a
// captured decode graph: copied into the graph's fixed buffers before replay).
struct AttnMeta {
  const int32_t* block_tables = nullptr;  // [num_seqs, max_pages] page ids of each sequence, position order
  int max_pages = 0;                      // row stride of block_tables
  const int32_t* kv_lens = nullptr;       // [num_seqs] tokens in the cache after this step (start + new)
  const int32_t* new_lens = nullptr;      // [num_seqs] new (query) tokens this step; 0: padding, skipped
  const int32_t* q_rows = nullptr;        // [num_seqs] first row of the sequence in q / out
  int num_seqs = 0;
  int page_size = 16;
  // Profiling hook (tests and benchmarks only; null when serving): the keys-as-M decode blocks write clock64() at
  // kAttnPhaseCount points, [linear block][phase] (attention_decode_gqa.cuh names them).
  long long* phase_clocks = nullptr;
};
constexpr int kAttnPhaseCount = 8;

// Query token i of a sequence (row q_rows[s] + i) sits at position kv_lens[s] - new_lens[s] + i and attends
// causally to positions 0 .. that position. GQA: head h uses kv head h / (heads / kv_heads).
// q: row stride q_stride elements, head h at column h * head_dim; out: [rows, heads * head_dim] with
// row stride out_stride. scale = 1 / sqrt(head_dim) for Qwen models. Rows not covered by any sequence are
// left untouched.
struct AttnShape {
  int heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
};

// Prefill / chunked prefill / mixed batches: flash-attention style over query tiles. max_new_lens: an upper
// bound of new_lens (host-known; sets the grid).
void paged_attention_prefill(const bf16* q, int64_t q_stride, const bf16* k_cache, const bf16* v_cache,
                             const AttnMeta& meta, const AttnShape& shape, int max_new_lens, bf16* out,
                             int64_t out_stride, cudaStream_t stream);

// Decode (one new token per sequence), split-KV: each sequence's keys are cut into up to `num_splits` parts
// processed by separate blocks, then merged by a second launch. The grids depend only on (num_seqs, num_splits),
// so a graph captured for a batch size replays for any lengths <= max_pages * page_size. workspace: at least
// decode_workspace_bytes(num_seqs, heads, head_dim, num_splits) bytes (the parts' partial outputs; every part
// the merge reads is written by the same step, so no state is carried between launches; init_decode_workspace
// zeroes it). One workspace sized for the largest (num_seqs, num_splits) serves every smaller launch.
size_t decode_workspace_bytes(int num_seqs, int heads, int head_dim, int num_splits);
void init_decode_workspace(void* workspace, size_t workspace_bytes, cudaStream_t stream);
void paged_attention_decode(const bf16* q, int64_t q_stride, const bf16* k_cache, const bf16* v_cache,
                            const AttnMeta& meta, const AttnShape& shape, int num_splits, void* workspace,
                            size_t workspace_bytes, bf16* out, int64_t out_stride, cudaStream_t stream);

// Decode with the attention input stage inside the attention launch (one kernel where the unfused step runs
// qk_norm_rope_store_kv, then paged_attention_decode): qkv holds each token's raw q/k/v row as
// qk_norm_rope_store_kv takes it; every block norms and rotates the q heads it needs, and the blocks whose keys
// hold the new token also norm and rotate its k and store k and v at slots[row] of the caches. qkv is not
// modified. Needs RoPE over the whole head (attention_input_stage_fusable); the math is qk_norm_rope_store_kv's.
struct AttnInputStage {
  const bf16* q_norm = nullptr;  // [head_dim] or null (no norm)
  const bf16* k_norm = nullptr;
  float eps = 1e-6f;
  const int32_t* positions = nullptr;  // [rows] the position of each token row
  RopeArgs rope;
  const int32_t* slots = nullptr;  // [rows] cache slot of each token row (< 0: not stored)
};
bool attention_input_stage_fusable(const AttnShape& shape, const RopeArgs& rope);
// Whether paged_attention_decode runs the keys-as-M tiles (attention_decode_gqa.cuh) for this shape and batch:
// head_dim 128, groups of up to 8 heads, MOESERVE_ATTN_DECODE_GQA_MIN (default 1) sequences or more.
bool decode_gqa_usable(const AttnShape& shape, int num_seqs);
// Whether paged_attention_decode_fused_input runs the keys-as-M tiles with the input stage inside where they apply
// (MOESERVE_ATTN_GQA_FUSED_IN=0: the 16-row tiles take the fused input stage there, and the model runs the keys-as-M
// tiles with qk_norm_rope_store_kv as a launch of its own instead).
bool decode_gqa_fused_input();
// Split-KV parts for a decode grid of num_seqs sequences on `sms` multiprocessors (at most max_splits): one wave
// of blocks (two an SM at head_dim <= 128, one at 256); but where the keys-as-M tiles merge inside clusters, as
// many parts as keep the grid at one block an SM (so that the cluster merge applies) when that is at least 2
// (MOESERVE_ATTN_CLUSTER_SPLITS=0: never).
int paged_attention_decode_splits(const AttnShape& shape, int num_seqs, int sms, int max_splits);
void paged_attention_decode_fused_input(const bf16* qkv, int64_t qkv_stride, bf16* k_cache, bf16* v_cache,
                                        const AttnMeta& meta, const AttnShape& shape, const AttnInputStage& in,
                                        int num_splits, void* workspace, size_t workspace_bytes, bf16* out,
                                        int64_t out_stride, cudaStream_t stream);

}  // namespace moeserve::cuda

// Paged attention launchers: prefill (flash-attention tiles over the new tokens) and decode (split-KV over the
// cached keys, then a launch that merges the parts). Both run the tensor-core kernel of attention_mma.cuh; see there for the tiling.
// Prefill at head_dim 128 on an sm_90 GPU runs the warp-specialized wgmma tiles of attention_wgmma_ws.cuh instead
// (MOESERVE_ATTN_PREFILL_WS=0: the two-CTA tiles of attention_wgmma.cuh).
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/env.h"
#include "cuda/device.h"
#include "cuda/kernels/attention_decode_gqa.cuh"
#include "cuda/kernels/attention_mma.cuh"
#include "cuda/kernels/attention_wgmma.cuh"
#include "cuda/kernels/attention_wgmma_ws.cuh"
#include "cuda/kernels/kernel_utils.cuh"
#include "cuda/kernels/ops.h"
#include "cuda/launch.h"

namespace moeserve::cuda {

namespace {

using detail::AttnParams;

// The kernel's dynamic shared-memory ceiling raised to `bytes` the first time a launch needs it (device.cu's
// raise_dynamic_smem remembers it), not by cudaFuncSetAttribute before every launch.
void raise_smem_or_throw(const void* kernel, size_t bytes) {
  MS_CHECK(raise_dynamic_smem(kernel, bytes), "paged attention: the device refuses {} bytes of shared memory a block",
           bytes);
}

template <int D, int WARPS_M, int WARPS_N, int BLOCK_N, int STAGES, bool DECODE, bool SPLIT, bool FUSED_IN = false>
void launch_attention(dim3 grid, const AttnParams& p, cudaStream_t stream) {
  constexpr size_t smem = detail::attn_smem_bytes<D, WARPS_M, WARPS_N, BLOCK_N, STAGES>();
  // sm_90 allows 227 KB of dynamic shared memory per block.
  static_assert(smem <= 227 * 1024, "attention tile does not fit in shared memory");
  auto kernel = detail::paged_attention_mma_kernel<D, WARPS_M, WARPS_N, BLOCK_N, STAGES, DECODE, SPLIT, FUSED_IN>;
  // A host-side attribute, not a stream operation: allowed while a graph is being captured (raised once a process).
  raise_smem_or_throw(reinterpret_cast<const void*>(kernel), smem);
  launch_pdl(kernel, grid, dim3(128), smem, stream, p);
}

// Prefill: 64 rows (4 warps x 16) per block. Key tiles of 32 at head_dim 128 and 256 (at 128: 168 registers and
// 48 KB, 3 blocks an SM where 64-key tiles allow 2; on the H200 a 16 x 512-token prefill took 274 us per layer
// against 387 with 64-key tiles, and 345 with 3 stages of 32 keys); head_dim 64 keeps 64 (not measured with 32).
template <int D>
void launch_prefill(dim3 grid, const AttnParams& p, cudaStream_t stream) {
  launch_attention<D, 4, 1, (D == 64 ? 64 : 32), 2, false, false>(grid, p, stream);
}

// Decode: 16 rows (the heads of a group) per block, each warp a quarter of every 64-key tile; a 3-stage K/V
// ring (two 64-key tiles in flight per block). Shared memory per block: 50 KB (head_dim 64), 100 KB (128: two
// blocks per SM), 200 KB (256).
template <int D, bool FUSED_IN>
void launch_decode(dim3 grid, const AttnParams& p, bool split, cudaStream_t stream) {
  constexpr int kStages = 3;
  if (split) {
    launch_attention<D, 1, 4, 64, kStages, true, true, FUSED_IN>(grid, p, stream);
    // Then the parts' merge: a block per (row tile, kv head, sequence).
    const dim3 merge_grid(grid.x / unsigned(p.num_splits), grid.y, grid.z);
    launch_pdl(detail::split_merge_kernel<D>, merge_grid, dim3(128), 0, stream, p);
  } else {
    launch_attention<D, 1, 4, 64, kStages, true, false, FUSED_IN>(grid, p, stream);
  }
}

template <bool FUSED_IN>
void launch_decode_for(int head_dim, dim3 grid, const AttnParams& p, bool split, cudaStream_t stream) {
  switch (head_dim) {
    case 64: launch_decode<64, FUSED_IN>(grid, p, split, stream); break;
    case 128: launch_decode<128, FUSED_IN>(grid, p, split, stream); break;
    default: launch_decode<256, FUSED_IN>(grid, p, split, stream); break;
  }
}

AttnParams make_params(const char* op, const bf16* q, int64_t q_stride, const bf16* k_cache, const bf16* v_cache,
                       const AttnMeta& meta, const AttnShape& shape, bf16* out, int64_t out_stride) {
  MS_CHECK(shape.heads > 0 && shape.kv_heads > 0 && shape.heads % shape.kv_heads == 0,
           "{}: {} heads over {} kv heads", op, shape.heads, shape.kv_heads);
  MS_CHECK(shape.head_dim == 64 || shape.head_dim == 128 || shape.head_dim == 256,
           "{}: head_dim {} is not supported (64, 128, 256)", op, shape.head_dim);
  MS_CHECK(meta.page_size > 0, "{}: page_size {}", op, meta.page_size);
  MS_CHECK(meta.num_seqs >= 0 && meta.num_seqs <= 65535, "{}: num_seqs {} (grid limit 65535)", op, meta.num_seqs);
  MS_CHECK(shape.kv_heads <= 65535, "{}: kv_heads {}", op, shape.kv_heads);
  MS_CHECK(meta.num_seqs == 0 || (meta.block_tables != nullptr && meta.kv_lens != nullptr &&
                                  meta.new_lens != nullptr && meta.q_rows != nullptr && meta.max_pages > 0),
           "{}: incomplete metadata", op);
  // 16-byte cp.async of q, K and V rows; bf16x2 / vector stores of out rows.
  MS_CHECK(detail::aligned_to(q, 16) && q_stride % 8 == 0 && q_stride >= int64_t(shape.heads) * shape.head_dim,
           "{}: q must be 16-byte aligned with a row stride that is a multiple of 8 (stride {})", op, q_stride);
  MS_CHECK(detail::aligned_to(out, 16) && out_stride % 8 == 0 &&
               out_stride >= int64_t(shape.heads) * shape.head_dim,
           "{}: out must be 16-byte aligned with a row stride that is a multiple of 8 (stride {})", op, out_stride);
  MS_CHECK(detail::aligned_to(k_cache, 16) && detail::aligned_to(v_cache, 16), "{}: caches must be 16-byte aligned",
           op);
  AttnParams p{};
  p.q = q;
  p.q_stride = q_stride;
  p.k_cache = k_cache;
  p.v_cache = v_cache;
  p.block_tables = meta.block_tables;
  p.max_pages = meta.max_pages;
  p.kv_lens = meta.kv_lens;
  p.new_lens = meta.new_lens;
  p.q_rows = meta.q_rows;
  p.page_size = meta.page_size;
  p.phase_clocks = meta.phase_clocks;
  p.heads = shape.heads;
  p.kv_heads = shape.kv_heads;
  p.group = shape.heads / shape.kv_heads;
  p.scale_log2 = shape.scale * 1.4426950408889634f;
  p.out = out;
  p.out_stride = out_stride;
  p.num_splits = 1;
  return p;
}

constexpr size_t round_up_256(size_t n) { return (n + 255) / 256 * 256; }

// The wgmma prefill tiles (attention_wgmma.cuh) where head_dim is 128 and the device is an sm_90 GPU (their code
// exists for sm_90a only). MOESERVE_ATTN_PREFILL_WGMMA=0: the mma.sync tiles everywhere.
bool prefill_wgmma_usable(int head_dim) {
  static const bool on = [] {
    if (!env_flag("MOESERVE_ATTN_PREFILL_WGMMA", true)) return false;
    return current_device_sm() == 90;
  }();
  return on && head_dim == detail::kWgDim;
}

// The warp-specialized persistent form (attention_wgmma_ws.cuh) unless MOESERVE_ATTN_PREFILL_WS=0 (the two-CTA
// tiles of attention_wgmma.cuh).
bool prefill_ws_on() {
  static const bool on = env_flag("MOESERVE_ATTN_PREFILL_WS", true);
  return on;
}

void launch_prefill_wgmma(const AttnParams& p, int max_new_lens, int kv_heads, int num_seqs, cudaStream_t stream) {
  if (prefill_ws_on()) {
    auto kernel = detail::paged_attention_prefill_ws_kernel;
    raise_smem_or_throw(reinterpret_cast<const void*>(kernel), detail::kWsSmemBytes);
    const int m_tiles = int(ceil_div(int64_t(max_new_lens) * p.group, detail::kWgRows));
    const int64_t items = int64_t(m_tiles) * kv_heads * num_seqs;
    MS_CHECK(items <= std::numeric_limits<int32_t>::max(), "paged_attention_prefill: {} work items", items);
    static const int sms = current_device_multiprocessors();
    const unsigned grid = unsigned(std::min<int64_t>(items, sms));
    static const bool use_list = env_flag("MOESERVE_ATTN_WS_ORDER", true);  // A/B: 0 walks the grid order
    launch_pdl(kernel, dim3(grid), dim3(detail::kWsThreads), detail::kWsSmemBytes, stream, p, m_tiles, num_seqs,
               use_list ? 1 : 0);
    return;
  }
  auto kernel = detail::paged_attention_prefill_wgmma_kernel;
  raise_smem_or_throw(reinterpret_cast<const void*>(kernel), detail::kWgSmemBytes);
  const int64_t rows = int64_t(max_new_lens) * p.group;
  const dim3 grid(unsigned(ceil_div(rows, detail::kWgRows)), unsigned(kv_heads), unsigned(num_seqs));
  launch_pdl(kernel, grid, dim3(256), detail::kWgSmemBytes, stream, p);
}

}  // namespace

void paged_attention_prefill(const bf16* q, int64_t q_stride, const bf16* k_cache, const bf16* v_cache,
                             const AttnMeta& meta, const AttnShape& shape, int max_new_lens, bf16* out,
                             int64_t out_stride, cudaStream_t stream) {
  AttnParams p =
      make_params("paged_attention_prefill", q, q_stride, k_cache, v_cache, meta, shape, out, out_stride);
  if (meta.num_seqs == 0 || max_new_lens <= 0) return;
  const int64_t rows = int64_t(max_new_lens) * p.group;
  MS_CHECK(rows <= std::numeric_limits<int32_t>::max() / 2, "paged_attention_prefill: {} rows", rows);
  if (prefill_wgmma_usable(shape.head_dim))
    return launch_prefill_wgmma(p, max_new_lens, shape.kv_heads, meta.num_seqs, stream);
  const dim3 grid(unsigned(ceil_div(rows, 64)), unsigned(shape.kv_heads), unsigned(meta.num_seqs));
  switch (shape.head_dim) {
    case 64: launch_prefill<64>(grid, p, stream); break;
    case 128: launch_prefill<128>(grid, p, stream); break;
    default: launch_prefill<256>(grid, p, stream); break;
  }
}

namespace {
// Experiment: MOESERVE_ATTN_MIN_SPLIT_KEYS sets the shortest split-KV part (default detail::kMinSplitKeys).
int decode_min_split_keys() {
  static const int keys = int(env_int("MOESERVE_ATTN_MIN_SPLIT_KEYS", detail::kMinSplitKeys, 1, 1 << 20));
  return keys;
}

// Workspace of a split decode: partial outputs, then their log2-sum-exps.
struct DecodeWorkspace {
  size_t o = 0, lse = 0, parts_end = 0;
};
DecodeWorkspace decode_workspace(int num_seqs, int heads, int head_dim, int num_splits) {
  DecodeWorkspace w;
  if (num_splits <= 1 || num_seqs <= 0) return w;  // one part: written straight to out
  const size_t parts = size_t(num_seqs) * size_t(num_splits) * size_t(heads);
  w.lse = round_up_256(parts * size_t(head_dim) * sizeof(float));
  w.parts_end = w.lse + round_up_256(parts * sizeof(float));
  return w;
}
}  // namespace

size_t decode_workspace_bytes(int num_seqs, int heads, int head_dim, int num_splits) {
  const DecodeWorkspace w = decode_workspace(num_seqs, heads, head_dim, num_splits);
  return w.parts_end;
}

void init_decode_workspace(void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (workspace_bytes == 0) return;
  MS_CHECK(workspace != nullptr, "init_decode_workspace: no workspace");
  MS_CUDA_CHECK(cudaMemsetAsync(workspace, 0, workspace_bytes, stream));
}

// The keys-as-M decode tiles (attention_decode_gqa.cuh) for the unfused input stage at head_dim 128 and groups of
// up to 8 heads, from MOESERVE_ATTN_DECODE_GQA_MIN sequences on (default 1; 0: never). H200, q30b8l served step
// (two calls): 665.1-667.8 / 3,213.5-3,214.9 / 3,354.6-3,359.4 us at batch 1 / 64 / 128 with them (and the input
// stage as its own launch) against 672.0-672.6 / 3,231.1-3,236.8 / 3,403.9-3,404.1 for the 16-row tiles with the
// fused input stage up to 64 sequences; the attention alone at 128: 41.1 against 42.5 us.
bool decode_gqa_fused_input() {
  static const bool on = env_flag("MOESERVE_ATTN_GQA_FUSED_IN", true);
  return on;
}

bool decode_gqa_usable(const AttnShape& shape, int num_seqs) {
  static const int min_seqs = int(env_int("MOESERVE_ATTN_DECODE_GQA_MIN", 1, 0, 1 << 20));
  return min_seqs > 0 && num_seqs >= min_seqs && shape.head_dim == 128 && shape.kv_heads > 0 &&
         shape.heads / shape.kv_heads <= detail::kGqaMaxGroup;
}

namespace {

// The cluster path's K / V ring depth: 2 stages (66 KB blocks instead of 98 KB) for grids of at most half as many
// blocks as SMs. Such a block fits beside two of the q/k/v GEMV's ring blocks (68 KB each) and so becomes resident,
// and starts its cached keys, while that GEMV still runs; the GEMVs and the MoE down GEMV around it also run faster
// (H200, q30b8l served step, session 14: bs 1 (64 blocks) 656.0 / 658.0 us against 667.0 / 666.2; trace: GEMVs -5.7,
// down GEMV -3.6, attention -1.8 us a step), while at bs 4 (128 blocks) it cost +24 us. MOESERVE_ATTN_GQA_CLUSTER_STAGES
// = 2 or 3 forces a depth (A/B switch).
int decode_cluster_stages(dim3 grid) {
  static const int forced = int(env_int("MOESERVE_ATTN_GQA_CLUSTER_STAGES", 0, 0, 3));
  if (forced >= 2) return forced;
  static const int sms = current_device_multiprocessors();
  return 2 * int64_t(grid.x) * grid.y * grid.z <= sms ? 2 : detail::kGqaStages;
}

template <bool FUSED_IN, int STAGES>
bool cluster_fits(int splits) {  // false: no cluster of this size here, the merge launch
  auto kernel = detail::paged_attention_decode_gqa_kernel<128, true, true, FUSED_IN, STAGES>;
  return cluster_fits_device(reinterpret_cast<const void*>(kernel), splits, 128, detail::gqa_smem_bytes<128, STAGES>());
}

// Whether the split parts of a keys-as-M decode grid are merged inside clusters of `grid.x` blocks (see
// attention_decode_gqa.cuh) rather than by the merge launch: only for grids of at most one block an SM (H200,
// q30b8l served step, context 512: bs 1 (64 blocks) 633-635 us against 647-653 with the merge launch; bs 8 (256
// blocks in clusters of 8) 1,651 against 1,604-1,614: clusters must fit in one GPC, so two blocks an SM no longer
// make one wave). MOESERVE_ATTN_CLUSTER_MERGE=0 turns it off; sizes above 8 are non-portable cluster sizes, used
// only where the occupancy calculator says such a cluster fits on this GPU. Returns the cluster kernel's K / V ring
// depth (decode_cluster_stages), 0 where the parts are not merged in clusters.
template <bool FUSED_IN>
int decode_cluster_merge(dim3 grid) {
  static const bool on = env_flag("MOESERVE_ATTN_CLUSTER_MERGE", true);
  const int splits = int(grid.x);
  if (!on || splits <= 1 || splits > 16) return 0;
  static const int sms = current_device_multiprocessors();
  if (int64_t(grid.x) * grid.y * grid.z > sms) return 0;
  const int stages = decode_cluster_stages(grid);
  const bool fits = stages == 2 ? cluster_fits<FUSED_IN, 2>(splits) : cluster_fits<FUSED_IN, 3>(splits);
  return fits ? stages : 0;
}

}  // namespace

int paged_attention_decode_splits(const AttnShape& shape, int num_seqs, int sms, int max_splits) {
  const int per_split = std::max(1, num_seqs * shape.kv_heads);  // blocks a split adds
  const int blocks = shape.head_dim > 128 ? sms : 2 * sms;
  int splits = std::clamp(blocks / per_split, 1, max_splits);
  // H200, q30b8l served step, context 512 (two A/Bs in one call): bs 4 1,139.6 / 1,141.5 us against 1,143.8 /
  // 1,152.2 (8 parts in clusters instead of 16 with the merge launch), bs 8 1,618.3 / 1,619.4 against 1,624.8 /
  // 1,634.4 (4 parts instead of 8).
  static const bool cluster_fit =
      env_flag("MOESERVE_ATTN_CLUSTER_SPLITS", true) && env_flag("MOESERVE_ATTN_CLUSTER_MERGE", true);
  // At bs 1 and 2 this takes 16 parts (non-portable clusters of 16 blocks, of which 8 hold keys at context 512):
  // H200, session 22, three same-call pairs: bs 1 558.6-558.8 us with at most 8 (all holding keys) and 563.4-563.7
  // with 4, against 544.9-547.7 with 16 (the idle blocks share the cluster merge).
  if (cluster_fit && decode_gqa_usable(shape, num_seqs)) {
    const int fit = std::min({sms / per_split, max_splits, 16});
    if (fit >= 2) splits = fit;
  }
  return splits;
}

namespace {

template <bool FUSED_IN>
void launch_decode_gqa(AttnParams p, dim3 grid, bool split, cudaStream_t stream) {
  constexpr size_t smem = detail::gqa_smem_bytes<128>();
  static const bool prewait = env_flag("MOESERVE_ATTN_KV_PREWAIT", true);  // A/B switch
  p.kv_prewait = prewait ? 1 : 0;
  // The entry's metadata loads in one round trip where the grid has no split parts (session 43: at bs 64 a block
  // took 2.8 us from entry to its first cached keys issued - three dependent loads: the new length, the KV length,
  // the block table - on the step's path, as cuBLASLt's q/k/v before it does not release its dependents early).
  static const bool early = env_flag("MOESERVE_ATTN_EARLY_META", true);  // A/B switch
  p.early_meta = early ? 1 : 0;
  // (cudaFuncSetAttribute done by decode_cluster_merge)
  if (const int stages = split ? decode_cluster_merge<FUSED_IN>(grid) : 0; stages > 0) {
    if (stages == 2)
      launch_pdl_cluster(detail::paged_attention_decode_gqa_kernel<128, true, true, FUSED_IN, 2>, grid, dim3(128),
                         detail::gqa_smem_bytes<128, 2>(), stream, grid.x, p);
    else
      launch_pdl_cluster(detail::paged_attention_decode_gqa_kernel<128, true, true, FUSED_IN>, grid, dim3(128), smem,
                         stream, grid.x, p);
    return;
  }
  auto kernel = split ? detail::paged_attention_decode_gqa_kernel<128, true, false, FUSED_IN>
                      : detail::paged_attention_decode_gqa_kernel<128, false, false, FUSED_IN>;
  raise_smem_or_throw(reinterpret_cast<const void*>(kernel), smem);
  launch_pdl(kernel, grid, dim3(128), smem, stream, p);
  if (split) launch_pdl(detail::split_merge_kernel<128>, dim3(1, grid.y, grid.z), dim3(128), 0, stream, p);
}

void run_decode(AttnParams p, const AttnMeta& meta, const AttnShape& shape, int num_splits, void* workspace,
                size_t workspace_bytes, bool fused_in, cudaStream_t stream) {
  MS_CHECK(num_splits >= 1 && num_splits <= 1024, "paged_attention_decode: num_splits {}", num_splits);
  if (meta.num_seqs == 0) return;
  const bool split = num_splits > 1;
  if (split) {
    const DecodeWorkspace w = decode_workspace(meta.num_seqs, shape.heads, shape.head_dim, num_splits);
    MS_CHECK(workspace != nullptr && detail::aligned_to(workspace, 16) && workspace_bytes >= w.parts_end,
             "paged_attention_decode: workspace of {} bytes, {} needed", workspace_bytes, w.parts_end);
    char* base = static_cast<char*>(workspace);
    p.num_splits = num_splits;
    p.ws_o = reinterpret_cast<float*>(base + w.o);
    p.ws_lse = reinterpret_cast<float*>(base + w.lse);
    p.min_split_keys = decode_min_split_keys();
  }
  if (decode_gqa_usable(shape, meta.num_seqs) && (!fused_in || decode_gqa_fused_input())) {
    const dim3 grid(unsigned(num_splits), unsigned(shape.kv_heads), unsigned(meta.num_seqs));
    return fused_in ? launch_decode_gqa<true>(p, grid, split, stream) : launch_decode_gqa<false>(p, grid, split, stream);
  }
  const int m_tiles = int(ceil_div(p.group, detail::kDecodeRowTile));
  const dim3 grid(unsigned(m_tiles * num_splits), unsigned(shape.kv_heads), unsigned(meta.num_seqs));
  if (fused_in)
    launch_decode_for<true>(shape.head_dim, grid, p, split, stream);
  else
    launch_decode_for<false>(shape.head_dim, grid, p, split, stream);
}
}  // namespace

void paged_attention_decode(const bf16* q, int64_t q_stride, const bf16* k_cache, const bf16* v_cache,
                            const AttnMeta& meta, const AttnShape& shape, int num_splits, void* workspace,
                            size_t workspace_bytes, bf16* out, int64_t out_stride, cudaStream_t stream) {
  AttnParams p = make_params("paged_attention_decode", q, q_stride, k_cache, v_cache, meta, shape, out, out_stride);
  run_decode(p, meta, shape, num_splits, workspace, workspace_bytes, false, stream);
}

bool attention_input_stage_fusable(const AttnShape& shape, const RopeArgs& rope) {
  return (shape.head_dim == 64 || shape.head_dim == 128 || shape.head_dim == 256) &&
         rope.rotary_dim == shape.head_dim && rope.inv_freq != nullptr;
}

void paged_attention_decode_fused_input(const bf16* qkv, int64_t qkv_stride, bf16* k_cache, bf16* v_cache,
                                        const AttnMeta& meta, const AttnShape& shape, const AttnInputStage& in,
                                        int num_splits, void* workspace, size_t workspace_bytes, bf16* out,
                                        int64_t out_stride, cudaStream_t stream) {
  AttnParams p =
      make_params("paged_attention_decode_fused_input", qkv, qkv_stride, k_cache, v_cache, meta, shape, out, out_stride);
  MS_CHECK(attention_input_stage_fusable(shape, in.rope),
           "paged_attention_decode_fused_input: needs RoPE over the whole head (rotary_dim {}, head_dim {})",
           in.rope.rotary_dim, shape.head_dim);
  MS_CHECK(qkv_stride >= int64_t(shape.heads + 2 * shape.kv_heads) * shape.head_dim,
           "paged_attention_decode_fused_input: row stride {} holds no q/k/v row of {} heads", qkv_stride,
           shape.heads + 2 * shape.kv_heads);
  MS_CHECK(in.positions != nullptr && in.slots != nullptr, "paged_attention_decode_fused_input: positions and slots");
  const uintptr_t vec = uintptr_t(shape.head_dim / 32) * sizeof(bf16);
  MS_CHECK(detail::aligned_to(in.q_norm, vec) && detail::aligned_to(in.k_norm, vec),
           "paged_attention_decode_fused_input: norm weights aligned to {} bytes", vec);
  p.q_norm = in.q_norm;
  p.k_norm = in.k_norm;
  p.eps = in.eps;
  p.positions = in.positions;
  p.inv_freq = in.rope.inv_freq;
  p.rope_scaling = in.rope.attention_scaling;
  p.slots = in.slots;
  p.k_store = k_cache;
  p.v_store = v_cache;
  run_decode(p, meta, shape, num_splits, workspace, workspace_bytes, true, stream);
}

}  // namespace moeserve::cuda

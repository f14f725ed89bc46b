// The tensor-core paged attention kernel behind paged_attention_prefill and paged_attention_decode
// (internal header, included by attention.cu only).
//
// A block owns one (sequence, kv head) pair and a tile of BLOCK_M "rows", where a row is a (query token,
// q head of the GQA group) pair: row r is query r / group, head kv_head * group + r % group. Packing the
// heads of a group into the rows lets every K/V byte loaded into shared memory serve the whole group, and
// makes decode (one query, group heads) an ordinary tile.
//
// K/V tiles of BLOCK_N keys are gathered from the pages with cp.async (16-byte chunks, zero-filled past the
// block's key range) into a STAGES-deep shared-memory ring (STAGES - 1 tiles in flight while one is used), read
// back with ldmatrix (XOR-swizzled rows: no bank conflicts), and multiplied with mma.m16n8k16 (bf16 in, f32
// out). Softmax is the online (flash-attention 2) form in the exp2 domain, so a row's state is (m, l, acc) and
// tiles can be merged in any order.
//
// Two shapes of block (4 warps each):
//  - prefill: WARPS_M = 4, WARPS_N = 1: each warp owns 16 rows and all keys of a tile;
//  - decode:  WARPS_M = 1, WARPS_N = 4: 16 rows shared by all warps, each warp takes a quarter of every key
//    tile; the four partial states are merged through shared memory at the end. Decode does almost no math per
//    byte, so it runs a deeper ring (3 stages: two tiles in flight) to keep more of the cache read in flight.
// With SPLIT, the block handles only its part (a contiguous range of pages) of the keys and writes the
// normalized partial output and its log2-sum-exp to the workspace; split_merge_kernel, launched next, merges
// each (sequence, kv head, row tile)'s parts in split order (deterministic). A sequence is cut into at
// most num_splits parts of at least kMinSplitKeys keys (effective_splits): a graph captured with 16 parts
// serves short contexts with few.
// With FUSED_IN (decode), q is the raw q/k/v row: the block norms and rotates its q heads into the Q tile itself,
// and a block whose keys hold the new token norms and rotates its k, stores k and v to the caches and writes them
// into their ring slot when it lies in a prologue tile (a later tile loads them back from the cache); the unfused
// path runs qk_norm_rope_store_kv first.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/kernels/kernel_utils.cuh"
#include "cuda/kernels/mma_sm80.cuh"
#include "cuda/pdl.cuh"

namespace moeserve::cuda::detail {

struct AttnParams {
  const bf16* q;
  int64_t q_stride;
  const bf16* k_cache;
  const bf16* v_cache;
  const int32_t* block_tables;
  int max_pages;
  const int32_t* kv_lens;
  const int32_t* new_lens;
  const int32_t* q_rows;
  int page_size;
  int heads, kv_heads, group;
  float scale_log2;  // scale * log2(e): scores are kept in the exp2 domain
  bf16* out;
  int64_t out_stride;
  int num_splits;  // SPLIT only: key parts per sequence; grid.x = row tiles * num_splits
  float* ws_o;     // SPLIT only: [num_seqs, num_splits, heads, D] normalized partial outputs
  float* ws_lse;   // SPLIT only: [num_seqs, num_splits, heads] log2-sum-exp of the part (-inf: empty)
  int min_split_keys;  // SPLIT only: no part shorter than this (effective_splits)
  int kv_prewait;      // keys-as-M decode: issue the old keys of the prologue tiles before the programmatic wait
  int early_meta;      // keys-as-M decode without split parts: the lengths, the q row and the block-table row in one
                       // round trip at entry (MOESERVE_ATTN_EARLY_META=0 off)
  long long* phase_clocks;  // AttnMeta::phase_clocks
  // FUSED_IN only (decode with the input stage inside): q is the raw q/k/v row of the token (q heads, then k
  // heads, then v heads); q and k are RMS-normed (weights q_norm / k_norm, skipped when null) and rotated over
  // the whole head (rotary_dim == D) at positions[row], and the new k / v are stored at slots[row] of the caches.
  const bf16* q_norm;
  const bf16* k_norm;
  float eps;
  const int32_t* positions;
  const float* inv_freq;
  float rope_scaling;
  const int32_t* slots;
  bf16* k_store;  // the caches again, writable
  bf16* v_store;
};

// Split-KV merge of one 8-dim chunk of one q head: `part(z, lse, o0, o1)` gives part z's log2-sum-exp and the
// chunk of its normalized partial output. Loads of kMergeBatch parts are all issued before any is used, so up to
// kMergeBatch parts cost one round trip (a merge by one warp per head cost two or more per head, and each warp had
// two heads of a group of 8: 12 us more a step at batch 1 on the H200). Parts in order: within a batch M is the
// batch's maximum and w_z = 2^(lse_z - M); batches are combined with the running-max rescale (exact for one batch,
// the usual case: parts <= 8). Returns the merged chunk packed to bf16.
constexpr int kMergeBatch = 8;
template <typename Part>
__device__ __forceinline__ uint4 merge_parts_chunk(int parts, Part part) {
  constexpr float kNegInf = -INFINITY;
  float acc[8], M = kNegInf, W = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.0f;
  for (int z0 = 0; z0 < parts; z0 += kMergeBatch) {
    float lse[kMergeBatch];
    float4 o[kMergeBatch][2];
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i) {
      if (z0 + i < parts) {
        part(z0 + i, lse[i], o[i][0], o[i][1]);
      } else {
        lse[i] = kNegInf;
        o[i][0] = o[i][1] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    float mb = M;
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i) mb = fmaxf(mb, lse[i]);
    if (mb == kNegInf) continue;  // nothing visible so far
    const float scale = M == kNegInf ? 0.0f : exp2f(M - mb);
    W *= scale;
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] *= scale;
    M = mb;
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i) {
      if (lse[i] == kNegInf) continue;  // an empty part was never written: weight 0 (its o may be anything)
      const float w = exp2f(lse[i] - M);
      W += w;
      acc[0] += w * o[i][0].x, acc[1] += w * o[i][0].y, acc[2] += w * o[i][0].z, acc[3] += w * o[i][0].w;
      acc[4] += w * o[i][1].x, acc[5] += w * o[i][1].y, acc[6] += w * o[i][1].z, acc[7] += w * o[i][1].w;
    }
  }
  const float inv = W > 0.0f ? 1.0f / W : 0.0f;
  uint4 v;
  v.x = pack_bf16x2(acc[0] * inv, acc[1] * inv);
  v.y = pack_bf16x2(acc[2] * inv, acc[3] * inv);
  v.z = pack_bf16x2(acc[4] * inv, acc[5] * inv);
  v.w = pack_bf16x2(acc[6] * inv, acc[7] * inv);
  return v;
}

// Split-KV merge of `rows` consecutive q heads from h0 of sequence s by the whole block, a thread an item (row,
// 8-dim chunk), from the workspace. The parts were written by other blocks: read through L2.
template <int D>
__device__ __forceinline__ void merge_split_rows(const AttnParams& p, int s, int h0, int rows, int parts) {
  constexpr int CH = D / 8;
  for (int e = threadIdx.x; e < rows * CH; e += blockDim.x) {
    const int r = e / CH, c = e - r * CH;
    const int64_t base = int64_t(s) * p.num_splits * p.heads + h0 + r;  // part z: base + z * heads
    const uint4 v = merge_parts_chunk(parts, [&](int z, float& lse, float4& o0, float4& o1) {
      const int64_t part_row = base + int64_t(z) * p.heads;
      lse = __ldcg(p.ws_lse + part_row);
      const float4* src = reinterpret_cast<const float4*>(p.ws_o + part_row * D + c * 8);
      o0 = __ldcg(src);
      o1 = __ldcg(src + 1);
    });
    *reinterpret_cast<uint4*>(p.out + int64_t(p.q_rows[s]) * p.out_stride + int64_t(h0 + r) * D + c * 8) = v;
  }
}

// Split-KV: the parts a sequence of `key_end` keys is really cut into: at most num_splits, and none shorter than
// kMinSplitKeys keys (short contexts gain nothing from more blocks, and the merge costs per part). Blocks of
// parts past this exit at once. 64 since the merge is a launch of its own (H200, q30b8l served step, context
// 512: batch 1 673-677 us against 681-686 with 128, batch 8 and 32 even, context 2,048 even).
constexpr int kMinSplitKeys = 64;  // the default of AttnParams::min_split_keys
constexpr int kDecodeRowTile = 16;  // q heads of a decode block (WARPS_M = 1): the split merge's row tile too
// Keys [0, key_end) are visible to some row of a tile whose last row is last_row (row = token * G + head), the
// first new token sitting at position `start`. The attention blocks and the split merge cut the same parts.
__device__ __forceinline__ int visible_key_end(int start, int last_row, int G) {
  return max(start + last_row / G + 1, 0);
}
__device__ __forceinline__ int effective_splits(int num_splits, int key_end, int page_size, int min_split_keys) {
  const int n_pages = (key_end + page_size - 1) / page_size;
  const int min_pages = (max(min_split_keys, 1) + page_size - 1) / page_size;
  return max(1, min(num_splits, (n_pages + min_pages - 1) / min_pages));
}

// One row of the online softmax in a quad's m16 fragment: row lane / 4 (i = 0) or lane / 4 + 8 (i = 1), NT n8 tiles
// of scores in the exp2 domain (two a lane per tile). Takes the row maximum over the quad, turns the scores into
// p = 2^(s - m), updates the running (m, l) and returns the factor the row's accumulators must be scaled by.
template <int NT>
__device__ __forceinline__ float softmax_update_row(float (&s)[NT][4], int i, float& m, float& l) {
  float mx = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * i], s[nt][2 * i + 1]));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(m, mx);
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet stays at 0
  const float alpha = exp2f(m - m_use);
  m = m_new;
  float rs = 0.0f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float p0 = exp2f(s[nt][2 * i] - m_use), p1 = exp2f(s[nt][2 * i + 1] - m_use);
    s[nt][2 * i] = p0;
    s[nt][2 * i + 1] = p1;
    rs += p0 + p1;
  }
  l = l * alpha + rs;
  return alpha;
}

template <int D, int WARPS_M, int WARPS_N, int BLOCK_N, int STAGES>
constexpr size_t attn_smem_bytes() {
  return size_t(16 * WARPS_M * D + STAGES * 2 * BLOCK_N * D) * sizeof(bf16);
}

// Element offset of 16-byte chunk `ch` of row `r` in a [rows, D] bf16 tile: chunks are XOR-swizzled by
// (row mod 8), so eight rows read at the same column by ldmatrix fall in eight different bank groups.
template <int D>
__device__ __forceinline__ int swz(int r, int ch) {
  return r * D + ((ch ^ (r & 7)) << 3);
}

// K/V tile loader of the paged caches, shared by the tiles here and the keys-as-M decode: thread (ld_rg, ld_ch)
// of a 128-thread block copies 16-byte chunk ld_ch of RPT consecutive keys of a BLOCK_N-key tile into the swizzled
// ring slots dk / dv, following the block table page by page (one division per tile); rows past k_end are zeros.
// Decode: keys from `start` on are this step's, written by the kernel before. kAll copies every row; kCached
// skips this step's rows (issued before the programmatic wait); kNew copies only them (after it).
enum KvRows { kAll, kCached, kNew };
template <int D>
struct PagedKvLoader {
  static constexpr int CPR = D / 8;  // 16-byte chunks a key row
  const int32_t* table;
  const bf16* k_head;
  const bf16* v_head;
  int64_t row_stride;
  int page_size, k_end, start, ld_ch, ld_rg;
  int page0;  // table[i] is the entry of page page0 + i

  // staged (optional): the sequence's block-table entries from page page0_ on, copied to shared memory by the
  // block (a generic pointer: the dependent table load before each tile's copies is then a shared-memory one).
  __device__ __forceinline__ PagedKvLoader(const AttnParams& p, int s, int kvh, int k_end_, int start_, int tid,
                                           const int32_t* staged = nullptr, int page0_ = 0)
      : table(staged != nullptr ? staged : p.block_tables + int64_t(s) * p.max_pages),
        k_head(p.k_cache + int64_t(kvh) * D),
        v_head(p.v_cache + int64_t(kvh) * D),
        row_stride(int64_t(p.kv_heads) * D),
        page_size(p.page_size),
        k_end(k_end_),
        start(start_),
        ld_ch(tid % CPR),
        ld_rg(tid / CPR),
        page0(staged != nullptr ? page0_ : 0) {}

  template <int BLOCK_N>
  __device__ __forceinline__ void load(int tile_start, bf16* dk, bf16* dv, KvRows rows) const {
    constexpr int RPT = BLOCK_N / (128 / CPR);
    static_assert(128 % CPR == 0 && BLOCK_N % (128 / CPR) == 0, "load mapping");
    const int P = page_size;
    int key = tile_start + ld_rg * RPT;
    int page_idx = key / P;
    int off = key - page_idx * P;
    int page = key < k_end ? table[page_idx - page0] : 0;
#pragma unroll
    for (int j = 0; j < RPT; ++j) {
      const int r = ld_rg * RPT + j;
      const bool valid = key < k_end;
      const bool fresh = valid && key >= start;  // written this step
      if (rows == kAll || (rows == kCached && !fresh) || (rows == kNew && fresh)) {
        const int64_t o = valid ? (int64_t(page) * P + off) * row_stride + ld_ch * 8 : 0;
        cp_async_16(dk + swz<D>(r, ld_ch), k_head + o, valid);
        cp_async_16(dv + swz<D>(r, ld_ch), v_head + o, valid);
      }
      ++key;
      if (++off == P) {
        off = 0;
        ++page_idx;
        if (key < k_end) page = table[page_idx - page0];
      }
    }
  }
};

// The decode input stage inside an attention block (FUSED_IN): q is the raw q/k/v row of the step's token.
// Before the programmatic wait it reads only what the kernel before does not write (the rotary table, the norm
// weights, the slot); after it, warp w of the block's 4 takes items w, w + 4, ... of QROWS q heads from q_head0
// (zeros from q_valid on), then the new k and v when the block's keys [k_begin, k_end) hold the new key `start`:
// all loads first (one round trip), then RMSNorm + RoPE (q, k) as qk_norm_rope_store_kv computes them; q goes
// into the Q tile (rows 0 .. QROWS - 1), k / v into their ring slot when it lies in a prologue tile (a later tile
// loads them back from the cache) and into the caches (every block holding the new key stores the same bytes).
template <int D, int QROWS, int BLOCK_N, int STAGES>
__device__ __forceinline__ void decode_input_stage(const AttnParams& p, int kvh, int q_head0, int q_valid,
                                                   int q_row_base, int start, int k_begin, int k_end, bf16* sQ,
                                                   bf16* sK, bf16* sV) {
  constexpr int VPL = D / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float cs[VPL], sn[VPL], qw[VPL], kw[VPL];
  const float pos = float(p.positions[q_row_base]);
  rope_lane_table<VPL>(p.inv_freq, pos, p.rope_scaling, lane, cs, sn);
  if (p.q_norm != nullptr) load_bf16<VPL>(p.q_norm + lane * VPL, qw);
  if (p.k_norm != nullptr) load_bf16<VPL>(p.k_norm + lane * VPL, kw);
  const int32_t slot = p.slots[q_row_base];
  pdl_enter();  // q, k and v come from the kernel before
  const bf16* row = p.q + int64_t(q_row_base) * p.q_stride;
  const bool has_new = start >= k_begin && start < k_end;
  const int rel = start - k_begin, t_new = rel / BLOCK_N, r_new = rel - t_new * BLOCK_N;
  const int at = (lane * VPL / 8) * 8;  // the lane's elements sit in 16-byte chunk lane * VPL / 8 ...
  const int within = lane * VPL % 8;    // ... at this offset
  constexpr int kItems = QROWS + 2, kRounds = (kItems + 3) / 4;
  using Raw = std::conditional_t<VPL == 2, uint32_t, std::conditional_t<VPL == 4, uint2, uint4>>;
  static_assert(sizeof(Raw) == VPL * sizeof(bf16), "a lane's elements in one vector");
  auto item_src = [&](int item) -> const bf16* {
    if (item < QROWS) return item < q_valid ? row + int64_t(q_head0 + item) * D : nullptr;
    if (item < kItems && has_new) return row + int64_t(p.heads + (item == QROWS ? 0 : p.kv_heads) + kvh) * D;
    return nullptr;
  };
  Raw raw[kRounds];
#pragma unroll
  for (int i = 0; i < kRounds; ++i) {
    const bf16* src = item_src(warp + 4 * i);
    if (src != nullptr) raw[i] = *reinterpret_cast<const Raw*>(src + lane * VPL);
  }
#pragma unroll
  for (int i = 0; i < kRounds; ++i) {
    const int item = warp + 4 * i;
    if (item >= kItems) break;
    const bool present = item_src(item) != nullptr;  // warp-uniform
    if (item >= QROWS && !present) continue;
    float x[VPL];
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw[i]);
#pragma unroll
    for (int j = 0; j < VPL / 2; ++j) {
      const float2 f = present ? __bfloat1622float2(h[j]) : make_float2(0.0f, 0.0f);
      x[2 * j] = f.x;
      x[2 * j + 1] = f.y;
    }
    if (item < QROWS) {
      if (present) norm_rope_head<VPL>(x, qw, p.q_norm != nullptr, p.eps, cs, sn, lane);
      store_bf16<VPL>(sQ + swz<D>(item, at / 8) + within, x);
    } else {
      const bool is_k = item == QROWS;
      if (is_k) norm_rope_head<VPL>(x, kw, p.k_norm != nullptr, p.eps, cs, sn, lane);
      if (t_new < STAGES - 1)
        store_bf16<VPL>((is_k ? sK : sV) + t_new * BLOCK_N * D + swz<D>(r_new, at / 8) + within, x);
      if (slot >= 0)
        store_bf16<VPL>((is_k ? p.k_store : p.v_store) + (int64_t(slot) * p.kv_heads + kvh) * D + lane * VPL, x);
    }
  }
}

template <int D, int WARPS_M, int WARPS_N, int BLOCK_N, int STAGES, bool DECODE, bool SPLIT, bool FUSED_IN = false>
__global__ void __launch_bounds__(128) paged_attention_mma_kernel(const AttnParams p) {
  constexpr int kThreads = 128;
  static_assert(STAGES >= 2 && STAGES <= 4, "K/V ring depth");
  static_assert(WARPS_M * WARPS_N == 4, "4 warps");
  static_assert(WARPS_M == 1 || WARPS_N == 1, "rows or keys split over warps, not both");
  static_assert(!SPLIT || DECODE, "split-KV is a decode feature");
  static_assert(!FUSED_IN || (DECODE && BLOCK_N >= STAGES), "the fused input stage is a decode feature");
  constexpr int BLOCK_M = 16 * WARPS_M;
  constexpr int WARP_N = BLOCK_N / WARPS_N;  // keys of a tile handled by one warp
  static_assert(WARP_N % 16 == 0, "whole k16 steps of P V per warp");
  constexpr int CPR = D / 8;  // 16-byte chunks per row
  static_assert(CPR % 8 == 0, "the swizzle needs at least 8 chunks per row");
  constexpr int KSTEPS = D / 16, DTILES = D / 8, NTILES = WARP_N / 8;
  static_assert(kThreads == 128, "PagedKvLoader maps 128 threads");
  constexpr float kNegInf = -INFINITY;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [BLOCK_M, D]
  bf16* sK = sQ + BLOCK_M * D;                   // [STAGES][BLOCK_N, D]
  bf16* sV = sK + STAGES * BLOCK_N * D;          // [STAGES][BLOCK_N, D]

  // Prefill waits for the kernel before (q, and this step's K/V) first thing. Decode first reads what that kernel
  // does not write (the step's metadata, the cached keys of earlier steps) and starts their copies, then waits.
  if constexpr (!DECODE) pdl_enter();
  // A decode block that has nothing to do still waits, so the grid never completes before the kernel before it.
  auto exit_early = [] {
    if constexpr (DECODE) pdl_wait();
  };
  const int s = blockIdx.z, kvh = blockIdx.y;
  const int split = SPLIT ? int(blockIdx.x % unsigned(p.num_splits)) : 0;
  // Prefill takes the row tiles last-first: the late (longest) causal tiles start early.
  const int m_tile = SPLIT ? int(blockIdx.x / unsigned(p.num_splits)) : DECODE ? int(blockIdx.x)
                                                                               : int(gridDim.x - 1 - blockIdx.x);
  const int new_len = p.new_lens[s];
  if (new_len <= 0) return exit_early();  // padding sequence
  const int G = p.group;
  const int rows_total = DECODE ? G : new_len * G;  // decode: the first (only) new token
  const int row0 = m_tile * BLOCK_M;
  if (row0 >= rows_total) return exit_early();
  const int kv_len = p.kv_lens[s];
  const int start = kv_len - new_len;  // position of query 0
  const int last_row = min(row0 + BLOCK_M, rows_total) - 1;
  const int key_end = visible_key_end(start, last_row, G);
  int k_begin = 0, k_end = key_end;
  int parts = 1;  // SPLIT: the parts this sequence's keys are cut into (the same in every block of the group)
  if constexpr (SPLIT) {
    const int P = p.page_size;
    const int n_pages = (key_end + P - 1) / P;
    parts = effective_splits(p.num_splits, key_end, P, p.min_split_keys);
    if (split >= parts) return exit_early();  // not needed at this length
    const int pages_per_split = (n_pages + parts - 1) / parts;
    k_begin = min(split * pages_per_split, n_pages) * P;
    k_end = min(k_begin + pages_per_split * P, key_end);
  }
  const int n_keys = k_end - k_begin;
  const int n_tiles = n_keys > 0 ? (n_keys + BLOCK_N - 1) / BLOCK_N : 0;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
  const int q_row_base = p.q_rows[s];

  // ---- Q tile -> shared (zeros past the last row).
  auto load_q = [&] {
    for (int c = tid; c < BLOCK_M * CPR; c += kThreads) {
      const int r = c / CPR, ch = c % CPR, row = row0 + r;
      const bool valid = row < rows_total;
      const bf16* src = p.q;
      if (valid) {
        const int i = row / G, g = row - i * G;
        src = p.q + int64_t(q_row_base + i) * p.q_stride + int64_t(kvh * G + g) * D + ch * 8;
      }
      cp_async_16(sQ + swz<D>(r, ch), src, valid);
    }
  };
  if constexpr (!DECODE) {
    load_q();
    cp_async_commit();
  }

  // ---- K/V tiles (PagedKvLoader; prefill copies every row).
  const PagedKvLoader<D> kv(p, s, kvh, k_end, start, tid);
  auto load_kv = [&](int tile_start, int stage, KvRows rows = kAll) {
    kv.template load<BLOCK_N>(tile_start, sK + stage * BLOCK_N * D, sV + stage * BLOCK_N * D, rows);
  };
  // Prologue: tiles 0 .. STAGES - 2, one commit group each (empty groups past the last tile keep the count).
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < n_tiles) load_kv(k_begin + i * BLOCK_N, i, DECODE ? kCached : kAll);
    cp_async_commit();
  }
  if constexpr (FUSED_IN) {
    decode_input_stage<D, BLOCK_M, BLOCK_N, STAGES>(p, kvh, kvh * G + row0, rows_total - row0, q_row_base, start,
                                                    k_begin, k_end, sQ, sK, sV);
    cp_async_commit();  // (empty) keeps the group count of the unfused path
  } else if constexpr (DECODE) {
    pdl_enter();  // q and this step's K/V come from the kernel before
    load_q();
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i)
      if (i < n_tiles) load_kv(k_begin + i * BLOCK_N, i, kNew);
    cp_async_commit();
  }

  // ---- Per-thread rows (lane / 4 and lane / 4 + 8 of the warp's 16) and their causal limits. Rows past the
  // end borrow the last row's limit: their Q is zero, nothing of them is stored, and they never see -inf only.
  const int wr0 = row0 + warp_m * 16;
  const bool warp_active = wr0 < rows_total;
  const int rA = min(wr0 + (lane >> 2), rows_total - 1), rB = min(wr0 + (lane >> 2) + 8, rows_total - 1);
  const int limA = start + rA / G, limB = start + rB / G;  // last visible key, inclusive
  const int warp_lim_lo = start + min(wr0, rows_total - 1) / G;
  const int warp_lim_hi = start + min(wr0 + 15, rows_total - 1) / G;
  const int warp_kend = warp_active ? min(k_end, warp_lim_hi + 1) : k_begin;  // no key of the warp past this
  const int mask_from = min(k_end, warp_lim_lo + 1);  // keys from here on need the per-element check

  float m_r[2] = {kNegInf, kNegInf};  // running max (exp2 domain), rows A and B
  float l_r[2] = {0.0f, 0.0f};        // running sum, partial over the thread's columns until the end
  float acc[DTILES][4];
#pragma unroll
  for (int i = 0; i < DTILES; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

  if constexpr (DECODE)
    cp_async_wait<0>();  // Q and the prologue tiles (started before the wait: usually landed by now)
  else
    cp_async_wait<STAGES - 1>();  // the Q group (the STAGES - 1 prologue groups may still be in flight)
  __syncthreads();
  uint32_t qf[KSTEPS][4];
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks)
    ldmatrix_x4(qf[ks], sQ + swz<D>(warp_m * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), ks * 2 + (lane >> 4)));

  for (int t = 0; t < n_tiles; ++t) {
    // Tile t + STAGES - 1 goes to the stage read in iteration t - 1 (released by that iteration's final
    // __syncthreads). One group per iteration, empty or not: tile t's group is then followed by exactly
    // STAGES - 1 younger groups, so wait_group STAGES - 1 means tile t has landed.
    const int stage = int(unsigned(t) % unsigned(STAGES));
    if (t + STAGES - 1 < n_tiles)
      load_kv(k_begin + (t + STAGES - 1) * BLOCK_N, int(unsigned(t + STAGES - 1) % unsigned(STAGES)));
    cp_async_commit();
    cp_async_wait<STAGES - 1>();  // tile t has landed (for this thread) ...
    __syncthreads();              // ... and for every thread
    const int wk0 = k_begin + t * BLOCK_N + warp_n * WARP_N;  // first key of this warp's part of the tile
    if (wk0 < warp_kend) {
      const bf16* k_s = sK + stage * BLOCK_N * D;
      const bf16* v_s = sV + stage * BLOCK_N * D;
      // S = Q K^T for the warp's 16 rows x WARP_N keys.
      float sacc[NTILES][4];
#pragma unroll
      for (int i = 0; i < NTILES; ++i) sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
#pragma unroll
        for (int n2 = 0; n2 < NTILES / 2; ++n2) {
          uint32_t b[4];
          const int kr = warp_n * WARP_N + n2 * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldmatrix_x4(b, k_s + swz<D>(kr, ks * 2 + ((lane >> 3) & 1)));
          mma_bf16_16816(sacc[2 * n2], qf[ks], b[0], b[1]);
          mma_bf16_16816(sacc[2 * n2 + 1], qf[ks], b[2], b[3]);
        }
      }
      const bool need_mask = wk0 + WARP_N > mask_from;
#pragma unroll
      for (int nt = 0; nt < NTILES; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = sacc[nt][e] * p.scale_log2;
          if (need_mask) {
            const int key = wk0 + nt * 8 + ((lane & 3) << 1) + (e & 1);
            if (key >= k_end || key > (e < 2 ? limA : limB)) x = kNegInf;
          }
          sacc[nt][e] = x;
        }
      }
      // Online softmax; a quad (4 lanes) holds one row's WARP_N scores.
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float alpha = softmax_update_row<NTILES>(sacc, i, m_r[i], l_r[i]);
        // Once the rows' maxima settle, alpha is exactly 1 for every row of the warp: skip the rescale of the
        // accumulators (2 x DTILES multiplies a thread, a large part of a decode tile's instructions).
        if (__any_sync(0xffffffffu, alpha != 1.0f)) {
#pragma unroll
          for (int dt = 0; dt < DTILES; ++dt) {
            acc[dt][2 * i] *= alpha;
            acc[dt][2 * i + 1] *= alpha;
          }
        }
      }
      // acc += P V: the S accumulators of two n8 tiles are exactly the A fragment of one k16 step.
#pragma unroll
      for (int kk = 0; kk < WARP_N / 16; ++kk) {
        uint32_t a[4];
        a[0] = pack_bf16x2(sacc[2 * kk][0], sacc[2 * kk][1]);
        a[1] = pack_bf16x2(sacc[2 * kk][2], sacc[2 * kk][3]);
        a[2] = pack_bf16x2(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]);
        a[3] = pack_bf16x2(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3]);
        const int vr = warp_n * WARP_N + kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
        for (int d2 = 0; d2 < DTILES / 2; ++d2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_s + swz<D>(vr, d2 * 2 + (lane >> 4)));
          mma_bf16_16816(acc[2 * d2], a, b[0], b[1]);
          mma_bf16_16816(acc[2 * d2 + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the stage read here is overwritten by the next iteration's loads
  }

  // ---- Output. emit(): two adjacent elements of one row; emit_lse(): the row's log2-sum-exp (SPLIT).
  auto emit = [&](int row, int d, float o0, float o1) {
    const int i = row / G, h = kvh * G + (row - i * G);
    if (SPLIT && parts > 1) {
      float* dst = p.ws_o + ((int64_t(s) * p.num_splits + split) * p.heads + h) * D + d;
      *reinterpret_cast<float2*>(dst) = make_float2(o0, o1);
    } else {  // one part: normalized already, straight to out (no workspace, no merge)
      bf16* dst = p.out + int64_t(q_row_base + i) * p.out_stride + int64_t(h) * D + d;
      *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(o0, o1);
    }
  };
  auto emit_lse = [&](int row, float m, float l) {
    if (SPLIT && parts > 1) {
      const int h = kvh * G + row;  // decode: row < G
      p.ws_lse[(int64_t(s) * p.num_splits + split) * p.heads + h] = l > 0.0f ? m + log2f(l) : kNegInf;
    }
  };

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_r[i] += __shfl_xor_sync(0xffffffffu, l_r[i], 1);
    l_r[i] += __shfl_xor_sync(0xffffffffu, l_r[i], 2);
  }

  if constexpr (WARPS_N == 1) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = wr0 + (lane >> 2) + 8 * i;
      if (row >= rows_total) continue;
      const float inv = l_r[i] > 0.0f ? 1.0f / l_r[i] : 0.0f;
#pragma unroll
      for (int dt = 0; dt < DTILES; ++dt)
        emit(row, dt * 8 + ((lane & 3) << 1), acc[dt][2 * i] * inv, acc[dt][2 * i + 1] * inv);
      if ((lane & 3) == 0) emit_lse(row, m_r[i], l_r[i]);
    }
  } else {
    // Merge the key-parts of the four warps through shared memory (the K/V ring is free now).
    static_assert((2 * WARPS_N * 16 + WARPS_N * 16 * D) * sizeof(float) <=
                      size_t(STAGES) * 2 * BLOCK_N * D * sizeof(bf16),
                  "merge scratch fits in the K/V ring");
    cp_async_wait<0>();
    __syncthreads();
    float* red_m = reinterpret_cast<float*>(sK);  // [WARPS_N][16]
    float* red_l = red_m + WARPS_N * 16;          // [WARPS_N][16]
    float* red_o = red_l + WARPS_N * 16;          // [WARPS_N][16][D]
    // Only the tile's real rows (a decode group of 8 heads fills half of the 16): the merge is a chain of
    // dependent shared-memory steps in few warps, so every skipped row shortens the kernel.
    const int valid_rows = min(16, rows_total - row0);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = (lane >> 2) + 8 * i;
      if (r >= valid_rows) continue;
      if ((lane & 3) == 0) {
        red_m[warp_n * 16 + r] = m_r[i];
        red_l[warp_n * 16 + r] = l_r[i];
      }
#pragma unroll
      for (int dt = 0; dt < DTILES; ++dt)
        *reinterpret_cast<float2*>(red_o + (warp_n * 16 + r) * D + dt * 8 + ((lane & 3) << 1)) =
            make_float2(acc[dt][2 * i], acc[dt][2 * i + 1]);
    }
    __syncthreads();
    for (int e = tid; e < valid_rows * (D / 2); e += kThreads) {
      const int r = e / (D / 2), d = (e % (D / 2)) * 2, row = row0 + r;
      if (row >= rows_total) continue;
      float M = kNegInf;
#pragma unroll
      for (int w = 0; w < WARPS_N; ++w) M = fmaxf(M, red_m[w * 16 + r]);
      float L = 0.0f, o0 = 0.0f, o1 = 0.0f;
#pragma unroll
      for (int w = 0; w < WARPS_N; ++w) {
        const float mw = red_m[w * 16 + r];
        if (mw == kNegInf) continue;  // this warp saw no visible key of the row
        const float wt = exp2f(mw - M);
        const float2 ov = *reinterpret_cast<const float2*>(red_o + (w * 16 + r) * D + d);
        L += wt * red_l[w * 16 + r];
        o0 += wt * ov.x;
        o1 += wt * ov.y;
      }
      const float inv = L > 0.0f ? 1.0f / L : 0.0f;
      emit(row, d, o0 * inv, o1 * inv);
      if (d == 0) emit_lse(row, M, L);
    }
  }
  // SPLIT with parts > 1: split_merge_kernel, launched next, merges the parts.
}

// Split-KV merge: block (m_tile, kv head, sequence) merges the parts its group of attention blocks wrote, after the
// attention grid completed (a programmatic dependent of it). A launch of its own because that is faster inside
// the decode step's chain than a merge by the last block of each group (publish, fence, counter, merge; H200,
// q30b8l served step at batch 1: 684-686 us against 690-695, batch 8: 1,634-1,635 against 1,668-1,669), although
// the attention alone, outside a chain, takes 10.0 us against 9.0.
template <int D>
__global__ void __launch_bounds__(128) split_merge_kernel(const AttnParams p) {
  pdl_enter();
  const int s = blockIdx.z, kvh = blockIdx.y, m_tile = blockIdx.x;
  const int new_len = p.new_lens[s];
  if (new_len <= 0) return;
  const int G = p.group, row0 = m_tile * kDecodeRowTile;
  if (row0 >= G) return;
  const int last_row = min(row0 + kDecodeRowTile, G) - 1;
  const int key_end = visible_key_end(p.kv_lens[s] - new_len, last_row, G);
  const int parts = effective_splits(p.num_splits, key_end, p.page_size, p.min_split_keys);
  if (parts <= 1) return;  // one part wrote out itself
  merge_split_rows<D>(p, s, kvh * G + row0, min(kDecodeRowTile, G - row0), parts);
}

}  // namespace moeserve::cuda::detail

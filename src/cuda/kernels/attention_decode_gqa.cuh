// Decode attention for grouped-query heads with the keys as the MMA's M (internal header, included by
// attention.cu only; head_dim 128, groups of up to 8 q heads, the unfused input stage).
//
// The tiles of attention_mma.cuh put a (token, q head) pair on each MMA row: a decode step has one token, so a
// group of 8 heads fills 8 of the 16 rows and half of every MMA, softmax and rescale is padding. Here a warp takes
// 16 keys of each 64-key tile as the M of mma.m16n8k16 and the group's (up to 8) heads as its N:
//   S^T (16 keys x 8 heads) = K (16 x 128, ldmatrix from the swizzled ring) . Q^T (B fragments held in registers
//     for the whole block, loaded once);
//   online softmax down each head's column (a thread holds two heads' scores of keys g and g + 8; the column
//     maximum takes three shuffles);
//   O^T (128 x 8) += V^T (ldmatrix.trans of the ring) . P^T, whose B fragments are the S^T accumulators packed to
//     bf16 and transposed in registers by movmatrix.
// Eight MMAs a product per 16 keys instead of sixteen. The four warps' partial states are merged through shared
// memory at the end; split-KV parts go to the workspace for split_merge_kernel exactly as the other decode tiles
// write them (same parts, same layout), or, with CLUSTER, the parts of a (sequence, kv head) are the blocks of one
// thread-block cluster: each keeps its normalized part in shared memory and, after a cluster barrier, every block
// merges a share of the group's output chunks from the others' shared memory (no workspace, no merge launch).
//
// The keys cached by earlier steps are not written by the kernel before this one (only the step's new token is:
// qk_norm_rope_store_kv), so the prologue tiles' old keys are issued before the programmatic wait; q and the new
// token's K / V rows after it.
#pragma once

#include <cooperative_groups.h>

#include "cuda/kernels/attention_mma.cuh"
#include "cuda/kernels/ops.h"

namespace moeserve::cuda::detail {

constexpr int kGqaKeys = 64;    // keys a tile: 16 a warp
constexpr int kGqaStages = 3;   // K / V ring depth (two tiles in flight)
constexpr int kGqaMaxGroup = 8;  // q heads of a kv head: the MMA's N

// A block's block-table entries staged in shared memory when its keys span at most this many pages (one load of
// them all before the prologue instead of a dependent L2 load at the head of every tile's copies).
constexpr int kGqaStagedPages = 256;

template <int D, int STAGES = kGqaStages>
constexpr size_t gqa_smem_bytes() {
  return size_t(kGqaMaxGroup * D + STAGES * 2 * kGqaKeys * D) * sizeof(bf16) + kGqaStagedPages * sizeof(int32_t);
}

// An 8 x 8 b16 matrix held one bf16x2 a lane (row lane / 4, columns 2 (lane % 4), +1), transposed.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// O^T accumulators (dims g, g + 8 x heads 2q, 2q + 1) rescaled by their heads' softmax correction, unless no lane
// of the warp has one (the usual case once the running maximum has settled).
template <int N>
__device__ __forceinline__ void rescale_o(float (&oacc)[N][4], const float (&alpha)[2]) {
  if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    oacc[i][0] *= alpha[0];
    oacc[i][1] *= alpha[1];
    oacc[i][2] *= alpha[0];
    oacc[i][3] *= alpha[1];
  }
}

// FUSED_IN: the input stage of the step's token inside the kernel (decode_input_stage of attention_mma.cuh)
// instead of qk_norm_rope_store_kv before it: q is the raw q/k/v row.
// STAGES: the K / V ring depth (kGqaStages; 2 for cluster grids of at most half the SMs, attention.cu's
// decode_cluster_stages).
template <int D, bool SPLIT, bool CLUSTER = false, bool FUSED_IN = false, int STAGES = kGqaStages>
__global__ void __launch_bounds__(128) paged_attention_decode_gqa_kernel(const AttnParams p) {
  static_assert(SPLIT || !CLUSTER, "a cluster holds the split parts of a sequence");
  static_assert(STAGES >= 2, "a ring of at least two tiles");
  constexpr int BN = kGqaKeys, CPR = D / 8, KSTEPS = D / 16, DT = D / 16;
  static_assert(KSTEPS % 2 == 0, "Q fragments are loaded two k-steps at a time");
  constexpr float kNegInf = -INFINITY;
  extern __shared__ __align__(128) unsigned char gqa_smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(gqa_smem_raw);  // [8][D]
  bf16* sK = sQ + kGqaMaxGroup * D;                  // [STAGES][BN][D]
  bf16* sV = sK + STAGES * BN * D;                   // [STAGES][BN][D]
  int32_t* sTable = reinterpret_cast<int32_t*>(sV + STAGES * BN * D);  // [kGqaStagedPages]

  // Profiling (AttnMeta::phase_clocks, tests and benchmarks only): clock64 at 0 entry, 1 the cached keys issued,
  // 2 the input stage done (programmatic wait, q / k / v, norm, RoPE, KV store), 3 the prologue tiles landed, 4 the
  // key tiles done, 5 the warps' states merged and the part written, 6 the first cluster barrier passed, 7 the end.
  auto stamp = [&](int phase) {
    if (p.phase_clocks != nullptr && threadIdx.x == 0)
      p.phase_clocks[((int64_t(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * kAttnPhaseCount +
                     phase] = clock64();
  };
  stamp(0);
  // Before the programmatic wait only what the step's metadata upload and earlier steps wrote is read: the
  // lengths, the block table and the old keys (every kernel before the previous one has completed, see launch.h).
  const int s = blockIdx.z, kvh = blockIdx.y, split = SPLIT ? int(blockIdx.x) : 0;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // Without split parts a block's keys start at page 0, so its block-table entries are known at entry: with
  // early_meta they are loaded beside the lengths and the q row (one round trip instead of three dependent ones; a
  // padding sequence's row is in the table's allocation, its entries unused).
  const bool early = !SPLIT && p.early_meta != 0;
  const int32_t* tab_row = p.block_tables + int64_t(s) * p.max_pages;
  const int new_len = p.new_lens[s];
  const int kv_len = p.kv_lens[s];
  const int q_row_base = p.q_rows[s];
  const int tab0 = early && tid < p.max_pages ? tab_row[tid] : 0;  // entry tid (tid < 128 <= kGqaStagedPages)
  if (new_len <= 0) {  // padding sequence (a whole cluster: same s)
    pdl_enter();
    return;
  }
  const int G = p.group;
  const int start = kv_len - new_len;  // position of the (first) new token
  const int key_end = visible_key_end(start, G - 1, G);
  int k_begin = 0, k_end = key_end, parts = 1;
  if constexpr (SPLIT) {
    const int P = p.page_size;
    const int n_pages = (key_end + P - 1) / P;
    parts = effective_splits(p.num_splits, key_end, P, p.min_split_keys);
    if (split >= parts && !(CLUSTER && parts > 1)) {  // a cluster's idle blocks still join its barriers
      pdl_enter();
      return;
    }
    const int pages_per_split = (n_pages + parts - 1) / parts;
    k_begin = min(split * pages_per_split, n_pages) * P;
    k_end = min(k_begin + pages_per_split * P, key_end);
    if (split >= parts) k_begin = k_end = 0;  // idle block of a cluster: no keys, lse -inf
  }
  const int n_tiles = k_end > k_begin ? (k_end - k_begin + BN - 1) / BN : 0;

  // K / V tiles (PagedKvLoader of attention_mma.cuh), with the block's table entries from shared memory when they
  // fit (the table is the step's metadata upload: readable before the programmatic wait).
  const int page0 = k_begin / p.page_size;
  const int n_pages_blk = k_end > k_begin ? (k_end - 1) / p.page_size + 1 - page0 : 0;
  const bool staged = n_pages_blk <= kGqaStagedPages;
  if (staged) {
    const int32_t* tab = tab_row + page0;
    if (early && tid < n_pages_blk) sTable[tid] = tab0;
    for (int i = early ? tid + 128 : tid; i < n_pages_blk; i += 128) sTable[i] = tab[i];
    __syncthreads();
  }
  const PagedKvLoader<D> kv(p, s, kvh, k_end, start, tid, staged ? sTable : nullptr, page0);
  auto load_kv = [&](int tile_start, int stage, KvRows rows) {
    kv.template load<BN>(tile_start, sK + stage * BN * D, sV + stage * BN * D, rows);
  };
  // Prologue: the old keys of the first STAGES - 1 tiles, then (after the wait) Q and the new keys, all in one
  // group waited for at once; the loop's groups then stay one a tile.
  const bool prewait = FUSED_IN || p.kv_prewait != 0;
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i)
    if (prewait && i < n_tiles) load_kv(k_begin + i * BN, i, kCached);
  stamp(1);
  if constexpr (FUSED_IN) {
    decode_input_stage<D, kGqaMaxGroup, BN, STAGES>(p, kvh, kvh * G, G, q_row_base, start, k_begin, k_end, sQ, sK,
                                                    sV);
  } else {
    pdl_enter();  // q and this step's K / V come from the kernel before
    for (int c = tid; c < kGqaMaxGroup * CPR; c += 128) {  // Q of the group's heads (zero rows past G)
      const int r = c / CPR, ch = c % CPR;
      const bool valid = r < G;
      const bf16* src = valid ? p.q + int64_t(q_row_base) * p.q_stride + int64_t(kvh * G + r) * D + ch * 8 : p.q;
      cp_async_16(sQ + swz<D>(r, ch), src, valid);
    }
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i)
      if (i < n_tiles) load_kv(k_begin + i * BN, i, prewait ? kNew : kAll);
  }
  stamp(2);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  stamp(3);
  // Q^T as B fragments (k = dims, n = heads): ldmatrix of the Q rows gives lane (g, q) head g, dims 2q, 2q + 1.
  uint32_t qf[KSTEPS][2];
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ks += 2) {
    uint32_t r[4];
    ldmatrix_x4(r, sQ + swz<D>(lane & 7, 2 * ks + (lane >> 3)));
    qf[ks][0] = r[0], qf[ks][1] = r[1], qf[ks + 1][0] = r[2], qf[ks + 1][1] = r[3];
  }

  const int g = lane >> 2;
  float m_r[2] = {kNegInf, kNegInf}, l_r[2] = {0.0f, 0.0f};  // heads 2q and 2q + 1
  float oacc[DT][4];  // O^T: dims 16 dt + g (+ 8) x heads 2q, 2q + 1
#pragma unroll
  for (int i = 0; i < DT; ++i) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.0f;

  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t % STAGES;
    if (t + STAGES - 1 < n_tiles) load_kv(k_begin + (t + STAGES - 1) * BN, (t + STAGES - 1) % STAGES, kAll);
    cp_async_commit();
    cp_async_wait<STAGES - 1>();
    __syncthreads();
    const int wk0 = k_begin + t * BN + warp * 16;  // this warp's first key
    if (wk0 < k_end) {
      const bf16* k_s = sK + stage * BN * D;
      const bf16* v_s = sV + stage * BN * D;
      // S^T: keys g (+ 8) x heads 2q, 2q + 1, as two accumulators over the even and the odd k-steps (two chains of
      // KSTEPS / 2 dependent MMAs instead of one of KSTEPS: a block has 4 warps, an SM 8, too few to hide the chain).
      float sacc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sacc1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        uint32_t a[4];
        ldmatrix_x4(a, k_s + swz<D>(warp * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), ks * 2 + (lane >> 4)));
        mma_bf16_16816(ks % 2 == 0 ? sacc : sacc1, a, qf[ks][0], qf[ks][1]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) sacc[i] += sacc1[i];
      const bool key_a = wk0 + g < k_end, key_b = wk0 + g + 8 < k_end;
      float alpha[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float x0 = key_a ? sacc[j] * p.scale_log2 : kNegInf;
        const float x1 = key_b ? sacc[j + 2] * p.scale_log2 : kNegInf;
        float mx = fmaxf(x0, x1);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        const float m_new = fmaxf(m_r[j], mx);
        const float m_use = m_new == kNegInf ? 0.0f : m_new;
        alpha[j] = exp2f(m_r[j] - m_use);
        m_r[j] = m_new;
        const float p0 = exp2f(x0 - m_use), p1 = exp2f(x1 - m_use);
        sacc[j] = p0;
        sacc[j + 2] = p1;
        l_r[j] = l_r[j] * alpha[j] + p0 + p1;  // this thread's keys only; summed over g at the end
      }
      rescale_o(oacc, alpha);
      // P^T as B fragments (k = keys, n = heads): the accumulator pairs (key g, heads 2q, 2q + 1) transposed.
      const uint32_t b0 = movmatrix_trans(pack_bf16x2(sacc[0], sacc[1]));
      const uint32_t b1 = movmatrix_trans(pack_bf16x2(sacc[2], sacc[3]));
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        uint32_t a[4];
        ldmatrix_x4_trans(a,
                          v_s + swz<D>(warp * 16 + (lane & 7) + ((lane >> 4) << 3), dt * 2 + ((lane >> 3) & 1)));
        mma_bf16_16816(oacc[dt], a, b0, b1);
      }
    }
    __syncthreads();  // the stage read here is overwritten by the next iteration's loads
  }

#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l_r[j] += __shfl_xor_sync(0xffffffffu, l_r[j], 4);
    l_r[j] += __shfl_xor_sync(0xffffffffu, l_r[j], 8);
    l_r[j] += __shfl_xor_sync(0xffffffffu, l_r[j], 16);
  }
  stamp(4);
  // Merge the four warps' states through shared memory (the ring is free now).
  cp_async_wait<0>();
  __syncthreads();
  float* red_m = reinterpret_cast<float*>(sK);  // [4][8]
  float* red_l = red_m + 4 * kGqaMaxGroup;      // [4][8]
  float* red_o = red_l + 4 * kGqaMaxGroup;      // [4][8][D]
  // The block's part, normalized, and its log2-sum-exp: to the workspace, to shared memory for the cluster merge
  // (after the warps' scratch: 8 x D + 8 floats), or straight to out when the sequence has one part.
  float* part_o = red_o + 4 * kGqaMaxGroup * D;  // [8][D]
  float* part_lse = part_o + kGqaMaxGroup * D;   // [8]
  static_assert((8 * kGqaMaxGroup + 4 * kGqaMaxGroup * D) * sizeof(float) <= size_t(STAGES) * 2 * BN * D * sizeof(bf16),
                "merge scratch fits in the ring");
  const int q4 = lane & 3;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int h = 2 * q4 + j;
    if (g == 0) {
      red_m[warp * kGqaMaxGroup + h] = m_r[j];
      red_l[warp * kGqaMaxGroup + h] = l_r[j];
    }
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      red_o[(warp * kGqaMaxGroup + h) * D + dt * 16 + g] = oacc[dt][j];
      red_o[(warp * kGqaMaxGroup + h) * D + dt * 16 + g + 8] = oacc[dt][j + 2];
    }
  }
  __syncthreads();
  static_assert((8 * kGqaMaxGroup + 5 * kGqaMaxGroup * D + kGqaMaxGroup) * sizeof(float) <=
                    size_t(STAGES) * 2 * BN * D * sizeof(bf16),
                "cluster part fits in the ring");
  // Warp 0 turns the warps' (max, sum) pairs into one weight per (warp, head), the 1 / sum of the block's part
  // folded in, and writes the part's log2-sum-exp (lane = 8 w + h); then every thread sums its output elements
  // over the warps with those weights: the exp2 / division / log2 chain runs once per head, not per element.
  float* red_wt = part_o + kGqaMaxGroup * D + kGqaMaxGroup;  // [4][8], after part_lse
  static_assert((8 * kGqaMaxGroup + 5 * kGqaMaxGroup * D + 5 * kGqaMaxGroup) * sizeof(float) <=
                    size_t(STAGES) * 2 * BN * D * sizeof(bf16),
                "merge weights fit in the ring");
  if (warp == 0) {
    const int w = lane >> 3, h = lane & 7;
    const float mw = red_m[w * kGqaMaxGroup + h];
    float M = mw;
    M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, 8));
    M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, 16));
    const float wt = mw == kNegInf ? 0.0f : exp2f(mw - M);  // a warp that saw no key weighs nothing
    float L = wt * red_l[w * kGqaMaxGroup + h];
    L += __shfl_xor_sync(0xffffffffu, L, 8);
    L += __shfl_xor_sync(0xffffffffu, L, 16);
    red_wt[w * kGqaMaxGroup + h] = L > 0.0f ? wt / L : 0.0f;
    if (w == 0 && h < G) {
      const float lse = L > 0.0f ? M + log2f(L) : kNegInf;
      if (CLUSTER && parts > 1)
        part_lse[h] = lse;
      else if (SPLIT && parts > 1)
        p.ws_lse[(int64_t(s) * p.num_splits + split) * p.heads + kvh * G + h] = lse;
    }
  }
  __syncthreads();
#pragma unroll 4
  for (int e = tid; e < G * (D / 2); e += 128) {
    const int h = e / (D / 2), d = (e % (D / 2)) * 2;
    float o0 = 0.0f, o1 = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float wt = red_wt[w * kGqaMaxGroup + h];
      const float2 o = *reinterpret_cast<const float2*>(red_o + (w * kGqaMaxGroup + h) * D + d);
      o0 += wt * o.x;
      o1 += wt * o.y;
    }
    const int hg = kvh * G + h;
    if (CLUSTER && parts > 1) {
      *reinterpret_cast<float2*>(part_o + h * D + d) = make_float2(o0, o1);
    } else if (SPLIT && parts > 1) {
      float* dst = p.ws_o + ((int64_t(s) * p.num_splits + split) * p.heads + hg) * D + d;
      *reinterpret_cast<float2*>(dst) = make_float2(o0, o1);
    } else {
      bf16* dst = p.out + int64_t(q_row_base) * p.out_stride + int64_t(hg) * D + d;
      *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(o0, o1);
    }
  }
  stamp(5);
  if constexpr (CLUSTER) {
    if (parts <= 1) return;  // uniform over the cluster: no block of it reaches a barrier
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every part in its block's shared memory
    stamp(6);
    // Block `split` merges items split, split + num_splits, ... of the group's G x D / 8 chunks (split order).
    constexpr int CH = D / 8;
    const int nb = p.num_splits;
    for (int e = split + tid * nb; e < G * CH; e += 128 * nb) {
      const int h = e / CH, c = e - h * CH;
      const uint4 v = merge_parts_chunk(parts, [&](int z, float& lse, float4& o0, float4& o1) {
        const float* po = cluster.map_shared_rank(part_o, unsigned(z));
        const float* pl = cluster.map_shared_rank(part_lse, unsigned(z));
        lse = pl[h];
        o0 = *reinterpret_cast<const float4*>(po + h * D + c * 8);
        o1 = *reinterpret_cast<const float4*>(po + h * D + c * 8 + 4);
      });
      *reinterpret_cast<uint4*>(p.out + int64_t(q_row_base) * p.out_stride + int64_t(kvh * G + h) * D + c * 8) = v;
    }
    cluster.sync();  // no block leaves while another still reads its shared memory
    stamp(7);
  }
}

}  // namespace moeserve::cuda::detail

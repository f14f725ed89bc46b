// Prefill attention on wgmma, warp-specialized and persistent (sm_90a builds, head_dim 128; internal header,
// included by attention.cu only). Same rows, masking, online softmax, rounding and output as the tiles of
// attention_wgmma.cuh (whose shared-memory layout, descriptors and PV wgmma it reuses), organised the way
// FlashAttention-3 organises a Hopper forward pass:
//   - one CTA an SM walks work items (a 128-row tile of one sequence and kv head: 16 query tokens x 8 heads at
//     q30b's group of 8), items blockIdx.x, + gridDim.x, ... of a work list that every CTA builds in its prologue
//     (before the programmatic wait: it reads only the step's lengths) from the items that have rows, ordered by
//     their key tiles, most first (a counting sort; ws_work_list). The grid order it replaced (row tiles from the
//     last, every (sequence, kv head) of each) handed a CTA the same (sequence, kv head) at every row tile whenever
//     kv_heads x sequences shared factors with the grid, and short sequences' empty items with them: 64 decodes
//     riding with two 512-token prompts (66 sequences, 264 items a row tile on 132 CTAs) put all the prompts' rows
//     on 8 CTAs (H200, session 35: 2,856 us of attention in that step against 506 with one prompt). A step with more
//     than kWsMaxSeqs sequences or kWsMaxItems items (or MOESERVE_ATTN_WS_ORDER=0) walks the grid order;
//   - warpgroup 0 produces: the item's Q into one of two Q buffers and each 64-key K / V tile into a 4-stage ring,
//     gathered from the pages by cp.async and published on mbarriers (cp.async.mbarrier.arrive.noinc: K and V each
//     their own `full` barrier, so S = Q K^T can start before V has landed); it runs up to four tiles and one item
//     ahead, so the next item's Q and first tiles load while the consumers still work on this one;
//   - warpgroups 1 and 2 consume, 64 rows each, software-pipelined inside the warpgroup: S(t+1) = Q K(t+1)^T and
//     O += P(t) V(t) are both in flight while the softmax of S(t+1) runs, so the exponentials overlap the MMAs;
//     a stage is released through its `empty` barrier once both consumer warpgroups' PV of it completed; no
//     block-wide barrier after the prologue.
// Why: the two-CTA tiles of attention_wgmma.cuh wait on S, then on PV, then on a __syncthreads for every 64-key
// tile, with the next tile's loads issued only one tile ahead; a 16 x 512 prefill step ran its attention at ~170
// TFLOP/s (1.87 ms of a 16.7 ms step, x5.4 of its flop floor; docs/PERF.md session 34). H200, same call: 16 x 512
// 175.3 us against 199.7, 1 x 512 18.9 against 26.1 (AttentionTiming); served prefill +1.4%, 64 concurrent even.
// What limits it now: the items are short (~4.5 tiles), so each item's first S and its epilogue are exposed.
#pragma once

#include "cuda/kernels/attention_wgmma.cuh"

namespace moeserve::cuda::detail {

constexpr int kWsStages = 4;      // K / V ring depth (64-key tiles)
constexpr int kWsThreads = 384;   // producer warpgroup + two consumer warpgroups
constexpr int kWsProducerRegs = 72, kWsConsumerRegs = 216;  // 128 x 72 + 256 x 216 <= 64 K registers
// Q buffers, then the K ring, the V ring and the barriers; + 1 KB of alignment slack (1024-byte aligned tiles).
constexpr size_t kWsBarrierBytes = 8 * (4 + 3 * kWsStages);
// The work list: up to kWsMaxItems items of a step with up to kWsMaxSeqs sequences, their key-tile counts sorted in
// kWsSortBins bins (counts past the last share it).
constexpr int kWsMaxItems = 4096, kWsMaxSeqs = 1024, kWsSortBins = 512;
constexpr size_t kWsSmemBytes = 1024 + 2 * size_t(kWgQBytes) + 2 * size_t(kWsStages) * kWgTileBytes + kWsBarrierBytes +
                                kWsMaxItems * sizeof(int);
static_assert((2 * kWsMaxSeqs + 2 + kWsSortBins + kWsMaxItems) * sizeof(int) <= kWsStages * kWgTileBytes,
              "the work list's scratch fits in the K ring");

struct WsItem {
  int s, kvh, m_tile;
};
// Item idx of the grid order over m_tiles row tiles x kv_heads x num_seqs, the last row tiles first.
__device__ __forceinline__ WsItem ws_grid_item(int idx, int m_tiles, int kv_heads, int num_seqs) {
  const int per_m = kv_heads * num_seqs;
  const int r = idx % per_m;
  return {r / kv_heads, r % kv_heads, m_tiles - 1 - idx / per_m};
}
// A work-list entry: (s x m_tiles + m_tile) x kv_heads + kvh.
__device__ __forceinline__ WsItem ws_list_item(int code, int m_tiles, int kv_heads) {
  const int rest = code / kv_heads;
  return {rest / m_tiles, code - rest * kv_heads, rest % m_tiles};
}

// Builds the work list into `list` with all threads of the CTA (ends with a block barrier): the (sequence, row
// tile) pairs that have rows, ordered by the key tiles their last row sees, most first (row tiles in order among
// equals: every CTA must build the same list), each followed by its kv heads. `scratch` (2 kWsMaxSeqs + 2 +
// kWsSortBins + kWsMaxItems ints) is free shared memory. Returns the item count, or -1 where the step exceeds the
// list (the caller walks the grid order).
__device__ __forceinline__ int ws_work_list(const AttnParams& p, int m_tiles, int num_seqs, int* list, int* scratch) {
  __shared__ int s_count;
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, G = p.group, KV = p.kv_heads;
  if (num_seqs > kWsMaxSeqs) return -1;  // uniform
  int* s_mt = scratch;                   // [num_seqs] row tiles of each sequence
  int* s_off = s_mt + kWsMaxSeqs;        // [num_seqs + 1] their exclusive prefix sums
  int* s_bin = s_off + kWsMaxSeqs + 2;   // [kWsSortBins] row tiles a bin, then each bin's next position
  int* s_ubin = s_bin + kWsSortBins;     // [row tiles] each row tile's sequence and bin
  for (int s = tid; s < num_seqs; s += nt) {
    const int n = p.new_lens[s];
    s_mt[s] = n > 0 ? (n * G + kWgRows - 1) / kWgRows : 0;
  }
  for (int b = tid; b < kWsSortBins; b += nt) s_bin[b] = 0;
  __syncthreads();
  if (tid < 32) {  // s_off by one warp, 32 sequences a round
    int carry = 0;
    if (lane == 0) s_off[0] = 0;
    for (int base = 0; base < num_seqs; base += 32) {
      int v = base + lane < num_seqs ? s_mt[base + lane] : 0;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, v, d);
        if (lane >= d) v += u;
      }
      if (base + lane < num_seqs) s_off[base + lane + 1] = carry + v;
      carry += __shfl_sync(0xffffffffu, v, 31);
    }
    if (lane == 0) s_count = int64_t(carry) * KV <= kWsMaxItems ? carry : -1;
  }
  __syncthreads();
  const int rows = s_count;  // row tiles with rows, or -1
  if (rows < 0) return -1;
  for (int u = tid; u < rows; u += nt) {
    int lo = 0, hi = num_seqs;  // the sequence s with s_off[s] <= u < s_off[s + 1]
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (s_off[mid] <= u) lo = mid; else hi = mid;
    }
    const int n = p.new_lens[lo], row0 = (u - s_off[lo]) * kWgRows;
    const int k_end = visible_key_end(p.kv_lens[lo] - n, min(row0 + kWgRows, n * G) - 1, G);
    const int bin = kWsSortBins - 1 - min((k_end + kWgKeys - 1) / kWgKeys, kWsSortBins - 1);  // most tiles first
    s_ubin[u] = (lo << 16) | bin;  // (kWsMaxSeqs <= 2^15, kWsSortBins <= 2^16)
    atomicAdd(&s_bin[bin], 1);
  }
  __syncthreads();
  if (tid < 32) {  // the bins' first positions, in place
    int carry = 0;
    for (int base = 0; base < kWsSortBins; base += 32) {
      int v = s_bin[base + lane];
      const int own = v;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, v, d);
        if (lane >= d) v += u;
      }
      s_bin[base + lane] = carry + v - own;
      carry += __shfl_sync(0xffffffffu, v, 31);
    }
  }
  __syncthreads();
  // The scatter, stable (row tiles in order within a bin) and so the same in every CTA, which all walk this list:
  // warp 0, 32 row tiles a round, lanes of one bin ranked by their lane.
  if (tid < 32) {
    for (int base = 0; base < rows; base += 32) {
      const int u = base + lane;
      const bool ok = u < rows;
      const int su = ok ? s_ubin[u] : 0;
      const int bin = ok ? (su & 0xffff) : kWsSortBins + lane;  // idle lanes: a bin of their own
      const unsigned same = __match_any_sync(0xffffffffu, bin);
      const int rank = __popc(same & ((1u << lane) - 1u));
      const int pos = ok ? s_bin[bin] + rank : 0;
      __syncwarp();
      if (ok && rank == 0) s_bin[bin] += __popc(same);
      if (ok) {
        const int s = su >> 16, first = (s * m_tiles + (u - s_off[s])) * KV;
        for (int h = 0; h < KV; ++h) list[pos * KV + h] = first + h;
      }
      __syncwarp();
    }
  }
  __syncthreads();
  return rows * KV;
}

__global__ void __launch_bounds__(kWsThreads, 1)
    paged_attention_prefill_ws_kernel(const AttnParams p, int m_tiles, int num_seqs, int use_list) {
#if MOE_HAVE_WGMMA
  using namespace moe_ptx;
  constexpr int D = kWgDim, BN = kWgKeys, NS = kWsStages;
  constexpr float kNegInf = -INFINITY;
  extern __shared__ __align__(128) unsigned char ws_smem_raw[];
  char* smem = align_smem(reinterpret_cast<char*>(ws_smem_raw), 1024);
  char* sQ = smem;                  // [2 buffers][2 halves][128 rows][64]
  char* sK = sQ + 2 * kWgQBytes;    // [NS stages][2 halves][64 keys][64]
  char* sV = sK + NS * kWgTileBytes;
  const unsigned q_addr = smem_addr(sQ), k_addr = smem_addr(sK), v_addr = smem_addr(sV);
  const unsigned bars = smem_addr(sV + NS * kWgTileBytes);
  const unsigned q_full = bars, q_empty = bars + 16;  // [2] each
  const unsigned k_full = bars + 32, v_full = k_full + 8 * NS, kv_empty = v_full + 8 * NS;  // [NS] each
  int* s_list = reinterpret_cast<int*>(sV + NS * kWgTileBytes + kWsBarrierBytes);  // [kWsMaxItems] the work list

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int b = 0; b < 2; ++b) {
      mbar_init(q_full + 8 * b, 128);
      mbar_init(q_empty + 8 * b, 2);
    }
    for (int st = 0; st < NS; ++st) {
      mbar_init(k_full + 8 * st, 128);
      mbar_init(v_full + 8 * st, 128);
      mbar_init(kv_empty + 8 * st, 2);
    }
  }
  __syncthreads();
  // The work list from the step's lengths (metadata: readable before the wait), in the K ring's memory before any
  // copy into it.
  const int listed = use_list ? ws_work_list(p, m_tiles, num_seqs, s_list, reinterpret_cast<int*>(sK)) : -1;
  pdl_enter();  // q and this step's K / V come from the kernel before

  const int G = p.group, n_items = listed >= 0 ? listed : m_tiles * p.kv_heads * num_seqs;
  // Everything a role needs of item idx; false for items without rows (short sequences' upper row tiles).
  struct Tile {
    int s, kvh, row0, rows_total, start, k_end, n_tiles;
  };
  auto tile_of = [&](int idx, Tile& t) {
    const WsItem it = listed >= 0 ? ws_list_item(s_list[idx], m_tiles, p.kv_heads)
                                  : ws_grid_item(idx, m_tiles, p.kv_heads, num_seqs);
    const int new_len = p.new_lens[it.s];
    t.s = it.s, t.kvh = it.kvh;
    t.rows_total = new_len * G;
    t.row0 = it.m_tile * kWgRows;
    if (new_len <= 0 || t.row0 >= t.rows_total) return false;
    t.start = p.kv_lens[it.s] - new_len;
    t.k_end = visible_key_end(t.start, min(t.row0 + kWgRows, t.rows_total) - 1, G);
    t.n_tiles = (t.k_end + BN - 1) / BN;
    return true;
  };

  if (warp < 4) {
    // ---- producer: thread tid copies 16-byte chunk tid % 16 of rows tid / 16 + 8 j.
    setmaxnreg_dec<kWsProducerRegs>();
    const int cc = tid & 15, r0 = tid >> 4;
    const int P = p.page_size;
    const int64_t kv_row_stride = int64_t(p.kv_heads) * D;
    int q_count = 0, kv_count = 0;
    for (int idx = blockIdx.x; idx < n_items; idx += gridDim.x) {
      Tile t;
      if (!tile_of(idx, t)) continue;
      const int b = q_count & 1;
      mbar_wait(q_empty + 8 * b, ((q_count >> 1) & 1) ^ 1);
      const int q_row_base = p.q_rows[t.s];
      char* dq = sQ + b * kWgQBytes;
      // Rows r0 + 8 k: (token qi, head qg) of the first by one division, then stepped (ncu, session 34: with a
      // division a row and a key the producer's integer work, not the copies, set the pace of the ring).
      int row = t.row0 + r0, qi = row / G, qg = row - qi * G;
#pragma unroll 4
      for (int r = r0; r < kWgRows; r += 8, row += 8) {
        const bool valid = row < t.rows_total;
        const bf16* src =
            valid ? p.q + int64_t(q_row_base + qi) * p.q_stride + int64_t(t.kvh * G + qg) * D + cc * 8 : p.q;
        cp_async16(dq + wg_chunk_offset(kWgRows, r, cc), src, valid);
        for (qg += 8; qg >= G; qg -= G) ++qi;
      }
      cp_async_arrive_noinc(q_full + 8 * b);
      ++q_count;
      const int32_t* table = p.block_tables + int64_t(t.s) * p.max_pages;
      const bf16* k_head = p.k_cache + int64_t(t.kvh) * D + cc * 8;
      const bf16* v_head = p.v_cache + int64_t(t.kvh) * D + cc * 8;
      // Keys kt BN + r0 + 8 j: their pages' block-table entries (-1 past k_end) and slots, for tile kt + 1 loaded
      // before the wait for tile kt's stage, so that the round trip overlaps the wait.
      int page[BN / 8], slot[BN / 8];
      auto lookup = [&](int kt) {
        const int key0 = kt * BN + r0;
        int pi = key0 / P, sl = key0 - pi * P;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          page[j] = key0 + 8 * j < t.k_end ? table[pi] : -1;
          slot[j] = sl;
          for (sl += 8; sl >= P; sl -= P) ++pi;
        }
      };
      lookup(0);
      for (int kt = 0; kt < t.n_tiles; ++kt, ++kv_count) {
        int64_t o[BN / 8];
        bool ok[BN / 8];
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          ok[j] = page[j] >= 0;
          o[j] = ok[j] ? (int64_t(page[j]) * P + slot[j]) * kv_row_stride : 0;
        }
        if (kt + 1 < t.n_tiles) lookup(kt + 1);
        const int st = kv_count % NS;
        mbar_wait(kv_empty + 8 * st, ((kv_count / NS) & 1) ^ 1);
        char* dk = sK + st * kWgTileBytes;
        char* dv = sV + st * kWgTileBytes;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) cp_async16(dk + wg_chunk_offset(BN, r0 + 8 * j, cc), k_head + o[j], ok[j]);
        cp_async_arrive_noinc(k_full + 8 * st);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) cp_async16(dv + wg_chunk_offset(BN, r0 + 8 * j, cc), v_head + o[j], ok[j]);
        cp_async_arrive_noinc(v_full + 8 * st);
      }
    }
    cp_async_wait<0>();
    return;
  }

  // ---- consumers: warpgroup cw owns rows 64 cw .. 64 cw + 63 of each item.
  setmaxnreg_inc<kWsConsumerRegs>();
  const int cw = warp / 4 - 1;
  const bool releaser = (tid & 127) == 0;
  constexpr unsigned v_lbo = BN * 128, v_sbo = 1024;  // V: the second 64 dims one half further; 8 keys an atom
  int q_count = 0, kv_count = 0;
  for (int idx = blockIdx.x; idx < n_items; idx += gridDim.x) {
    Tile t;
    if (!tile_of(idx, t)) continue;
    const int b = q_count & 1;
    // This thread's rows (lane / 4 and + 8 of its warp's 16) and their causal limits; rows past the end borrow
    // the last row's limit (their Q is zero and nothing of them is stored).
    const int wr0 = t.row0 + cw * 64 + (warp & 3) * 16;
    const int rA = min(wr0 + (lane >> 2), t.rows_total - 1), rB = min(wr0 + (lane >> 2) + 8, t.rows_total - 1);
    const int lim[2] = {t.start + rA / G, t.start + rB / G};
    const bool wg_active = t.row0 + cw * 64 < t.rows_total;
    const int wg_lim_lo = t.start + min(t.row0 + cw * 64, t.rows_total - 1) / G;
    const int wg_lim_hi = t.start + min(t.row0 + cw * 64 + 63, t.rows_total - 1) / G;
    // The tiles this warpgroup's rows can see: a prefix of the item's (the causal limit grows with the row).
    const int n_mine = wg_active ? min(t.n_tiles, wg_lim_hi / BN + 1) : 0;
    const unsigned qa = q_addr + unsigned(b * kWgQBytes + cw * 64 * 128);

    float m_r[2] = {kNegInf, kNegInf}, l_r[2] = {0.0f, 0.0f};
    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
    unsigned pa[4][4];  // P of the tile whose PV is next, bf16 A fragments

    // S = Q K(kt)^T issued (not waited for) into sacc.
    auto issue_s = [&](float (&sacc)[32], int kt) {
      const int st = (kv_count + kt) % NS;
      mbar_wait(k_full + 8 * st, ((kv_count + kt) / NS) & 1);
      fence_proxy_async_smem();  // the producers' cp.async writes (generic proxy) before wgmma's reads
      const unsigned ks = k_addr + unsigned(st * kWgTileBytes);
#pragma unroll
      for (int i = 0; i < 32; ++i) sacc[i] = 0.0f;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const unsigned half = unsigned(kk >> 2), within = unsigned((kk & 3) * 32);
        wgmma_m64nk16_bf16(sacc, wgmma_desc_sw128(qa + half * (kWgRows * 128) + within),
                           wgmma_desc_sw128(ks + half * (BN * 128) + within));
      }
      wgmma_commit();
    };
    // O += P V(kt) issued.
    auto issue_pv = [&](int kt) {
      const int st = (kv_count + kt) % NS;
      mbar_wait(v_full + 8 * st, ((kv_count + kt) / NS) & 1);
      fence_proxy_async_smem();
      const unsigned vs = v_addr + unsigned(st * kWgTileBytes);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_m64n128k16_rs_tb(o, pa[kk], wg_desc_mn_sw128(vs + unsigned(kk * 2 * 1024), v_lbo, v_sbo));
      wgmma_commit();
    };
    // The scores of tile kt (complete in sacc) -> masked, exponentiated in place; alpha: the factors the rows'
    // accumulators must be scaled by. The running maxima stay in raw score units and the scale rides in the
    // exponent's FFMA, with ex2.approx.ftz (ncu, session 34: exp2f's range handling and the separate scale were
    // ~130 of the ~870 instructions a warp issued a tile, and the consumers issue-bound).
    auto softmax = [&](float (&sacc)[32], int kt, float (&alpha)[2]) {
      const int key0 = kt * BN;
      if (key0 + BN - 1 > wg_lim_lo || key0 + BN > t.k_end) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + 8 * j + ((lane & 3) << 1) + (e & 1);
            if (key >= t.k_end || key > lim[e >> 1]) sacc[4 * j + e] = kNegInf;
          }
      }
      const float sc = p.scale_log2;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        // Row lane / 4 (i = 0) or lane / 4 + 8 (i = 1) of the warp's 16: two scores a lane in each n8 tile.
        float mx = kNegInf;
#pragma unroll
        for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fmaxf(sacc[4 * j + 2 * i], sacc[4 * j + 2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_r[i], mx);
        const float m_use = m_new == kNegInf ? 0.0f : m_new;  // a row with nothing visible yet stays at 0
        const float neg = -m_use * sc;
        alpha[i] = m_new == m_r[i] ? 1.0f : exp2_approx(fmaf(m_r[i], sc, neg));  // exactly 1: no rescale
        m_r[i] = m_new;
        float rs = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float p0 = exp2_approx(fmaf(sacc[4 * j + 2 * i], sc, neg));
          const float p1 = exp2_approx(fmaf(sacc[4 * j + 2 * i + 1], sc, neg));
          sacc[4 * j + 2 * i] = p0;
          sacc[4 * j + 2 * i + 1] = p1;
          rs += p0 + p1;
        }
        l_r[i] = l_r[i] * alpha[i] + rs;
      }
    };
    auto pack_p = [&](const float (&sacc)[32]) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        pa[kk][0] = pack_bf16x2(sacc[8 * kk + 0], sacc[8 * kk + 1]);
        pa[kk][1] = pack_bf16x2(sacc[8 * kk + 2], sacc[8 * kk + 3]);
        pa[kk][2] = pack_bf16x2(sacc[8 * kk + 4], sacc[8 * kk + 5]);
        pa[kk][3] = pack_bf16x2(sacc[8 * kk + 6], sacc[8 * kk + 7]);
      }
    };
    auto rescale = [&](const float (&alpha)[2]) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
        if (__any_sync(0xffffffffu, alpha[i] != 1.0f)) {
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            o[4 * j + 2 * i] *= alpha[i];
            o[4 * j + 2 * i + 1] *= alpha[i];
          }
        }
    };
    auto release = [&](int kt) {
      if (releaser) mbar_arrive(kv_empty + 8 * ((kv_count + kt) % NS));
    };

    mbar_wait(q_full + 8 * b, (q_count >> 1) & 1);
    if (n_mine > 0) {
      float sacc[32], alpha[2];
      issue_s(sacc, 0);
      wgmma_wait<0>();
      softmax(sacc, 0, alpha);  // o is zero: nothing to rescale
      pack_p(sacc);
      for (int kt = 1; kt < n_mine; ++kt) {
        issue_s(sacc, kt);   // S(kt) ...
        issue_pv(kt - 1);    // ... and O += P(kt - 1) V(kt - 1) in flight together
        wgmma_wait<1>();     // S(kt) done
        softmax(sacc, kt, alpha);
        wgmma_wait<0>();     // PV(kt - 1) done: its stage is free, o may be rescaled, pa rewritten
        release(kt - 1);
        rescale(alpha);
        pack_p(sacc);
      }
      issue_pv(n_mine - 1);
      wgmma_wait<0>();
      release(n_mine - 1);
    }
    // Tiles past this warpgroup's rows: wait until they landed (so that a release never runs a ring pass ahead of
    // the producer), then release them.
    for (int kt = n_mine; kt < t.n_tiles; ++kt) {
      const int st = (kv_count + kt) % NS;
      mbar_wait(v_full + 8 * st, ((kv_count + kt) / NS) & 1);  // V's arrivals follow K's copies too
      release(kt);
    }
    if (releaser) mbar_arrive(q_empty + 8 * b);
    kv_count += t.n_tiles;
    ++q_count;

    wg_store_rows(p, o, l_r, wr0, lane, t.rows_total, G, t.kvh, p.q_rows[t.s]);
  }
#else
  (void)p;
  (void)m_tiles;
  (void)num_seqs;
  (void)use_list;
#endif
}

}  // namespace moeserve::cuda::detail

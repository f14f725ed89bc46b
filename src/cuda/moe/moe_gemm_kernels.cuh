// Device code of the fused MoE path, one source for three builds: nvcc ahead of time for sm_90a (fused_sm90),
// nvcc for sm_100a only (fused_sm100_build) and NVRTC at startup (jit, with hidden/inter as compile-time
// constants). NVRTC compiles it with no CUDA headers: only built-in types, moe_kernel_params.h and moe_ptx.cuh
// (both handed to NVRTC as in-memory headers).
//
// The pipeline (all on the device, launch shapes depend only on T and the model's shapes, never on routing,
// so a CUDA graph replays it for any routing):
//   prep     count pairs per expert, exclusive scan, per-expert token tiles, pair permutation: one CTA up to
//            kPrepChunk pairs, else two launches of a CTA per chunk (count + scan, then scatter; PrepParams)
//   gemm     kGateUp: act = silu(x Wg^T) * (x Wu^T)          grid (ceil(I / (BM/2)), slots)
//            kDown:   y   = topk_weight * (act Wd^T)          grid (ceil(H / BM), slots)
//   combine  out[t] = sum of its k rows of y, in slot order (deterministic, no float atomics)
// Direct mode (small T, GemmParams::direct_ids set): no prep launch; GEMM slot y is pair y as a one-row tile of
// expert topk_ids[y], act/y rows are indexed by pair, and the combine is done by the down GEMM's last CTA of
// each (token, hidden block) (GemmParams::combine_counters), or by the combine kernel reading topk_ids.
//
// Programmatic dependent launch (all kernels may be launched with the attribute): prep, gate/up and combine
// wait for the kernel before them first and only then let their dependent start; the down GEMM lets its
// dependent start at once and prefetches its weight slices before waiting. So the down GEMM's early reads of
// topk_ids (direct mode) come after the gate/up's wait, i.e. after the router finished.
//
// GEMM layout ("swap AB"): weight rows are the MMA M dimension and tokens the N dimension, so a decode step
// with one or two tokens per expert still fills whole m16n8k16 MMAs and every weight byte of an active expert
// is streamed exactly once, through a cp.async ring into XOR-swizzled shared memory, then ldmatrix + mma.sync.
#pragma once

#include "moe_kernel_params.h"
#include "moe_ptx.cuh"

namespace moe_kernels {

struct alignas(16) U4 {
  unsigned x, y, z, w;
};
struct alignas(16) F4 {
  float x, y, z, w;
};
struct alignas(8) F2 {
  float x, y;
};

// Element offset of 16-byte chunk `chunk` of row `row` in a [rows][BK] bf16 tile. XOR with the row's low three
// bits: the eight rows an ldmatrix phase reads land in eight different bank groups.
template <int BK>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * BK + ((chunk ^ (row & 7)) << 3);
}

// The division as one approximate reciprocal (__fdividef): IEEE division's Newton steps, FCHK and slow-path branch
// were ~40% of the gate/up GEMM epilogue's instructions (ncu source counters, session 23). g -> -inf: the denominator
// goes to inf and the result to -0, the function's limit; the error (~2 ulp) is far below the bf16 rounding of act.
__device__ __forceinline__ float silu(float g) {
  return __fdividef(g, 1.0f + moe_ptx::exp2_approx(-1.4426950408889634f * g));
}

// 16 bytes written by another CTA of this grid: read through L2 (never a stale L1 line).
__device__ __forceinline__ U4 load_cg(const unsigned short* p) {
  U4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Direct-mode down GEMM, fused combine (see GemmParams::combine_counters): every CTA calls this after its rows
// of y are written (or after finding its pair dropped); the last of a token's top_k CTAs for this block of
// hidden rows [h0, h0 + BM) writes the token's output there.
template <int BM>
__device__ __forceinline__ void direct_combine_tail(const GemmParams& p, int H) {
  __shared__ int combine_here;
  __threadfence();
  __syncthreads();
  const int t = blockIdx.y / p.top_k;
  if (threadIdx.x == 0) {
    int* c = p.combine_counters + t * gridDim.x + blockIdx.x;
    combine_here = atomicAdd(c, 1) == p.top_k - 1;
    if (combine_here) *c = 0;  // all of the token's CTAs have counted: ready for the next launch
  }
  __syncthreads();
  if (!combine_here) return;
  __threadfence();
  const long long pair0 = (long long)t * p.top_k;
  for (int c = threadIdx.x; c < BM / 8; c += blockDim.x) {
    const int h = blockIdx.x * BM + c * 8;
    if (h >= H) break;
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < p.top_k; ++j) {
      const int e = p.direct_ids[pair0 + j];
      if (e < 0 || e >= p.num_experts) continue;  // a dropped pair adds nothing
      const U4 v = load_cg(p.dst + (pair0 + j) * H + h);
      a[0] += moe_ptx::bf16_lo(v.x), a[1] += moe_ptx::bf16_hi(v.x), a[2] += moe_ptx::bf16_lo(v.y);
      a[3] += moe_ptx::bf16_hi(v.y), a[4] += moe_ptx::bf16_lo(v.z), a[5] += moe_ptx::bf16_hi(v.z);
      a[6] += moe_ptx::bf16_lo(v.w), a[7] += moe_ptx::bf16_hi(v.w);
    }
    U4 o;
    o.x = moe_ptx::pack_bf16x2(a[0], a[1]), o.y = moe_ptx::pack_bf16x2(a[2], a[3]);
    o.z = moe_ptx::pack_bf16x2(a[4], a[5]), o.w = moe_ptx::pack_bf16x2(a[6], a[7]);
    *reinterpret_cast<U4*>(p.combine_out + (long long)t * H + h) = o;
  }
}

// ---------------------------------------------------------------------------------------------------------
// prep (see PrepParams): kPrepThreads a CTA. smem: 3 * kMaxExperts + 2 ints.
// The rank inside the expert comes from atomics, so the order of an expert's rows varies from run to run; results
// do not: every output element is computed from its own row alone, in a fixed k order.

// Exclusive scans of the rows and tiles of each expert by one warp (lane: its lane), 32 experts a step, from rows(e)
// (expert e's pairs): off[0..E] and toff[0..E] in shared memory. Static slots (fixed): toff counts only the tiles
// after each expert's first. Shared by the prep and the GEMMs' inline routing (moe_gemm_ws.cuh).
template <class Rows>
__device__ __forceinline__ void scan_expert_rows(Rows rows, int E, int BN, bool fixed, int* s_off, int* s_toff,
                                                 int lane) {
  int carry = 0, tcarry = 0;
  for (int base = 0; base < E; base += 32) {
    const int e = base + lane;
    int c = e < E ? rows(e) : 0;
    int t = (c + BN - 1) / BN;
    if (fixed && t > 0) --t;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int c2 = __shfl_up_sync(0xffffffffu, c, d), t2 = __shfl_up_sync(0xffffffffu, t, d);
      if (lane >= d) c += c2, t += t2;
    }
    if (e < E) s_off[e + 1] = carry + c, s_toff[e + 1] = tcarry + t;
    carry += __shfl_sync(0xffffffffu, c, 31);
    tcarry += __shfl_sync(0xffffffffu, t, 31);
  }
  if (lane == 0) s_off[0] = 0, s_toff[0] = 0;
}

// The tile table of num_slots entries from the scans and rows(e) (threads tid, tid + nt, ...): static slots put
// expert e's first tile in slot e, even without rows (the host sizes num_slots for this layout), its further tiles
// from slot E on.
template <class Rows>
__device__ __forceinline__ void write_tile_table(Rows rows, Tile* tiles, int num_slots, const int* s_off,
                                                 const int* s_toff, int E, int BN, bool fixed, int tid, int nt) {
  for (int e = tid; e < E; e += nt) {
    const int n = rows(e);
    if (fixed) {
      Tile t;
      t.expert = e, t.row0 = s_off[e], t.rows = n < BN ? n : BN, t.pad = 0;
      tiles[e] = t;
    }
    for (int j = fixed ? 1 : 0, s = fixed ? E + s_toff[e] : s_toff[e]; j * BN < n && s < num_slots; ++j, ++s) {
      Tile t;
      t.expert = e, t.row0 = s_off[e] + j * BN, t.rows = n - j * BN < BN ? n - j * BN : BN, t.pad = 0;
      tiles[s] = t;
    }
  }
  for (int s = (fixed ? E : 0) + s_toff[E] + tid; s < num_slots; s += nt) {
    Tile t;
    t.expert = 0, t.row0 = 0, t.rows = 0, t.pad = 0;
    tiles[s] = t;
  }
}

// The prep's scans and tile table from its counts cnt.
__device__ __forceinline__ void prep_scan_and_tiles(const PrepParams& p, const int* cnt, int* s_off, int* s_toff) {
  const int tid = threadIdx.x, E = p.num_experts, BN = p.tile_rows;
  const bool fixed = p.static_slots != 0;
  auto rows = [&](int e) { return cnt[e]; };
  if (tid < 32) scan_expert_rows(rows, E, BN, fixed, s_off, s_toff, tid);
  __syncthreads();
  write_tile_table(rows, p.tiles, p.num_slots, s_off, s_toff, E, BN, fixed, tid, int(blockDim.x));
}

// Pairs [i0, i1): pair_pos holds each pair's rank within its expert (or -1); it becomes the pair's sorted
// position off[expert] + rank, and perm_pair its inverse. Thread tid takes pairs i0 + tid + k * blockDim.x.
__device__ __forceinline__ void prep_scatter(const PrepParams& p, int i0, int i1, const int* off) {
  const int nt = blockDim.x;
  for (int b = i0 + int(threadIdx.x); b < i1; b += nt * kPrepUnroll) {
    int r[kPrepUnroll], e[kPrepUnroll];
#pragma unroll
    for (int u = 0; u < kPrepUnroll; ++u) {
      const int i = b + u * nt;
      r[u] = i < i1 ? p.pair_pos[i] : -1;
      e[u] = i < i1 ? p.topk_ids[i] : 0;
    }
#pragma unroll
    for (int u = 0; u < kPrepUnroll; ++u) {
      if (r[u] < 0) continue;
      const int i = b + u * nt, pos = off[e[u]] + r[u];
      p.perm_pair[pos] = i;
      p.pair_pos[i] = pos;
    }
  }
}

__device__ __forceinline__ void prep_body(const PrepParams& p, char* smem) {
  moe_ptx::grid_dep_wait();  // topk_ids come from the router (kPrepScatter: the counts from kPrepCount)
  moe_ptx::grid_dep_launch_dependents();
  int* s_cnt = reinterpret_cast<int*>(smem);  // [E]
  int* s_off = s_cnt + kMaxExperts;           // [E + 1] first sorted position of each expert
  int* s_toff = s_off + kMaxExperts + 1;      // [E + 1] first tile of each expert (kPrepCount: ranks reserved)
  const int tid = threadIdx.x, nt = blockDim.x, E = p.num_experts, P = p.num_pairs;
  // Pairs [i0, i1) of this CTA; thread tid takes i0 + tid + k nt, kPrepUnroll of them at a time with their loads
  // issued together (one at a time, each load's round trip came in turn).
  const int i0 = p.mode == kPrepWhole ? 0 : int(blockIdx.x) * kPrepChunk;
  const int i1 = p.mode == kPrepWhole ? P : min(P, i0 + kPrepChunk);

  if (p.mode == kPrepScatter) return prep_scatter(p, i0, i1, p.offsets);

  for (int e = tid; e < E; e += nt) s_cnt[e] = 0;
  __syncthreads();
  for (int b = i0 + tid; b < i1; b += nt * kPrepUnroll) {
    int e[kPrepUnroll];
#pragma unroll
    for (int u = 0; u < kPrepUnroll; ++u) e[u] = b + u * nt < i1 ? p.topk_ids[b + u * nt] : -1;
#pragma unroll
    for (int u = 0; u < kPrepUnroll; ++u)
      if (b + u * nt < i1) p.pair_pos[b + u * nt] = (e[u] >= 0 && e[u] < E) ? atomicAdd(&s_cnt[e[u]], 1) : -1;
  }
  __syncthreads();

  if (p.mode == kPrepCount) {
    // Reserve this CTA's ranks of each expert, then make the pairs' ranks step-wide. A thread rereads only the
    // pair_pos entries it wrote itself.
    for (int e = tid; e < E; e += nt) s_toff[e] = s_cnt[e] > 0 ? atomicAdd(&p.counts[e], s_cnt[e]) : 0;
    __syncthreads();
    for (int b = i0 + tid; b < i1; b += nt * kPrepUnroll) {
      int r[kPrepUnroll], e[kPrepUnroll];
#pragma unroll
      for (int u = 0; u < kPrepUnroll; ++u) {
        const int i = b + u * nt;
        r[u] = i < i1 ? p.pair_pos[i] : -1;
        e[u] = i < i1 ? p.topk_ids[i] : 0;
      }
#pragma unroll
      for (int u = 0; u < kPrepUnroll; ++u)
        if (r[u] >= 0) p.pair_pos[b + u * nt] = s_toff[e[u]] + r[u];
    }
    // The last CTA to finish sees every reservation: it scans them and resets the counters for the next launch.
    __threadfence();
    __syncthreads();
    __shared__ int s_last;
    if (tid == 0) s_last = atomicAdd(p.done, 1) == int(gridDim.x) - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    for (int e = tid; e < E; e += nt) {
      s_cnt[e] = __ldcg(p.counts + e);
      p.counts[e] = 0;
    }
    if (tid == 0) *p.done = 0;
    __syncthreads();
    prep_scan_and_tiles(p, s_cnt, s_off, s_toff);
    for (int e = tid; e <= E; e += nt) p.offsets[e] = s_off[e];
    return;
  }

  prep_scan_and_tiles(p, s_cnt, s_off, s_toff);
  __syncthreads();
  prep_scatter(p, i0, i1, s_off);  // each thread rereads the pair_pos entries it wrote above
}

// ---------------------------------------------------------------------------------------------------------
// The epilogue from the f32 accumulator tile cs ([BN][BM + 4], token-major): kGateUp pairs gate row c with up row
// c + BM / 2 into act = bf16(silu(gate) * up); kDown scales each token's row by its pair's top-k weight into y.
// Threads t0, t0 + nt, ... take the 16-byte output chunks.
//
// A chunk's 8 floats are two 16-byte loads 32 bytes apart from the next chunk's; 8 lanes of consecutive chunks c read
// in one wavefront would hit banks 8c .. 8c + 3 mod 32 twice (chunks c and c + 4). Lanes with bit 2 of c set read
// their upper half first, so each wavefront covers all 32 banks once (ncu, session 23: 3% / 7% excess shared
// wavefronts in the gate/up / down GEMMs).
__device__ __forceinline__ void load_chunk_f8(const float* r, int c, F4& lo, F4& hi) {
  const bool up = (c & 4) != 0;
  const F4 first = *reinterpret_cast<const F4*>(r + (up ? 4 : 0));
  const F4 second = *reinterpret_cast<const F4*>(r + (up ? 0 : 4));
  lo = up ? second : first;
  hi = up ? first : second;
}
template <int BM, int BN, int MODE>
__device__ __forceinline__ void store_tile(const GemmParams& p, const float* cs, const Tile& tile, int bx, int H,
                                           int I, bool direct, int t0, int nt, const float* row_weights = nullptr) {
  using namespace moe_ptx;
  constexpr int LDC = BM + 4;
  if (MODE == kGateUp) {
    constexpr int HALF = BM / 2, OC = HALF / 8;
    for (int idx = t0; idx < BN * OC; idx += nt) {
      const int n = idx / OC, c = idx % OC;
      const int i = bx * HALF + c * 8;
      if (n >= tile.rows || i >= I) continue;
      const float* gr = cs + n * LDC + c * 8;
      F4 g0, g1, u0, u1;
      load_chunk_f8(gr, c, g0, g1);
      load_chunk_f8(gr + HALF, c, u0, u1);
      U4 o;
      o.x = pack_bf16x2(silu(g0.x) * u0.x, silu(g0.y) * u0.y);
      o.y = pack_bf16x2(silu(g0.z) * u0.z, silu(g0.w) * u0.w);
      o.z = pack_bf16x2(silu(g1.x) * u1.x, silu(g1.y) * u1.y);
      o.w = pack_bf16x2(silu(g1.z) * u1.z, silu(g1.w) * u1.w);
      *reinterpret_cast<U4*>(p.dst + (long long)(tile.row0 + n) * I + i) = o;
    }
  } else {
    constexpr int OC = BM / 8;
    for (int idx = t0; idx < BN * OC; idx += nt) {
      const int n = idx / OC, c = idx % OC;
      const int h = bx * BM + c * 8;
      if (n >= tile.rows || h >= H) continue;
      // row_weights: the tile's routing weights already in shared memory (the warp-specialized body loads them
      // during its main loop); else two dependent global loads here.
      const float wt = row_weights != nullptr ? row_weights[n]
                                              : p.topk_weights[direct ? tile.row0 + n : p.perm_pair[tile.row0 + n]];
      const float* yr = cs + n * LDC + c * 8;
      F4 a, b;
      load_chunk_f8(yr, c, a, b);
      U4 o;
      o.x = pack_bf16x2(a.x * wt, a.y * wt);
      o.y = pack_bf16x2(a.z * wt, a.w * wt);
      o.z = pack_bf16x2(b.x * wt, b.y * wt);
      o.w = pack_bf16x2(b.z * wt, b.w * wt);
      *reinterpret_cast<U4*>(p.dst + (long long)(tile.row0 + n) * H + h) = o;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Grouped GEMM CTA: blockIdx.y picks the tile (expert, rows), blockIdx.x the block of weight rows. FIXED_H /
// FIXED_I > 0 replace the runtime sizes with compile-time constants (the JIT build).
template <class Cfg, int MODE, int FIXED_H, int FIXED_I>
__device__ __forceinline__ void gemm_body(const GemmParams& p, char* smem) {
  using namespace moe_ptx;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES, THREADS = Cfg::THREADS;
  constexpr int WTM = BM / Cfg::WM, WTN = BN / Cfg::WN, MT = WTM / 16, NT = WTN / 8;
  constexpr int CPR = BK / 8;          // 16-byte chunks per smem row
  constexpr int RPP = THREADS / CPR;   // rows one pass of the CTA's loads covers
  constexpr int A_ITERS = BM / RPP, B_ITERS = BN / RPP;
  static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tile: whole m16 tiles and pairs of n8 tiles");
  static_assert(THREADS % CPR == 0 && BM % RPP == 0 && BN % RPP == 0 && A_ITERS > 0 && B_ITERS > 0, "loads");
  static_assert(CPR >= 8 && BK % 16 == 0, "the swizzle permutes 8 chunks");
  static_assert(MODE == kDown || BM % 16 == 0, "gate/up halves hold whole 8-wide output chunks");
  // The wgmma main loop (sm_90a builds of a WGMMA configuration): two warpgroups, each 64 weight rows x all BN
  // tokens, reading the swizzled tiles through descriptors, which need a 1024-byte aligned base.
  constexpr bool kWgmma = Cfg::WGMMA > 0 && MOE_HAVE_WGMMA;
  static_assert(!kWgmma || (BM == 128 && (BN == 128 || BN == 64) && BK == 64 && THREADS == 256),
                "wgmma tiles: 2 warpgroups x (64 weight rows x BN = 64 or 128 tokens), 128-byte rows");
  if constexpr (Cfg::WGMMA > 0) smem = moe_ptx::align_smem(smem, 1024);

  // Programmatic dependent launch (no-ops unless launched with the attribute). The gate/up GEMM reads x and the
  // routing (or the prep's tiles) first thing: it waits before anything, then lets the down GEMM be scheduled.
  // The down GEMM lets the next kernel be scheduled at once; that kernel waits for this grid's completion.
  if (MODE == kGateUp) moe_ptx::grid_dep_wait();
  moe_ptx::grid_dep_launch_dependents();
  const bool direct = p.direct_ids != nullptr;
  Tile tile;
  if (direct) {
    // topk_ids were complete before the gate/up GEMM passed its wait, which is before this grid could start,
    // so they may be read before the wait; everything the previous kernel writes (act) is read only after it.
    const int e = p.direct_ids[blockIdx.y];
    tile.expert = e, tile.row0 = blockIdx.y, tile.rows = (e >= 0 && e < p.num_experts) ? 1 : 0, tile.pad = 0;
  } else {
    // Tiles come from the prep kernel. The gate/up GEMM has waited for it above; the down GEMM may read them
    // before its wait: the prep completed before the gate/up GEMM passed its wait, which is before this grid
    // could start (the same argument as topk_ids in direct mode).
    tile = p.tiles[blockIdx.y];
  }
  if (tile.rows <= 0) {
    moe_ptx::grid_dep_wait();  // every CTA waits, so this grid completes only after its prerequisite
    // A dropped pair still counts towards its token's fused combine.
    if (MODE == kDown && direct && p.combine_counters != nullptr)
      direct_combine_tail<BM>(p, FIXED_H > 0 ? FIXED_H : p.hidden);
    return;  // the grid is sized for the worst routing; most slots are empty at decode
  }

  const int H = FIXED_H > 0 ? FIXED_H : p.hidden;
  const int I = FIXED_I > 0 ? FIXED_I : p.inter;
  const int K = MODE == kGateUp ? H : I;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % Cfg::WM, wn = warp / Cfg::WM;
  const int ch = tid % CPR;  // this thread's 16-byte chunk column; THREADS % CPR == 0 keeps it fixed

  const unsigned short* wexp =
      p.weights + (long long)tile.expert * (MODE == kGateUp ? 2LL * I * H : (long long)H * I);
  // kGateUp: the first BM/2 tile rows are gate rows i0.., the next BM/2 the matching up rows I + i0.., so the
  // SwiGLU pairs meet in this CTA's epilogue.
  const unsigned short* a_src[A_ITERS];
  bool a_ok[A_ITERS];
#pragma unroll
  for (int it = 0; it < A_ITERS; ++it) {
    const int r = tid / CPR + it * RPP;
    int grow;
    bool ok;
    if (MODE == kGateUp) {
      const int i = blockIdx.x * (BM / 2) + (r % (BM / 2));
      ok = i < I;
      grow = r < BM / 2 ? i : I + i;
    } else {
      grow = blockIdx.x * BM + r;
      ok = grow < H;
    }
    a_src[it] = wexp + (long long)(ok ? grow : 0) * K + ch * 8;
    a_ok[it] = ok;
  }
  unsigned short* As = reinterpret_cast<unsigned short*>(smem);
  unsigned short* Bs = As + STAGES * BM * BK;
  const unsigned short* b_src[B_ITERS];
  bool b_ok[B_ITERS];
  // The decode tiles (BN 16, mma.sync) stream their weights with an L2 priority (GemmParams::weight_evict_first);
  // the larger tiles re-read a weight tile from several CTAs and keep the default.
  constexpr bool kHint = BN == 16 && Cfg::WGMMA == 0;
  const bool hint = kHint && p.weight_evict_first != 0;
  const unsigned long long wpol = hint ? moe_ptx::l2_evict_first_policy() : 0ull;
  auto load_a = [&](int stage, int kt) {
    const int k0 = kt * BK;
    const bool k_ok = k0 + ch * 8 < K;
    unsigned short* as = As + stage * BM * BK;
#pragma unroll
    for (int it = 0; it < A_ITERS; ++it) {
      const int r = tid / CPR + it * RPP;
      const bool ok = a_ok[it] && k_ok;
      moe_ptx::cp_async16_hint(as + swz<BK>(r, ch), ok ? a_src[it] + k0 : p.weights, ok, hint, wpol);
    }
  };
  auto load_b = [&](int stage, int kt) {
    const int k0 = kt * BK;
    const bool k_ok = k0 + ch * 8 < K;
    unsigned short* bs = Bs + stage * BN * BK;
#pragma unroll
    for (int it = 0; it < B_ITERS; ++it) {
      const int n = tid / CPR + it * RPP;
      const bool ok = b_ok[it] && k_ok;
      cp_async16(bs + swz<BK>(n, ch), ok ? b_src[it] + k0 : p.src, ok);
    }
  };

  // Prologue: the perm_pair loads are issued first but used last, so their latency hides behind the weight
  // slices' copies (whose addresses are known already). Group s then holds B slice s (group 0 also every
  // prologue A slice), so waiting for group kt still covers slice kt.
  int b_row[B_ITERS];  // kGateUp: the pair of each B row this thread loads; kDown: its sorted position
#pragma unroll
  for (int it = 0; it < B_ITERS; ++it) {
    const int n = tid / CPR + it * RPP;
    b_row[it] = n >= tile.rows                 ? -1
                : MODE == kGateUp && !direct ? p.perm_pair[tile.row0 + n]
                                             : tile.row0 + n;
  }
  const int KT = (K + BK - 1) / BK;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s)
    if (s < KT) load_a(s, s);
  // The down GEMM: the weight slices above are loaded while the gate/up GEMM may still be running; the token
  // rows (act, written by it) are loaded only after the wait, as are all outputs written below. (Also starting
  // the rest of the CTA's weight rows towards L2 here, one bulk prefetch, made the layer at 1 token slower on
  // the H200: 26.7 -> 29.0 us.)
  if constexpr (MODE == kDown) moe_ptx::grid_dep_wait();
#pragma unroll
  for (int it = 0; it < B_ITERS; ++it) {
    b_ok[it] = b_row[it] >= 0;
    const long long row = !b_ok[it] ? 0 : MODE == kGateUp ? b_row[it] / p.top_k : b_row[it];
    b_src[it] = p.src + row * K + ch * 8;  // x rows have stride H = K, act rows stride I = K
  }
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_b(s, s);
    cp_async_commit();  // empty groups too: the wait below counts groups
  }
  // Accumulators -> smem as [token][weight row] f32 after the main loop, then 16-byte stores of whole output rows.
  constexpr int LDC = BM + 4;
  float* cs = reinterpret_cast<float*>(smem);
  if constexpr (kWgmma) {
#if MOE_HAVE_WGMMA
    float d[BN / 2];  // 64 x BN f32 over the warpgroup's 128 threads
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
    const int wg = warp / 4;  // warpgroup: weight rows [64 wg, 64 wg + 64) of the tile
    const unsigned as_addr = smem_addr(As) + unsigned(wg * 64 * BK * 2), bs_addr = smem_addr(Bs);
    constexpr bool kInFlight = Cfg::WGMMA == 2;
#pragma unroll 1
    for (int kt = 0; kt < KT; ++kt) {
      cp_async_wait<STAGES - 2>();  // this thread's copies for slice kt have landed...
      fence_proxy_async_smem();     // ...are visible to wgmma's (async proxy) reads...
      __syncthreads();              // ...and so are everyone's; slice kt - 1's wgmma completed (waited below)
      const int next = kt + STAGES - 1;  // refills the stage of slice kt - 1
      if constexpr (!kInFlight) {
        if (next < KT) load_a(next % STAGES, next), load_b(next % STAGES, next);
        cp_async_commit();
      }
      const unsigned a_st = as_addr + unsigned((kt % STAGES) * BM * BK * 2);
      const unsigned b_st = bs_addr + unsigned((kt % STAGES) * BN * BK * 2);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
        wgmma_m64nk16_bf16(d, wgmma_desc_sw128(a_st + kk * 32), wgmma_desc_sw128(b_st + kk * 32));
      wgmma_commit();
      if constexpr (kInFlight) {
        wgmma_wait<1>();  // this warpgroup's MMAs of slice kt - 1 are done (slice kt's may still run)...
        __syncthreads();  // ...and the other warpgroup's: slice kt - 1's stage may be refilled
        if (next < KT) load_a(next % STAGES, next), load_b(next % STAGES, next);
        cp_async_commit();
      } else {
        wgmma_wait<0>();  // the stage is refilled by the next iteration's loads
      }
    }
    wgmma_wait<0>();
    cp_async_wait<0>();
    __syncthreads();  // the ring is reused as the accumulator tile
    wgmma_acc_to_token_major(d, cs, LDC, wg * 64 + (warp & 3) * 16 + (lane >> 2), lane & 3);
#endif
  } else {
    float acc[MT][NT][4];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int ni = 0; ni < NT; ++ni)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;
#pragma unroll 1  // rolled in both builds (the JIT knows K): the cp.async ring hides latency, unrolling adds registers
    for (int kt = 0; kt < KT; ++kt) {
      cp_async_wait<STAGES - 2>();  // this thread's copies for slice kt have landed...
      __syncthreads();              // ...and everyone's; everyone is also done reading slice kt - 1
      const int next = kt + STAGES - 1;
      if (next < KT) load_a(next % STAGES, next), load_b(next % STAGES, next);  // refills slice kt - 1's stage
      cp_async_commit();

      const unsigned short* as = As + (kt % STAGES) * BM * BK;
      const unsigned short* bs = Bs + (kt % STAGES) * BN * BK;
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        unsigned af[MT][4], bfr[NT][2];
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          // matrices: rows 0-7 / k 0-7, rows 8-15 / k 0-7, rows 0-7 / k 8-15, rows 8-15 / k 8-15 = a0..a3
          const int r = wm * WTM + mi * 16 + (lane & 15);
          ldsm_x4(as + swz<BK>(r, kk * 2 + (lane >> 4)), af[mi][0], af[mi][1], af[mi][2], af[mi][3]);
        }
#pragma unroll
        for (int nj = 0; nj < NT / 2; ++nj) {
          // matrices: tokens 0-7 / k 0-7, tokens 0-7 / k 8-15, tokens 8-15 / k 0-7, tokens 8-15 / k 8-15
          const int n = wn * WTN + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldsm_x4(bs + swz<BK>(n, kk * 2 + ((lane >> 3) & 1)), bfr[2 * nj][0], bfr[2 * nj][1], bfr[2 * nj + 1][0],
                  bfr[2 * nj + 1][1]);
        }
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int ni = 0; ni < NT; ++ni) mma_bf16_16816(acc[mi][ni], af[mi], bfr[ni]);
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the ring is reused as the accumulator tile
    {
      const int g = lane >> 2, tig = lane & 3;
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int ni = 0; ni < NT; ++ni) {
          const int m = wm * WTM + mi * 16 + g, n = wn * WTN + ni * 8 + tig * 2;
          cs[n * LDC + m] = acc[mi][ni][0];
          cs[(n + 1) * LDC + m] = acc[mi][ni][1];
          cs[n * LDC + m + 8] = acc[mi][ni][2];
          cs[(n + 1) * LDC + m + 8] = acc[mi][ni][3];
        }
    }
  }
  __syncthreads();

  store_tile<BM, BN, MODE>(p, cs, tile, blockIdx.x, H, I, direct, tid, THREADS);
  if (MODE == kDown && direct && p.combine_counters != nullptr) direct_combine_tail<BM>(p, H);
}

// ---------------------------------------------------------------------------------------------------------
// combine: one CTA per token, 8 hidden values per thread step.
__device__ __forceinline__ void combine_body(const CombineParams& p) {
  using namespace moe_ptx;
  grid_dep_wait();  // y comes from the down GEMM (a no-op unless launched as its programmatic dependent)
  grid_dep_launch_dependents();
  const int t = blockIdx.x;
  if (t >= p.num_tokens) return;
  const long long pair0 = (long long)t * p.top_k;
  // The token's rows of y in groups of kCombineBatch slots: the group's row positions, then all of its row loads,
  // then the sums in slot order, so that a thread has up to 8 loads in flight however the compiler treats the
  // runtime trip count. H200, session 38 (CUPTI traces of the served 8,192-token prompt step, q30b8l): 92-99 us a
  // launch on four machines against 101-102 for the one-slot-a-time loop (a same-call A/B was not possible: the old
  // loop as a runtime branch beside this one compiled to 169 us). The decode steps are even.
  constexpr int kCombineBatch = 8;
  auto chunk = [&](int c) {  // out[t, 8c .. 8c + 7]: the token's pairs in slot order, rounded to bf16
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j0 = 0; j0 < p.top_k; j0 += kCombineBatch) {
      int r[kCombineBatch];
      U4 v[kCombineBatch];
#pragma unroll
      for (int i = 0; i < kCombineBatch; ++i) {
        const int j = j0 + i;
        r[i] = -1;  // past top_k, or a dropped pair (expert id out of range): adds nothing
        if (j < p.top_k) {
          if (p.direct_ids != nullptr) {
            const int e = p.direct_ids[pair0 + j];
            r[i] = (e >= 0 && e < p.num_experts) ? int(pair0 + j) : -1;
          } else {
            r[i] = p.pair_pos[pair0 + j];
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kCombineBatch; ++i)
        if (r[i] >= 0) v[i] = *reinterpret_cast<const U4*>(p.y + (long long)r[i] * p.hidden + c * 8);
#pragma unroll
      for (int i = 0; i < kCombineBatch; ++i) {
        if (r[i] < 0) continue;
        a[0] += bf16_lo(v[i].x), a[1] += bf16_hi(v[i].x), a[2] += bf16_lo(v[i].y), a[3] += bf16_hi(v[i].y);
        a[4] += bf16_lo(v[i].z), a[5] += bf16_hi(v[i].z), a[6] += bf16_lo(v[i].w), a[7] += bf16_hi(v[i].w);
      }
    }
    U4 o;
    o.x = pack_bf16x2(a[0], a[1]), o.y = pack_bf16x2(a[2], a[3]);
    o.z = pack_bf16x2(a[4], a[5]), o.w = pack_bf16x2(a[6], a[7]);
    *reinterpret_cast<U4*>(p.out + (long long)t * p.hidden + c * 8) = o;
    return o;
  };
  if (p.residual == nullptr) {
    for (int c = threadIdx.x; c < p.hidden / 8; c += blockDim.x) chunk(c);
    return;
  }
  // With the next RMSNorm: x = residual + float(out) kept in registers, the sum of squares reduced over the block,
  // then xn_out and the residual written (the norm in f32 as the rmsnorm kernels compute it).
  __shared__ float red[33];
  float* res = p.residual + (long long)t * p.hidden;
  float x[kCombineNormChunks][8];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kCombineNormChunks; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < p.hidden / 8) {
      const U4 o = chunk(c);
      const unsigned ov[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        x[i][e] = res[c * 8 + e] + ((e & 1) ? bf16_hi(ov[e / 2]) : bf16_lo(ov[e / 2]));
        ss += x[i][e] * x[i][e];
      }
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) red[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    float tot = lane < int(blockDim.x >> 5) ? red[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) tot += __shfl_xor_sync(0xffffffffu, tot, o);
    if (lane == 0) red[32] = tot;
  }
  __syncthreads();
  const float inv = rsqrtf(red[32] / float(p.hidden) + p.eps);
#pragma unroll
  for (int i = 0; i < kCombineNormChunks; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < p.hidden / 8) {
      const U4 wv = *reinterpret_cast<const U4*>(p.norm_w + c * 8);
      const unsigned wa[4] = {wv.x, wv.y, wv.z, wv.w};
      unsigned xo[4];
#pragma unroll
      for (int e = 0; e < 8; e += 2) {
        xo[e / 2] = pack_bf16x2(bf16_lo(wa[e / 2]) * (x[i][e] * inv), bf16_hi(wa[e / 2]) * (x[i][e + 1] * inv));
        res[c * 8 + e] = x[i][e];
        res[c * 8 + e + 1] = x[i][e + 1];
      }
      U4 xn;
      xn.x = xo[0], xn.y = xo[1], xn.z = xo[2], xn.w = xo[3];
      *reinterpret_cast<U4*>(p.xn_out + (long long)t * p.hidden + c * 8) = xn;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Direct mode's down projection and combine in one launch (GemmParams as for the down GEMM, combine_out the output;
// kDownGemv* in moe_kernel_params.h). CTA b takes hidden rows [16 b, 16 b + 16) of every pair's expert: warp j is
// pair j, a GEMV of 16 weight rows by the pair's act row with the rows as mma.m16n8k16's M and the act row as
// token 0 of its N (the lane mapping of the gemv backend: lane (g, q) holds rows g and g + 8 at k = 8q + 32h of
// each 64-k slice, the act chunk at the same k for g == 0, zero for the other tokens). Each warp streams its rows
// through its own cp.async ring of 64-k slices (XOR-swizzled 16-byte chunks), the first slices issued before the
// programmatic wait (the expert ids were final before the gate/up GEMM passed its wait). Then
//   out[t, h] = bf16(sum over the token's slots j, in order, of bf16(topk_weight[j] * (act[j] . Wd[e_j, h])))
// which is the down GEMM's y rows and the combine's sum, rounded the same way. A CTA streams 8 x 16 rows of I
// (196 KB at q30b shapes) instead of the down GEMM's 48 KB tiles, and no CTA waits for another to combine.
template <int FIXED_H, int FIXED_I, int S = kDownGemvStages>
__device__ __forceinline__ void down_gemv_body(const GemmParams& p, char* smem) {
  using namespace moe_ptx;
  constexpr int R = kDownGemvRows, SLICE = kDownGemvSlice;
  const int H = FIXED_H > 0 ? FIXED_H : p.hidden;
  const int I = FIXED_I > 0 ? FIXED_I : p.inter;
  const int P = p.num_slots, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int h0 = blockIdx.x * R;
  float* ys = reinterpret_cast<float*>(smem);                                           // [kDownGemvWarps][R]
  unsigned short* ring = reinterpret_cast<unsigned short*>(ys + kDownGemvWarps * R);   // [warps][S][R][SLICE]
  unsigned short* xs = ring + kDownGemvWarps * S * R * SLICE;                           // [warps][I]
  unsigned short* my_ring = ring + warp * S * R * SLICE;
  unsigned short* my_x = xs + (long long)warp * I;
  grid_dep_launch_dependents();  // the next kernel may be scheduled; it waits for this grid's completion
  const int j = warp;
  const int e = j < P ? p.direct_ids[j] : -1;
  const bool active = e >= 0 && e < p.num_experts;
  const int NS = I / SLICE;
  const unsigned short* w = p.weights + ((long long)(active ? e : 0) * H + h0) * I;
  const bool hint = p.weight_evict_first != 0;
  const unsigned long long wpol = hint ? l2_evict_first_policy() : 0ull;
  // Slice s of this warp's 16 rows: 128 16-byte chunks, 4 a lane; chunk c of row r lands at chunk c ^ (r & 7).
  auto load_slice = [&](int s) {
    unsigned short* dst = my_ring + (s % S) * R * SLICE;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int id = lane + 32 * m, r = id >> 3, c = id & 7;
      const bool ok = active && s < NS;  // else a zero fill (the address is not read)
      cp_async16_hint(dst + r * SLICE + ((c ^ (r & 7)) << 3), ok ? w + (long long)r * I + s * SLICE + c * 8 : p.weights,
                      ok, hint, wpol);
    }
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    load_slice(s);
    cp_async_commit();
  }
  grid_dep_wait();  // act comes from the gate/up GEMM
  if (active)
    for (int c = lane; c < I / 8; c += 32)
      *reinterpret_cast<U4*>(my_x + c * 8) = load_cg(p.src + (long long)j * I + c * 8);
  __syncwarp();
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int s = 0; s < NS; ++s) {
    load_slice(s + S - 1);  // refills the stage read one slice ago (zero-size copies past the end)
    cp_async_commit();
    cp_async_wait<S - 1>();  // this lane's copies of slice s have landed...
    __syncwarp();            // ...and the warp's
    const unsigned short* sl = my_ring + (s % S) * R * SLICE;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = 4 * h + q;
      const U4 lo = *reinterpret_cast<const U4*>(sl + g * SLICE + ((c ^ g) << 3));
      const U4 hi = *reinterpret_cast<const U4*>(sl + (g + 8) * SLICE + ((c ^ g) << 3));
      U4 b = {0u, 0u, 0u, 0u};
      if (g == 0) b = *reinterpret_cast<const U4*>(my_x + s * SLICE + c * 8);
      const unsigned a0[4] = {lo.x, hi.x, lo.y, hi.y}, b0[2] = {b.x, b.y};
      const unsigned a1[4] = {lo.z, hi.z, lo.w, hi.w}, b1[2] = {b.z, b.w};
      mma_bf16_16816(acc, a0, b0);
      mma_bf16_16816(acc, a1, b1);
    }
    __syncwarp();  // the stage is refilled by the next slice's copies
  }
  cp_async_wait<0>();
  // acc[0]: row g, token 0 on lanes q == 0; acc[2]: row g + 8. The pair's y values, rounded as the down GEMM's.
  if (q == 0) {
    const float wt = active ? p.topk_weights[j] : 0.0f;
    ys[j * R + g] = active ? bf16_lo(pack_bf16x2(acc[0] * wt, 0.0f)) : 0.0f;
    ys[j * R + g + 8] = active ? bf16_lo(pack_bf16x2(acc[2] * wt, 0.0f)) : 0.0f;
  }
  __syncthreads();
  const int T = P / p.top_k;
  auto combined = [&](int t, int r) {  // bf16 bits of token t's row h0 + r: the pairs in slot order, as the combine
    float a = 0.0f;
    for (int k = 0; k < p.top_k; ++k) a += ys[(t * p.top_k + k) * R + r];
    return pack_bf16x2(a, 0.0f) & 0xffffu;
  };
  for (int i = threadIdx.x; i < T * R; i += blockDim.x)
    p.combine_out[(long long)(i / R) * H + h0 + i % R] = (unsigned short)combined(i / R, i % R);
  if (p.residual != nullptr) {
    // Threads t R .. t R + R - 1 (R = 16: half a warp, aligned) hold token t's rows: each adds its bf16 output to
    // the residual and the half-warp sums the squares in a fixed xor order. T R <= blockDim.x (host).
    static_assert(R == 16 && kDownGemvThreads % 32 == 0, "one token's rows in an aligned half-warp");
    const int t = threadIdx.x / R, r = threadIdx.x % R;
    float v = 0.0f;
    if (t < T) {
      float* rp = p.residual + (long long)t * H + h0 + r;
      v = *rp + bf16_lo(combined(t, r));
      *rp = v;
    }
    float sq = v * v;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
    if (t < T && r == 0) p.res_partials[(long long)t * gridDim.x + blockIdx.x] = sq;
  }
}

}  // namespace moe_kernels

#include "moe_gemm_ws.cuh"

namespace moe_kernels {
// The ordinary body, or the warp-specialized persistent one for WGMMA == 3 configurations.
template <class Cfg, int MODE, int FIXED_H, int FIXED_I>
__device__ __forceinline__ void gemm_entry(const GemmParams& p, char* smem) {
  if constexpr (Cfg::WGMMA == 3)
    gemm_body_ws<Cfg, MODE, FIXED_H, FIXED_I>(p, smem);
  else
    gemm_body<Cfg, MODE, FIXED_H, FIXED_I>(p, smem);
}
}  // namespace moe_kernels

// ---------------------------------------------------------------------------------------------------------
// Kernel entry points. A host-side harness may define MOE_KERNEL_BODIES_ONLY and call the bodies itself.
#ifndef MOE_KERNEL_BODIES_ONLY
extern __shared__ moe_kernels::U4 moe_dyn_smem[];

#ifdef MOE_JIT
// NVRTC build: unmangled names for cudaLibraryGetKernel, shapes baked in.
#ifndef MOE_JIT_HIDDEN
#error "MOE_JIT_HIDDEN and MOE_JIT_INTER must be defined for the JIT build"
#endif
extern "C" __global__ void __launch_bounds__(moe_kernels::kPrepThreads) moe_prep(moe_kernels::PrepParams p) {
  moe_kernels::prep_body(p, reinterpret_cast<char*>(moe_dyn_smem));
}
extern "C" __global__ void __launch_bounds__(moe_kernels::kCombineThreads) moe_combine(moe_kernels::CombineParams p) {
  moe_kernels::combine_body(p);
}
extern "C" __global__ void __launch_bounds__(moe_kernels::kDownGemvThreads)
    moe_down_gemv(const __grid_constant__ moe_kernels::GemmParams p) {
  moe_kernels::down_gemv_body<MOE_JIT_HIDDEN, MOE_JIT_INTER>(p, reinterpret_cast<char*>(moe_dyn_smem));
}
// The other ring depths of kDownGemvStageVariants (moe_down_gemv_s<S>), compiled only when one is picked (the JIT
// options then define MOE_JIT_DOWN_GEMV_VARIANTS): the default start compiles nothing it does not run.
#ifdef MOE_JIT_DOWN_GEMV_VARIANTS
#define MOE_JIT_DOWN_GEMV(S)                                                                               \
  extern "C" __global__ void __launch_bounds__(moe_kernels::kDownGemvThreads)                              \
      moe_down_gemv_s##S(const __grid_constant__ moe_kernels::GemmParams p) {                              \
    moe_kernels::down_gemv_body<MOE_JIT_HIDDEN, MOE_JIT_INTER, S>(p, reinterpret_cast<char*>(moe_dyn_smem)); \
  }
MOE_JIT_DOWN_GEMV(2)
MOE_JIT_DOWN_GEMV(3)
MOE_JIT_DOWN_GEMV(4)
#endif
#define MOE_JIT_GEMM(IDX, MODE, SUFFIX)                                                                  \
  extern "C" __global__ void __launch_bounds__(moe_kernels::GemmCfg##IDX::THREADS,                       \
                                               moe_kernels::GemmCfg##IDX::MINB)                          \
      moe_gemm_##IDX##_##SUFFIX(const __grid_constant__ moe_kernels::GemmParams p) {                   \
    moe_kernels::gemm_entry<moe_kernels::GemmCfg##IDX, moe_kernels::MODE, MOE_JIT_HIDDEN, MOE_JIT_INTER>( \
        p, reinterpret_cast<char*>(moe_dyn_smem));                                                       \
  }
MOE_JIT_GEMM(0, kGateUp, gu)
MOE_JIT_GEMM(0, kDown, dn)
MOE_JIT_GEMM(1, kGateUp, gu)
MOE_JIT_GEMM(1, kDown, dn)
MOE_JIT_GEMM(2, kGateUp, gu)
MOE_JIT_GEMM(2, kDown, dn)
MOE_JIT_GEMM(3, kGateUp, gu)
MOE_JIT_GEMM(3, kDown, dn)
MOE_JIT_GEMM(4, kGateUp, gu)
MOE_JIT_GEMM(4, kDown, dn)
MOE_JIT_GEMM(5, kGateUp, gu)
MOE_JIT_GEMM(5, kDown, dn)
MOE_JIT_GEMM(6, kGateUp, gu)
MOE_JIT_GEMM(6, kDown, dn)
MOE_JIT_GEMM(7, kGateUp, gu)
MOE_JIT_GEMM(7, kDown, dn)
MOE_JIT_GEMM(8, kGateUp, gu)
MOE_JIT_GEMM(8, kDown, dn)
MOE_JIT_GEMM(9, kGateUp, gu)
MOE_JIT_GEMM(9, kDown, dn)
MOE_JIT_GEMM(10, kGateUp, gu)
MOE_JIT_GEMM(10, kDown, dn)
MOE_JIT_GEMM(11, kGateUp, gu)
MOE_JIT_GEMM(11, kDown, dn)
MOE_JIT_GEMM(12, kGateUp, gu)
MOE_JIT_GEMM(12, kDown, dn)
MOE_JIT_GEMM(13, kGateUp, gu)
MOE_JIT_GEMM(13, kDown, dn)
MOE_JIT_GEMM(14, kGateUp, gu)
MOE_JIT_GEMM(14, kDown, dn)
#undef MOE_JIT_GEMM

#else
// nvcc build. The includer names the namespace (MOE_KERNEL_NAMESPACE) so that the sm_90a and the sm_100a
// translation units define distinct kernels: identical names would let the linker merge their host stubs.
#ifndef MOE_KERNEL_NAMESPACE
#error "define MOE_KERNEL_NAMESPACE before including moe_gemm_kernels.cuh"
#endif
namespace MOE_KERNEL_NAMESPACE {
using namespace moe_kernels;

__global__ void __launch_bounds__(kPrepThreads) moe_prep_kernel(PrepParams p) {
  prep_body(p, reinterpret_cast<char*>(moe_dyn_smem));
}
// __grid_constant__: the warp-specialized configurations hand the TMA unit the address of p.wmap.
template <class Cfg, int MODE>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MINB) moe_gemm_kernel(const __grid_constant__ GemmParams p) {
  gemm_entry<Cfg, MODE, 0, 0>(p, reinterpret_cast<char*>(moe_dyn_smem));
}
__global__ void __launch_bounds__(kCombineThreads) moe_combine_kernel(CombineParams p) { combine_body(p); }
template <int S>
__global__ void __launch_bounds__(kDownGemvThreads) moe_down_gemv_kernel(const __grid_constant__ GemmParams p) {
  down_gemv_body<0, 0, S>(p, reinterpret_cast<char*>(moe_dyn_smem));
}

inline KernelTable kernel_table() {
  KernelTable t{};
  t.prep = reinterpret_cast<const void*>(&moe_prep_kernel);
  t.combine = reinterpret_cast<const void*>(&moe_combine_kernel);
  static_assert(kNumDownGemvVariants == 4, "one kernel per ring depth");
  t.down_gemv[0] = reinterpret_cast<const void*>(&moe_down_gemv_kernel<kDownGemvStageVariants[0]>);
  t.down_gemv[1] = reinterpret_cast<const void*>(&moe_down_gemv_kernel<kDownGemvStageVariants[1]>);
  t.down_gemv[2] = reinterpret_cast<const void*>(&moe_down_gemv_kernel<kDownGemvStageVariants[2]>);
  t.down_gemv[3] = reinterpret_cast<const void*>(&moe_down_gemv_kernel<kDownGemvStageVariants[3]>);
  t.gemm[0][kGateUp] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg0, kGateUp>);
  t.gemm[0][kDown] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg0, kDown>);
  t.gemm[1][kGateUp] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg1, kGateUp>);
  t.gemm[1][kDown] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg1, kDown>);
  t.gemm[2][kGateUp] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg2, kGateUp>);
  t.gemm[2][kDown] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg2, kDown>);
  t.gemm[3][kGateUp] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg3, kGateUp>);
  t.gemm[3][kDown] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg3, kDown>);
  t.gemm[4][kGateUp] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg4, kGateUp>);
  t.gemm[4][kDown] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg4, kDown>);
  t.gemm[5][kGateUp] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg5, kGateUp>);
  t.gemm[5][kDown] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg5, kDown>);
  t.gemm[6][kGateUp] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg6, kGateUp>);
  t.gemm[6][kDown] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg6, kDown>);
  t.gemm[7][kGateUp] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg7, kGateUp>);
  t.gemm[7][kDown] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg7, kDown>);
  t.gemm[8][kGateUp] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg8, kGateUp>);
  t.gemm[8][kDown] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg8, kDown>);
  t.gemm[9][kGateUp] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg9, kGateUp>);
  t.gemm[9][kDown] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg9, kDown>);
  t.gemm[10][kGateUp] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg10, kGateUp>);
  t.gemm[10][kDown] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg10, kDown>);
  t.gemm[11][kGateUp] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg11, kGateUp>);
  t.gemm[11][kDown] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg11, kDown>);
  t.gemm[12][kGateUp] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg12, kGateUp>);
  t.gemm[12][kDown] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg12, kDown>);
  t.gemm[13][kGateUp] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg13, kGateUp>);
  t.gemm[13][kDown] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg13, kDown>);
  t.gemm[14][kGateUp] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg14, kGateUp>);
  t.gemm[14][kDown] = reinterpret_cast<const void*>(&moe_gemm_kernel<GemmCfg14, kDown>);
#ifdef MOE_TABLE_WGMMA
  t.wgmma = MOE_TABLE_WGMMA;
#endif
  t.pdl = true;  // both ahead-of-time builds target sm_90a / sm_100a
  return t;
}

}  // namespace MOE_KERNEL_NAMESPACE
#endif  // MOE_JIT
#endif  // MOE_KERNEL_BODIES_ONLY

// Warp-specialized, persistent GEMM of the fused MoE path (sm_90a wgmma builds only; included by
// moe_gemm_kernels.cuh): configurations 8-12 (moe_kernel_params.h); 12 copies its weight tiles with cp.async.
//
// Why: ncu at 8,192 tokens had the wgmma tiles of configuration 6 at ~60% of L2 and ~60% of SM throughput with 7
// cycles per issued instruction: every k slice waits on cp.async groups and two block-wide barriers. Here the
// copies and the MMAs never wait on a block barrier:
//   NP producer warpgroups fill a STAGES-deep ring: one thread loads the weight tile by TMA (one arrival on the
//     stage's `full` mbarrier that expects its bytes), and every producer thread copies its part of the gathered
//     token rows with cp.async and hands them to the same barrier (cp.async.mbarrier.arrive.noinc: the barrier
//     counts 128 NP + 1 arrivals, each firing when that thread's copies have landed);
//   two consumer warpgroups (BM / 2 weight rows x BN tokens each) wait on `full`, fence the async proxy (the token
//     copies are generic-proxy writes, wgmma reads through the async proxy), run the slice's wgmma, keep one
//     slice's MMAs in flight, and release the stage before it through its `empty` mbarrier (one arrival a
//     consumer warpgroup);
//   the CTA is persistent: it walks units u = blockIdx.x, blockIdx.x + gridDim.x, ... of the grid_x x num_slots
//     grid the ordinary kernel would launch, so the producers already fill the ring for the next unit while the
//     consumers store this unit in BM / 64 parts through a separate f32 tile (`cs`), synchronized among the
//     consumers by named barrier 1 only (the 256 x 128 tile stages it as bf16 by stmatrix instead: epilogue_stm).
// What the H200 taught (session 9): with publishing by cp.async.wait_group + arrive (a producer thread waiting on
// its own copies) and one producer warpgroup issuing every copy, 8,192 tokens took 2,726 us against 1,599 for
// configuration 6 - the producer's issue rate was the limit (long-scoreboard stalls, tensor pipe 37% busy); a
// second producer warpgroup took 128-token tiles from 366 to 304 us, TMA for the weights brought 128 x 128 tiles to
// parity with configuration 6, and 256 x 128 tiles beat it by 11%.
// Ping-pong consumers (each MMA warpgroup a whole 128 x 128 unit, the two alternating so that one's epilogue runs
// during the other's main loop; order mbarriers between the main loops) were measured against configuration 10 in
// session 32 (1564477 / 380d5f0, reverted): correct, but the layer at 8,192 tokens 1,428-1,517 us against 1,183 -
// ncu: gate/up 1,020 us at 62% tensor-pipe activity against 808 at 79%, down 581 at 54% against 498 at 64%; a single
// warpgroup's 128 x 128 stream, fed by twice the token gathers a flop, keeps the pipe less busy than the epilogue
// it hides costs.
// Also measured and not kept (session 38, docs/PERF.md): configuration 14 on 2-CTA clusters with each weight slice's
// halves multicast by TMA into both CTAs (branch next/moe-cluster-multicast: the layer +2%, the served prompt step's
// experts +6% - the pair padding and the paired rings' lockstep cancel the bytes saved; a cluster-scope release on
// the per-slice remote arrivals made it +44%), and a tile's empty warpgroup skipping its MMAs (even: a unit's time
// is its loads). Session 39: a 192 x 192 tile with three m64n192 MMA warpgroups and a 3-deep ring (branch
// next/moe-prefill-192: the layer at 8,192 tokens +25%, the prompt step's experts +40%); the weights stored tiled
// ([R/64][K/64][64][64], 4-D TMA boxes; branch next/moe-tiled-weights: correct, the decode steps even though the
// layout reads 3% faster alone); mbarrier waits with a suspend-time hint (the same instruction count); each CTA's
// next tile loaded one unit ahead (decode steps +0.8%).
// Same tile layout and swizzle as gemm_body (swap AB: weight rows = M, tokens = N; BK = 64, 128-byte rows): the
// TMA's 128-byte swizzle is the pattern of swz() on 1024-byte aligned stages.
#pragma once

namespace moe_kernels {

namespace ws {  // the rest of the ring's PTX (mbar_init / _arrive / _wait, setmaxnreg): moe_ptx.cuh
using moe_ptx::mbar_arrive_expect_tx;
using moe_ptx::tma_load_2d;
// Barrier among the two consumer warpgroups only (the 256 threads after the producers).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
// Barrier among one consumer warpgroup's 128 threads (named barrier 2 + the warpgroup).
__device__ __forceinline__ void warpgroup_sync(unsigned id) { asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ U4 lds128(unsigned smem_byte_addr) {
  U4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem_byte_addr)
               : "memory");
  return v;
}
}  // namespace ws

#if MOE_HAVE_WGMMA
namespace ws {
// One slice of an MMA warpgroup's main loop over the ring: waits for stage slice % STAGES to land, makes the
// producers' cp.async writes (generic proxy) visible to this thread's wgmma reads (async proxy), lets `issue(stage)`
// compute its addresses, fence and issue the slice's MMAs, commits them, keeps them in flight and releases the stage
// of the slice before (kt > 0: one arrival a warpgroup on its `empty` barrier).
template <int STAGES, class Issue>
__device__ __forceinline__ void consume_slice(unsigned full0, unsigned empty0, int slice, int kt, int ctid,
                                              Issue&& issue) {
  using namespace moe_ptx;
  const int stage = slice % STAGES;
  mbar_wait(full0 + stage * 8, (slice / STAGES) & 1);
  fence_proxy_async_smem();
  issue(stage);
  wgmma_commit();
  wgmma_wait<1>();  // the slice before this one is read: release its stage
  if (kt > 0 && (ctid & 127) == 0) mbar_arrive(empty0 + ((slice - 1) % STAGES) * 8);
}
// After a unit's last slice (slices: the count consumed so far): its MMAs complete and its stage is released.
template <int STAGES>
__device__ __forceinline__ void finish_unit(unsigned empty0, int slices, int ctid) {
  moe_ptx::wgmma_wait<0>();
  if ((ctid & 127) == 0) moe_ptx::mbar_arrive(empty0 + ((slices - 1) % STAGES) * 8);
}
}  // namespace ws

// The epilogue of the 256 x 128 tile (GemmConfig::STM_EPI), the accumulators of MMA warpgroup cw (d[j]: m64 block j
// of its 128 weight rows x 128 tokens) staged as bf16 by stmatrix.trans into token-major boxes of 64 columns x 128-byte
// rows (the ring's swizzle, swz<64>: conflict-free for the stmatrix rows and the 16-byte reads), then stored by
// the consumers' 16-byte stores. Why: the f32 tile of the other epilogue took 128 shared stores a thread and a store
// loop of ~900 instructions a down unit (ncu, session 32: the epilogue instruction-bound, global stores 2% of its
// samples). H200, session 33 (same call, two rounds): the MoE layer at 8,192 tokens 1,162.6 us against 1,203.7,
// the 16 x 512 prefill step's experts 10,046 against 10,436; TMA tensor stores of the staged boxes for full tiles were
// no faster (layer 1,168.7 against 1,167.2, one round) and were removed.
//  kGateUp: MMA warpgroup cw's m64 blocks are the gate rows and the up rows of act columns 64 cw .. 64 cw + 63 (the
//    consumers' A addresses), so d[0] and d[1] are the gate and up values of the same (act column, token):
//    act = silu(gate) * up in registers, one staged tile [128 tokens][128 columns] (two boxes); 2 consumer barriers a
//    unit against the f32 tile's 8.
//  kDown: y = routing weight * d in registers (row_wt: the tile's weights, written before the first barrier), staged
//    in two halves [64 tokens][256 rows] (four boxes each); 4 barriers a unit.
// Barrier discipline: the staged tile and row_wt are rewritten only after a consumer barrier that follows every
// thread's reads of them.
// Byte offset of 16-byte chunk c (0-7) of row r in a box of 128-byte rows: the ring's swizzle (swz) in bytes.
__device__ __forceinline__ unsigned swz_bytes(int r, int c) { return unsigned(r * 128 + ((c ^ (r & 7)) << 4)); }
template <int BM, int BN, int MODE>
__device__ __forceinline__ void epilogue_stm(const GemmParams& p, const float (&d)[2][BN / 2], unsigned st,
                                             float* row_wt, float my_wt, const Tile& tile, int bx, int H, int I,
                                             int cw, int ctid) {
  using namespace moe_ptx;
  const int lane = ctid & 31, w4 = (ctid >> 5) & 3, tig = lane & 3;
  // stmatrix x4 of token pair-block m (tokens 16m .. 16m + 15): matrix q = lane / 8 holds tokens 16m + 8 (q / 2) + r
  // (r = lane % 8, this lane's memory row) x the 8 weight rows 16 w4 + 8 (q % 2) of the warp's 16 rows of block j.
  const int q = lane >> 3, r8 = lane & 7;
  const unsigned lane_off = swz_bytes(8 * (q >> 1) + r8, 2 * w4 + (q & 1));  // + m 2,048 (16 rows of 128 bytes)
  if constexpr (MODE == kGateUp) {
    constexpr int BOX = BN * 128;  // bytes of one 64-column box of BN token rows
    ws::consumers_sync();  // the previous unit's staged tile has been read
    const unsigned base = st + unsigned(cw * BOX) + lane_off;  // box cw: act columns 64 cw .. 64 cw + 63
#pragma unroll
    for (int m = 0; m < BN / 16; ++m) {
      unsigned r[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int x = 4 * (2 * m + (k >> 1)) + 2 * (k & 1);  // jn = 2m + k / 2; rows + 8 for odd k
        r[k] = pack_bf16x2(silu(d[0][x]) * d[1][x], silu(d[0][x + 1]) * d[1][x + 1]);
      }
      stsm_x4_trans(base + unsigned(m * 2048), r[0], r[1], r[2], r[3]);
    }
    ws::consumers_sync();
    // Thread ctid stores 16-byte chunk c of tokens n0 + 16 k: 16 chunks a token row of 128 columns.
    const int c = ctid & 15, n0 = ctid >> 4;
    const int i = bx * (BM / 2) + c * 8;
    if (i >= I) return;
    const unsigned src = st + unsigned((c >> 3) * BOX) + swz_bytes(n0, c & 7);  // + k 2,048 (16 rows)
    unsigned short* dst = p.dst + (long long)(tile.row0 + n0) * I + i;
#pragma unroll
    for (int k = 0; k < BN / 16; ++k)
      if (n0 + 16 * k < tile.rows)
        *reinterpret_cast<U4*>(dst + (long long)16 * k * I) = ws::lds128(src + unsigned(k * 2048));
  } else {
    constexpr int HT = BN / 2;        // tokens a half
    constexpr int BOX = HT * 128;     // bytes of one 64-row box of HT token rows
    if (ctid < BN) row_wt[ctid] = my_wt;
    ws::consumers_sync();  // the previous unit's staged half has been read; row_wt written
    const unsigned base = st + unsigned(cw * 2 * BOX) + lane_off;  // boxes 2 cw + j: rows 128 cw + 64 j ..
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      if (hf == 1) {
        if (tile.rows <= HT) break;  // uniform over the consumers
        ws::consumers_sync();  // half 0 has been read
      }
#pragma unroll
      for (int m = 0; m < HT / 16; ++m) {
        const int jn0 = 8 * hf + 2 * m;  // n8 blocks jn0 and jn0 + 1 of the accumulators
        const F2 w0 = *reinterpret_cast<const F2*>(row_wt + 8 * jn0 + 2 * tig);
        const F2 w1 = *reinterpret_cast<const F2*>(row_wt + 8 * jn0 + 8 + 2 * tig);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int x = 4 * jn0;
          stsm_x4_trans(base + unsigned(j * BOX + m * 2048), pack_bf16x2(d[j][x] * w0.x, d[j][x + 1] * w0.y),
                        pack_bf16x2(d[j][x + 2] * w0.x, d[j][x + 3] * w0.y),
                        pack_bf16x2(d[j][x + 4] * w1.x, d[j][x + 5] * w1.y),
                        pack_bf16x2(d[j][x + 6] * w1.x, d[j][x + 7] * w1.y));
        }
      }
      ws::consumers_sync();
      // Thread ctid stores 16-byte chunk c of tokens n0 + 8 k of the half: 32 chunks a token row of 256 rows.
      const int c = ctid & 31, n0 = ctid >> 5;
      const int h = bx * BM + c * 8;
      if (h < H) {
        const unsigned src = st + unsigned((c >> 3) * BOX) + swz_bytes(n0, c & 7);  // + k 1,024 (8 rows)
        unsigned short* dst = p.dst + (long long)(tile.row0 + hf * HT + n0) * H + h;
#pragma unroll
        for (int k = 0; k < HT / 8; ++k)
          if (hf * HT + n0 + 8 * k < tile.rows)
            *reinterpret_cast<U4*>(dst + (long long)8 * k * H) = ws::lds128(src + unsigned(k * 1024));
      }
    }
  }
}

// The epilogue of configuration 14 (GemmConfig::TOKENS_AS_M): MMA warpgroup cw's accumulator d holds its 64 tokens
// (rows 16 (warp % 4) + lane / 4, + 8) x the tile's 256 weight rows (columns 8 j + 2 (lane % 4), + 1 in d[4 j ..]):
//  kGateUp: columns j < 16 are the gate rows, j + 16 the up rows of the same 128 act columns: act = silu(gate) x up
//    in registers, staged [64 tokens][128 columns] as bf16 by stmatrix (no transpose: the rows are tokens already);
//  kDown: y = the token's routing weight (wt0 / wt1 for its two rows) x d, staged in two passes of 128 columns.
// The staging tile (16 KB a warpgroup, 256-byte rows, 16-byte chunk c of row r at c ^ (r % 8): conflict-free for the
// stmatrix rows and the 16-byte reads) is the warpgroup's own, so only its 128 threads meet at barriers.
__device__ __forceinline__ unsigned swz_row256(int r, int c) { return unsigned(r * 256 + ((c ^ (r & 7)) << 4)); }
template <int MODE>
__device__ __forceinline__ void epilogue_tokens_as_m(const GemmParams& p, const float (&d)[128], unsigned st,
                                                     unsigned bar_id, const Tile& tile, int bx, int H, int I, int cw,
                                                     int ctid, float wt0, float wt1) {
  using namespace moe_ptx;
  const int wtid = ctid & 127, lane = ctid & 31, w4 = wtid >> 5, q = lane >> 3;
  // stmatrix x4 of column blocks 2m and 2m + 1 x the warp's 16 token rows: matrix q holds rows 8 (q % 2) + lane % 8
  // of block 2m + q / 2; this lane gives the address of that row.
  const int srow = 16 * w4 + 8 * (q & 1) + (lane & 7);
  constexpr int PASSES = MODE == kGateUp ? 1 : 2;
  const int ncol = MODE == kGateUp ? I : H;
#pragma unroll
  for (int h = 0; h < PASSES; ++h) {
    ws::warpgroup_sync(bar_id);  // the previous pass's (or unit's) staged rows have been read
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      unsigned r[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int x = 4 * (16 * h + 2 * m + (k >> 1)) + 2 * (k & 1);  // block 16h + 2m + k / 2, row + 8 for odd k
        if constexpr (MODE == kGateUp) {
          r[k] = pack_bf16x2(silu(d[x]) * d[x + 64], silu(d[x + 1]) * d[x + 65]);
        } else {
          const float wt = (k & 1) ? wt1 : wt0;
          r[k] = pack_bf16x2(d[x] * wt, d[x + 1] * wt);
        }
      }
      stsm_x4(st + swz_row256(srow, 2 * m + (q >> 1)), r[0], r[1], r[2], r[3]);
    }
    ws::warpgroup_sync(bar_id);
    // Thread wtid stores 16-byte chunk c of staged rows n0 + 8 k: 16 chunks (128 columns) a row.
    const int c = wtid & 15, n0 = wtid >> 4;
    const int col = MODE == kGateUp ? bx * 128 + 8 * c : bx * 256 + 128 * h + 8 * c;
    if (col < ncol) {
      unsigned short* dst = p.dst + (long long)(tile.row0 + cw * 64 + n0) * ncol + col;
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (cw * 64 + n0 + 8 * k < tile.rows)
          *reinterpret_cast<U4*>(dst + (long long)8 * k * ncol) = ws::lds128(st + swz_row256(n0 + 8 * k, c));
    }
  }
}
#endif

// Inline routing (GemmParams::inline_ids): the prep's tile table and permutation (prep_body's layout) built in this
// CTA's shared memory at rt (InlineRouteLayout) by all NT threads (block barriers inside). Token t's pair with
// expert e sets bit t of e's mask; the pair's rank within e is the number of bits below it, so the rows are in token
// order in every CTA (the prep's atomics gave a run-dependent order). pair_pos non-null: the pairs' sorted positions
// (-1 for a dropped pair) also go there.
template <int BN, int NT>
__device__ __forceinline__ void inline_route(const GemmParams& p, char* rt, int* pair_pos) {
  const int tid = threadIdx.x, E = p.num_experts, T = p.num_tokens, K = p.top_k, P = T * K, W = (T + 31) / 32;
  const InlineRouteLayout L = inline_route_layout(E, T, K, p.num_slots);
  unsigned* mask = reinterpret_cast<unsigned*>(rt + L.mask);
  int* off = reinterpret_cast<int*>(rt + L.off);
  int* toff = reinterpret_cast<int*>(rt + L.toff);
  Tile* tiles = reinterpret_cast<Tile*>(rt + L.tiles);
  int* perm = reinterpret_cast<int*>(rt + L.perm);
  const bool fixed = p.static_slots != 0;
  // The thread's pairs tid + r NT, their loads issued together (L2: the router wrote them; not through L1).
  int ids[kInlineRoutePerThread];
#pragma unroll
  for (int r = 0; r < kInlineRoutePerThread; ++r) {
    const int i = tid + r * NT;
    ids[r] = i < P ? __ldcg(p.inline_ids + i) : -1;
  }
  for (int i = tid; i < E * W; i += NT) mask[i] = 0u;
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kInlineRoutePerThread; ++r) {
    const int i = tid + r * NT, e = ids[r];
    if (i < P && e >= 0 && e < E) atomicOr(&mask[e * W + (i / K) / 32], 1u << ((i / K) & 31));
  }
  __syncthreads();
  if (tid < 32) {
    scan_expert_rows(
        [&](int e) {
          int c = 0;
          for (int w = 0; w < W; ++w) c += __popc(mask[e * W + w]);
          return c;
        },
        E, BN, fixed, off, toff, tid);
  }
  __syncthreads();
  write_tile_table([&](int e) { return off[e + 1] - off[e]; }, tiles, p.num_slots, off, toff, E, BN, fixed, tid, NT);
#pragma unroll
  for (int r = 0; r < kInlineRoutePerThread; ++r) {
    const int i = tid + r * NT, e = ids[r];
    if (i >= P) continue;
    int pos = -1;
    if (e >= 0 && e < E) {
      const int t = i / K, w = t / 32;
      int rank = __popc(mask[e * W + w] & ((1u << (t & 31)) - 1u));
      for (int v = 0; v < w; ++v) rank += __popc(mask[e * W + v]);
      pos = off[e] + rank;
      perm[pos] = i;
    }
    if (pair_pos != nullptr) pair_pos[i] = pos;
  }
  __syncthreads();
}

template <class Cfg, int MODE, int FIXED_H, int FIXED_I>
__device__ __forceinline__ void gemm_body_ws(const GemmParams& p, char* smem) {
#if MOE_HAVE_WGMMA
  using namespace moe_ptx;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES;
  constexpr int NP = Cfg::THREADS / 128 - 2;  // producer warpgroups
  static_assert(((BM == 128 && (BN == 128 || BN == 64 || BN == 32)) || (BM == 256 && BN == 128)) && BK == 64 &&
                    NP >= 1,
                "ws tiles: 128 weight rows x 32, 64 or 128 tokens, or 256 x 128");
  constexpr int MW = BM / 128;      // m64 blocks of each consumer warpgroup (BM / 2 weight rows)
  constexpr int PARTS = BM / 64;    // the epilogue stores the tile in PARTS parts of TP tokens
  constexpr int TP = BN / PARTS;
  static_assert(STAGES >= 3, "at least 3 stages");
  constexpr int CPR = BK / 8;                // 16-byte chunks per smem row
  constexpr int RPP = 128 * NP / CPR;        // rows one pass of the producer threads covers
  constexpr int B_ITERS = BN / RPP;
  constexpr int LDC = BM + 4;
  constexpr bool kStm = Cfg::STM_EPI;  // the bf16 stmatrix epilogue (BM 256, MW 2; epilogue_stm below)
  static_assert(!kStm || (BM == 256 && BN == 128 && !Cfg::WEIGHTS_CP_ASYNC),
                "the stmatrix epilogue: 256 x 128 tiles with TMA weight boxes");
  smem = align_smem(smem, 1024);
  unsigned short* As = reinterpret_cast<unsigned short*>(smem);  // [STAGES][BM][BK]
  unsigned short* Bs = As + STAGES * BM * BK;                    // [STAGES][BN][BK]
  float* cs = reinterpret_cast<float*>(Bs + STAGES * BN * BK);   // [TP][LDC] the epilogue tile
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(cs + TP * LDC);  // full[STAGES], empty[STAGES]
  float* row_wt = reinterpret_cast<float*>(bars + 2 * STAGES);  // [BN] the down tile's routing weights
  const unsigned full0 = smem_addr(bars), empty0 = full0 + STAGES * 8;
  // Weight tiles by the producers' cp.async (Cfg::WEIGHTS_CP_ASYNC): A_ITERS 16-byte chunks a producer thread a
  // slice, rows tid / CPR + k RPP as for the token rows.
  constexpr bool kCpW = Cfg::WEIGHTS_CP_ASYNC;
  static_assert(!kCpW || BM % RPP == 0, "cp.async weight tiles: whole passes of the producer threads");
  constexpr int A_ITERS = kCpW ? BM / RPP : 1;
  // kCpW: the weights with the L2 evict_first priority where the host asks for it (GemmParams::weight_evict_first),
  // as the decode tiles' cp.async weights.
  const bool hint = kCpW && p.weight_evict_first != 0;
  const unsigned long long wpol = hint ? l2_evict_first_policy() : 0ull;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full0 + s * 8, 128 * NP + (kCpW ? 0 : 1));  // + the TMA issuer's expect_tx arrival
      mbar_init(empty0 + s * 8, 2);
    }
  }
  __syncthreads();

  const int H = FIXED_H > 0 ? FIXED_H : p.hidden;
  const int I = FIXED_I > 0 ? FIXED_I : p.inter;
  const int K = MODE == kGateUp ? H : I;
  const int KT = (K + BK - 1) / BK;
  const int gx = MODE == kGateUp ? (I + BM / 2 - 1) / (BM / 2) : (H + BM - 1) / BM;
  const int units = gx * p.num_slots;
  // The tile table and the permutation: the prep's in global memory, or (inline routing, configuration 12 only) this
  // CTA's own in shared memory after the configuration's layout (GemmParams::inline_ids).
  constexpr bool kInline = kCpW && BN == 32;
  const bool inl = kInline && p.inline_ids != nullptr;
  char* const rt = reinterpret_cast<char*>(row_wt + BN);
  const Tile* tiles = p.tiles;
  const int* perm = p.perm_pair;
  if (inl) {
    const InlineRouteLayout L = inline_route_layout(p.num_experts, p.num_tokens, p.top_k, p.num_slots);
    tiles = reinterpret_cast<const Tile*>(rt + L.tiles);
    perm = reinterpret_cast<const int*>(rt + L.perm);
  }
  // The weight tile of global slice `slice` (stage slice % STAGES) of unit (tile, bx): one arrival that expects its
  // bytes, then the TMA loads. Weight rows of a unit in the [experts x rows, K] view of the TMA descriptor: gate/up
  // loads the gate rows i and the up rows I + i of i in [bx BM/2, bx BM/2 + BM/2) as two boxes, down BM rows as one
  // (rows past the expert's end belong to the next expert or the zero fill, and the epilogue drops them).
  auto issue_weights = [&](int slice, const Tile& tile, int bx, int kt) {
    const int stage = slice % STAGES;
    const unsigned as = smem_addr(As + stage * BM * BK);
    const int wrow = MODE == kGateUp ? tile.expert * 2 * I + bx * (BM / 2) : tile.expert * H + bx * BM;
    ws::mbar_arrive_expect_tx(full0 + stage * 8, BM * BK * 2);
    ws::tma_load_2d(as, &p.wmap, kt * BK, wrow, full0 + stage * 8);
    if (MODE == kGateUp) ws::tma_load_2d(as + BM / 2 * BK * 2, &p.wmap, kt * BK, wrow + I, full0 + stage * 8);
  };
  // Row r of unit (expert, bx)'s weight tile in the [experts x rows, K] weights (gate/up: the gate rows i, then the
  // up rows I + i, of i in [bx BM/2, bx BM/2 + BM/2); down: BM rows); ok: the row is one of the expert's.
  auto weight_row = [&](int expert, int bx, int r, bool& ok) -> long long {
    int rr;  // the row within the expert's [2 I] (gate/up) or [H] (down) rows
    if (MODE == kGateUp) {
      const int i = bx * (BM / 2) + (r % (BM / 2));
      ok = i < I;
      rr = r < BM / 2 ? i : I + i;
    } else {
      rr = bx * BM + r;
      ok = rr < H;
    }
    return (long long)expert * (MODE == kGateUp ? 2 * I : H) + rr;
  };
  // kCpW: producer thread tid's chunks of the weight tile of global slice `slice` (its part of the stage's
  // `full` arrival is the thread's cp_async_arrive_noinc after its token rows). Rows past the expert's rows are
  // zero-filled.
  const int wch = tid % CPR;
  auto copy_weights = [&](int slice, const Tile& tile, int bx, int kt) {
    unsigned short* as = As + (slice % STAGES) * BM * BK;
    const int k0 = kt * BK;
    const bool k_ok = k0 + wch * 8 < K;
#pragma unroll
    for (int it = 0; it < A_ITERS; ++it) {
      const int r = tid / CPR + it * RPP;
      bool ok;
      const long long grow = weight_row(tile.expert, bx, r, ok);
      ok = ok && k_ok;
      cp_async16_hint(as + swz<BK>(r, wch), ok ? p.weights + grow * K + k0 + wch * 8 : p.weights, ok, hint, wpol);
    }
  };
  // The down GEMM's CTAs become resident while the gate/up GEMM's last units still run (the persistent grid's
  // tail): the first pass over the ring (STAGES weight slices, the stages are free) is issued before the wait. The
  // weights are constants and the tiles come from the prep, which completed before the gate/up GEMM passed its
  // wait, before this grid could start (moe_gemm_kernels.cuh, the same argument); act is read only after the wait.
  int prefetched = 0;  // global slices whose weight tile was issued before the wait (thread 0's TMA, or kCpW every
                       // producer thread's copies)
  // The gate/up GEMM over static slots (GemmParams::static_slots, kCpW): the i-th unit of this CTA's walk, u, is
  // expert u / gx's while that is below E, so the walk's first PW (<= STAGES) weight slices go out before the wait (the
  // experts' first rows and the prep's table are not needed for them). pre_slices(u): how many of unit u's
  // slices that covered (the walk's units in order, stopping at the first overflow slot). H200, q30b8l, session 27
  // (same call, three rounds): the bs 64 step 2,893.8-2,898.3 us overlapped against 2,905.3-2,907.4 without; the
  // trace has the MoE GEMMs' chain -27 us a step and the prep's +18 (its loads queue behind the slices). Going further
  // ahead (each row's next 4-16 slices of the first unit as L2 bulk prefetches) was +6 to +22 us; 2 slices instead of
  // the ring's 4, -5 us more (session 28, the default).
  const bool gu_prewait = MODE == kGateUp && kCpW && p.static_slots > 0;
  const int PW = gu_prewait ? (p.static_slots < STAGES ? p.static_slots : STAGES) : 0;  // slices issued before
  auto pre_slices = [&](int u) {
    if (!gu_prewait || u / gx >= p.num_experts) return 0;
    const int before = (u - int(blockIdx.x)) / int(gridDim.x) * KT;  // slices of the walk's earlier units
    return before >= PW ? 0 : (PW - before < KT ? PW - before : KT);
  };
  if (gu_prewait && warp < 4 * NP) {
    for (int u = blockIdx.x; u < units && prefetched < PW && u / gx < p.num_experts; u += gridDim.x) {
      Tile tile;
      tile.expert = u / gx, tile.row0 = 0, tile.rows = 0, tile.pad = 0;
      for (int kt = 0; kt < KT && prefetched < PW; ++kt, ++prefetched) copy_weights(prefetched, tile, u % gx, kt);
    }
  }
  if constexpr (MODE == kDown && kInline) {
    if (inl) inline_route<BN, Cfg::THREADS>(p, rt, nullptr);  // before the wait: the ids were complete before
  }                                                           // the gate/up GEMM passed its own
  if (MODE == kDown && (kCpW ? warp < 4 * NP : tid == 0)) {
    for (int u = blockIdx.x; u < units && prefetched < STAGES; u += gridDim.x) {
      const Tile tile = tiles[u / gx];
      if (tile.rows <= 0) continue;
      for (int kt = 0; kt < KT && prefetched < STAGES; ++kt, ++prefetched) {
        if constexpr (kCpW)
          copy_weights(prefetched, tile, u % gx, kt);
        else
          issue_weights(prefetched, tile, u % gx, kt);
      }
    }
  }
  // Every thread waits for the kernel before (x / act, the prep's tiles), then lets the next one be scheduled.
  grid_dep_wait();
  grid_dep_launch_dependents();
  if constexpr (MODE == kGateUp && kInline) {
    if (inl) inline_route<BN, Cfg::THREADS>(p, rt, blockIdx.x == 0 ? p.inline_pair_pos : nullptr);
  }

  // With two producer warpgroups (512 threads, 128 registers each at launch) the register file is rebalanced:
  // producers drop to 56, the MMA warpgroups rise to what is left (the 128-token tiles need ~146).
  constexpr int kConsumerRegs = NP == 2 && BN == 128 ? 200 : 0;
  if (warp < 4 * NP) {
    if constexpr (kConsumerRegs > 0) setmaxnreg_dec<56>();
    // ---- producer: thread tid copies chunk (tid % CPR) of rows tid / CPR + k RPP of every slice.
    const int ch = tid % CPR;
    int slice = 0;  // slices issued so far (over all units)
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      const int bx = u % gx;
      const Tile tile = tiles[u / gx];
      // A unit without rows runs only the slices issued for it before the wait (zero token rows, drained by the
      // consumers without MMAs).
      const int nk = tile.rows > 0 ? KT : pre_slices(u);
      if (nk == 0) continue;
      const unsigned short* b_src[B_ITERS];
      bool b_ok[B_ITERS];
#pragma unroll
      for (int it = 0; it < B_ITERS; ++it) {
        const int n = tid / CPR + it * RPP;
        const int pos = n < tile.rows ? tile.row0 + n : -1;
        const long long row = pos < 0 ? 0 : MODE == kGateUp ? perm[pos] / p.top_k : pos;
        b_ok[it] = pos >= 0;
        b_src[it] = p.src + row * K + ch * 8;  // row 0's for a row past the tile's: a valid address at every k0
      }
      // kCpW: the unit's weight sources, computed once a unit (copy_weights recomputes them a slice). A row past the
      // expert's rows keeps p.weights' first row as its source (a valid address at every k0, read with src-size 0),
      // so that a slice's copies are its k0 added, with no select.
      const unsigned short* w_src[A_ITERS];
      unsigned w_ok = 0;
      if constexpr (kCpW) {
#pragma unroll
        for (int it = 0; it < A_ITERS; ++it) {
          bool ok;
          const long long grow = weight_row(tile.expert, bx, tid / CPR + it * RPP, ok);
          w_src[it] = p.weights + (ok ? grow * K : 0) + wch * 8;
          w_ok |= unsigned(ok) << it;
        }
      }
      for (int kt = 0; kt < nk; ++kt, ++slice) {
        const int stage = slice % STAGES;
        // The consumers released this stage (the first pass over the ring waits on the phase before the first,
        // which counts as complete).
        mbar_wait(empty0 + stage * 8, ((slice / STAGES) & 1) ^ 1);
        const int k0 = kt * BK;
        const bool k_ok = k0 + ch * 8 < K;
        unsigned short* bs = Bs + stage * BN * BK;
        if constexpr (kCpW) {
          if (slice >= prefetched) {
            unsigned short* as = As + stage * BM * BK;
            // One uniform branch on the launch's L2 choice instead of both cp.async forms under predicates.
            if (hint) {
#pragma unroll
              for (int it = 0; it < A_ITERS; ++it)
                cp_async16_hint(as + swz<BK>(tid / CPR + it * RPP, wch), w_src[it] + k0, ((w_ok >> it) & 1u) && k_ok,
                                true, wpol);
            } else {
#pragma unroll
              for (int it = 0; it < A_ITERS; ++it)
                cp_async16(as + swz<BK>(tid / CPR + it * RPP, wch), w_src[it] + k0, ((w_ok >> it) & 1u) && k_ok);
            }
          }
        } else if (tid == 0 && slice >= prefetched) {
          issue_weights(slice, tile, bx, kt);
        }
#pragma unroll
        for (int it = 0; it < B_ITERS; ++it) {
          const int n = tid / CPR + it * RPP;
          cp_async16(bs + swz<BK>(n, ch), b_src[it] + k0, b_ok[it] && k_ok);
        }
        // The stage's `full` barrier completes when every producer thread's copies of it have landed (one
        // asynchronous arrival a thread, counted by the barrier's init count: .noinc).
        cp_async_arrive_noinc(full0 + stage * 8);
      }
    }
    cp_async_wait<0>();
    return;
  }

  if constexpr (kConsumerRegs > 0) setmaxnreg_inc<kConsumerRegs>();
  // ---- consumers: warpgroup cw (0 or 1) owns weight rows [64 cw, 64 cw + 64) of the tile.
  const int cw = (warp - 4 * NP) / 4, ctid = tid - 128 * NP;
  if constexpr (Cfg::TOKENS_AS_M) {
    // Configuration 14: warpgroup cw takes tokens [64 cw, 64 cw + 64) of the tile x all 256 weight rows, one
    // m64n256k16 a k step (A: its token rows of the stage, B: the weight tile), the ring protocol as below.
    static_assert(BM == 256 && BN == 128 && BK == 64 && !kCpW, "tokens as M: configuration 10's tile");
    const unsigned a_base = smem_addr(Bs) + unsigned(cw * 64 * BK * 2), b_base = smem_addr(As);
    const unsigned st = smem_addr(cs) + unsigned(cw * 64 * 256);  // its staging tile, 64 rows of 256 bytes
    const int tok0 = cw * 64 + 16 * ((ctid >> 5) & 3) + ((ctid & 31) >> 2);  // this thread's rows tok0, tok0 + 8
    int slice = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      const int bx = u % gx;
      const Tile tile = p.tiles[u / gx];
      if (tile.rows <= 0) continue;
      float d[128];
#pragma unroll
      for (int i = 0; i < 128; ++i) d[i] = 0.0f;
      // The down epilogue's routing weights of the thread's two rows: the pairs now, the weights after a slice.
      int pair0 = -1, pair1 = -1;
      float wt0 = 0.0f, wt1 = 0.0f;
      if (MODE == kDown) {
        if (tok0 < tile.rows) pair0 = p.perm_pair[tile.row0 + tok0];
        if (tok0 + 8 < tile.rows) pair1 = p.perm_pair[tile.row0 + tok0 + 8];
      }
      auto load_weights = [&] {
        if (pair0 >= 0) wt0 = p.topk_weights[pair0];
        if (pair1 >= 0) wt1 = p.topk_weights[pair1];
      };
      for (int kt = 0; kt < KT; ++kt, ++slice) {
        if (MODE == kDown && kt == 1) load_weights();
        ws::consume_slice<STAGES>(full0, empty0, slice, kt, ctid, [&](int stage) {
          const unsigned a_st = a_base + unsigned(stage * BN * BK * 2);
          const unsigned b_st = b_base + unsigned(stage * BM * BK * 2);
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < BK / 16; ++kk)
            wgmma_m64nk16_bf16(d, wgmma_desc_sw128(a_st + kk * 32), wgmma_desc_sw128(b_st + kk * 32));
        });
      }
      ws::finish_unit<STAGES>(empty0, slice, ctid);
      if (MODE == kDown && KT == 1) load_weights();
      epilogue_tokens_as_m<MODE>(p, d, st, 2u + unsigned(cw), tile, bx, H, I, cw, ctid, wt0, wt1);
    }
    return;
  }
  // MMA warpgroup cw's m64 block j: weight rows cw BM / 2 + 64 j of the tile; the 256-row gate/up tile (kStm)
  // instead takes the gate rows 64 cw (j = 0) and the up rows BM / 2 + 64 cw (j = 1) of the same 64 act columns, so
  // that its epilogue has both halves of each act value in registers.
  constexpr bool kGateUpPairs = kStm && MODE == kGateUp;
  const unsigned as_addr = smem_addr(As) + unsigned(cw * (kGateUpPairs ? 64 : BM / 2) * BK * 2),
                 bs_addr = smem_addr(Bs);
  constexpr int kBlockRows = kGateUpPairs ? BM / 2 : 64;  // weight rows from block j to block j + 1
  int slice = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const int bx = u % gx;
    const Tile tile = tiles[u / gx];
    if (tile.rows <= 0) {  // drain the slices issued for it before the wait (static slots), if any
      for (int kt = pre_slices(u); kt > 0; --kt, ++slice) {
        const int stage = slice % STAGES;
        mbar_wait(full0 + stage * 8, (slice / STAGES) & 1);
        if ((ctid & 127) == 0) mbar_arrive(empty0 + stage * 8);
      }
      continue;
    }
    float d[MW][BN / 2];
#pragma unroll
    for (int j = 0; j < MW; ++j)
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) d[j][i] = 0.0f;
    // The down epilogue scales token row n by topk_weights[perm_pair[row0 + n]]: two dependent global loads that,
    // issued inside the epilogue, stalled every part of every tile on their round trips (ncu, session 22: 46% of
    // the down GEMM's warp cycles on scoreboard waits). Consumer thread n < BN issues the first here and the second
    // after the first slice, and parks the weight in shared memory (row_wt) at the epilogue. The same holds for any
    // global round trip on the consumers' path between units: the combine done here by per-(token, column) counters
    // (fence, atomics, the token's pair positions) cost ~2 us a unit and the bs 64 step +104 us (session 29).
    int my_pair = -1;
    float my_wt = 0.0f;
    if (MODE == kDown && ctid < BN && ctid < tile.rows) my_pair = perm[tile.row0 + ctid];
    for (int kt = 0; kt < KT; ++kt, ++slice) {
      if (MODE == kDown && kt == 1 && my_pair >= 0) my_wt = p.topk_weights[my_pair];
      ws::consume_slice<STAGES>(full0, empty0, slice, kt, ctid, [&](int stage) {
        const unsigned a_st = as_addr + unsigned(stage * BM * BK * 2);
        const unsigned b_st = bs_addr + unsigned(stage * BN * BK * 2);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk)
#pragma unroll
          for (int j = 0; j < MW; ++j)
            wgmma_m64nk16_bf16(d[j], wgmma_desc_sw128(a_st + j * kBlockRows * BK * 2 + kk * 32),
                               wgmma_desc_sw128(b_st + kk * 32));
      });
    }
    ws::finish_unit<STAGES>(empty0, slice, ctid);
    if (MODE == kDown && KT == 1 && my_pair >= 0) my_wt = p.topk_weights[my_pair];

    if constexpr (kStm) {
      epilogue_stm<BM, BN, MODE>(p, d, smem_addr(cs), row_wt, my_wt, tile, bx, H, I, cw, ctid);
    } else {
      // The epilogue in PARTS parts of TP tokens through the part-size tile cs.
#pragma unroll
      for (int h = 0; h < PARTS; ++h) {
        // Every part stays compile-time (fully unrolled) so that d keeps to registers: a runtime jn range would
        // index d dynamically and move the wgmma accumulators to local memory.
        if (h > 0 && tile.rows <= h * TP) continue;  // uniform over the consumers
        ws::consumers_sync();  // the previous part (or unit) has finished reading cs (and row_wt)
        if (MODE == kDown && h == 0 && ctid < BN) row_wt[ctid] = my_wt;
        const int g = lane >> 2, tig = lane & 3;
#pragma unroll
        for (int j = 0; j < MW; ++j) {
          const int m = cw * (BM / 2) + j * 64 + (warp & 3) * 16 + g;
#pragma unroll
          for (int jn = 0; jn < BN / 8; ++jn) {
            if (jn / (TP / 8) != h) continue;
            const int n = jn * 8 + tig * 2 - h * TP;
            cs[n * LDC + m] = d[j][4 * jn];
            cs[(n + 1) * LDC + m] = d[j][4 * jn + 1];
            cs[n * LDC + m + 8] = d[j][4 * jn + 2];
            cs[(n + 1) * LDC + m + 8] = d[j][4 * jn + 3];
          }
        }
        ws::consumers_sync();
        Tile part = tile;
        part.row0 += h * TP;
        part.rows -= h * TP;
        store_tile<BM, TP, MODE>(p, cs, part, bx, H, I, false, ctid, 256,
                                 MODE == kDown ? row_wt + h * TP : nullptr);
      }
    }
  }
#else
  (void)p;
  (void)smem;  // never launched: the host picks this configuration only for tables with wgmma (KernelTable)
#endif
}

}  // namespace moe_kernels

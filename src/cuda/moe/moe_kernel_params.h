// Kernel parameter blocks and GEMM tile configurations of the fused MoE kernels. Read by three compilers:
// the host C++ compiler (launchers), nvcc (the ahead-of-time kernels) and NVRTC (the JIT backend gets this file
// as an in-memory header). So: no #include, only built-in types, nothing but plain structs and constants.
#pragma once

namespace moe_kernels {

// One unit of GEMM work: up to `rows` consecutive rows (token-expert pairs, in expert-sorted order) that all
// use expert `expert`. Written by the prep kernel; rows == 0 marks an unused grid slot (the block exits).
struct alignas(16) Tile {
  int expert, row0, rows, pad;
};

// Most experts the single-block prep kernel counts in shared memory.
constexpr int kMaxExperts = 1024;
constexpr int kPrepThreads = 512;
constexpr int kPrepSmemBytes = (3 * kMaxExperts + 2) * 4;
constexpr int kCombineThreads = 256;
// Direct (small-T) mode is used while T * top_k <= max(kDirectMaxPairs, top_k): every pair is its own one-row tile,
// so the prep kernel (a whole launch) is skipped. At T = 1 the pairs of a token have distinct experts, so this
// is exactly the work the prep's tiles would have described.
constexpr int kDirectMaxPairs = 8;

// Direct mode's down projection + combine as one GEMV launch (down_gemv_body): a CTA of kDownGemvWarps warps (one a
// pair, so at most that many pairs) takes kDownGemvRows hidden rows of every pair's expert, each warp streaming its
// rows through a kDownGemvStages-deep ring of 64-k slices. Shared memory: the pairs' y values, the rings and the
// pairs' act rows (I <= kDownGemvMaxI). kDownGemvStageVariants: the ring depths built (the first is the default);
// MOESERVE_MOE_DOWN_GEMV_STAGES picks another (for A/B). 8 stages put 8 of a warp's slices (q30b: 8 of 12) in flight
// before the programmatic wait: served q30b8l decode step, H200, session 18 (same call): bs 1 -8.7 us against 4
// stages (551.8 against 560.5 / 559.1 overlapped), 3 stages +12.5 (the shallower CTAs that fit beside the gate/up
// GEMM's do not pay: session 12's hypothesis refuted), bs 64 even (the down GEMV is the 1-token path).
constexpr int kDownGemvRows = 16, kDownGemvWarps = 8, kDownGemvThreads = kDownGemvWarps * 32, kDownGemvStages = 8;
constexpr int kDownGemvStageVariants[] = {kDownGemvStages, 2, 3, 4};
constexpr int kNumDownGemvVariants = 4;
constexpr int kDownGemvSlice = 64;  // k elements a ring stage
constexpr int kDownGemvMaxI = 4096;
#ifndef __CUDACC_RTC__  // host-side helper (NVRTC rejects unannotated functions)
constexpr int down_gemv_smem_bytes(int inter, int stages = kDownGemvStages) {
  return kDownGemvWarps * (kDownGemvRows * 4 + stages * kDownGemvRows * kDownGemvSlice * 2 + inter * 2);
}
// CTAs of the down GEMV an SM at a ring depth (sm_90 / sm_100: 228 KiB of shared memory an SM, 1 KiB of it reserved
// a CTA; at most 2,048 threads an SM).
constexpr int kSmemPerSm = 228 << 10, kSmemReservedPerCta = 1 << 10;
constexpr int down_gemv_ctas_per_sm(int inter, int stages) {
  const int by_smem = kSmemPerSm / (down_gemv_smem_bytes(inter, stages) + kSmemReservedPerCta);
  return by_smem < 2048 / kDownGemvThreads ? by_smem : 2048 / kDownGemvThreads;
}
// The ring-depth variant (an index into kDownGemvStageVariants) for hidden / kDownGemvRows CTAs on `sms` SMs:
// `forced` (>= 0: MOESERVE_MOE_DOWN_GEMV_STAGES) as it is; else the default depth where its grid stays one wave,
// else the 4-stage ring (2 CTAs an SM at inter 768: hidden 4,096's 256 CTAs still one wave on 132 SMs, where the
// 8-stage ring's one CTA an SM would make two; the default was measured at hidden 2,048 only).
constexpr int kDownGemvFallbackVariant = 3;  // 4 stages
constexpr int down_gemv_variant_for(int hidden, int inter, int sms, int forced) {
  if (forced >= 0) return forced;
  const int ctas = hidden / kDownGemvRows;
  return ctas <= sms * down_gemv_ctas_per_sm(inter, kDownGemvStageVariants[0]) ? 0 : kDownGemvFallbackVariant;
}
#endif

// Routing -> per-expert tiles and the pair permutation, on the device (no host sync). Up to kPrepChunk pairs one
// CTA does it all (kPrepWhole). More pairs take two launches of ceil(P / kPrepChunk) CTAs, one chunk of pairs
// each (one CTA alone took 114-153 us at 65,536 pairs on the H200):
//  kPrepCount: each CTA ranks its pairs within their experts, reserves each expert's block of ranks with one
//    global atomic (counts, zero between launches) and stores every pair's rank within its expert in pair_pos;
//    the last CTA to finish (done) scans the counts into offsets and the tile table and zeroes counts and done;
//  kPrepScatter: pair_pos = offsets[expert] + rank, and perm_pair its inverse.
enum PrepMode { kPrepWhole = 0, kPrepCount = 1, kPrepScatter = 2 };
constexpr int kPrepUnroll = 8;                           // pairs a thread has in flight
constexpr int kPrepChunk = kPrepThreads * kPrepUnroll;  // pairs a CTA of the two-launch prep takes
struct PrepParams {
  const int* topk_ids;  // [P] expert of each (token, slot) pair; ids outside [0, E) are dropped
  int num_pairs;        // P = T * top_k
  int num_experts;
  int tile_rows;        // tokens per tile: BN of the GEMM configuration chosen for this T
  int num_slots;        // entries of `tiles` to fill (the GEMM grid's y extent)
  Tile* tiles;          // [num_slots]
  int* perm_pair;       // [P] sorted position -> pair index (t * top_k + j)
  int* pair_pos;        // [P] pair index -> sorted position, -1 for dropped pairs
  int mode;             // PrepMode
  int* counts;          // kPrepCount: [E] ints, zero between launches
  int* offsets;         // kPrepCount / kPrepScatter: [E + 1] first sorted position of each expert
  int* done;            // kPrepCount: CTAs finished, zero between launches
  // Static slots when non-zero (GemmParams::static_slots): slot e < num_experts holds expert e's first tile (rows 0 when it has no
  // pairs); an expert's further tiles follow from slot num_experts on. Needs num_slots >= num_experts + P / tile_rows.
  int static_slots;
};

enum GemmMode { kGateUp = 0, kDown = 1 };

// Grouped GEMM in the "swap AB" form: weight rows are the MMA M dimension, tokens the N dimension.
//  kGateUp: act[pos, i] = bf16(silu(x[tok] . Wg[e, i]) * (x[tok] . Wu[e, i])), Wgu = [E, 2I, H]
//  kDown:   y[pos, h]   = bf16(topk_weight[pair] * (act[pos] . Wd[e, h])),      Wd  = [E, H, I]
// The bits of a CUtensorMap (cuda.h), which the JIT build cannot include.
struct alignas(64) TmaDesc {
  unsigned long long bits[16];
};

struct GemmParams {
  const unsigned short* weights;  // bf16 bits
  const unsigned short* src;      // kGateUp: x [T, H]; kDown: act [P, I]
  unsigned short* dst;            // kGateUp: act [P, I]; kDown: y [P, H]
  const Tile* tiles;
  const int* perm_pair;
  const float* topk_weights;  // [P]
  int hidden, inter, top_k;
  // Direct (small-T) mode when non-null: there is no prep kernel, tiles and perm_pair are unused, and grid slot y
  // is pair y itself: tile {expert = direct_ids[y], row0 = y, rows = 1} (rows = 0 for an id outside
  // [0, num_experts)), and sorted position == pair index (the identity permutation).
  const int* direct_ids;  // [P] topk_ids, or nullptr
  int num_experts;
  // kDown in direct mode, when non-null: the combine is fused. Counter (t, blockIdx.x) counts the finished CTAs
  // of token t's pairs for that block of hidden rows; the one that brings it to top_k sums the token's rows of y
  // in slot order into combine_out [T, H] (as the combine kernel would) and resets the counter to zero.
  int* combine_counters;          // [T, gridDim.x], zero between launches
  unsigned short* combine_out;    // bf16 bits
  // The warp-specialized persistent configuration (WGMMA == 3): the entries of `tiles` (the ordinary launch's grid
  // y extent); its CTAs walk the ordinary grid's blocks themselves.
  int num_slots;
  // The warp-specialized configurations: a TMA descriptor (CUtensorMap, encoded on the host) of `weights` as a 2D
  // bf16 tensor [experts x rows, K] with 128-byte swizzle and boxes of 64 x 64 (gate/up: the gate and the up half
  // of a tile, two loads) or 64 x 128 (down) elements. The kernel parameter is __grid_constant__ so that the TMA
  // unit reads the descriptor in place.
  TmaDesc wmap;
  // The down GEMV only, when non-null: residual[t, h] += float(combine_out[t, h]) and res_partials[t, blockIdx.x] =
  // the sum of squares of the CTA's updated residual rows (MoeBackend::run_residual).
  float* residual;                // [T, H] f32
  float* res_partials;            // [T, gridDim.x]
  // Decode-sized tiles (configurations 0, 7, 12 and 13) and the down GEMV: stream the weights with the L2
  // evict_first priority (moe_ptx::l2_evict_first_policy; cuda/device.h l2_evict_first_weights). (The TMA boxes of
  // configuration 11 with the same hint: bs 64 step -10 us against 12's -26 on the same H200, session 25; removed.)
  int weight_evict_first;
  // The tile table in static slots (PrepParams::static_slots): unit u's expert is its slot u / grid_x while that is
  // below num_experts, known before the prep has run, so the warp-specialized gate/up GEMM with cp.async weights
  // (configurations 12, 13) issues its first weight slices (2 by default) before its programmatic wait, while the
  // route and the prep run (the DRAM is otherwise idle then). A unit whose expert turns out to have no pairs drains
  // the slices issued for it without MMAs. The value is how many slices go out before the wait (at most the ring's
  // depth; 0: none, the prep's ordinary layout).
  // For the gate/up GEMM the number of slices issued before its wait; for the down GEMM with inline_ids only the
  // table's layout (static slots or not).
  int static_slots;
  // Inline routing (batched decode on configuration 12; MOESERVE_MOE_INLINE_ROUTE=0 turns it off): when non-null there is no prep
  // launch - every CTA of both GEMMs builds the prep's tile table and pair permutation (the same layout, in static
  // slots where static_slots) in its own shared memory (InlineRouteLayout, after the configuration's) from these
  // ids: the gate/up GEMM after its programmatic wait, the down GEMM before its wait (the ids were complete before
  // the gate/up GEMM passed its wait, the argument by which the down GEMM reads the prep's tiles early). An expert's
  // rows are in token order (bit t of the expert's token mask; a token's ids must be distinct, as a top-k is), so
  // every CTA finds the same table. The gate/up GEMM's CTA 0 also writes inline_pair_pos for the combine.
  const int* inline_ids;  // [num_tokens * top_k] topk_ids, or nullptr
  int num_tokens;
  int* inline_pair_pos;   // [num_tokens * top_k]: sorted position of each pair, -1 for a dropped one
};

// Shared-memory layout (byte offsets from its 16-byte aligned start) of the inline routing tables of GemmParams::
// inline_ids for E experts, T tokens and num_slots tile slots: each expert's token mask (ceil(T / 32) words), the
// exclusive scans of rows and overflow tiles (E + 1 ints each), the tile table and the permutation (sorted position
// -> pair).
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define MOE_HOST_DEVICE __host__ __device__
#else
#define MOE_HOST_DEVICE
#endif
struct InlineRouteLayout {
  int mask, off, toff, tiles, perm, bytes;
};
MOE_HOST_DEVICE constexpr InlineRouteLayout inline_route_layout(int E, int T, int top_k, int num_slots) {
  InlineRouteLayout l{};
  l.mask = 0;
  l.off = l.mask + E * ((T + 31) / 32) * 4;
  l.toff = l.off + (E + 1) * 4;
  l.tiles = (l.toff + (E + 1) * 4 + 15) / 16 * 16;
  l.perm = l.tiles + num_slots * 16;
  l.bytes = (l.perm + T * top_k * 4 + 15) / 16 * 16;
  return l;
}
// The most shared memory the tables may take (configuration 12 keeps two CTAs an SM: 2 x (91.6 + 16 + 1) KB of 228)
// and pairs a CTA thread holds (512 threads: 2,048 pairs, 256 tokens of top-8).
constexpr int kInlineRouteMaxBytes = 16 << 10;
constexpr int kInlineRoutePerThread = 4;

// out[t, :] = bf16(sum over j < top_k of y[pair_pos[t * top_k + j], :]), slots in order (deterministic).
// Direct mode (direct_ids non-null, pair_pos unused): row of pair i is i, dropped when direct_ids[i] is outside
// [0, num_experts).
// With residual non-null (MoeBackend::run_combine_norm) the combine also adds out into the residual and writes the
// next RMSNorm of it: residual[t] += float(out[t]); xn_out[t] = bf16(norm_w * (residual[t] * rsqrt(mean sq + eps))),
// hidden <= 8 * kCombineNormChunks * kCombineThreads.
struct CombineParams {
  const unsigned short* y;
  const int* pair_pos;
  unsigned short* out;
  int num_tokens, top_k, hidden;
  const int* direct_ids;
  int num_experts;
  float* residual;                // [T, hidden] f32, or null
  const unsigned short* norm_w;   // [hidden] bf16 bits
  float eps;
  unsigned short* xn_out;         // [T, hidden] bf16 bits
};
constexpr int kCombineNormChunks = 4;  // 8-element chunks a thread keeps for the norm

// A CTA computes a BM (weight rows) x BN (tokens) tile with WM x WN warps, streaming K in BK slices through a
// STAGES-deep cp.async ring. MINB is the occupancy asked of the register allocator.
// WGMMA > 0: the main loop runs on sm_90a's warpgroup MMA (two warpgroups of 64 weight rows x BN tokens) where
// the build targets sm_90a, else on mma.sync like the others; its tiles need a 1024-byte aligned base (1 KB more).
// 1: each slice's MMAs complete before the ring is refilled; 2: one slice's MMAs stay in flight while the ring
// is refilled; 3: warp-specialized and persistent (moe_gemm_ws.cuh: a producer warpgroup and two MMA warpgroups
// behind mbarriers, one CTA an SM walking the ordinary grid; sm_90a tables only).
// CPW (WGMMA 3 only): the producer warpgroups copy the weight tiles with cp.async (16-byte chunks, the same
// 128-byte swizzle) instead of one thread's TMA boxes.
// TOKM (WGMMA 3, 256 x 128 tiles only): the MMAs with the tokens as M - each MMA warpgroup 64 tokens x all 256
// weight rows (m64n256k16; moe_gemm_ws.cuh) instead of 128 weight rows x 128 tokens (two m64n128k16 a k step).
template <int BM_, int BN_, int WM_, int WN_, int BK_, int STAGES_, int MINB_, int WGMMA_ = 0, int CPW_ = 0,
          int TOKM_ = 0>
struct GemmConfig {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_, BK = BK_, STAGES = STAGES_, MINB = MINB_;
  static constexpr int WGMMA = WGMMA_;
  static constexpr bool WEIGHTS_CP_ASYNC = CPW_ != 0;
  static constexpr bool TOKENS_AS_M = TOKM_ != 0;
  static constexpr int THREADS = WM * WN * 32;
  static constexpr int PIPE_BYTES = STAGES * (BM + BN) * BK * 2;
  // The warp-specialized 256-row tile (configuration 10) stages its epilogue as bf16 through stmatrix
  // (moe_gemm_ws.cuh): gate/up's act tile [BN tokens][BM / 2] whole, down's y tile [BN / 2 tokens][BM] in two halves,
  // in 128-byte rows with the 128-byte swizzle. Its gate/up MMA warpgroups each take the gate and the up rows of 64
  // act columns, so that each holds both halves of its act values.
  static constexpr bool STM_EPI = WGMMA == 3 && BM == 256;
  // f32 accumulator tile, padded against bank conflicts; WGMMA 3 keeps it apart from the ring (the producer
  // refills the ring during the epilogue) and stores the tile in BM / 64 parts, plus 2 x STAGES mbarriers and the
  // down tile's BN routing weights.
  static constexpr int EPI_BYTES = STM_EPI ? BN * BM : (WGMMA == 3 ? BN / (BM / 64) : BN) * (BM + 4) * 4;
  static constexpr int SMEM_BYTES =
      WGMMA == 3 ? PIPE_BYTES + EPI_BYTES + 16 * STAGES + 4 * BN + 1024
                 : (PIPE_BYTES > EPI_BYTES ? PIPE_BYTES : EPI_BYTES) + (WGMMA > 0 ? 1024 : 0);
};

// Chosen by the average tokens per expert (T * top_k / E) so that one tile usually holds all of an expert's
// tokens (each weight byte read once) while decode still launches enough CTAs to cover every SM.
using GemmCfg0 = GemmConfig<32, 16, 2, 1, 128, 4, 4>;    // decode: <= ~5 tokens per expert
using GemmCfg1 = GemmConfig<64, 32, 4, 1, 64, 4, 4>;     // batched decode: <= ~12
using GemmCfg2 = GemmConfig<128, 64, 4, 2, 64, 3, 2>;    // small prefill: <= ~40
using GemmCfg3 = GemmConfig<128, 128, 2, 4, 64, 3, 2>;   // prefill
using GemmCfg4 = GemmConfig<128, 128, 2, 4, 64, 3, 2, 1>;  // prefill on wgmma (sm_90a builds)
using GemmCfg5 = GemmConfig<128, 64, 4, 2, 64, 3, 2, 1>;   // small prefill on wgmma (opt-in, see the host)
using GemmCfg6 = GemmConfig<128, 128, 2, 4, 64, 3, 2, 2>;  // prefill on wgmma, MMAs in flight
// 40-256 tokens an expert on wgmma, warp-specialized and persistent (WGMMA 3): 2 producer warpgroups (TMA for the
// weights, cp.async for the gathered tokens) + 2 MMA warpgroups, a 6-deep ring (192 KB) and half the f32 epilogue
// tile (33 KB) apart: one CTA an SM; 512 threads, so registers are rebalanced (setmaxnreg) towards the MMAs.
using GemmCfg8 = GemmConfig<128, 128, 4, 4, 64, 6, 1, 3>;
// batched decode (3-12 tokens an expert) on the same body with MOESERVE_MOE_WS_DECODE=9 (11 is the default):
// 64-token tiles, an 8-deep ring (192 KB) so that ~150 KB of weights stay in flight an SM and no CTA pays a ramp of
// its own (ncu, configuration 1 at 128 tokens: the down GEMM streamed 3.35 TB/s against 3.98 for gate/up, K = 768
// being a short stream a CTA)
using GemmCfg9 = GemmConfig<128, 64, 4, 4, 64, 8, 1, 3>;
// Direct mode's gate/up GEMM with a 5-deep ring (MOESERVE_MOE_DIRECT_GU_CONFIG=7, experiment): the MoE layer
// alone at 1 token 24.4-24.5 us (jit) against 26.9-27.2, but the served decode step 4-7 us slower (H200, session 8).
using GemmCfg7 = GemmConfig<32, 16, 2, 1, 128, 5, 3>;
// Prefill (> 256 tokens an expert) until session 37 (now 14, below): 256 weight rows x 128 tokens on the
// warp-specialized body, one producer warpgroup (TMA weights, cp.async tokens), each MMA warpgroup 128 rows (154
// registers), a 4-deep ring (192 KB): a third fewer bytes through L2 per flop than 128 x 128 (8,192 tokens 1,411 us
// against 1,587 for configuration 6)
using GemmCfg10 = GemmConfig<256, 128, 3, 4, 64, 4, 1, 3>;
// Batched decode on the warp-specialized body with two CTAs an SM (MINB 2): 32-token tiles and a 4-deep ring each
// (~92 KB, 64 registers), so that two independent weight streams share an SM. gpu_read_bw's tma rows (session 24):
// the 128-row TMA pattern at gate/up's K read 4.36 TB/s as 2 x 4 stages an SM against 4.24 as 1 x 8. The default at
// 3-12 tokens an expert in session 24 (bs 64 step -15 us against 9, bs 128 -20 to -26), then 12 (its shape with
// cp.async weights); MOESERVE_MOE_WS_DECODE=11 for it.
using GemmCfg11 = GemmConfig<128, 32, 4, 4, 64, 4, 2, 3>;
// Configuration 11 with the weight tiles copied by the producer warpgroup's cp.async (with the L2 evict_first
// priority, GemmParams::weight_evict_first) instead of TMA: the default for batched decode since session 25 (H200,
// same call: bs 64 step -92 us, bs 128 -100; without the L2 hint only -23 us at bs 64). (Three CTAs an SM with TMA,
// 3-deep rings, was 12 in session 24: the layer at 64 tokens 294.5 us against 288.9; removed.)
using GemmCfg12 = GemmConfig<128, 32, 4, 4, 64, 4, 2, 3, 1>;
// Configuration 9 with cp.async weight tiles (experiment, MOESERVE_MOE_WS_DECODE=13).
using GemmCfg13 = GemmConfig<128, 64, 4, 4, 64, 8, 1, 3, 1>;
// Prefill (> 256 tokens an expert; the default since session 37, MOESERVE_MOE_WS_PREFILL=10 for the former):
// configuration 10 with the tokens as the MMAs' M, each MMA warpgroup 64 tokens x the 256 weight rows by one
// m64n256k16 a k step. Its k step reads 20 KB of shared memory a CTA instead of 24 (each of 10's m64n128 blocks
// re-reads the 128-token tile), and its epilogue stages each warpgroup's token-major rows by stmatrix without a
// transpose, behind the warpgroup's own barriers instead of the 256-thread ones. H200 (session 37, same call): the
// layer at 8,192 tokens -8% (fused_sm90) / -11% (JIT); ncu: gate/up 759.8 against 786.1 us, down 438.6 against 460.5,
// shared-memory wavefronts 57% of peak against 66%, the tensor pipe 83.6 / 72.9% active against 82.8 / 70.2.
using GemmCfg14 = GemmConfig<256, 128, 3, 4, 64, 4, 1, 3, 0, 1>;
constexpr int kNumGemmConfigs = 15;

#ifndef __CUDACC_RTC__  // host-side helper; NVRTC treats unannotated functions as host code and rejects them
struct GemmConfigInfo {
  int bm, bn, threads, smem_bytes;
  bool persistent;  // warp-specialized (WGMMA 3): MINB CTAs an SM walk the grid, launched with MINB x the SM count
  int ctas_per_sm;
  bool weights_cp_async;  // persistent, weight tiles by the producers' cp.async (GemmParams::static_slots applies)
};
template <class C>
constexpr GemmConfigInfo gemm_config_info_of() {
  return GemmConfigInfo{C::BM, C::BN, C::THREADS, C::SMEM_BYTES, C::WGMMA == 3, C::MINB,
                        C::WGMMA == 3 && C::WEIGHTS_CP_ASYNC};
}
constexpr GemmConfigInfo gemm_config_info(int i) {
  return i == 0   ? gemm_config_info_of<GemmCfg0>()
         : i == 1 ? gemm_config_info_of<GemmCfg1>()
         : i == 2 ? gemm_config_info_of<GemmCfg2>()
         : i == 3 ? gemm_config_info_of<GemmCfg3>()
         : i == 4 ? gemm_config_info_of<GemmCfg4>()
         : i == 5 ? gemm_config_info_of<GemmCfg5>()
         : i == 6 ? gemm_config_info_of<GemmCfg6>()
         : i == 7 ? gemm_config_info_of<GemmCfg7>()
         : i == 8 ? gemm_config_info_of<GemmCfg8>()
         : i == 9 ? gemm_config_info_of<GemmCfg9>()
         : i == 10 ? gemm_config_info_of<GemmCfg10>()
         : i == 11 ? gemm_config_info_of<GemmCfg11>()
         : i == 12 ? gemm_config_info_of<GemmCfg12>()
         : i == 13 ? gemm_config_info_of<GemmCfg13>()
                   : gemm_config_info_of<GemmCfg14>();
}
#endif

// The kernels of one build (AOT sm_90a, AOT sm_100a or JIT) as launchable handles: `__global__` function
// addresses, or cudaKernel_t from cudaLibraryGetKernel cast to const void*. The launcher is shared.
struct KernelTable {
  const void* prep;
  const void* gemm[kNumGemmConfigs][2];  // [config][GemmMode]
  const void* combine;
  // Direct mode's down projection + combine (down_gemv_body), one kernel per ring depth of kDownGemvStageVariants.
  const void* down_gemv[kNumDownGemvVariants];
  // The GPU supports programmatic dependent launch (sm_90+): the direct path then launches the down GEMM and
  // combine with cudaLaunchAttributeProgrammaticStreamSerialization.
  bool pdl;
  // The kernels were built for sm_90a (wgmma): the warp-specialized configuration runs; others never launch it.
  bool wgmma;
  int num_sms;  // persistent grids (set when the backend is prepared)
};

}  // namespace moe_kernels

// The lm_head screen's 9-64-row form (lmhead_screen.h; the shared pieces in lmhead_screen_common.cuh, the bound in
// lmhead_screen_math.h): the same int8 copy as the 1-8-row form, on sm_90's wgmma, in three launches
// (two by default, the pick folded into the screen; MOESERVE_LMHEAD_SCREEN_FOLD=0: three):
// 0. prep: the token rows as fp16 with k permuted inside each 16-k group (logical 2q + i <- actual 4q + i, 8 + 2q + i
//    <- 4q + 2 + i: what each lane's 32-bit read of 4 int8 weights becomes in the MMA's A fragment), zero rows up to
//    64, X1 and e_x a token;
// 1. screen: one CTA an SM walking units of 384 rows x all K; a producer thread streams each unit's int8 rows (three
//    128-row TMA boxes of 128 bytes) and the 64 token rows (two 64-column fp16 boxes) into a 3-deep ring of 64 KB
//    stages; three MMA warpgroups of 128 rows (two m64 blocks each) read their weights from shared memory into
//    registers, convert them to fp16 and run wgmma m64n64k16 with A from registers and the token tile as B (two
//    fragment sets, so that a k step's conversion runs under the step before). A unit's epilogue folds a - B into
//    the block's max a token (shared, monotone), then lists every (row, a + B) that reaches it: a superset of the
//    rows that can reach the global L; after its list, the block reduces its max into a grid-wide one (global
//    atomicMax, reset by the prep) and loads that back at its next unit's start, so that later units list against
//    the best lower bound found so far anywhere (a 384-row unit alone lists ~10-25 rows a token on q30b8l-like rows;
//    later units ~0-3). On an H100 its stream bounds it; on an H200 its consumers would (~73-77 us alone at 16-64
//    rows, measured on an H100 with three warpgroups, against a ~71 us stream: latency-bound warps, the tensor pipe
//    ~45% busy at N = 64 tokens; docs/PERF.md sessions 47-48);
// 2. pick: a block a token takes L over the blocks, evaluates the listed rows with a + B >= L exactly (a warp a
//    row), then every row of the blocks whose list overflowed (all warps, row by row), and writes the argmax.
//    By default (wide_screen_kernel<true>; session 46, H100: the bs 64 step -11 to -16 us) there is no pick launch: each
//    screen block evaluates its own listed rows that reach the grid's bound at its end (flat over its (token, entry)
//    pairs, a warp a candidate), and the last block writes ids.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "cuda/launch.h"
#include "cuda/moe/moe_kernel_params.h"
#include "cuda/pdl.cuh"
#include "cuda/registry.h"
#include "cuda/sampling/lmhead_screen.h"
#include "cuda/sampling/lmhead_screen_common.cuh"
#include "cuda/tma.h"

namespace moeserve::cuda {
namespace screen_detail {
constexpr int kWTok = kWideRows;           // token rows (the MMA's N)
constexpr int kWCW = 3;                    // consumer (MMA) warpgroups
constexpr int kWMB = 2;                    // m64 blocks a consumer warpgroup
constexpr int kWPart = 64 * kWMB;          // a consumer warpgroup's rows (one TMA box)
constexpr int kWUnit = kWCW * kWPart;      // rows a unit (384)
constexpr int kWSliceK = 128;              // int8 bytes a row a stage
constexpr int kWStages = 3;
constexpr int kWConsumers = 128 * kWCW;    // consumer threads (named barrier 1)
constexpr int kWThreads = 128 + kWConsumers;
// Registers a thread after setmaxnreg: the producer warpgroup few, the consumers the rest of the 64 K (multiples of 8).
constexpr int kWProducerRegs = 40;
constexpr int kWConsumerRegs = (65536 - 128 * kWProducerRegs) / kWConsumers / 8 * 8;
constexpr int kWRowBytes = kWUnit * kWSliceK;        // 48 KB
constexpr int kWTokBoxBytes = kWTok * 128;           // 8 KB: 64 tokens x 64 fp16
constexpr int kWStageBytes = kWRowBytes + 2 * kWTokBoxBytes;  // 64 KB
constexpr int kWCap = 128;                 // listed rows a (token, block): ~10-40 expected, more is an overflow
constexpr int kWMaxGrid = 256;             // blocks of the wide screen the lists are sized for (one an SM)

struct WideWs {
  __half* xp;     // [64][K] permuted fp16 token rows
  float* x1;      // [64]
  float* ex;      // [64]
  int* glo;       // [64]: the grid's best lower bound a token so far (ordered), reset by the prep
  unsigned long long* best;  // [64]: the folded pick's best (packed: best_key), reset by the prep
  unsigned* done;            // the folded pick's count of finished blocks, reset by the prep
  float* lo;      // [64][kMaxGrid]
  int* cnt;       // [64][kMaxGrid]
  Entry* list;    // [64][kWMaxGrid][kWCap]
};
// The layout of the workspace (bytes: its size, when asked).
WideWs carve_wide(void* ws, int K, size_t* bytes = nullptr) {
  WsCarve c(ws);
  WideWs w;
  w.xp = c.take<__half>(size_t(kWTok) * K * 2);
  w.x1 = c.take<float>(kWTok * 4);
  w.ex = c.take<float>(kWTok * 4);
  w.glo = c.take<int>(kWTok * 4);
  w.best = c.take<unsigned long long>(kWTok * 8);
  w.done = c.take<unsigned>(4);
  w.lo = c.take<float>(size_t(kWTok) * kMaxGrid * 4);
  w.cnt = c.take<int>(size_t(kWTok) * kMaxGrid * 4);
  w.list = c.take<Entry>(size_t(kWTok) * kWMaxGrid * kWCap * sizeof(Entry));
  if (bytes != nullptr) *bytes = c.used;
  return w;
}
size_t wide_ws_bytes(int K) {
  size_t bytes = 0;
  carve_wide(nullptr, K, &bytes);
  return bytes;
}
// lmhead_screen_topk's 9-64-row layout: the wide form's, then hi and the pick's best k a (token, block).
WideTopkWs carve_wide_topk(void* ws, int K, int V, size_t* bytes) {
  const WideWs w = carve_wide(ws, K);
  WsCarve c(static_cast<char*>(ws) + wide_ws_bytes(K));
  WideTopkWs t;
  t.lo = w.lo;
  t.hi = c.take<float>(size_t(kWTok) * size_t(V) * 4);
  t.topk = c.take<Best>(size_t(kWTok) * kMaxGrid * kLmheadScreenMaxTopK * sizeof(Best));
  t.topk_n = c.take<int>(size_t(kWTok) * kMaxGrid * sizeof(int));
  if (bytes != nullptr) *bytes = wide_ws_bytes(K) + c.used;
  return t;
}

__device__ __forceinline__ int permuted_source(int l) {  // actual k (inside the 16-k group) of logical position l
  const int q = (l & 7) >> 1, i = l & 1;
  return 4 * q + i + (l >= 8 ? 2 : 0);
}

// A thread a 16-k group of token blockIdx.x: two 16-byte loads, the permutation in registers, two 16-byte stores - one
// L2 round trip a thread instead of one a k (session 47: the k-strided form's loads serialized behind its stores,
// which may alias x, ~9 us of chain at 64 rows).
constexpr int kWPrepThreads = 128;
__global__ void __launch_bounds__(kWPrepThreads) wide_prep_kernel(const bf16* x, int M, int K, float amax_all,
                                                                 WideWs w) {
  pdl_enter();
  const int t = blockIdx.x;
  float s = 0.0f, e = 0.0f;
  for (int g = threadIdx.x; g < K / 16; g += kWPrepThreads) {
    uint4 in[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
    if (t < M) {
      const uint4* src = reinterpret_cast<const uint4*>(x + int64_t(t) * K + 16 * g);
      in[0] = __ldcg(src), in[1] = __ldcg(src + 1);
    }
    const bf16* v = reinterpret_cast<const bf16*>(in);
    alignas(16) __half h[16];
#pragma unroll
    for (int l = 0; l < 16; ++l) h[l] = screen_half(__bfloat162float(v[permuted_source(l)]), s, e);
    uint4* dst = reinterpret_cast<uint4*>(w.xp + int64_t(t) * K + 16 * g);
    dst[0] = reinterpret_cast<const uint4*>(h)[0], dst[1] = reinterpret_cast<const uint4*>(h)[1];
  }
  constexpr int kWarps = kWPrepThreads / 32;
  __shared__ float rs[kWarps], re[kWarps];
  for (int o = 16; o > 0; o /= 2) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
    e = fmaxf(e, __shfl_xor_sync(0xffffffffu, e, o));
  }
  if (threadIdx.x % 32 == 0) rs[threadIdx.x / 32] = s, re[threadIdx.x / 32] = e;
  __syncthreads();
  if (threadIdx.x == 0) {
    float S = 0.0f, E = 0.0f;
    for (int i = 0; i < kWarps; ++i) S += rs[i], E = fmaxf(E, re[i]);  // (a NaN sum stays NaN: every row a candidate)
    w.x1[t] = screen::round_up_l1(S, K);
    w.ex[t] = screen::ex_term(E, K, amax_all);
    w.glo[t] = ordered(-INFINITY);
    w.best[t] = 0;  // below every key
    if (t == 0) *w.done = 0;
  }
}

#if MOE_HAVE_WGMMA
__device__ __forceinline__ void wgmma_rs_f16_n64(float (&d)[32], const unsigned (&a)[4], unsigned long long b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, "
      "%35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}
// The consumer warpgroups' named barrier (the producer warpgroup has left or never joins).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kWConsumers) : "memory"); }
// Registers a wgmma still reads (A) or writes (D) stay where they are until after its wait (the compiler sees a use).
template <int N>
__device__ __forceinline__ void keep(unsigned (&a)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j) asm volatile("" : "+r"(a[j][0]), "+r"(a[j][1]), "+r"(a[j][2]), "+r"(a[j][3]));
}
__device__ __forceinline__ void keep(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i]));
}
#endif

struct WideArgs {
  moe_kernels::TmaDesc wmap;  // the int8 rows as [V, K / 2] 2-byte elements, boxes of 64 x 192 rows
  moe_kernels::TmaDesc xmap;  // the permuted fp16 tokens [64, K], boxes of 64 x 64 rows
  int M, K, V, units;
  const screen::RowMeta* meta;
  const float* x1;
  const float* ex;
  int* glo;
  float* lo;
  int* cnt;
  Entry* list;
  // The folded pick (wide_screen_kernel<true>, the default): each block evaluates its own listed
  // rows that reach the grid's lower bound as it finds it at the end, folds them into best (a 64-bit atomicMax a
  // token), and the last block to finish writes the ids; no pick launch.
  const bf16* x;  // [M][K]
  const bf16* w;  // [V][K]
  unsigned long long* best;
  unsigned* done;
  int32_t* out_ids;
  float* hi;  // [M][V] (wide_screen_hi_kernel)
};

// What a wide screen block does with its rows' bounds (one body, three kernels): kList lists them for the pick launch
// (MOESERVE_LMHEAD_SCREEN_FOLD=0), kFold picks in the tail (the default), kHi writes every (token, row)'s a + B to hi and
// keeps each block's own max a - B (lmhead_screen_topk at 9-64 rows: no grid-wide bound, so that the blocks' maxima are
// distinct rows' lower bounds).
enum class WideMode { kList, kFold, kHi };
template <WideMode kMode>
__device__ __forceinline__ void wide_screen_body(const WideArgs& a) {
#if MOE_HAVE_WGMMA
  using namespace moe_ptx;
  extern __shared__ char wide_smem_raw[];
  char* smem = align_smem(wide_smem_raw, 1024);
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem + kWStages * kWStageBytes);
  int* lo_s = reinterpret_cast<int*>(bars + 2 * kWStages);  // [64] ordered
  int* cnt_s = lo_s + kWTok;                                 // [64]
  float* x1_s = reinterpret_cast<float*>(cnt_s + kWTok);    // [64]
  float* ex_s = x1_s + kWTok;                                 // [64]
  const unsigned ring = smem_addr(smem), full0 = smem_addr(bars), empty0 = full0 + kWStages * 8;
  const int tid = threadIdx.x, wg = tid / 128;
  if (tid == 0) {
    for (int s = 0; s < kWStages; ++s) {
      mbar_init(full0 + s * 8, 1);
      mbar_init(empty0 + s * 8, kWCW);  // a consumer warpgroup's arrival each
    }
    fence_proxy_async_smem();
  }
  if (tid < kWTok) lo_s[tid] = ordered(-INFINITY), cnt_s[tid] = 0;
  __syncthreads();
  const int KT = a.K / kWSliceK;
  const int my_units = a.units > int(blockIdx.x) ? (a.units - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  const int total = my_units * KT;
  // The register file rebalanced: the producer warpgroup (one TMA thread) needs few, the MMA warpgroups hold two
  // sets of A fragments beside 64 accumulators (128 x 40 + 384 x 152 <= 64 K).
  if (wg == 0) {
    setmaxnreg_dec<kWProducerRegs>();
    if (tid == 0) {
      // Slice s: unit blockIdx.x + (s / KT) gridDim.x, k bytes (s % KT) 128. The first pass's weight boxes before the
      // wait; the token boxes (written by the prep launch) after it.
      const int pre = total < kWStages ? total : kWStages;
      auto weights = [&](int s, unsigned st) {
        const int unit = int(blockIdx.x) + (s / KT) * int(gridDim.x);
        const int c0 = (s % KT) * (kWSliceK / 2);
#pragma unroll
        for (int c = 0; c < kWCW; ++c)
          tma_load_2d(st + c * kWPart * kWSliceK, &a.wmap, c0, unit * kWUnit + c * kWPart, full0 + (s % kWStages) * 8);
      };
      auto tokens = [&](int s, unsigned st) {
        const int c0 = (s % KT) * kWSliceK;  // fp16 columns
        tma_load_2d(st + kWRowBytes, &a.xmap, c0, 0, full0 + (s % kWStages) * 8);
        tma_load_2d(st + kWRowBytes + kWTokBoxBytes, &a.xmap, c0 + 64, 0, full0 + (s % kWStages) * 8);
      };
      for (int s = 0; s < pre; ++s) {
        mbar_arrive_expect_tx(full0 + s * 8, kWStageBytes);
        weights(s, ring + unsigned(s * kWStageBytes));
      }
      pdl_wait();
      pdl_launch_dependents();
      for (int s = 0; s < pre; ++s) tokens(s, ring + unsigned(s * kWStageBytes));
      for (int s = pre; s < total; ++s) {
        const int stage = s % kWStages;
        mbar_wait(empty0 + stage * 8, ((s / kWStages) & 1) ^ 1);
        const unsigned st = ring + unsigned(stage * kWStageBytes);
        mbar_arrive_expect_tx(full0 + stage * 8, kWStageBytes);
        weights(s, st);
        tokens(s, st);
      }
    } else {
      pdl_wait();
    }
    return;
  }
  setmaxnreg_inc<kWConsumerRegs>();
  pdl_wait();
  const int cw = wg - 1, ctid = tid - 128, warp = (ctid / 32) & 3, lane = ctid % 32, g = lane / 4, q = lane % 4;
  if (ctid < kWTok) x1_s[ctid] = __ldcg(a.x1 + ctid), ex_s[ctid] = __ldcg(a.ex + ctid);
  consumers_sync();
  int s = 0;  // slices consumed
  // Two sets of A fragments a warpgroup, alternating by k step: step kk's weights are loaded and converted while
  // step kk - 1's wgmmas run (wgmma_wait<1> frees the set step kk - 2 read), so a warpgroup keeps one group in
  // flight through its conversions (session 47, H100: -2.5 us at 16-64 rows against one set rebuilt after a full
  // wait; the consumers alone still take ~87-95 us, the MMAs at N = 64 tokens, docs/PERF.md).
  unsigned A[2][kWMB][4];
  for (int ui = 0; ui < my_units; ++ui) {
    const int unit = int(blockIdx.x) + ui * int(gridDim.x);
    float d[kWMB][32];
#pragma unroll
    for (int j = 0; j < kWMB; ++j)
#pragma unroll
      for (int i = 0; i < 32; ++i) d[j][i] = 0.0f;
    // The grid's lower bound a token as it stands now (ordered; the earlier units' maxima of every block that traded),
    // its load in flight through the unit's MMAs.
    const int grid_lo = kMode != WideMode::kHi && ui > 0 && ctid < a.M ? __ldcg(a.glo + ctid) : ordered(-INFINITY);
    for (int kt = 0; kt < KT; ++kt, ++s) {
      const int stage = s % kWStages;
      mbar_wait(full0 + stage * 8, (s / kWStages) & 1);
      const char* wt = smem + stage * kWStageBytes + cw * kWPart * kWSliceK;
      // The token tile's descriptor once a slice; a k step's is it plus a constant (the start address field, bits
      // 0-13 in 16-byte units, cannot carry: shared addresses stay below 256 KB).
      const unsigned long long bd0 = wgmma_desc_sw128(ring + unsigned(stage * kWStageBytes + kWRowBytes));
#pragma unroll
      for (int kk = 0; kk < kWSliceK / 16; ++kk) {
        unsigned (&Ab)[kWMB][4] = A[kk & 1];
        wgmma_wait<1>();  // the groups before the last: the one that read this set (step kk - 2) is done
        keep(Ab);
        // Slice s - 1's last group (two steps back) is done: its stage is free (the unit's last slice: after the loop).
        if (kk == 1 && kt > 0 && ctid % 128 == 0) mbar_arrive(empty0 + ((s - 1) % kWStages) * 8);
#pragma unroll
        for (int j = 0; j < kWMB; ++j) {
          const int r = 64 * j + 16 * warp + g;  // r and r + 8 share r % 8, hence the 16-byte chunk's swizzle
          const int off = 16 * (kk ^ (r & 7)) + 4 * q;
          const unsigned w0 = *reinterpret_cast<const unsigned*>(wt + r * kWSliceK + off);
          const unsigned w1 = *reinterpret_cast<const unsigned*>(wt + (r + 8) * kWSliceK + off);
          int8x4_to_half2x2(w0, Ab[j][0], Ab[j][2]);
          int8x4_to_half2x2(w1, Ab[j][1], Ab[j][3]);
        }
        wgmma_fence();
        const unsigned long long bd = bd0 + unsigned(((kk / 4) * kWTokBoxBytes + (kk % 4) * 32) >> 4);
#pragma unroll
        for (int j = 0; j < kWMB; ++j) wgmma_rs_f16_n64(d[j], Ab[j], bd);
        wgmma_commit();
      }
    }
    // This thread's 2 kWMB rows (block j, rows 16 warp + g (+ 8)): their metadata, loaded while the last MMAs run. Rows
    // past V (the TMA's zero fill) get a NaN scale: they never raise the maximum (fmaxf drops a NaN) and are never
    // listed.
    screen::RowMeta meta[kWMB][2];
#pragma unroll
    for (int j = 0; j < kWMB; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = unit * kWUnit + cw * kWPart + 64 * j + 16 * warp + g + 8 * h;
        meta[j][h] = r < a.V ? a.meta[r] : screen::RowMeta{NAN, 0.0f};
      }
    wgmma_wait<0>();
    keep(A[0]);
    keep(A[1]);
#pragma unroll
    for (int j = 0; j < kWMB; ++j) keep(d[j]);
    if (ctid % 128 == 0) mbar_arrive(empty0 + ((s - 1) % kWStages) * 8);  // the unit's last slice
    // Epilogue. d[j][4 i + 2 h + e]: row 64 j + 16 warp + g + 8 h, token 8 i + 2 q + e. Each accumulator becomes
    // its hi = a + B; the token's max of a - B over this warp's rows goes to the block's (shared, monotone).
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = 8 * i + 2 * q + e;
        const float x1n = x1_s[n], exn = ex_s[n];
        float m = -INFINITY;
#pragma unroll
        for (int j = 0; j < kWMB; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float& v = d[j][4 * i + 2 * h + e];
            const float approx = meta[j][h].scale * v;
            const float b = screen::bound(approx, meta[j][h].c, x1n, exn);
            const float hi = approx + b;
            m = fmaxf(m, approx - b);
            v = hi == hi ? hi : INFINITY;
            if constexpr (kMode == WideMode::kHi) {
              const int r = unit * kWUnit + cw * kWPart + 64 * j + 16 * warp + g + 8 * h;
              if (n < a.M && r < a.V) a.hi[int64_t(n) * a.V + r] = v;
            }
          }
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
        if (g == 0 && n < a.M && m == m) atomicMax(lo_s + n, ordered(m));
      }
    if constexpr (kMode == WideMode::kHi) continue;  // no list: the block's own maxima only
    if (ctid < a.M) atomicMax(lo_s + ctid, grid_lo);
    consumers_sync();  // the unit's maxima and the grid's are in
    // The list: a warp none of whose entries reaches its token's bound skips the per-entry pass (session 48: after a
    // block's first unit, with the grid's bound in, most warps list nothing, and the pass's 64 branches a thread were
    // a fifth of the epilogue). Tokens past M get a NaN bound: no entry (not even an infinite one) compares >= it.
    float lon[8][2];
    bool any = false;
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = 8 * i + 2 * q + e;
        lon[i][e] = n < a.M ? unordered(lo_s[n]) : NAN;
#pragma unroll
        for (int j = 0; j < kWMB; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) any |= d[j][4 * i + 2 * h + e] >= lon[i][e];
      }
    if (__any_sync(0xffffffffu, any)) {
#pragma unroll
      for (int j = 0; j < kWMB; ++j)
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int n = 8 * i + 2 * q + e;
              const int r = unit * kWUnit + cw * kWPart + 64 * j + 16 * warp + g + 8 * h;
              const float hi = d[j][4 * i + 2 * h + e];
              if (r < a.V && hi >= lon[i][e]) {
                const int slot = atomicAdd(cnt_s + n, 1);
                if (slot < kWCap) a.list[(size_t(n) * kWMaxGrid + blockIdx.x) * kWCap + slot] = Entry{r, hi};
              }
            }
    }
    // The block's maximum to the grid's, without waiting for an answer (a reduction: session 47, a returning
    // atomic held the first MMA warpgroup a round trip a unit); the grid's comes back by the load at the next unit's
    // start, applied in that unit's epilogue (any value of either is a lower bound of the exact maximum).
    if (ctid < a.M) atomicMax(a.glo + ctid, lo_s[ctid]);
  }
  consumers_sync();
  if (ctid < a.M) {
    a.lo[ctid * kMaxGrid + blockIdx.x] = unordered(lo_s[ctid]);
    a.cnt[ctid * kMaxGrid + blockIdx.x] = cnt_s[ctid];
  }
  if constexpr (kMode != WideMode::kFold) return;
  // The folded pick. The lower bound a token: this block's, raised by the grid's as it stands now (every value of
  // either is at most the final L, so every row that reaches the final L, the argmax among them, is evaluated by its
  // block). Flat over the block's (token, entry) pairs rather than a warp a token (session 47: a warp's eight tokens at
  // 64 rows were eight chains of L2 and DRAM round trips, ~20 us): (1) every token's L at once; (2) every listed entry,
  // four loads in flight a thread, those that reach their token's L to a candidate list in the ring (free now: every
  // slice is consumed); (3) a warp a candidate, its exact logit, into the token's best. A token whose list
  // overflowed evaluates every row of the block's units (a warp a token), and so does every token when the candidates
  // overflow theirs (a NaN or infinite token row).
  const int cwarp = ctid / 32;
  float* Ls = reinterpret_cast<float*>(smem);   // [64]
  int* off = reinterpret_cast<int*>(Ls + kWTok);  // [65]: token t's entries at off[t] of the flat order
  int* ncand = off + kWTok + 1;
  int2* cand = reinterpret_cast<int2*>(smem + 1024);  // [kWTailCap] (token, row)
  constexpr int kWTailCap = (kWStages * kWStageBytes - 1024) / int(sizeof(int2));
  if (ctid < kWTok) Ls[ctid] = ctid < a.M ? fmaxf(unordered(lo_s[ctid]), unordered(__ldcg(a.glo + ctid))) : INFINITY;
  if (cwarp == 0) {  // a lane two tokens: the listed counts' exclusive scan (overflowed lists count 0 here)
    const int t0 = 2 * lane;
    const int c0 = t0 < a.M && cnt_s[t0] <= kWCap ? cnt_s[t0] : 0;
    const int c1 = t0 + 1 < a.M && cnt_s[t0 + 1] <= kWCap ? cnt_s[t0 + 1] : 0;
    int incl = c0 + c1;
    for (int o = 1; o < 32; o *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    off[t0] = incl - c0 - c1, off[t0 + 1] = incl - c1;
    if (lane == 31) off[kWTok] = incl, *ncand = 0;
  }
  consumers_sync();
  const int n_flat = off[kWTok];
  const Entry* blist = a.list + size_t(blockIdx.x) * kWCap;  // (t, i) at blist[t kWMaxGrid kWCap + i]
  for (int base = 0; base < n_flat; base += 4 * kWConsumers) {
    Entry en[4];
    int tok[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = base + kWConsumers * u + ctid;
      tok[u] = -1;
      if (i < n_flat) {
        int lo = 0, hi = kWTok;  // the token: the last t with off[t] <= i (a listed token has off[t + 1] > off[t])
        while (hi - lo > 1) {
          const int mid = (lo + hi) / 2;
          if (off[mid] <= i) lo = mid; else hi = mid;
        }
        tok[u] = lo;
        en[u] = blist[size_t(lo) * kWMaxGrid * kWCap + (i - off[lo])];
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (tok[u] >= 0 && en[u].hi >= Ls[tok[u]]) {
        const int slot = atomicAdd(ncand, 1);
        if (slot < kWTailCap) cand[slot] = make_int2(tok[u], en[u].row);
      }
  }
  consumers_sync();
  const int nc = *ncand;
  const bool cand_over = nc > kWTailCap;
  if (!cand_over) {
    for (int c = cwarp; c < nc; c += kWConsumers / 32) {
      const int2 tr = cand[c];
      const float v = exact_logit<8>(a.x + int64_t(tr.x) * a.K, a.w + int64_t(tr.y) * a.K, a.K, lane);
      if (lane == 0 && v == v) atomicMax(a.best + tr.x, best_key(v, tr.y));  // (a NaN logit never wins)
    }
  }
  for (int t = cwarp; t < a.M; t += kWConsumers / 32) {
    const int n = cnt_s[t];
    if (n <= kWCap && !cand_over) continue;
    const bf16* xr = a.x + int64_t(t) * a.K;
    Best best{-INFINITY, INT_MAX};
    if (n > kWCap) {
      for (int ui = 0; ui < my_units; ++ui) {
        const int unit = int(blockIdx.x) + ui * int(gridDim.x);
        for (int r = unit * kWUnit; r < min(a.V, (unit + 1) * kWUnit); ++r)
          best = better(best, Best{exact_logit<4>(xr, a.w + int64_t(r) * a.K, a.K, lane), r});
      }
    } else {
      best = exact_listed<4>(best, a.list + (size_t(t) * kWMaxGrid + blockIdx.x) * kWCap, n, Ls[t], xr, a.w, a.K, lane);
    }
    if (lane == 0 && best.id != INT_MAX) atomicMax(a.best + t, best_key(best.v, best.id));
  }
  // The last block to finish writes the ids (its reads of best after the fence see every block's atomics).
  __shared__ bool last;
  __threadfence();
  consumers_sync();
  if (ctid == 0) last = atomicAdd(a.done, 1u) == gridDim.x - 1;
  consumers_sync();
  if (last && ctid < a.M) {
    __threadfence();
    a.out_ids[ctid] = row_of_key(atomicAdd(a.best + ctid, 0ull));
  }
#else
  (void)a;
#endif
}
template <bool kFold>
__global__ void __launch_bounds__(kWThreads, 1) wide_screen_kernel(const __grid_constant__ WideArgs a) {
  wide_screen_body<kFold ? WideMode::kFold : WideMode::kList>(a);
}
__global__ void __launch_bounds__(kWThreads, 1) wide_screen_hi_kernel(const __grid_constant__ WideArgs a) {
  wide_screen_body<WideMode::kHi>(a);
}

struct WidePickArgs {
  const bf16* x;  // [M][K]
  const bf16* w;  // [V][K]
  int K, V, units, blocks;
  const float* lo;
  const int* cnt;
  const Entry* list;
  int32_t* out_ids;
};

// One block a token, in four phases, each with its global loads issued together (the pick is a chain of L2 and DRAM
// round trips, not bandwidth): (1) every screen block's lower bound and list length at once (a thread a block): L,
// and the lists' offsets by a block-wide scan; (2) the listed entries flat over all threads, 8 loads in flight a
// thread: those with a + B >= L go to a shared candidate list; (3) a warp a candidate, its exact logit
// (exact_logit); (4) every row of the blocks whose list overflowed (all warps, row by row), or of every block when
// the candidates overflow their shared list (a NaN or infinite token row: every row a candidate). The best wins.
constexpr int kWCand = 2048;  // a token's candidates the pick holds (~1-60 expected)
__global__ void __launch_bounds__(kPickThreads) wide_pick_kernel(const __grid_constant__ WidePickArgs a) {
  static_assert(kWMaxGrid <= kPickThreads, "a thread a screen block");
  pdl_enter();
  const int t = blockIdx.x, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  __shared__ int off[kWMaxGrid + 1];
  __shared__ float wmax[kPickThreads / 32];
  __shared__ int wsum[kPickThreads / 32];
  __shared__ Best wb[kPickThreads / 32];
  __shared__ int n_over, n_cand;
  __shared__ short over[kWMaxGrid];
  __shared__ int cand[kWCand];
  if (tid == 0) n_over = 0, n_cand = 0;
  // (1) A thread a screen block: its lower bound and list length.
  float lo = -INFINITY;
  int len = 0;
  if (tid < a.blocks) {
    lo = __ldcg(a.lo + t * kMaxGrid + tid);
    len = __ldcg(a.cnt + t * kMaxGrid + tid);
  }
  __syncthreads();  // n_over, n_cand
  if (len > kWCap) over[atomicAdd(&n_over, 1)] = short(tid), len = 0;
  int incl = len;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  float m = lo;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 31) wsum[warp] = incl;
  if (lane == 0) wmax[warp] = m;
  __syncthreads();
  int base = 0, sum = 0;
  float L = -INFINITY;
#pragma unroll
  for (int w = 0; w < kPickThreads / 32; ++w) {
    base += w < warp ? wsum[w] : 0;
    sum += wsum[w];
    L = fmaxf(L, wmax[w]);
  }
  if (tid < a.blocks) off[tid] = base + incl - len;
  if (tid == 0) off[a.blocks] = sum;
  __syncthreads();
  // (2) The entries of all lists, flat: entry i of block b is at off[b] + i.
  const int total = off[a.blocks];
  for (int i0 = 0; i0 < total; i0 += 8 * kPickThreads) {
    Entry en[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int i = i0 + tid + j * kPickThreads;
      en[j] = Entry{-1, -INFINITY};
      if (i < total) {
        int lo_b = 0, hi_b = a.blocks - 1;  // the last b with off[b] <= i
        while (lo_b < hi_b) {
          const int mid = (lo_b + hi_b + 1) / 2;
          if (off[mid] <= i) lo_b = mid;
          else hi_b = mid - 1;
        }
        const Entry* e = a.list + (size_t(t) * kWMaxGrid + lo_b) * kWCap + (i - off[lo_b]);
        en[j] = Entry{__ldcg(&e->row), __ldcg(&e->hi)};
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (en[j].row >= 0 && en[j].hi >= L) {
        const int c = atomicAdd(&n_cand, 1);
        if (c < kWCand) cand[c] = en[j].row;
      }
  }
  __syncthreads();
  const bf16* xr = a.x + int64_t(t) * a.K;
  Best best{-INFINITY, INT_MAX};
  const int nc = n_cand;
  if (nc <= kWCand) {
    // (3) A warp a candidate.
    for (int i = warp; i < nc; i += kPickThreads / 32) {
      const int r = cand[i];
      best = better(best, Best{exact_logit(xr, a.w + int64_t(r) * a.K, a.K, lane), r});
    }
    // (4) The overflowed blocks' rows.
    for (int i = 0; i < n_over; ++i)
      for (int u = over[i]; u < a.units; u += a.blocks)
        for (int r = u * kWUnit + warp; r < min(a.V, (u + 1) * kWUnit); r += kPickThreads / 32)
          best = better(best, Best{exact_logit(xr, a.w + int64_t(r) * a.K, a.K, lane), r});
  } else {
    for (int r = warp; r < a.V; r += kPickThreads / 32)
      best = better(best, Best{exact_logit(xr, a.w + int64_t(r) * a.K, a.K, lane), r});
  }
  if (lane == 0) wb[warp] = best;
  __syncthreads();
  if (tid == 0) {
    Best b = wb[0];
    for (int i = 1; i < kPickThreads / 32; ++i) b = better(b, wb[i]);
    a.out_ids[t] = b.id == INT_MAX ? 0 : b.id;
  }
}

int wide_blocks(int vocab) {
  static const int sms = current_device_multiprocessors();
  return std::min({sms, (vocab + kWUnit - 1) / kWUnit, kWMaxGrid});
}

// The prep and the stream kernel's arguments (the screen's inputs; the outputs a mode writes are set by the caller).
WideArgs wide_args(const bf16* x, int rows, int K, const void* screen_weights, float amax_all, int vocab,
                   const WideWs& ws, cudaStream_t stream) {
  launch_pdl(wide_prep_kernel, dim3(unsigned(kWTok)), dim3(kWPrepThreads), 0, stream, x, rows, K, amax_all, ws);
  const char* p = static_cast<const char*>(screen_weights);
  WideArgs a{};
  encode_bf16_tma_2d(&a.wmap, p, vocab, K / 2, kWPart);  // the int8 rows as 2-byte pairs: boxes of 128 bytes
  encode_bf16_tma_2d(&a.xmap, ws.xp, kWTok, K, kWTok);
  a.M = rows, a.K = K, a.V = vocab, a.units = (vocab + kWUnit - 1) / kWUnit;
  a.meta = reinterpret_cast<const screen::RowMeta*>(p + meta_offset(vocab, K));
  a.x1 = ws.x1, a.ex = ws.ex, a.glo = ws.glo, a.lo = ws.lo, a.cnt = ws.cnt, a.list = ws.list;
  return a;
}
constexpr size_t kWSmem = size_t(kWStages) * kWStageBytes + 2 * kWStages * 8 + 4 * kWTok * 4 + 1024;
void launch_wide_stream(void (*kernel)(WideArgs), const WideArgs& a, cudaStream_t stream) {
  MS_CHECK(raise_dynamic_smem(reinterpret_cast<const void*>(kernel), kWSmem),
           "lmhead_screen: the device refuses {} bytes of shared memory a block", kWSmem);
  launch_pdl(kernel, dim3(unsigned(wide_blocks(a.V))), dim3(kWThreads), kWSmem, stream, a);
}

int launch_wide_hi(const bf16* x, int rows, int K, const void* screen_weights, float amax_all, int vocab,
                   void* workspace, float* hi, cudaStream_t stream) {
  WideArgs a = wide_args(x, rows, K, screen_weights, amax_all, vocab, carve_wide(workspace, K), stream);
  a.hi = hi;
  launch_wide_stream(wide_screen_hi_kernel, a, stream);
  return wide_blocks(vocab);
}

void launch_wide(const bf16* x, int rows, int K, const bf16* w, const void* screen_weights, float amax_all, int vocab,
                 int32_t* out_ids, void* workspace, cudaStream_t stream) {
  const WideWs ws = carve_wide(workspace, K);
  WideArgs a = wide_args(x, rows, K, screen_weights, amax_all, vocab, ws, stream);
  const bool fold = screen_fold();
  a.x = x, a.w = w, a.best = ws.best, a.done = ws.done, a.out_ids = out_ids;
  const int blocks = wide_blocks(vocab);
  launch_wide_stream(fold ? wide_screen_kernel<true> : wide_screen_kernel<false>, a, stream);
  if (fold) return;
  WidePickArgs pa{x, w, K, vocab, a.units, blocks, ws.lo, ws.cnt, ws.list, out_ids};
  launch_pdl(wide_pick_kernel, dim3(unsigned(rows)), dim3(kPickThreads), 0, stream, pa);
}


std::string wide_code(const DeviceInfo& dev) {
  for (const void* k : {reinterpret_cast<const void*>(wide_prep_kernel),
                        reinterpret_cast<const void*>(wide_screen_kernel<false>),
                        reinterpret_cast<const void*>(wide_screen_kernel<true>),
                        reinterpret_cast<const void*>(wide_screen_hi_kernel),
                        reinterpret_cast<const void*>(wide_pick_kernel)})
    if (std::string why = check_kernel_present(k, dev); !why.empty()) return why;
  return "";
}

}  // namespace screen_detail

using namespace screen_detail;

LmheadScreenLists lmhead_screen_wide_lists(const void* workspace, int rows, int K, int vocab) {
  const WideWs ws = carve_wide(const_cast<void*>(workspace), K);
  std::vector<int> cnt(size_t(kWTok) * kMaxGrid);
  MS_CUDA_CHECK(cudaDeviceSynchronize());
  MS_CUDA_CHECK(cudaMemcpy(cnt.data(), ws.cnt, cnt.size() * sizeof(int), cudaMemcpyDeviceToHost));
  LmheadScreenLists r;
  for (int t = 0; t < rows; ++t)
    for (int b = 0; b < wide_blocks(vocab); ++b) {
      const int n = cnt[size_t(t) * kMaxGrid + b];
      r.longest = std::max(r.longest, n);
      r.overflowed += n > kWCap;
    }
  return r;
}

}  // namespace moeserve::cuda

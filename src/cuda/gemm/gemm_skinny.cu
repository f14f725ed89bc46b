// Dense GEMMs of 9-128 tokens on sm_90a warpgroup MMA (wgmma), written for batched decode's projections: cuBLASLt's
// tiles leave the H200's bandwidth idle there (bs 64 step, session 21: q/k/v 21 MB in 7.7-9.5 us, o_proj 16.8 MB in
// 7.7-8.2 us + a 1.8 us split-K reduce) and as a library kernel it cannot start its weight stream during the kernel
// before it. Measured (session 26) it wins only on router-sized W (128 x 2048 at 64 tokens: 4.9 us against 9.6), so
// the gemv backend uses it there (gemm.h kSkinnyMaxN): with 64-row tiles every tile re-reads the token rows from
// L2 (as many bytes as W at 64 tokens), and the short split-K CTAs pay their latencies per few slices.
//
// Layout ("swap AB", as the MoE tiles): weight rows are the MMA's M (64 a CTA, one m64 wgmma), tokens its N (BN =
// 16, 32, 64 or 128, the token count rounded up), K in 64-element slices of 128-byte rows with the 128-byte swizzle
// (chunk c of row r at chunk c ^ (r % 8)). One warpgroup a CTA: every thread copies its chunks of the weight and
// token slices with cp.async into a STAGES-deep ring, then the warpgroup runs the slice's four k16 MMAs with one
// slice's MMAs in flight.
// Programmatic dependent launch: the first STAGES - 1 weight slices (constants) are issued before the wait, the token
// rows (written by the kernel before) after it.
// Split-K: blockIdx.x is the CTA's share of K (kb_per_split slices), and the splits of a row tile form one thread-block
// cluster (at most 8): each CTA leaves its f32 tile in its shared memory, and after a cluster barrier each adds its
// 1/S of the tile over the S CTAs in split order through distributed shared memory (deterministic; no scratch
// buffer, no reduce launch) and stores it.
#include <cooperative_groups.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include "core/env.h"
#include "cuda/device.h"
#include "cuda/gemm/gemm.h"
#include "cuda/launch.h"
#include "cuda/moe/moe_kernel_params.h"
#include "cuda/moe/moe_ptx.cuh"
#include "cuda/moe/route_dev.cuh"
// The routing prep's body for the router + top-k form (prep_body; the kernels' entry points left out).
#define MOE_KERNEL_BODIES_ONLY
#include "cuda/moe/moe_gemm_kernels.cuh"
#undef MOE_KERNEL_BODIES_ONLY
#include "cuda/pdl.cuh"
#include "cuda/tma.h"

namespace moeserve::cuda {
namespace {

constexpr int kSkRows = 64;        // weight rows a CTA: the wgmma's M
constexpr int kSkBK = 64;          // k elements a slice: one 128-byte swizzled row
constexpr int kSkThreads = 128;    // one warpgroup
constexpr int kSkMaxSplits = 8;    // the portable cluster size
constexpr int kSkLdc = kSkRows + 4;  // f32 tile row pitch: the fragment stores hit 32 distinct banks
constexpr int kSkMaxRouteCluster = 16;  // CTAs of the router + top-k form's one cluster (non-portable above 8)

struct SkinnyArgs {
  const bf16* x;
  int64_t ldx;
  int M, K;
  const bf16* W;
  int N;
  void* y;
  int64_t ldy;
  int kb_per_split;  // k slices of each split (the last may have fewer, never none)
  int evict_first;   // the weight stream with the L2 evict_first priority (l2_evict_first_weights)
  int vec_out;       // y and ldy let 4 consecutive outputs store as one vector
  // The router + top-k form (skinny_router_topk, TOPK): every row tile in one cluster of splits x tiles CTAs laid
  // along x (CTA (s, g) at x = g * splits + s), then the top-k of each token's logits row (y, f32).
  int top_k, renormalize;
  int32_t* ids;
  float* weights;
};
// The router + top-k form's arguments: then, where has_prep, the MoE's routing prep over ids by the cluster's first CTA
// (MoeBackend::prep_in_route). (A type of its own: a larger SkinnyArgs changed the other kernels' registers.)
struct SkinnyRouteArgs : SkinnyArgs {
  int has_prep;
  moe_kernels::PrepParams prep;
};

// The ring and the f32 tile in at most ~113 KB, so that two CTAs share an SM (64-144 KB of weights in flight on it).
template <int BN>
constexpr int skinny_stages() {
  return BN == 16 ? 10 : BN == 32 ? 8 : BN == 64 ? 5 : 3;
}
template <int BN>
constexpr size_t skinny_ring_bytes() {
  return size_t(skinny_stages<BN>()) * (kSkRows + BN) * kSkBK * 2;
}
template <int BN>
constexpr size_t skinny_smem_bytes() {
  return 1024 + skinny_ring_bytes<BN>() + size_t(BN) * kSkLdc * 4;  // + the ring's 1024-byte alignment
}

__device__ __forceinline__ int skinny_swz(int row, int chunk) { return row * kSkBK + ((chunk ^ (row & 7)) << 3); }

template <typename OutT>
__device__ __forceinline__ void store_out(OutT* y, int n, int N, bool vec, const float (&v)[4]) {
  if constexpr (sizeof(OutT) == 4) {
    if (vec && n + 3 < N) {
      *reinterpret_cast<float4*>(y + n) = make_float4(v[0], v[1], v[2], v[3]);
      return;
    }
  } else {
    if (vec && n + 3 < N) {
      uint2 p;
      p.x = moe_ptx::pack_bf16x2(v[0], v[1]);
      p.y = moe_ptx::pack_bf16x2(v[2], v[3]);
      *reinterpret_cast<uint2*>(y + n) = p;
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (n + j < N) y[n + j] = OutT(v[j]);
}

// The split-K reduction of both forms: the S splits of a ROWS-row tile left their f32 sums token-major in cs (pitch
// ldc) in their shared memories (cluster ranks rank0 .. rank0 + S - 1; cs itself when not clustered); this split's
// quads of 4 rows [q0, q1) (split_quads) are added up in split order (the same sums whatever CTA stores them) and
// stored to y's rows n0 + r of the tokens below M.
template <int ROWS, int TOKENS>
__device__ __forceinline__ int2 split_quads(int split, int S) {
  constexpr int Q = TOKENS * (ROWS / 4);  // quads of 4 consecutive rows of one token
  return make_int2(split * Q / S, (split + 1) * Q / S);
}
template <int ROWS, int THREADS, typename OutT, typename Cluster>
__device__ __forceinline__ void store_split_sums(Cluster& cluster, bool clustered, const float* cs, int ldc, int S,
                                                 int2 quads, unsigned rank0, int M, OutT* y, int64_t ldy, int n0,
                                                 int N, bool vec) {
  for (int q = quads.x + int(threadIdx.x); q < quads.y; q += THREADS) {
    const int t = q / (ROWS / 4), r = (q % (ROWS / 4)) * 4;
    if (t >= M) continue;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    for (int s = 0; s < S; ++s) {
      const float* src = clustered ? cluster.map_shared_rank(cs, rank0 + unsigned(s)) : cs;
      const float4 p = *reinterpret_cast<const float4*>(src + t * ldc + r);
      v[0] += p.x, v[1] += p.y, v[2] += p.z, v[3] += p.w;
    }
    store_out(y + int64_t(t) * ldy, n0 + r, N, vec, v);
  }
}

// CTA (s, g) of the (S, G) grid takes split s (slices [s kb_per_split, ...)) of row tiles g, g + G, g + 2 G, ...:
// persistent, its ring running on across its tiles, so that each CTA streams its whole share in one wave (short CTAs
// paid their DRAM latency and cluster barriers once per ~32 KB: 13-17 us for q/k/v at 16-64 tokens, H200). The S
// CTAs of a cluster take the same tiles in the same order, so their per-tile reductions meet.
// TOPK (skinny_router_topk): the grid is one cluster of splits x tiles CTAs along x, each CTA one (split, tile);
// after the tile's sums are stored (f32 logits) and the cluster barrier that ends it (release / acquire at cluster
// scope), warp w of CTA r routes tokens 4 r + w, + 4 x CTAs, ... as moe_route_topk does (route_dev::route_token):
// the same logits and the same routing as the skinny GEMM + moe_route_topk, one launch less.
template <int BN, typename OutT, bool TOPK = false>
__global__ void __launch_bounds__(kSkThreads) skinny_gemm_kernel(std::conditional_t<TOPK, SkinnyRouteArgs, SkinnyArgs> a) {
#if MOE_HAVE_WGMMA
  using namespace moe_ptx;
  constexpr int STAGES = skinny_stages<BN>();
  constexpr int CPR = kSkBK / 8;            // 16-byte chunks a row
  constexpr int RPP = kSkThreads / CPR;     // rows one pass of the threads covers
  constexpr int A_IT = kSkRows / RPP, B_IT = BN / RPP;
  static_assert(B_IT >= 1 && BN % 16 == 0, "token tiles of 16, 32, 64 or 128");
  extern __shared__ __align__(16) char smem_raw[];
  char* smem = align_smem(smem_raw, 1024);
  auto* As = reinterpret_cast<unsigned short*>(smem);                  // [STAGES][64][64]
  auto* Bs = As + STAGES * kSkRows * kSkBK;                            // [STAGES][BN][64]
  float* cs = reinterpret_cast<float*>(smem + skinny_ring_bytes<BN>());  // [BN tokens][kSkLdc] the tile's sums
  const int tid = threadIdx.x, ch = tid % CPR;
  const int tiles = (a.N + kSkRows - 1) / kSkRows;
  const int S = TOPK ? int(gridDim.x) / tiles : int(gridDim.x), split = TOPK ? int(blockIdx.x) % S : int(blockIdx.x);
  const int G = TOPK ? tiles : int(gridDim.y), g = TOPK ? int(blockIdx.x) / S : int(blockIdx.y);
  const unsigned rank0 = TOPK ? unsigned(g * S) : 0u;  // cluster rank of this tile's split 0
  const bool clustered = TOPK || S > 1;
  const int units = g < tiles ? (tiles - g + G - 1) / G : 0;  // the same for the CTAs of a cluster
  const int KB = (a.K + kSkBK - 1) / kSkBK;
  const int kb0 = split * a.kb_per_split;
  const int nk = min(KB, kb0 + a.kb_per_split) - kb0;
  const int total = units * nk;  // slices this CTA streams, over all its tiles
  const bool hint = a.evict_first != 0;
  const unsigned long long pol = hint ? l2_evict_first_policy() : 0ull;
  const auto* W = reinterpret_cast<const unsigned short*>(a.W);
  const auto* X = reinterpret_cast<const unsigned short*>(a.x);

  // Slice j: row tile g + (j / nk) G, k slice kb0 + j % nk, into stage j % STAGES.
  auto load_a = [&](int j) {
    const int n0 = (g + (j / nk) * G) * kSkRows, k = (kb0 + j % nk) * kSkBK + ch * 8;
    unsigned short* as = As + (j % STAGES) * kSkRows * kSkBK;
#pragma unroll
    for (int it = 0; it < A_IT; ++it) {
      const int r = tid / CPR + it * RPP;
      const bool ok = n0 + r < a.N && k < a.K;
      cp_async16_hint(as + skinny_swz(r, ch), ok ? W + int64_t(n0 + r) * a.K + k : W, ok, hint, pol);
    }
  };
  auto load_b = [&](int j) {
    const int k = (kb0 + j % nk) * kSkBK + ch * 8;
    unsigned short* bs = Bs + (j % STAGES) * BN * kSkBK;
#pragma unroll
    for (int it = 0; it < B_IT; ++it) {
      const int t = tid / CPR + it * RPP;
      const bool ok = t < a.M && k < a.K;
      cp_async16(bs + skinny_swz(t, ch), ok ? X + int64_t(t) * a.ldx + k : X, ok);
    }
  };

  // The weight slices before the wait (group 0 holds them and token slice 0; group j token slice j).
#pragma unroll
  for (int j = 0; j < STAGES - 1; ++j)
    if (j < total) load_a(j);
  pdl_wait();
#pragma unroll
  for (int j = 0; j < STAGES - 1; ++j) {
    if (j < total) load_b(j);
    cp_async_commit();
  }
  pdl_launch_dependents();

  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int2 quads = split_quads<kSkRows, BN>(split, S);  // this split's share of the stores
  OutT* y = static_cast<OutT*>(a.y);
  const int warp = tid >> 5, lane = tid & 31, m = warp * 16 + (lane >> 2), tig = lane & 3;
  float d[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
  const unsigned a_base = smem_addr(As), b_base = smem_addr(Bs);
#pragma unroll 1
  for (int j = 0; j < total; ++j) {
    cp_async_wait<STAGES - 2>();  // this thread's copies of slice j have landed...
    fence_proxy_async_smem();     // ...are visible to wgmma's (async proxy) reads...
    __syncthreads();              // ...and so are everyone's
    const int st = j % STAGES;
    const unsigned a_st = a_base + unsigned(st * kSkRows * kSkBK * 2), b_st = b_base + unsigned(st * BN * kSkBK * 2);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kSkBK / 16; ++kk)
      wgmma_m64nk16_bf16(d, wgmma_desc_sw128(a_st + kk * 32), wgmma_desc_sw128(b_st + kk * 32));
    wgmma_commit();
    wgmma_wait<1>();  // slice j - 1's MMAs are done (slice j's may still run)...
    __syncthreads();  // ...in every warp: its stage may be refilled
    const int nx = j + STAGES - 1;
    if (nx < total) load_a(nx), load_b(nx);
    cp_async_commit();
    if ((j + 1) % nk != 0) continue;

    // The tile's last slice: its sums through cs (the ring's next slices keep landing meanwhile).
    wgmma_wait<0>();
    wgmma_acc_to_token_major(d, cs, kSkLdc, m, tig);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
    if (clustered)
      cluster.sync();  // every split's sums of this tile in its shared memory
    else
      __syncthreads();
    store_split_sums<kSkRows, kSkThreads>(cluster, clustered, cs, kSkLdc, S, quads, rank0, a.M, y, a.ldy,
                                          (g + (j / nk) * G) * kSkRows, a.N, a.vec_out != 0);
    if (clustered)
      cluster.sync();  // cs is read by every split before any rewrites it (or leaves); with TOPK also the logits'
                       // release to the cluster
    else
      __syncthreads();
  }
  cp_async_wait<0>();
  if constexpr (TOPK) {
    constexpr int kWarps = kSkThreads / 32;
    const int lane = tid & 31;
    for (int t = int(blockIdx.x) * kWarps + (tid >> 5); t < a.M; t += int(gridDim.x) * kWarps)
      route_dev::route_token(reinterpret_cast<const float*>(a.y) + int64_t(t) * a.ldy, t, a.N, a.top_k,
                             a.renormalize != 0, a.ids, a.weights, lane);
    if (a.has_prep) {
      cluster.sync();  // every token's experts are written (release / acquire at cluster scope)
      // The prep in CTA 0, its counts in the ring's first bytes (no CTA reads this one's shared memory any more).
      if (blockIdx.x == 0) moe_kernels::prep_body(a.prep, smem);
    }
  }
#else
  (void)a;  // never launched: skinny_gemm_supported() is false without sm_90a code
#endif
}

// Resident CTAs an SM of each kernel (shared memory bound), asked once.
template <int BN, typename OutT>
int skinny_ctas_per_sm() {
  static const int n = [] {
    int b = 0;
    auto* kernel = skinny_gemm_kernel<BN, OutT>;
    MS_CHECK(raise_dynamic_smem(reinterpret_cast<const void*>(kernel), skinny_smem_bytes<BN>()),
             "skinny GEMM: the device refuses {} bytes of shared memory", skinny_smem_bytes<BN>());
    MS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kSkThreads, skinny_smem_bytes<BN>()));
    return std::max(1, b);
  }();
  return n;
}

// One wave of persistent CTAs: S splits of K (clusters of S, at most 8 and at most the k slices) while the row
// tiles alone fill fewer than the resident slots, then G = min(tiles, slots / S) CTAs a split.
// MOESERVE_SKINNY_SLOTS (CTAs an SM to plan for) and MOESERVE_SKINNY_SPLITS (a fixed split count): measurement
// overrides (0: the plan above).
struct SkinnyPlan {
  int splits, kb_per_split, G, slots;
};
SkinnyPlan skinny_plan(int N, int K, int ctas_per_sm) {
  static const int sms = current_device_multiprocessors();
  static const int slots_env = int(env_int("MOESERVE_SKINNY_SLOTS", 0, 0, 64));
  static const int splits_env = int(env_int("MOESERVE_SKINNY_SPLITS", 0, 0, kSkMaxSplits));
  SkinnyPlan p{};
  p.slots = sms * (slots_env > 0 ? slots_env : ctas_per_sm);
  const int tiles = (N + kSkRows - 1) / kSkRows, kb = (K + kSkBK - 1) / kSkBK;
  p.splits = std::clamp(splits_env > 0 ? splits_env : p.slots / std::max(tiles, 1), 1, std::min(kSkMaxSplits, kb));
  p.kb_per_split = (kb + p.splits - 1) / p.splits;
  p.splits = (kb + p.kb_per_split - 1) / p.kb_per_split;  // no empty split
  p.G = std::min(tiles, std::max(1, p.slots / p.splits));
  return p;
}

template <int BN, typename OutT>
void launch_skinny(SkinnyArgs a, cudaStream_t stream) {
  auto* kernel = skinny_gemm_kernel<BN, OutT>;
  const SkinnyPlan plan = skinny_plan(a.N, a.K, skinny_ctas_per_sm<BN, OutT>());
  const int splits = plan.splits, G = plan.G;
  a.kb_per_split = plan.kb_per_split;
  const dim3 grid{unsigned(splits), unsigned(G)};
  if (splits > 1)
    launch_pdl_cluster(kernel, grid, dim3(kSkThreads), skinny_smem_bytes<BN>(), stream, unsigned(splits), a);
  else
    launch_pdl(kernel, grid, dim3(kSkThreads), skinny_smem_bytes<BN>(), stream, a);
}

template <typename OutT>
void launch_skinny_bn(const SkinnyArgs& a, cudaStream_t stream) {
  if (a.M <= 16) return launch_skinny<16, OutT>(a, stream);
  if (a.M <= 32) return launch_skinny<32, OutT>(a, stream);
  if (a.M <= 64) return launch_skinny<64, OutT>(a, stream);
  launch_skinny<128, OutT>(a, stream);
}

// The router + top-k form: splits x tiles CTAs (at most 16, a non-portable cluster above 8) in one cluster, if the
// device can hold such a cluster of this kernel (asked once per size).
template <int BN>
bool launch_skinny_router_topk(SkinnyRouteArgs a, cudaStream_t stream) {
  auto* kernel = skinny_gemm_kernel<BN, float, true>;
  const int tiles = (a.N + kSkRows - 1) / kSkRows;
  const SkinnyPlan plan = skinny_plan(a.N, a.K, skinny_ctas_per_sm<BN, float>());
  const int kb = (a.K + kSkBK - 1) / kSkBK;
  int splits = std::min(plan.splits, kSkMaxRouteCluster / tiles);
  if (splits < 1) return false;
  a.kb_per_split = (kb + splits - 1) / splits;
  splits = (kb + a.kb_per_split - 1) / a.kb_per_split;  // no empty split
  const int ctas = splits * tiles;
  // No such cluster here: the caller's two launches.
  if (!cluster_fits_device(reinterpret_cast<const void*>(kernel), ctas, kSkThreads, skinny_smem_bytes<BN>()))
    return false;
  launch_pdl_cluster(kernel, dim3(unsigned(ctas)), dim3(kSkThreads), skinny_smem_bytes<BN>(), stream, unsigned(ctas),
                     a);
  return true;
}

// ---- The preloaded split-K form for wide W (preload_gemm, an experiment: MOESERVE_GEMM_PRELOAD=1). Why: at bs 64
// o_proj (2048 x 4096) takes cuBLASLt 7.9 us + a 1.8 us split-K reduce of chain a layer against 3.9 at the read floor
// (session 30), and a library kernel cannot start its weight stream during the attention before it. Here one wave
// of CTAs, each a 128-row tile x its split's k slices (at most 8: o_proj's 128 KB of W), holds its whole share of W
// in shared memory: thread 0 issues every weight box (TMA, 128 rows x 64 k) before the programmatic wait and the
// token boxes (64 rows x 64 k, zero past M) after it, each slice on its own mbarrier; one warpgroup runs m64n128k16
// with the tokens as M as the slices land; the tile's f32 sums go to shared memory (over the consumed weights) and
// the splits of a tile, one thread-block cluster, add them in split order through distributed shared memory (no
// scratch, no reduce launch), as the skinny form does. Session 26's skinny GEMM lost on wide W by its 64-row tiles
// (token rows re-read per 8 KB of W) and short split-K CTAs; session 30's WsLinear by its combine launch.
// The x-ring form (XRING, MOESERVE_GEMM_PRELOAD=2; written in session 42 for q/k/v, 5120 x 2048 at bs 64: 40 tiles x
// 3 splits of 11 slices, whose token rows would not fit beside 176 KB of W): the token slices pass through a ring of
// kPlXStages, slice q + kPlXStages issued into slice q's stage once every warp's MMAs of slice q are done.
constexpr int kPlRows = 128;       // weight rows a CTA: the wgmma's N
constexpr int kPlTok = 64;         // token rows: the wgmma's M
constexpr int kPlBK = 64;          // k a slice: 128-byte rows
constexpr int kPlMaxSlices = 8;    // slices a CTA holds at once, token slices with them: 8 x (16 + 8) KB
constexpr int kPlMaxRingSlices = 12;  // the x-ring form: 12 x 16 KB of W + kPlXStages x 8 KB
constexpr int kPlXStages = 4;
constexpr int kPlMaxSplits = 8;    // the portable cluster size
constexpr int kPlThreads = 128;    // one warpgroup
constexpr int kPlWBytes = kPlRows * kPlBK * 2;  // 16 KB
constexpr int kPlXBytes = kPlTok * kPlBK * 2;   // 8 KB
constexpr int kPlLdc = kPlRows + 4;             // f32 tile [token][row] pitch

struct PreloadArgs {
  moe_kernels::TmaDesc xmap;  // x [M, K], row stride ldx: boxes of 64 k x 64 rows (zero past M)
  moe_kernels::TmaDesc wmap;  // W [N, K]: boxes of 64 k x 128 rows
  int M, N, K, slices;        // slices: k slices of each split (the last split may have fewer, never none)
  void* y;
  int64_t ldy;
  int vec_out;
};

// The weight region, which the f32 tile reuses once the MMAs are done.
constexpr size_t preload_w_region(int slices) {
  const size_t w = size_t(slices) * kPlWBytes, c = (size_t(kPlTok) * kPlLdc * 4 + 1023) / 1024 * 1024;
  return w > c ? w : c;
}
constexpr size_t preload_smem_bytes(int slices, bool x_ring) {
  return 1024 + preload_w_region(slices) + size_t(x_ring ? kPlXStages : slices) * kPlXBytes + size_t(slices) * 8;
}
static_assert(preload_smem_bytes(kPlMaxRingSlices, true) <= (227u << 10), "the x-ring form's largest share fits an SM");
static_assert(preload_smem_bytes(kPlMaxSlices, false) <= (227u << 10), "the whole-x form's largest share fits an SM");

template <typename OutT, bool XRING>
__global__ void __launch_bounds__(kPlThreads, 1) preload_gemm_kernel(const __grid_constant__ PreloadArgs a) {
#if MOE_HAVE_WGMMA
  using namespace moe_ptx;
  extern __shared__ __align__(16) char smem_raw[];
  char* smem = align_smem(smem_raw, 1024);
  const size_t wreg = preload_w_region(a.slices);
  const int xst = XRING ? kPlXStages : a.slices;  // token stages: slice q's in stage q % xst
  const unsigned wbase = smem_addr(smem), xbase = wbase + unsigned(wreg);
  const unsigned bar0 = xbase + unsigned(xst * kPlXBytes);
  const int tid = threadIdx.x, split = int(blockIdx.x), S = int(gridDim.x), tile = int(blockIdx.y);
  const int KT = (a.K + kPlBK - 1) / kPlBK, kt0 = split * a.slices, nk = min(KT, kt0 + a.slices) - kt0;
  if (tid == 0) {
    for (int q = 0; q < nk; ++q) mbar_init(bar0 + 8 * q, 1);
    fence_proxy_async_smem();
    for (int q = 0; q < nk; ++q) {  // the weights are constants: before the wait
      mbar_arrive_expect_tx(bar0 + 8 * q, kPlWBytes + kPlXBytes);
      tma_load_2d(wbase + unsigned(q * kPlWBytes), &a.wmap, (kt0 + q) * kPlBK, tile * kPlRows, bar0 + 8 * q);
    }
  }
  __syncthreads();  // the barriers are initialized
  pdl_wait();       // the token rows come from the kernel before
  if (tid == 0)
    for (int q = 0; q < min(nk, xst); ++q)
      tma_load_2d(xbase + unsigned(q * kPlXBytes), &a.xmap, (kt0 + q) * kPlBK, 0, bar0 + 8 * q);
  pdl_launch_dependents();

  float d[kPlRows / 2];
#pragma unroll
  for (int i = 0; i < kPlRows / 2; ++i) d[i] = 0.0f;
#pragma unroll 1
  for (int q = 0; q < nk; ++q) {
    mbar_wait(bar0 + 8 * q, 0);
    const unsigned xs = xbase + unsigned((q % xst) * kPlXBytes), ws = wbase + unsigned(q * kPlWBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPlBK / 16; ++kk)
      wgmma_m64nk16_bf16(d, wgmma_desc_sw128(xs + kk * 32), wgmma_desc_sw128(ws + kk * 32));
    wgmma_commit();
    wgmma_wait<1>();  // slice q - 1's MMAs are done in this warp
    if constexpr (XRING) {
      const int nx = q - 1 + kPlXStages;  // into slice q - 1's stage, once no warp reads it (the same in every thread)
      if (q >= 1 && nx < nk) {
        __syncthreads();
        if (tid == 0)
          tma_load_2d(xbase + unsigned(((q - 1) % kPlXStages) * kPlXBytes), &a.xmap, (kt0 + nx) * kPlBK, 0,
                      bar0 + 8 * nx);
      }
    }
  }
  wgmma_wait<0>();
  __syncthreads();  // every warp's MMAs have read the weights: the region takes the f32 tile

  // The fragment of m64n128 holds, for j < 16, (token 16 warp + lane / 4, row 8 j + 2 (lane % 4) + {0, 1}) in d[4 j],
  // d[4 j + 1] and token + 8 in d[4 j + 2], d[4 j + 3].
  float* cs = reinterpret_cast<float*>(smem);
  const int warp = tid >> 5, lane = tid & 31, t0 = 16 * warp + lane / 4, c0 = 2 * (lane % 4);
#pragma unroll
  for (int j = 0; j < kPlRows / 8; ++j) {
    *reinterpret_cast<float2*>(cs + t0 * kPlLdc + 8 * j + c0) = make_float2(d[4 * j], d[4 * j + 1]);
    *reinterpret_cast<float2*>(cs + (t0 + 8) * kPlLdc + 8 * j + c0) = make_float2(d[4 * j + 2], d[4 * j + 3]);
  }
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  if (S > 1)
    cluster.sync();  // every split's tile in its shared memory
  else
    __syncthreads();
  store_split_sums<kPlRows, kPlThreads>(cluster, S > 1, cs, kPlLdc, S, split_quads<kPlRows, kPlTok>(split, S), 0u, a.M,
                                        static_cast<OutT*>(a.y), a.ldy, tile * kPlRows, a.N, a.vec_out != 0);
  if (S > 1) cluster.sync();  // no CTA leaves while another still reads its shared memory
#else
  (void)a;  // never launched: preload_gemm_supported() is false without sm_90a code
#endif
}

}  // namespace

int preload_gemm_mode() {
  static const int mode = int(env_int("MOESERVE_GEMM_PRELOAD", 0, 0, 2));
  return mode;
}

bool preload_gemm_supported(const DeviceInfo& dev) {
  if (sm_version(dev) != 90) return false;
  for (const void* k : {reinterpret_cast<const void*>(preload_gemm_kernel<bf16, false>),
                        reinterpret_cast<const void*>(preload_gemm_kernel<float, false>),
                        reinterpret_cast<const void*>(preload_gemm_kernel<bf16, true>),
                        reinterpret_cast<const void*>(preload_gemm_kernel<float, true>)})
    if (!check_kernel_present(k, dev).empty()) return false;
  return true;
}

bool preload_gemm(const bf16* x, int64_t ldx, int M, int K, const bf16* W, int N, void* y, int64_t ldy, OutType out,
                  cudaStream_t stream, bool x_ring) {
  if (M < 1 || M > kPlTok || N < kPlRows || N % kPlRows != 0 || K < 8 || K % 8 != 0 || ldx < K || ldx % 8 != 0 ||
      ldy < N || !aligned_to(x, 16) || !aligned_to(W, 16))
    return false;
  static const int sms = current_device_multiprocessors();
  const int tiles = N / kPlRows, KT = (K + kPlBK - 1) / kPlBK;
  if (tiles > sms) return false;
  int splits = std::clamp(sms / tiles, 1, std::min(kPlMaxSplits, KT));
  const int slices = (KT + splits - 1) / splits;
  const bool ring = slices > kPlMaxSlices;  // the token slices through a ring beside the weights
  if (slices > (x_ring ? kPlMaxRingSlices : kPlMaxSlices)) return false;  // the split's weights would not fit
  splits = (KT + slices - 1) / slices;     // no empty split
  PreloadArgs a{};
  encode_bf16_tma_2d(&a.xmap, x, M, K, kPlTok, ldx);
  encode_bf16_tma_2d(&a.wmap, W, N, K, kPlRows);
  a.M = M, a.N = N, a.K = K, a.slices = slices, a.y = y, a.ldy = ldy;
  const size_t elt = out == OutType::F32 ? 4 : 2;
  a.vec_out = (reinterpret_cast<uintptr_t>(y) % (4 * elt)) == 0 && ldy % 4 == 0;
  const size_t smem = preload_smem_bytes(slices, ring);
  auto launch = [&](auto* kernel) {
    MS_CHECK(raise_dynamic_smem(reinterpret_cast<const void*>(kernel), smem),
             "preloaded GEMM: the device refuses {} bytes of shared memory", smem);
    const dim3 grid{unsigned(splits), unsigned(tiles)};
    if (splits > 1)
      launch_pdl_cluster(kernel, grid, dim3(kPlThreads), smem, stream, unsigned(splits), a);
    else
      launch_pdl(kernel, grid, dim3(kPlThreads), smem, stream, a);
  };
  if (out == OutType::F32)
    ring ? launch(preload_gemm_kernel<float, true>) : launch(preload_gemm_kernel<float, false>);
  else
    ring ? launch(preload_gemm_kernel<bf16, true>) : launch(preload_gemm_kernel<bf16, false>);
  return true;
}

bool skinny_router_topk(const bf16* x, int64_t ldx, int M, int K, const bf16* W, int E, float* logits, int top_k,
                        bool renormalize, int32_t* ids, float* weights, cudaStream_t stream,
                        const moe_kernels::PrepParams* prep) {
  if (!skinny_gemm_fits(M, K, ldx, x, W) || E < 1 || E > kSkinnyMaxN || top_k < 1 || top_k > E ||
      top_k > route_dev::kRouteMaxTopK || (E + kSkRows - 1) / kSkRows > kSkMaxRouteCluster)
    return false;
  MS_CHECK(prep == nullptr || (prep->mode == moe_kernels::kPrepWhole && prep->topk_ids == ids &&
                               prep->num_pairs == M * top_k && prep->num_experts == E &&
                               E <= moe_kernels::kMaxExperts),
           "router + top-k: the routing prep must be a single-CTA prep over these {} x {} ids of {} experts", M,
           top_k, E);
  SkinnyRouteArgs a{};
  static_cast<SkinnyArgs&>(a) = SkinnyArgs{x, ldx, M, K, W, E, logits, E, 0, l2_evict_first_weights() ? 1 : 0, 0};
  a.vec_out = (reinterpret_cast<uintptr_t>(logits) % 16) == 0 && E % 4 == 0;
  a.top_k = top_k, a.renormalize = renormalize ? 1 : 0, a.ids = ids, a.weights = weights;
  a.has_prep = prep != nullptr ? 1 : 0;
  if (prep != nullptr) a.prep = *prep;
  if (M <= 16) return launch_skinny_router_topk<16>(a, stream);
  if (M <= 32) return launch_skinny_router_topk<32>(a, stream);
  if (M <= 64) return launch_skinny_router_topk<64>(a, stream);
  return launch_skinny_router_topk<128>(a, stream);
}

bool skinny_gemm_enabled() {
  static const bool on = env_flag("MOESERVE_GEMM_SKINNY", true);
  return on;
}

bool skinny_gemm_supported(const DeviceInfo& dev) {
  if (sm_version(dev) != 90) return false;
  for (const void* k : {reinterpret_cast<const void*>(skinny_gemm_kernel<16, bf16>),
                        reinterpret_cast<const void*>(skinny_gemm_kernel<32, bf16>),
                        reinterpret_cast<const void*>(skinny_gemm_kernel<64, bf16>),
                        reinterpret_cast<const void*>(skinny_gemm_kernel<128, bf16>),
                        reinterpret_cast<const void*>(skinny_gemm_kernel<16, float>),
                        reinterpret_cast<const void*>(skinny_gemm_kernel<32, float>),
                        reinterpret_cast<const void*>(skinny_gemm_kernel<64, float>),
                        reinterpret_cast<const void*>(skinny_gemm_kernel<128, float>),
                        reinterpret_cast<const void*>(skinny_gemm_kernel<16, float, true>),
                        reinterpret_cast<const void*>(skinny_gemm_kernel<32, float, true>),
                        reinterpret_cast<const void*>(skinny_gemm_kernel<64, float, true>),
                        reinterpret_cast<const void*>(skinny_gemm_kernel<128, float, true>)})
    if (!check_kernel_present(k, dev).empty()) return false;
  return true;
}

bool skinny_gemm_fits(int M, int K, int64_t ldx, const void* x, const void* W) {
  return M >= 1 && M <= kSkinnyMaxM && K > 0 && K % 8 == 0 && ldx >= K && ldx % 8 == 0 && aligned_to(x, 16) &&
         aligned_to(W, 16);
}

void skinny_gemm(const bf16* x, int64_t ldx, int M, int K, const bf16* W, int N, void* y, int64_t ldy, OutType out,
                 cudaStream_t stream) {
  MS_CHECK(skinny_gemm_fits(M, K, ldx, x, W) && N > 0 && ldy >= N,
           "skinny GEMM: M {} K {} N {} ldx {} ldy {} do not fit (M <= {}, K % 8 == 0, 16-byte aligned x and W)", M,
           K, N, ldx, ldy, kSkinnyMaxM);
  SkinnyArgs a{x, ldx, M, K, W, N, y, ldy, 0, l2_evict_first_weights() ? 1 : 0, 0};
  const size_t elt = out == OutType::F32 ? 4 : 2;
  a.vec_out = (reinterpret_cast<uintptr_t>(y) % (4 * elt)) == 0 && ldy % 4 == 0;
  if (out == OutType::F32)
    launch_skinny_bn<float>(a, stream);
  else
    launch_skinny_bn<bf16>(a, stream);
}

std::string skinny_gemm_describe(int M, int N, int K, OutType out) {
  auto occ = [&]() {
    const bool f = out == OutType::F32;
    if (M <= 16) return f ? skinny_ctas_per_sm<16, float>() : skinny_ctas_per_sm<16, bf16>();
    if (M <= 32) return f ? skinny_ctas_per_sm<32, float>() : skinny_ctas_per_sm<32, bf16>();
    if (M <= 64) return f ? skinny_ctas_per_sm<64, float>() : skinny_ctas_per_sm<64, bf16>();
    return f ? skinny_ctas_per_sm<128, float>() : skinny_ctas_per_sm<128, bf16>();
  }();
  const SkinnyPlan p = skinny_plan(N, K, occ);
  return fmt::format("{} CTAs/SM, {} slots, grid {} x {} ({} k-slices a split)", occ, p.slots, p.splits, p.G,
                     p.kb_per_split);
}

}  // namespace moeserve::cuda

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

#include <fmt/format.h>

#include "core/env.h"
#include "cuda/device.h"
#include "cuda/gemm/gemm.h"
#include "cuda/launch.h"
#include "cuda/moe/moe_ptx.cuh"
#include "cuda/pdl.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kSkRows = 64;        // weight rows a CTA: the wgmma's M
constexpr int kSkBK = 64;          // k elements a slice: one 128-byte swizzled row
constexpr int kSkThreads = 128;    // one warpgroup
constexpr int kSkMaxSplits = 8;    // the portable cluster size
constexpr int kSkLdc = kSkRows + 4;  // f32 tile row pitch: the fragment stores hit 32 distinct banks

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

// CTA (s, g) of the (S, G) grid takes split s (slices [s kb_per_split, ...)) of row tiles g, g + G, g + 2 G, ...:
// persistent, its ring running on across its tiles, so that each CTA streams its whole share in one wave (short CTAs
// paid their DRAM latency and cluster barriers once per ~32 KB: 13-17 us for q/k/v at 16-64 tokens, H200). The S
// CTAs of a cluster take the same tiles in the same order, so their per-tile reductions meet.
template <int BN, typename OutT>
__global__ void __launch_bounds__(kSkThreads) skinny_gemm_kernel(SkinnyArgs a) {
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
  const int tiles = (a.N + kSkRows - 1) / kSkRows, G = int(gridDim.y), g = int(blockIdx.y);
  const int units = g < tiles ? (tiles - g + G - 1) / G : 0;  // the same for the CTAs of a cluster
  const int KB = (a.K + kSkBK - 1) / kSkBK;
  const int kb0 = int(blockIdx.x) * a.kb_per_split;
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
  const int S = int(gridDim.x);
  cg::cluster_group cluster = cg::this_cluster();
  constexpr int Q = BN * (kSkRows / 4);  // quads of 4 consecutive rows of one token
  const int q0 = int(blockIdx.x) * Q / S, q1 = (int(blockIdx.x) + 1) * Q / S;  // this split's share of the stores
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
    if (S > 1)
      cluster.sync();  // every split's sums of this tile in its shared memory
    else
      __syncthreads();
    const int n0 = (g + (j / nk) * G) * kSkRows;
    for (int q = q0 + tid; q < q1; q += kSkThreads) {
      const int t = q / (kSkRows / 4), r = (q % (kSkRows / 4)) * 4;
      if (t >= a.M) continue;
      float v[4] = {0.f, 0.f, 0.f, 0.f};
      for (int s = 0; s < S; ++s) {  // in split order: the same sums whatever CTA stores them
        const float* src = S > 1 ? cluster.map_shared_rank(cs, unsigned(s)) : cs;
        const float4 p = *reinterpret_cast<const float4*>(src + t * kSkLdc + r);
        v[0] += p.x, v[1] += p.y, v[2] += p.z, v[3] += p.w;
      }
      store_out(y + int64_t(t) * a.ldy, n0 + r, a.N, a.vec_out != 0, v);
    }
    if (S > 1)
      cluster.sync();  // cs is read by every split before any rewrites it (or leaves)
    else
      __syncthreads();
  }
  cp_async_wait<0>();
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

}  // namespace

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
                        reinterpret_cast<const void*>(skinny_gemm_kernel<128, float>)})
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

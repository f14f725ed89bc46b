// The "gemv" backend: decode-sized GEMMs are bound by reading W once, so the kernels stream W with 16-byte
// loads and let tensor cores do the (nearly free) math: mma.m16n8k16 with 16 weight rows as the MMA's M
// dimension and tokens as its N dimension, 8 at a time. Two kernels:
//  - gemv_bf16_kernel, M <= 8 (and M > kWideMaxM when a test raises the threshold): one token group per
//    block, 16 rows per block, 8 warps split K and meet in shared memory.
//  - gemv_wide_kernel, 8 < M <= kWideMaxM (128): every block holds all ceil(M/8) token tiles in registers,
//    so W is still read once whatever M is; x is staged through shared memory 64 k at a time and shared by
//    the block's 4 warps (64 W rows). Blocks split K (split-K) so that 2048- and 5120-row matrices fill the
//    SMs; each split writes its f32 partial sums to a scratch buffer fixed at prepare(), and a second kernel
//    adds them in split order (deterministic) and writes y.
// Larger M (prefill) goes to cuBLASLt, which is compute-bound there and better at it.
//
// The reduction order over k does not matter, so each lane feeds the MMA the k values it loaded itself
// (8 consecutive ones per 16-byte load) instead of the canonical fragment layout: lane (g = lane/4,
// q = lane%4) loads W rows g and g+8 and token g at k = base + 8q .. base + 8q + 7; the first MMA of the pair
// takes elements 0-3 of that chunk as its virtual k {2q, 2q+1, 2q+8, 2q+9}, the second elements 4-7. A and B
// agree on the mapping (it depends on q only), so the products pair up exactly. gemv_wide_kernel uses the same
// per-lane mapping, with token g's chunk read from shared memory instead of global memory.
#include <algorithm>
#include <climits>
#include <map>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "core/env.h"
#include "cuda/device.h"
#include "cuda/gemm/backends.h"
#include "cuda/fused_norm.cuh"
#include "cuda/launch.h"
#include "cuda/moe/moe_ptx.cuh"
#include "cuda/pdl.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kWarps = 8;            // per block; they split K
constexpr int kRows = 16;            // W rows per block: the MMA's M
constexpr int kTokens = 8;           // tokens per block: the MMA's N
constexpr int kKPerIteration = 64;   // per warp and iteration: two 16-byte chunks per lane and row
constexpr unsigned kPrefetchBlocks = 512;  // blocks that prefetch their rows: 16 MiB for K = 2048
constexpr int kStride = kWarps * kKPerIteration;  // k between one warp's iterations
// The cp.async ring of gemv_bf16_kernel<..., STAGES > 0>: STAGES k-iterations a warp, each 16 rows x 64 k; kRingStages
// (64 KiB: all of a K = 2048 row block), kDeepRingStages for gemv_residual_out's longer rows (launch_gemv).
constexpr int kRingStages = 4;
constexpr int kDeepRingStages[] = {8, 6};  // deepest first
constexpr int kRingStageElems = kRows * kKPerIteration;
constexpr size_t ring_bytes(int stages) { return size_t(kWarps) * size_t(stages) * kRingStageElems * sizeof(bf16); }

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// W is read exactly once: stream it past L1.
__device__ __forceinline__ uint4 load_weight(const bf16* p) { return __ldcs(reinterpret_cast<const uint4*>(p)); }
// x is written by the kernel before (a programmatic dependent launch starts this one while that kernel runs):
// never the non-coherent path (ld.global.nc / __ldg), whose cached lines may predate the wait; read via L2.
__device__ __forceinline__ uint4 load_token(const bf16* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// The MMAs of one ring slice (16 rows x 64 k from k = kb, row r's chunk c at c ^ 4 (r & 1)) against the token row at
// xr (lane (g, q): token g's k = 8q .. from shared memory); the lane mapping of the header comment.
__device__ __forceinline__ void mma_ring_slice(float (&c)[4], const bf16* sl, const bf16* xr, int kb, int K, int g, int q,
                                               bool has_token) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int ch = (q + 4 * h) ^ ((g & 1) << 2);  // rows g and g + 8 have the same parity
    const uint4 lo = *reinterpret_cast<const uint4*>(sl + g * kKPerIteration + 8 * ch);
    const uint4 hi = *reinterpret_cast<const uint4*>(sl + (g + 8) * kKPerIteration + 8 * ch);
    const int k = kb + 32 * h;
    const uint4 b = has_token && k + 8 * q < K ? *reinterpret_cast<const uint4*>(xr + k) : make_uint4(0, 0, 0, 0);
    mma_bf16(c, lo.x, hi.x, lo.y, hi.y, b.x, b.y);
    mma_bf16(c, lo.z, hi.z, lo.w, hi.w, b.z, b.w);
  }
}

// The fused norm prologue of gemv_bf16_kernel<OutT, kNormRows> (norm_gemv): x = rmsnorm(residual + delta) * w is
// computed by every block into shared memory; the last block adds delta into the residual.
struct NormArgs {
  float* residual;   // [M, K] f32
  const bf16* delta;  // [M, K] or nullptr (then the residual is only read)
  const bf16* weight;  // [K]
  float eps;
  int* counter;
};
constexpr int kNormPad = 8;  // bf16 of padding per shared row: the 8 token rows a quarter-warp reads hit 8 banks

// The residual fusion of gemv_bf16_kernel (gemv_norm_in / gemv_residual_out): a decode step's residual stream
// carried between GEMVs as the f32 residual plus per-part sums of squares, so that no norm needs a launch or a
// block-wide reduction of its own.
struct ResidualArgs {
  float* residual;            // [M, K] read (NORM_IN) / [M, N] updated (RES_OUT)
  const float* partials_in;   // NORM_IN: [M, nparts_in], summed in index order (a fixed xor tree)
  int nparts_in;
  const bf16* weight;         // NORM_IN: the RMSNorm weight [K]
  float eps;
  bf16* xn_out;               // NORM_IN: block x = 0 also writes the normalized rows here, when non-null
  float* partials_out;        // RES_OUT: [M, ceil(n_main / 16)]
  int evict_first;            // RING: the weight slices with the L2 evict_first priority (l2_evict_first_weights)
  // Extra rows (GemvExtraRows): rows n >= n_main (a multiple of 16, so whole blocks) go to ext_out[m, n - n_main]
  // as f32 instead of y, and take no part in the residual update. n_main = N: none.
  int n_main = INT_MAX;
  float* ext_out = nullptr;
  int64_t ld_ext = 0;
};
enum GemvPrologue { kPlainX, kNormRows, kNormIn };

// Tokens t0 .. t0 + tokens - 1 (tokens <= kTokens) as shared-memory rows of stride K + kNormPad: x's rows as they are,
// or (stage_norm_rows) bf16(rmsnorm(residual) * weight) from the residual fusion's partial sums, also written to
// ra.xn_out when non-null and `write_xn`. Every warp sums each token's partials itself (lanes strided, then a fixed
// xor tree: the same order in every warp and block), so no barrier is needed before the caller's one after the rows.
__device__ __forceinline__ void stage_token_rows(const bf16* x, int64_t ldx, int t0, int tokens, int K, bf16* rows) {
  for (int i = threadIdx.x; i < tokens * (K / 8); i += blockDim.x) {
    const int t = i / (K / 8), c = i % (K / 8);
    *reinterpret_cast<uint4*>(rows + t * (K + kNormPad) + 8 * c) = load_token(x + int64_t(t0 + t) * ldx + 8 * c);
  }
}
__device__ __forceinline__ void stage_norm_rows(const ResidualArgs& ra, int t0, int tokens, int K, bf16* rows,
                                                bool write_xn) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    if (t >= tokens) break;
    const float* part = ra.partials_in + int64_t(t0 + t) * ra.nparts_in;
    float ss = 0.f;
    for (int i = lane; i < ra.nparts_in; i += 32) ss += __ldcg(part + i);
    const float inv = rms_inverse_from_lane_sums(ss, K, ra.eps);
    const float4* r = reinterpret_cast<const float4*>(ra.residual + int64_t(t0 + t) * K);
    for (int c = threadIdx.x; c < K / 4; c += blockDim.x) {
      bf16* row = rows + t * (K + kNormPad) + 4 * c;
      store_norm4(row, __ldcg(r + c), ra.weight + 4 * c, inv);
      if (ra.xn_out != nullptr && write_xn)
        *reinterpret_cast<uint2*>(ra.xn_out + int64_t(t0 + t) * K + 4 * c) = *reinterpret_cast<const uint2*>(row);
    }
  }
}
// Block (blockIdx.x, blockIdx.y) computes rows [16 bx, 16 bx + 16) for tokens [8 by, 8 by + 8). Needs
// K % 8 == 0, ldx % 8 == 0 and 16-byte aligned x and W (checked on the host). PRO == kNormRows: x is the normalized
// residual (NormArgs), one token group (M <= 8), K + kNormPad bf16 of dynamic shared memory per token; kNormIn: x
// is bf16(rmsnorm(residual) * weight) with the sums of squares from ra.partials_in (same shared memory). RES_OUT:
// besides y, residual[m, n] += float(bf16(y[m, n])) and ra.partials_out[m, bx] = the block's rows' sum of squares.
//
// STAGES > 0 (RING): each warp streams its 16 rows through a cp.async ring of STAGES 64-k slices in shared memory
// (ring_bytes(STAGES) at the start of the dynamic shared memory, the token rows after it), the first STAGES slices
// issued before
// the programmatic wait: a 1-token GEMV of K <= 2048 then has all its weight bytes in flight while the kernel
// before still runs, and no load waits on a register (ptxas schedules register loads just ahead of their MMAs,
// which leaves each warp one memory round trip an iteration). The plain x is staged into shared memory as well.
template <typename OutT, int PRO = kPlainX, bool RES_OUT = false, int STAGES = 0>
__global__ void __launch_bounds__(kWarps * 32) gemv_bf16_kernel(const bf16* x, int64_t ldx, int M,
                                                                 int K, const bf16* __restrict__ W, int N,
                                                                 OutT* __restrict__ y, int64_t ldy, NormArgs na,
                                                                 ResidualArgs ra) {
  constexpr bool NORM = PRO != kPlainX;
  constexpr bool RING = STAGES > 0;
  constexpr int kS = RING ? STAGES : 1;  // (the ring's index arithmetic, also compiled without a ring)
  __shared__ float partial[kWarps][kRows][kTokens];
  extern __shared__ __align__(16) bf16 gemv_dyn_smem[];
  bf16* norm_rows = gemv_dyn_smem + ring_bytes(STAGES) / sizeof(bf16);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;
  const int n0 = blockIdx.x * kRows, t0 = blockIdx.y * kTokens;
  // The block's weight rows are contiguous: start them towards L2 (one bulk prefetch) while the kernel before
  // may still run. Only the first kPrefetchBlocks blocks do: beyond that the prefetched lines of a large matrix
  // (lm_head) would push each other out of L2 before use.
  // RING: this warp's k-iterations i (k = 64 warp + kStride i), slice i in stage i % STAGES; chunk c of row r
  // at chunk c ^ 4 (r & 1), so that the two rows a quarter-warp reads fill all 32 banks once.
  bf16* my_ring = gemv_dyn_smem + warp * kS * kRingStageElems;
  const int iters = warp * kKPerIteration < K ? (K - warp * kKPerIteration + kStride - 1) / kStride : 0;
  const bool hint = RING && ra.evict_first != 0;
  const unsigned long long wpol = hint ? moe_ptx::l2_evict_first_policy() : 0ull;
  auto load_slice = [&](int i) {
    bf16* dst = my_ring + (i % kS) * kRingStageElems;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int id = lane + 32 * m, r = id >> 3, c = id & 7;
      const int k = warp * kKPerIteration + i * kStride + 8 * c;
      const bool ok = i < iters && k < K;  // else a zero fill (the address is not read)
      moe_ptx::cp_async16_hint(dst + r * kKPerIteration + ((c ^ ((r & 1) << 2)) << 3),
                               ok ? W + int64_t(min(n0 + r, N - 1)) * K + k : W, ok, hint, wpol);
    }
  };
  if constexpr (RING) {
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      load_slice(i);
      moe_ptx::cp_async_commit();
    }
  } else if (threadIdx.x == 0 && blockIdx.y == 0 && blockIdx.x < kPrefetchBlocks) {
    prefetch_l2(W + int64_t(n0) * K, unsigned(min(kRows, N - n0)) * unsigned(K) * unsigned(sizeof(bf16)));
  }
  pdl_enter();
  if constexpr (PRO == kNormRows) {
    norm_rows_to_smem(na.residual, na.delta, na.weight, na.eps, M, K, norm_rows, K + kNormPad);
  } else if constexpr (PRO == kNormIn) {
    stage_norm_rows(ra, t0, min(kTokens, M - t0), K, norm_rows, blockIdx.x == 0);
    __syncthreads();
  } else if constexpr (RING) {
    // The block's token rows into shared memory (the same layout as the normalized rows).
    stage_token_rows(x, ldx, t0, min(kTokens, M - t0), K, norm_rows);
    __syncthreads();
  }
  constexpr bool X_IN_SMEM = NORM || RING;
  if constexpr (X_IN_SMEM) {
    x = norm_rows;
    ldx = K + kNormPad;
  }
  const int tokens = min(kTokens, M - t0);
  // Rows past N read row N-1 (valid memory) and are never stored: no branch in the streaming loop.
  const bf16* w_lo = W + int64_t(min(n0 + g, N - 1)) * K + 8 * q;
  const bf16* w_hi = W + int64_t(min(n0 + g + 8, N - 1)) * K + 8 * q;
  const bool has_token = g < tokens;
  const bf16* xt = x + int64_t(t0 + (has_token ? g : 0)) * ldx + 8 * q;

  float c[4] = {0.f, 0.f, 0.f, 0.f};
  if constexpr (RING) {
    const bf16* xr = norm_rows + (has_token ? g : 0) * (K + kNormPad) + 8 * q;
    for (int i = 0; i < iters; ++i) {
      moe_ptx::cp_async_wait<kS - 1>();  // this lane's copies of slice i have landed...
      __syncwarp();                                // ...and the warp's
      const bf16* sl = my_ring + (i % kS) * kRingStageElems;
      const int kb = warp * kKPerIteration + i * kStride;
      mma_ring_slice(c, sl, xr, kb, K, g, q, has_token);
      __syncwarp();  // the stage is refilled by slice i + STAGES
      load_slice(i + kS);
      moe_ptx::cp_async_commit();
    }
    moe_ptx::cp_async_wait<0>();
  }
#pragma unroll 4
  for (int k0 = warp * kKPerIteration; k0 < (RING ? 0 : K); k0 += kWarps * kKPerIteration) {
    uint4 a_lo[2], a_hi[2], b[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int k = k0 + 32 * h;
      const bool in = k + 8 * q < K;
      a_lo[h] = in ? load_weight(w_lo + k) : make_uint4(0, 0, 0, 0);
      a_hi[h] = in ? load_weight(w_hi + k) : make_uint4(0, 0, 0, 0);
      if constexpr (X_IN_SMEM)
        b[h] = in && has_token ? *reinterpret_cast<const uint4*>(xt + k) : make_uint4(0, 0, 0, 0);
      else
        b[h] = in && has_token ? load_token(xt + k) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mma_bf16(c, a_lo[h].x, a_hi[h].x, a_lo[h].y, a_hi[h].y, b[h].x, b[h].y);
      mma_bf16(c, a_lo[h].z, a_hi[h].z, a_lo[h].w, a_hi[h].w, b[h].z, b[h].w);
    }
  }
  // c[0], c[1]: row g, tokens 2q, 2q+1; c[2], c[3]: row g+8, same tokens.
  partial[warp][g][2 * q] = c[0];
  partial[warp][g][2 * q + 1] = c[1];
  partial[warp][g + 8][2 * q] = c[2];
  partial[warp][g + 8][2 * q + 1] = c[3];
  __syncthreads();
  if (threadIdx.x < kRows * kTokens) {
    const int r = threadIdx.x % kRows, t = threadIdx.x / kRows;  // consecutive threads: consecutive y addresses
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][r][t];
    const bool ext = n0 >= ra.n_main;  // the whole block (n_main % kRows == 0)
    if (t < tokens && n0 + r < N) {
      if (ext) ra.ext_out[int64_t(t0 + t) * ra.ld_ext + (n0 + r - ra.n_main)] = sum;
      else store(y + int64_t(t0 + t) * ldy + n0 + r, sum);
    }
    if constexpr (RES_OUT) {
      if (!ext) {
        // Token t's rows are threads 16 t .. 16 t + 15 (an aligned half-warp; threads 0-127 are whole warps).
        static_assert(kRows == 16, "a token's rows in an aligned half-warp");
        const int width = ra.n_main;  // the residual's
        float v = 0.f;
        if (t < tokens && n0 + r < width) {
          float* rp = ra.residual + int64_t(t0 + t) * width + n0 + r;
          v = __ldcg(rp) + __bfloat162float(__float2bfloat16_rn(sum));
          *rp = v;
        }
        float sq = v * v;
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
        if (r == 0 && t < tokens) ra.partials_out[int64_t(t0 + t) * ((width + kRows - 1) / kRows) + blockIdx.x] = sq;
      }
    }
  }
  if constexpr (PRO == kNormRows) {
    if (na.delta != nullptr && finished_last(na.counter)) add_to_residual(na.residual, na.delta, M, K);
  }
}

// Launches gemv_bf16_kernel for one or more token groups: the cp.async ring (RING; MOESERVE_GEMV_RING=0 off) for up
// to kRingMaxM tokens when the grid, with the ring's shared memory, is still one wave on this device, else the
// register-streaming loop; PRO != kPlainX or RING: the token rows in dynamic shared memory. Served q30b8l decode
// steps (H200, session 13) with the ring and the residual fusion against neither: bs 1 -19 to -30 us, bs 2 -6 to
// -15; but bs 4 +5 to +8 and bs 8 +16 to +18 when the ring served every fitting grid, hence kRingMaxM (and at 4 or
// 8 tokens the token rows push the q/k/v GEMV's 320 blocks into a second wave: +30-45 us without the one-wave rule).
constexpr int kRingMaxM = 2;

// The deepest ring allowed (MOESERVE_GEMV_RING_STAGES, default kDeepRingStages[0]; 4 keeps kRingStages):
// gemv_residual_out's rows longer than kRingStages slices a warp (K > 2048: o_proj's 4096) take the deepest of
// kDeepRingStages that keeps the grid one wave, so that more of their weights are in flight before the programmatic
// wait (at K = 4096 the 4-stage ring holds half of a block's rows, 6 stages three quarters). Served q30b8l decode
// step, H200, session 18 (same call): bs 1 -4.6 us (554.6 against 559.2 / 561.0 overlapped), bs 64 even.
int gemv_ring_stages_wanted() {
  static const int stages =
      int(env_int("MOESERVE_GEMV_RING_STAGES", kDeepRingStages[0], kRingStages, kDeepRingStages[0]));
  return stages;
}

// Blocks of `kernel` an SM with `smem` bytes of dynamic shared memory, its shared-memory ceiling raised to at least
// that (raise_dynamic_smem: a kernel launched at several sizes keeps the largest; setting the attribute to each size
// once let a smaller size lower it under a larger one cached before, session 15): once per (kernel, size) in a
// process (one device per process), not at every eager launch.
int prepared_blocks_per_sm(const void* kernel, size_t smem) {
  static std::mutex mu;
  static std::map<std::pair<const void*, size_t>, int> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(kernel, smem);
  if (auto it = known.find(key); it != known.end()) return it->second;
  int per_sm = 0;
  if (smem <= (227 << 10)) {
    MS_CHECK(raise_dynamic_smem(kernel, smem), "gemv: the device refuses {} bytes of shared memory", smem);
    MS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarps * 32, smem));
  }
  known.emplace(key, per_sm);
  return per_sm;
}

template <typename OutT, int PRO = kPlainX, bool RES_OUT = false>
void launch_gemv(dim3 grid, cudaStream_t stream, const bf16* x, int64_t ldx, int M, int K, const bf16* W, int N,
                 OutT* y, int64_t ldy, const NormArgs& na, const ResidualArgs& ra) {
  static const bool ring_on = env_flag("MOESERVE_GEMV_RING", true);
  ResidualArgs ra_hint = ra;  // (the weight streams' L2 priority, cuda/device.h)
  ra_hint.evict_first = l2_evict_first_weights() ? 1 : 0;
  static const int sms = current_device_multiprocessors();
  const size_t rows = size_t(std::min(M, kTokens)) * size_t(K + kNormPad) * sizeof(bf16);
  // The ring at `stages` if the grid stays one wave with it.
  auto try_ring = [&](auto kernel, int stages) {
    const size_t smem = ring_bytes(stages) + rows;
    const int per_sm = prepared_blocks_per_sm(reinterpret_cast<const void*>(kernel), smem);
    if (per_sm <= 0 || int64_t(per_sm) * sms < int64_t(grid.x) * grid.y) return false;
    launch_pdl(kernel, grid, dim3(kWarps * 32), smem, stream, x, ldx, M, K, W, N, y, ldy, na, ra_hint);
    return true;
  };
  if (ring_on && M <= kRingMaxM) {
    if constexpr (RES_OUT) {  // (only o_proj's form has rows this long in the models served: fewer kernels to build)
      const int wanted = gemv_ring_stages_wanted(), slices = int(ceil_div(K, kStride));  // a warp's k-iterations
      if (wanted >= kDeepRingStages[0] && slices >= kDeepRingStages[0] &&
          try_ring(gemv_bf16_kernel<OutT, PRO, RES_OUT, kDeepRingStages[0]>, kDeepRingStages[0]))
        return;
      if (wanted >= kDeepRingStages[1] && slices > kRingStages &&
          try_ring(gemv_bf16_kernel<OutT, PRO, RES_OUT, kDeepRingStages[1]>, kDeepRingStages[1]))
        return;
    }
    if (try_ring(gemv_bf16_kernel<OutT, PRO, RES_OUT, kRingStages>, kRingStages)) return;
  }
  auto kernel = gemv_bf16_kernel<OutT, PRO, RES_OUT, 0>;
  const size_t smem = PRO != kPlainX ? rows : 0;
  MS_CHECK(raise_dynamic_smem(reinterpret_cast<const void*>(kernel), smem),
           "gemv: the device refuses {} bytes of shared memory", smem);
  launch_pdl(kernel, grid, dim3(kWarps * 32), smem, stream, x, ldx, M, K, W, N, y, ldy, na, ra_hint);
}

// ---- gemv_stream_kernel: a vocabulary-sized W at M <= 8 (lm_head) ----
// One block an SM, persistent: block b takes the contiguous run of 16-row blocks [b R / G, (b + 1) R / G) and its 8
// warps stream each row block together (warp w its 64-k slices w, w + 8, ...) through per-warp cp.async rings of
// kStreamStages slices that run on across row blocks, so a block keeps its next two row blocks (128 KB of contiguous
// W at K = 2048) in flight for the whole matrix, with no drain between row blocks (unlike a grid of one block a row
// block). The warps' partial products meet in double-buffered shared memory, one barrier a row block.
// bench/gpu_read_bw measured cp.async rings of 64-128 KB a block at 4.56-4.58 TB/s on the H200, where cuBLASLt reads
// the 622 MB lm_head at ~4.16 TB/s. A first form with each warp on its own run of whole row blocks (1,056 streams of
// 1 KB runs a row) read at 4.18 (session 20). Needs M <= 8, K % 8 == 0, ldx % 8 == 0, 16-byte aligned x and W.
// A warp's ring: 4 x 2 KB, 64 KB a block, two blocks an SM (the 622 MB lm_head in 138.3 us at 1 token, 4.50 TB/s,
// against 143.3 us with one 8-stage block an SM: session 21's test_cuda_gemm bandwidth rows, same call).
constexpr int kStreamStages = 4;
constexpr int kStreamBlocksPerSm = 2;
constexpr size_t stream_smem_bytes(int M, int K, int stages = kStreamStages) {
  return ring_bytes(stages) + size_t(M) * size_t(K + kNormPad) * sizeof(bf16);
}
// Whether a block fits an SM: the dynamic bytes above plus the kernel's static partial sums.
constexpr bool stream_smem_fits(size_t dynamic_bytes) {
  return dynamic_bytes + size_t(2) * kWarps * kRows * kTokens * sizeof(float) <= (227u << 10);
}

template <typename OutT, int kStreamStages = kStreamStages>
__global__ void __launch_bounds__(kWarps * 32) gemv_stream_kernel(const bf16* x, int64_t ldx, int M, int K,
                                                                   const bf16* __restrict__ W, int N,
                                                                   OutT* __restrict__ y, int64_t ldy, int evict_first,
                                                                   ResidualArgs ra) {
  __shared__ float partial[2][kWarps][kRows][kTokens];
  extern __shared__ __align__(16) bf16 gemv_dyn_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;
  bf16* ring = gemv_dyn_smem + warp * kStreamStages * kRingStageElems;
  bf16* xs = gemv_dyn_smem + ring_bytes(kStreamStages) / sizeof(bf16);
  const int ldxs = K + kNormPad;
  const int64_t row_blocks = (N + kRows - 1) / kRows;
  const int64_t rb0 = int64_t(blockIdx.x) * row_blocks / gridDim.x;
  const int64_t rb1 = int64_t(blockIdx.x + 1) * row_blocks / gridDim.x;
  const int slices = (K + kKPerIteration - 1) / kKPerIteration;  // a row block's
  const int per_warp = (slices + kWarps - 1) / kWarps;            // this warp's slices of a row block, padded
  const int64_t total = (rb1 - rb0) * per_warp;
  const unsigned long long wpol = evict_first ? moe_ptx::l2_evict_first_policy() : 0ull;
  // Slice i of the warp's sequence: row block rb0 + i / per_warp, k slice warp + kWarps (i % per_warp); row r's chunk
  // c at c ^ 4 (r & 1). Padding slices (past K) and slices past the run are zero fills that read nothing.
  int64_t next_rb = rb0;
  int next_u = 0;
  // (The same copies as gemv_bf16_kernel's load_slice, written out in each kernel: as a shared function ptxas
  // allocated the measured kernels' registers differently.)
  auto load_next = [&](int64_t i) {
    bf16* dst = ring + int(i % kStreamStages) * kRingStageElems;
    const bool live = i < total;
    const int kb = (warp + kWarps * next_u) * kKPerIteration;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int id = lane + 32 * m, r = id >> 3, c = id & 7;
      const int k = kb + 8 * c;
      const bool ok = live && k < K;
      const int64_t row = min(next_rb * kRows + r, int64_t(N) - 1);
      moe_ptx::cp_async16_hint(dst + r * kKPerIteration + ((c ^ ((r & 1) << 2)) << 3), ok ? W + row * K + k : W, ok,
                               evict_first != 0, wpol);
    }
    moe_ptx::cp_async_commit();
    if (++next_u == per_warp) next_u = 0, ++next_rb;
  };
  // W is never written: its first slices go out before the programmatic wait.
  for (int i = 0; i < kStreamStages; ++i) load_next(i);
  pdl_enter();
  if (ra.residual != nullptr)  // x = the normalized residual, as gemv_norm_in computes it
    stage_norm_rows(ra, 0, M, K, xs, false);
  else
    stage_token_rows(x, ldx, 0, M, K, xs);
  __syncthreads();
  const bool has_token = g < M;
  const bf16* xr = xs + (has_token ? g : 0) * ldxs + 8 * q;
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  int64_t rb = rb0;
  int u = 0;
  for (int64_t i = 0; i < total; ++i) {
    moe_ptx::cp_async_wait<kStreamStages - 1>();  // this lane's copies of slice i have landed...
    __syncwarp();                                 // ...and the warp's
    const bf16* sl = ring + int(i % kStreamStages) * kRingStageElems;
    const int kb = (warp + kWarps * u) * kKPerIteration;
    mma_ring_slice(c, sl, xr, kb, K, g, q, has_token);
    __syncwarp();  // the stage is refilled by slice i + kStreamStages
    load_next(i + kStreamStages);
    if (++u < per_warp) continue;
    // The row block's last slice of this warp: c[0], c[1] are row g, tokens 2q, 2q + 1; c[2], c[3] row g + 8.
    const int buf = int((rb - rb0) & 1);
    partial[buf][warp][g][2 * q] = c[0];
    partial[buf][warp][g][2 * q + 1] = c[1];
    partial[buf][warp][g + 8][2 * q] = c[2];
    partial[buf][warp][g + 8][2 * q + 1] = c[3];
    c[0] = c[1] = c[2] = c[3] = 0.f;
    // One barrier a row block: buffer buf is complete, and the other one (row block rb - 1) was summed before
    // any warp passed this barrier, so the warps may write it for row block rb + 1 from here on.
    __syncthreads();
    if (threadIdx.x < kRows * kTokens) {
      const int r = threadIdx.x % kRows, t = threadIdx.x / kRows;
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += partial[buf][w][r][t];
      const int64_t n = rb * kRows + r;
      if (t < M && n < N) store(y + int64_t(t) * ldy + n, sum);
    }
    u = 0, ++rb;
  }
  moe_ptx::cp_async_wait<0>();
}

// MOESERVE_GEMV_STREAM_STAGES (A/B): 4 (default, two blocks an SM, 64 KB each), 6 (two blocks, 96 KB), 8 (one block,
// 128 KB: session 20's form) or 12 (one block, 192 KB). A form whose shared memory does not fit falls back to the
// default, then to one 8-stage block an SM, then to one 4-stage block (gemv_stream_fits' bound).
template <typename OutT>
void launch_gemv_stream(const bf16* x, int64_t ldx, int M, int K, const bf16* W, int N, OutT* y, int64_t ldy,
                        const ResidualArgs& ra, cudaStream_t stream) {
  static const int sms = current_device_multiprocessors();
  static const int wanted = int(env_int("MOESERVE_GEMV_STREAM_STAGES", kStreamStages, 4, 12));
  const int evict_first = l2_evict_first_weights() ? 1 : 0;
  auto try_launch = [&](auto kernel, int stages, int blocks_per_sm) {
    const size_t smem = stream_smem_bytes(M, K, stages);
    if (!stream_smem_fits(smem)) return false;
    const int per_sm = prepared_blocks_per_sm(reinterpret_cast<const void*>(kernel), smem);
    if (per_sm < blocks_per_sm) return false;
    launch_pdl(kernel, dim3(unsigned(sms * blocks_per_sm)), dim3(kWarps * 32), smem, stream, x, ldx, M, K, W, N, y,
               ldy, evict_first, ra);
    return true;
  };
  if (wanted == 6 && try_launch(gemv_stream_kernel<OutT, 6>, 6, kStreamBlocksPerSm)) return;
  if (wanted == 8 && try_launch(gemv_stream_kernel<OutT, 8>, 8, 1)) return;
  if (wanted == 12 && try_launch(gemv_stream_kernel<OutT, 12>, 12, 1)) return;
  if (try_launch(gemv_stream_kernel<OutT>, kStreamStages, kStreamBlocksPerSm)) return;
  if (try_launch(gemv_stream_kernel<OutT, 8>, 8, 1)) return;  // token rows too large for two blocks an SM
  MS_CHECK(try_launch(gemv_stream_kernel<OutT>, kStreamStages, 1),
           "gemv_stream: {} bytes of shared memory (M {} K {}) do not fit an SM", stream_smem_bytes(M, K), M, K);
}

// ---- gemv_wide_kernel: 8 < M <= kWideMaxM ----
constexpr int kWideWarps = 4;                   // per block; warp w owns W rows [16 w, 16 w + 16) of the block
constexpr int kWideRows = kWideWarps * kRows;   // W rows per block
constexpr int kWideK = 64;                      // k per iteration: two 16-byte chunks per lane and row
constexpr int kWideMaxM = 128;                  // 16 token tiles: 64 f32 accumulators per thread
constexpr int kWideBlocksPerSm = 3;             // split-K aims at this many blocks per SM
// Split-K scratch, allocated in prepare(): splits * M * N floats must fit, else fewer splits are used
// (splits = 1 needs none). 4 Mi floats = 16 MiB: M = 128 with N = 5120 still gets 6 splits, M = 64 with
// N = 5120 12, M = 64 with N = 2048 32.
constexpr int64_t kSplitScratchFloats = int64_t(4) << 20;

// Block (blockIdx.x, blockIdx.y) computes rows [64 bx, 64 bx + 64) for all M tokens over
// k in [by k_split, by k_split + k_split) ∩ [0, K). With partial == nullptr (one split) it stores y, else
// partial[by][m][n] (f32, dense [splits][M][N]). Needs K % 8 == 0, ldx % 8 == 0, 16-byte aligned x and W,
// k_split % 64 == 0 and M <= 8 kTiles.
template <typename OutT, int kTiles>
__global__ void __launch_bounds__(kWideWarps * 32) gemv_wide_kernel(const bf16* x, int64_t ldx,
                                                                     int M, int K, int k_split,
                                                                     const bf16* __restrict__ W, int N,
                                                                     OutT* __restrict__ y, int64_t ldy,
                                                                     float* __restrict__ partial) {
  // Token r's 8 chunks of 16 bytes, chunk c stored at slot c ^ (4 (r & 1)): a quarter-warp's reads (tokens
  // g = 2i, 2i + 1, chunks q + 4h) then cover all 32 banks once.
  __shared__ __align__(16) bf16 xs[kTiles * kTokens][kWideK];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;
  const int n0 = blockIdx.x * kWideRows + warp * kRows;
  const int kb = blockIdx.y * k_split, ke = min(K, kb + k_split);
  const int tiles = (M + kTokens - 1) / kTokens;  // <= kTiles (host)
  pdl_enter();
  // Rows past N read row N-1 (valid memory) and are never stored: no branch in the streaming loop.
  const bf16* w_lo = W + int64_t(min(n0 + g, N - 1)) * K + 8 * q;
  const bf16* w_hi = W + int64_t(min(n0 + g + 8, N - 1)) * K + 8 * q;

  float c[kTiles][4];
#pragma unroll
  for (int t = 0; t < kTiles; ++t) c[t][0] = c[t][1] = c[t][2] = c[t][3] = 0.f;

  // W for the current iteration; the next iteration's is loaded before this one's MMAs (one step ahead).
  uint4 a_lo[2], a_hi[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int k = kb + 32 * h;
    const bool in = k + 8 * q < ke;  // K, kb, ke are multiples of 8: a chunk is all in or all out
    a_lo[h] = in ? load_weight(w_lo + k) : make_uint4(0, 0, 0, 0);
    a_hi[h] = in ? load_weight(w_hi + k) : make_uint4(0, 0, 0, 0);
  }
  for (int k0 = kb; k0 < ke; k0 += kWideK) {
    __syncthreads();  // the previous iteration's reads of xs are done
    for (int i = threadIdx.x; i < tiles * kTokens * 8; i += kWideWarps * 32) {
      const int r = i / 8, ch = i % 8, k = k0 + 8 * ch;
      const uint4 v = r < M && k < ke ? load_token(x + int64_t(r) * ldx + k) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(&xs[r][8 * (ch ^ ((r & 1) << 2))]) = v;
    }
    __syncthreads();
    uint4 n_lo[2], n_hi[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int k = k0 + kWideK + 32 * h;
      const bool in = k + 8 * q < ke;
      n_lo[h] = in ? load_weight(w_lo + k) : make_uint4(0, 0, 0, 0);
      n_hi[h] = in ? load_weight(w_hi + k) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      if (t < tiles) {
        const int r = t * kTokens + g;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint4 b = *reinterpret_cast<const uint4*>(&xs[r][8 * ((q + 4 * h) ^ ((r & 1) << 2))]);
          mma_bf16(c[t], a_lo[h].x, a_hi[h].x, a_lo[h].y, a_hi[h].y, b.x, b.y);
          mma_bf16(c[t], a_lo[h].z, a_hi[h].z, a_lo[h].w, a_hi[h].w, b.z, b.w);
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      a_lo[h] = n_lo[h];
      a_hi[h] = n_hi[h];
    }
  }
  // c[t][0], c[t][1]: row g, tokens 8t + 2q, 8t + 2q + 1; c[t][2], c[t][3]: row g + 8, same tokens.
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    if (t < tiles) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int tok = t * kTokens + 2 * q + (i & 1), row = n0 + g + (i >= 2 ? 8 : 0);
        if (tok < M && row < N) {
          if (partial)
            partial[(int64_t(blockIdx.y) * M + tok) * N + row] = c[t][i];
          else
            store(y + int64_t(tok) * ldy + row, c[t][i]);
        }
      }
    }
  }
}

// y[m, n] = sum over s = 0, 1, ... of partial[s][m][n], always in that order.
template <typename OutT>
__global__ void __launch_bounds__(256) splitk_reduce_kernel(const float* partial, int splits, int M,
                                                             int N, OutT* __restrict__ y, int64_t ldy) {
  pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, mn = int64_t(M) * N;
  if (i >= mn) return;
  float sum = 0.f;
  for (int s = 0; s < splits; ++s) sum += partial[s * mn + i];
  store(y + (i / N) * ldy + i % N, sum);
}

template <typename OutT, int kTiles>
void launch_wide(const bf16* x, int64_t ldx, int M, int K, int k_split, const bf16* W, int N, void* y,
                 int64_t ldy, float* partial, cudaStream_t stream, dim3 grid) {
  launch_pdl(gemv_wide_kernel<OutT, kTiles>, grid, dim3(kWideWarps * 32), 0, stream, x, ldx, M, K, k_split, W, N,
             static_cast<OutT*>(y), ldy, partial);
}

template <typename OutT>
void launch_wide_tiles(int tiles, const bf16* x, int64_t ldx, int M, int K, int k_split, const bf16* W, int N,
                       void* y, int64_t ldy, float* partial, cudaStream_t stream, dim3 grid) {
  if (tiles <= 2)
    launch_wide<OutT, 2>(x, ldx, M, K, k_split, W, N, y, ldy, partial, stream, grid);
  else if (tiles <= 4)
    launch_wide<OutT, 4>(x, ldx, M, K, k_split, W, N, y, ldy, partial, stream, grid);
  else if (tiles <= 8)
    launch_wide<OutT, 8>(x, ldx, M, K, k_split, W, N, y, ldy, partial, stream, grid);
  else
    launch_wide<OutT, 16>(x, ldx, M, K, k_split, W, N, y, ldy, partial, stream, grid);
}

class GemvBackend final : public GemmBackend {
 public:
  explicit GemvBackend(int kernel_max_m)
      : kernel_max_m_(kernel_max_m),
        max_weight_bytes_(double(env_int("MOESERVE_GEMV_MAX_WEIGHT_MB", 128, 0, 1 << 20)) * (1 << 20)),
        fallback_(make_cublaslt_backend()) {
    spec_.name = "gemv";
    spec_.family = OpFamily::Gemm;
    spec_.formats = {"bf16"};
    spec_.capturable = true;
    spec_.summary = fmt::format(
        "bandwidth-bound tensor-core kernels for M <= {} (W read once with 16-byte loads) and, on sm_90a, wgmma "
        "kernels for 9-{} tokens of W up to {} rows; cuBLASLt for the rest",
        kernel_max_m, kSkinnyMaxM, kSkinnyMaxN);
  }
  ~GemvBackend() override {
    if (scratch_) cudaFree(scratch_);
  }
  GemvBackend(const GemvBackend&) = delete;
  GemvBackend& operator=(const GemvBackend&) = delete;
  const BackendSpec& spec() const override { return spec_; }

  std::string prepare(const DeviceInfo& dev, std::string& code) override {
    std::string lib;
    if (std::string why = fallback_->prepare(dev, lib); !why.empty()) return "its cuBLASLt fallback: " + why;
    code = "kernel " + sm_name(sm_version(dev)) + " in binary, " + lib + " for larger M";
    if (std::string why = check_arch_claim(spec_, dev); !why.empty()) return why;
    for (const void* k : {reinterpret_cast<const void*>(gemv_bf16_kernel<bf16>),
                          reinterpret_cast<const void*>(gemv_bf16_kernel<float>),
                          reinterpret_cast<const void*>(gemv_wide_kernel<bf16, 2>),
                          reinterpret_cast<const void*>(gemv_wide_kernel<bf16, 4>),
                          reinterpret_cast<const void*>(gemv_wide_kernel<bf16, 8>),
                          reinterpret_cast<const void*>(gemv_wide_kernel<bf16, 16>),
                          reinterpret_cast<const void*>(gemv_wide_kernel<float, 2>),
                          reinterpret_cast<const void*>(gemv_wide_kernel<float, 4>),
                          reinterpret_cast<const void*>(gemv_wide_kernel<float, 8>),
                          reinterpret_cast<const void*>(gemv_wide_kernel<float, 16>),
                          reinterpret_cast<const void*>(gemv_bf16_kernel<bf16, kNormRows>),
                          reinterpret_cast<const void*>(gemv_bf16_kernel<bf16, kNormIn>),
                          reinterpret_cast<const void*>(gemv_bf16_kernel<float, kNormIn>),
                          reinterpret_cast<const void*>(gemv_bf16_kernel<bf16, kPlainX, true>),
                          reinterpret_cast<const void*>(gemv_stream_kernel<bf16>),
                          reinterpret_cast<const void*>(gemv_stream_kernel<float>),
                          reinterpret_cast<const void*>(splitk_reduce_kernel<bf16>),
                          reinterpret_cast<const void*>(splitk_reduce_kernel<float>)})
      if (std::string why = check_kernel_present(k, dev); !why.empty()) return why;
    // The split-K scratch: fixed here so that run() never allocates (CUDA graph capture). Only a threshold
    // above one token group reaches the split-K kernel.
    if (!scratch_ && kernel_max_m_ > kTokens) {
      void* p = nullptr;
      if (cudaError_t e = cudaMalloc(&p, size_t(kSplitScratchFloats) * sizeof(float)); e != cudaSuccess) {
        cudaGetLastError();
        return fmt::format("cannot allocate the {} MiB split-K scratch: {}",
                           (size_t(kSplitScratchFloats) * sizeof(float)) >> 20, cudaGetErrorString(e));
      }
      scratch_ = static_cast<float*>(p);
    }
    multiprocessors_ = std::max(1, dev.multiprocessors);
    skinny_ = skinny_gemm_enabled() && skinny_gemm_supported(dev);
    if (skinny_)
      code += ", wgmma kernels for 9-" + std::to_string(kSkinnyMaxM) + " tokens of W up to " +
              std::to_string(kSkinnyMaxN) + " rows";
    prepared_ = true;
    return "";
  }

  void run(const bf16* x, int64_t ldx, int M, int K, const bf16* W, int N, void* y, int64_t ldy, OutType out,
           cudaStream_t stream) override {
    MS_CHECK(prepared_, "GEMM backend gemv used before prepare()");
    MS_CHECK(M >= 0 && N >= 0 && K >= 0 && ldx >= K && ldy >= N, "bad GEMM arguments M={} N={} K={} ldx={} ldy={}",
             M, N, K, ldx, ldy);
    if (M == 0 || N == 0) return;
    // 9-128 tokens, a router-sized W: the skinny wgmma GEMM (gemm.h says why not wider).
    if (skinny_ && M > kTokens && M <= kSkinnyMaxM && N <= kSkinnyMaxN && skinny_gemm_fits(M, K, ldx, x, W))
      return skinny_gemm(x, ldx, M, K, W, N, y, ldy, out, stream);
    const int64_t token_groups = ceil_div(M, kTokens);
    // W over MOESERVE_GEMV_MAX_WEIGHT_MB (default 128 MiB; 0: no limit), i.e. an lm_head, goes to cuBLASLt, which
    // streams it faster (H200, 151,936 x 2,048: 143.5 us against 151.0 at 1 token, 146.6 against 176.2 at 8); the
    // layers' matrices stay here (4,096 x 2,048 at 1 token: 4.7 us against 6.9).
    const bool small_w = max_weight_bytes_ <= 0 || double(N) * double(K) * sizeof(bf16) <= max_weight_bytes_;
    const bool kernel_fits = M <= kernel_max_m_ && K > 0 && K % 8 == 0 && ldx % 8 == 0 && aligned_to(x, 16) &&
                             aligned_to(W, 16) && token_groups <= 65535 && small_w;
    // A vocabulary-sized W at one token group: the streaming kernel (MOESERVE_GEMV_STREAM=0: cuBLASLt as before).
    if (!small_w && gemv_stream_enabled() && gemv_stream_fits(M, K) && ldx % 8 == 0 && aligned_to(x, 16) &&
        aligned_to(W, 16))
      return gemv_stream(x, ldx, M, K, W, N, y, ldy, out, stream);
    if (!kernel_fits) return fallback_->run(x, ldx, M, K, W, N, y, ldy, out, stream);
    if (M > kTokens && M <= kWideMaxM) return run_wide(x, ldx, M, K, W, N, y, ldy, out, stream);
    const dim3 grid(unsigned(ceil_div(N, kRows)), unsigned(token_groups));
    if (out == OutType::BF16)
      launch_gemv(grid, stream, x, ldx, M, K, W, N, static_cast<bf16*>(y), ldy, NormArgs{}, ResidualArgs{});
    else
      launch_gemv(grid, stream, x, ldx, M, K, W, N, static_cast<float*>(y), ldy, NormArgs{}, ResidualArgs{});
  }

  // The kernels here are this binary's (loaded with it); the counts cuBLASLt serves.
  std::vector<int> warm_up_tokens(int max_m) const override { return fallback_->warm_up_tokens(max_m); }

 private:
  // 8 < M <= kWideMaxM. The split count depends on the shape and the device only (deterministic results).
  void run_wide(const bf16* x, int64_t ldx, int M, int K, const bf16* W, int N, void* y, int64_t ldy,
                OutType out, cudaStream_t stream) {
    const int64_t row_blocks = ceil_div(N, kWideRows), k_iters = ceil_div(K, kWideK);
    int64_t splits = std::clamp<int64_t>(ceil_div(int64_t(kWideBlocksPerSm) * multiprocessors_, row_blocks), 1,
                                         std::min<int64_t>(k_iters, 65535));
    splits = std::min(splits, std::max<int64_t>(1, kSplitScratchFloats / (int64_t(M) * N)));
    const int64_t k_split = ceil_div(k_iters, splits) * kWideK;
    splits = ceil_div(K, k_split);  // no empty split; only ever smaller, so the scratch bound still holds
    const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(splits));
    const int tiles = int(ceil_div(M, kTokens));
    float* partial = splits > 1 ? scratch_ : nullptr;
    if (out == OutType::BF16)
      launch_wide_tiles<bf16>(tiles, x, ldx, M, K, int(k_split), W, N, y, ldy, partial, stream, grid);
    else
      launch_wide_tiles<float>(tiles, x, ldx, M, K, int(k_split), W, N, y, ldy, partial, stream, grid);
    if (!partial) return;
    const unsigned blocks = unsigned(ceil_div(int64_t(M) * N, 256));
    if (out == OutType::BF16)
      launch_pdl(splitk_reduce_kernel<bf16>, dim3(blocks), dim3(256), 0, stream, partial, int(splits), M, N,
                 static_cast<bf16*>(y), ldy);
    else
      launch_pdl(splitk_reduce_kernel<float>, dim3(blocks), dim3(256), 0, stream, partial, int(splits), M, N,
                 static_cast<float*>(y), ldy);
  }

  BackendSpec spec_;
  int kernel_max_m_;
  double max_weight_bytes_;
  std::unique_ptr<GemmBackend> fallback_;
  bool prepared_ = false;
  bool skinny_ = false;  // 8 < M <= kSkinnyMaxM on the skinny wgmma GEMM (sm_90 with its code, switch on)
  float* scratch_ = nullptr;  // kSplitScratchFloats floats, from prepare() (thresholds above kTokens only)
  int multiprocessors_ = 1;
};

}  // namespace

bool gemv_stream_fits(int M, int K) {
  return M >= 1 && M <= kTokens && K > 0 && K % 8 == 0 && stream_smem_fits(stream_smem_bytes(M, K));
}

void gemv_stream(const bf16* x, int64_t ldx, int M, int K, const bf16* W, int N, void* y, int64_t ldy, OutType out,
                 cudaStream_t stream) {
  MS_CHECK(gemv_stream_fits(M, K) && N > 0 && ldx >= K && ldx % 8 == 0 && ldy >= N,
           "gemv_stream: M {} K {} N {} ldx {} ldy {} do not fit", M, K, N, ldx, ldy);
  MS_CHECK(aligned_to(x, 16) && aligned_to(W, 16), "gemv_stream: x and W must be 16-byte aligned");
  if (out == OutType::BF16)
    launch_gemv_stream(x, ldx, M, K, W, N, static_cast<bf16*>(y), ldy, ResidualArgs{}, stream);
  else
    launch_gemv_stream(x, ldx, M, K, W, N, static_cast<float*>(y), ldy, ResidualArgs{}, stream);
}

bool gemv_stream_enabled() {
  static const bool on = env_flag("MOESERVE_GEMV_STREAM", true);
  return on;
}

void gemv_stream_norm_in(const float* residual, const float* partials, int nparts, const bf16* norm_w, float eps,
                         int M, int K, const bf16* W, int N, void* y, int64_t ldy, OutType out, cudaStream_t stream) {
  MS_CHECK(gemv_stream_fits(M, K) && N > 0 && ldy >= N && nparts >= 1 && partials != nullptr,
           "gemv_stream_norm_in: M {} K {} N {} ldy {} nparts {} do not fit", M, K, N, ldy, nparts);
  MS_CHECK(aligned_to(residual, 16) && aligned_to(W, 16) && (reinterpret_cast<uintptr_t>(norm_w) & 7) == 0,
           "gemv_stream_norm_in: residual and W 16-byte, the norm weight 8-byte aligned");
  const ResidualArgs ra{const_cast<float*>(residual), partials, nparts, norm_w, eps, nullptr, nullptr};
  if (out == OutType::BF16)
    launch_gemv_stream(static_cast<const bf16*>(nullptr), 0, M, K, W, N, static_cast<bf16*>(y), ldy, ra, stream);
  else
    launch_gemv_stream(static_cast<const bf16*>(nullptr), 0, M, K, W, N, static_cast<float*>(y), ldy, ra, stream);
}

bool norm_gemv_fits(int M, int K) { return M >= 1 && M <= kNormGemvMaxM && K > 0 && K % 8 == 0 && K <= 4096; }

void norm_gemv(float* residual, const bf16* delta, const bf16* norm_w, float eps, int M, int K, const bf16* W, int N,
               bf16* y, int64_t ldy, int* counter, cudaStream_t stream) {
  MS_CHECK(norm_gemv_fits(M, K) && N > 0 && ldy >= N, "norm_gemv: M {} K {} N {} ldy {} do not fit", M, K, N, ldy);
  MS_CHECK(aligned_to(residual, 16) && aligned_to(W, 16) && (delta == nullptr || aligned_to(delta, 16)) &&
               (reinterpret_cast<uintptr_t>(norm_w) & 7) == 0 && (delta == nullptr || counter != nullptr),
           "norm_gemv: residual, delta and W must be 16-byte aligned, the norm weight 8-byte aligned, and an update "
           "of the residual needs a counter");
  launch_gemv<bf16, kNormRows>(dim3(unsigned(ceil_div(N, kRows))), stream, nullptr, 0, M, K, W, N, y, ldy,
                               NormArgs{residual, delta, norm_w, eps, counter}, ResidualArgs{});
}

bool residual_gemv_fits(int M, int K) { return M >= 1 && M <= kResidualGemvMaxM && K > 0 && K % 8 == 0 && K <= 4096; }

int residual_gemv_parts(int N) { return int(ceil_div(N, kRows)); }

namespace {
// The extra rows' arguments into ra (checked); N_main: the rows that go to y.
void set_extra_rows(ResidualArgs& ra, int N, const GemvExtraRows& ext, const char* what) {
  ra.n_main = N;
  if (ext.rows == 0) return;
  MS_CHECK(ext.rows > 0 && ext.out != nullptr && ext.ld >= ext.rows && N % kRows == 0,
           "{}: {} extra rows (ld {}) after {} rows: the main rows must be a multiple of {}", what, ext.rows, ext.ld,
           N, kRows);
  ra.ext_out = ext.out;
  ra.ld_ext = ext.ld;
}
}  // namespace

void gemv_norm_in(const float* residual, const float* partials, int nparts, const bf16* norm_w, float eps, int M,
                  int K, const bf16* W, int N, void* y, int64_t ldy, OutType out, bf16* xn_out,
                  cudaStream_t stream, const GemvExtraRows& ext) {
  MS_CHECK(residual_gemv_fits(M, K) && N > 0 && ldy >= N && nparts >= 1 && partials != nullptr,
           "gemv_norm_in: M {} K {} N {} ldy {} nparts {} do not fit", M, K, N, ldy, nparts);
  MS_CHECK(aligned_to(residual, 16) && aligned_to(W, 16) && (reinterpret_cast<uintptr_t>(norm_w) & 7) == 0 &&
               (xn_out == nullptr || (reinterpret_cast<uintptr_t>(xn_out) & 7) == 0),
           "gemv_norm_in: residual and W 16-byte, the norm weight and xn_out 8-byte aligned");
  ResidualArgs ra{const_cast<float*>(residual), partials, nparts, norm_w, eps, xn_out, nullptr};
  set_extra_rows(ra, N, ext, "gemv_norm_in");
  const int rows = N + ext.rows;
  const dim3 grid(unsigned(ceil_div(rows, kRows)));
  if (out == OutType::BF16)
    launch_gemv<bf16, kNormIn>(grid, stream, nullptr, 0, M, K, W, rows, static_cast<bf16*>(y), ldy, NormArgs{}, ra);
  else
    launch_gemv<float, kNormIn>(grid, stream, nullptr, 0, M, K, W, rows, static_cast<float*>(y), ldy, NormArgs{}, ra);
}

void gemv_residual_out(const bf16* x, int64_t ldx, int M, int K, const bf16* W, int N, bf16* y, int64_t ldy,
                       float* residual, float* partials, cudaStream_t stream, const GemvExtraRows& ext) {
  MS_CHECK(residual_gemv_fits(M, K) && N > 0 && ldy >= N && ldx >= K && ldx % 8 == 0 && residual != nullptr &&
               partials != nullptr,
           "gemv_residual_out: M {} K {} N {} ldx {} ldy {} do not fit", M, K, N, ldx, ldy);
  MS_CHECK(aligned_to(x, 16) && aligned_to(W, 16), "gemv_residual_out: x and W must be 16-byte aligned");
  ResidualArgs ra{residual, nullptr, 0, nullptr, 0.f, nullptr, partials};
  set_extra_rows(ra, N, ext, "gemv_residual_out");
  const int rows = N + ext.rows;
  launch_gemv<bf16, kPlainX, true>(dim3(unsigned(ceil_div(rows, kRows))), stream, x, ldx, M, K, W, rows, y, ldy,
                                   NormArgs{}, ra);
}

std::unique_ptr<GemmBackend> make_gemv_backend(int kernel_max_m) {
  return std::make_unique<GemvBackend>(kernel_max_m);
}

}  // namespace moeserve::cuda

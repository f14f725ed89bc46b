// The lm_head of a greedy decode step with the argmax in its epilogue, for 1-64 token rows on sm_90a. Why: at bs 64
// cuBLASLt read the 622 MB lm_head at 3.62 TB/s (171.8 us of the step's chain) and the greedy sampler then read its
// 39 MB of f32 logits (19.2 us). H200 (session 40): 167.3 us from 16 to 64 rows in test_gpu_lmhead_argmax's Timing
// (3.72 TB/s; cuBLAS + greedy 166.1 / 174.7 / 186.1 at 16 / 32 / 64 rows, 155.8 against our 162.2 at one row, hence
// the executor's 32-row floor); in the served bs 64 step 159.2 + 5.1 us (merge) against 171.8 + 19.2.
//
// Form: one CTA an SM walking units of kRows vocabulary rows x all K (unit blockIdx.x, + gridDim.x, ...; 151,936 rows
// make 792 units of 192 = 6 a CTA on 132 SMs). Warpgroup 0 produces: its thread 0 issues, for every 64-column slice,
// one TMA box of the token rows (64 rows, zero past M) and one of the unit's weight rows (zero past V) into a
// kStages-deep ring on mbarriers; the weight boxes of the first ring pass go out before the programmatic wait (the
// weights are constants), the token boxes after it. Warpgroups 1 and 2 each take 96 of the unit's rows as
// wgmma m64n64k16 + m64n32k16 with the tokens as M (A: the token tile, B: the weight rows, both K-major with the
// 128-byte swizzle), one slice's MMAs in flight. A unit's epilogue reduces each thread's 24 columns of its two token
// rows to the greedy sampler's running state (max, lowest id at the max, sum of exp(x - max)), merges the quad's
// lanes by shuffles and the two warpgroups through shared memory, and writes one state a (token, unit); the merge
// launch folds a token's unit states in unit order (deterministic) into its id and raw logprob.
#include "cuda/sampling/lmhead_argmax.h"

#include <algorithm>
#include <cfloat>
#include <climits>

#include "core/error.h"
#include "cuda/device.h"
#include "cuda/launch.h"
#include "cuda/moe/moe_kernel_params.h"
#include "cuda/moe/moe_ptx.cuh"
#include "cuda/pdl.cuh"
#include "cuda/registry.h"
#include "cuda/sampling/greedy_state.cuh"
#include "cuda/tma.h"

namespace moeserve::cuda {
namespace {

constexpr int kRows = 192;                       // vocabulary rows a unit
constexpr int kHalf = kRows / 2;                 // a consumer warpgroup's rows: m64n64 + m64n32
constexpr int kTok = 64;                         // token rows a step (the MMAs' M)
constexpr int kBK = 64;                          // k a slice: 128-byte rows
constexpr int kStages = 6;
constexpr int kThreads = 384;                    // producer warpgroup + two MMA warpgroups
constexpr int kTokBytes = kTok * kBK * 2;        // 8 KB
constexpr int kRowBytes = kRows * kBK * 2;       // 24 KB
constexpr int kStageBytes = kTokBytes + kRowBytes;
constexpr int kMergeThreads = 256;

using greedy_state::State;
using greedy_state::add;
using greedy_state::merge;
using greedy_state::empty_state;
using greedy_state::shfl_xor;

struct Args {
  moe_kernels::TmaDesc xmap;  // tokens [M, K] bf16, boxes of 64 x 64 rows
  moe_kernels::TmaDesc wmap;  // weights [V, K] bf16, boxes of 64 x kRows rows
  int M, K, V, units;
  State* partials;  // [M][units]
};

__global__ void __launch_bounds__(kThreads, 1) lmhead_argmax_kernel(const __grid_constant__ Args a) {
#if MOE_HAVE_WGMMA
  using namespace moe_ptx;
  extern __shared__ char smem_raw[];
  char* smem = align_smem(smem_raw, 1024);
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem + kStages * kStageBytes);
  State* xchg = reinterpret_cast<State*>(bars + 2 * kStages);  // [2][kTok]: the second warpgroup's token states
  const unsigned ring = smem_addr(smem), full0 = smem_addr(bars), empty0 = full0 + kStages * 8;
  const int tid = threadIdx.x, wg = tid / 128;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full0 + s * 8, 1);   // the producer's expect_tx arrival
      mbar_init(empty0 + s * 8, 2);  // one arrival a consumer warpgroup
    }
    fence_proxy_async_smem();
  }
  __syncthreads();
  const int KT = (a.K + kBK - 1) / kBK;
  const int my_units = a.units > int(blockIdx.x) ? (a.units - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  const int total = my_units * KT;  // slices of this CTA's walk
  if (wg == 0) {
    if (tid == 0) {
      // Slice q: unit blockIdx.x + (q / KT) gridDim.x, columns (q % KT) 64. The first ring pass's weight boxes
      // before the wait; every token box after it.
      const int pre = total < kStages ? total : kStages;
      for (int q = 0; q < pre; ++q) {
        const unsigned st = ring + unsigned(q * kStageBytes);
        mbar_arrive_expect_tx(full0 + q * 8, kStageBytes);
        const int unit = int(blockIdx.x) + (q / KT) * int(gridDim.x);
        tma_load_2d(st + kTokBytes, &a.wmap, (q % KT) * kBK, unit * kRows, full0 + q * 8);
      }
      pdl_wait();  // the token rows come from the kernel before
      pdl_launch_dependents();
      for (int q = 0; q < pre; ++q) tma_load_2d(ring + unsigned(q * kStageBytes), &a.xmap, (q % KT) * kBK, 0, full0 + q * 8);
      for (int q = pre; q < total; ++q) {
        const int stage = q % kStages;
        mbar_wait(empty0 + stage * 8, ((q / kStages) & 1) ^ 1);
        const unsigned st = ring + unsigned(stage * kStageBytes);
        mbar_arrive_expect_tx(full0 + stage * 8, kStageBytes);
        const int unit = int(blockIdx.x) + (q / KT) * int(gridDim.x);
        tma_load_2d(st, &a.xmap, (q % KT) * kBK, 0, full0 + stage * 8);
        tma_load_2d(st + kTokBytes, &a.wmap, (q % KT) * kBK, unit * kRows, full0 + stage * 8);
      }
    } else {
      pdl_wait();  // every thread waits (the grid completes only after its predecessor)
    }
    return;
  }
  pdl_wait();
  // ---- MMA warpgroups: cw = 0 / 1 takes rows [96 cw, 96 cw + 96) of each unit.
  const int cw = wg - 1, ctid = tid - 128, lane = ctid % 32;
  const int tok0 = 16 * ((ctid % 128) / 32) + lane / 4;  // this thread's token rows tok0, tok0 + 8 (warp in its group)
  int q = 0;
  for (int ui = 0; ui < my_units; ++ui) {
    const int unit = int(blockIdx.x) + ui * int(gridDim.x);
    float d64[32], d32[16];
#pragma unroll
    for (int i = 0; i < 32; ++i) d64[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) d32[i] = 0.0f;
    for (int kt = 0; kt < KT; ++kt, ++q) {
      const int stage = q % kStages;
      mbar_wait(full0 + stage * 8, (q / kStages) & 1);
      const unsigned xs = ring + unsigned(stage * kStageBytes);
      const unsigned ws = xs + kTokBytes + unsigned(cw * kHalf * kBK * 2);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        wgmma_m64nk16_bf16(d64, wgmma_desc_sw128(xs + kk * 32), wgmma_desc_sw128(ws + kk * 32));
        wgmma_m64nk16_bf16(d32, wgmma_desc_sw128(xs + kk * 32), wgmma_desc_sw128(ws + 64 * kBK * 2 + kk * 32));
      }
      wgmma_commit();
      wgmma_wait<1>();  // the slice before this one is read: release its stage
      if (kt > 0 && ctid % 128 == 0) mbar_arrive(empty0 + ((q - 1) % kStages) * 8);
    }
    wgmma_wait<0>();
    if (ctid % 128 == 0) mbar_arrive(empty0 + ((q - 1) % kStages) * 8);
    // Epilogue: the fragment of m64nN holds, for j < N / 8, (token tok0, column 8 j + 2 (lane % 4) + {0, 1}) in
    // d[4 j], d[4 j + 1] and token tok0 + 8 in d[4 j + 2], d[4 j + 3].
    const int row0 = unit * kRows + cw * kHalf + 2 * (lane % 4);
    State s0 = empty_state(), s1 = empty_state();
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int id = row0 + 8 * j + e;
        if (id < a.V) {
          add(s0, d64[4 * j + e], id);
          add(s1, d64[4 * j + 2 + e], id);
        }
      }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int id = row0 + 64 + 8 * j + e;
        if (id < a.V) {
          add(s0, d32[4 * j + e], id);
          add(s1, d32[4 * j + 2 + e], id);
        }
      }
    // The quad's four lanes hold the same two tokens: lanes in order (a fixed tree).
    s0 = merge(s0, shfl_xor(s0, 1));
    s1 = merge(s1, shfl_xor(s1, 1));
    s0 = merge(s0, shfl_xor(s0, 2));
    s1 = merge(s1, shfl_xor(s1, 2));
    if (cw == 1 && lane % 4 == 0) {
      xchg[tok0] = s0;
      xchg[tok0 + 8] = s1;
    }
    asm volatile("bar.sync 1, 256;\n" ::: "memory");  // the second warpgroup's states are in xchg
    if (cw == 0 && lane % 4 == 0) {
      if (tok0 < a.M) a.partials[size_t(tok0) * a.units + unit] = merge(s0, xchg[tok0]);
      if (tok0 + 8 < a.M) a.partials[size_t(tok0 + 8) * a.units + unit] = merge(s1, xchg[tok0 + 8]);
    }
    asm volatile("bar.sync 1, 256;\n" ::: "memory");  // xchg is read before the next unit writes it
  }
#else
  (void)a;
#endif
}

// One block a token: its unit states merged in unit order per thread (strided), then the threads' states in thread
// order (a fixed tree), as greedy.cu's block reduction.
__global__ void __launch_bounds__(kMergeThreads) lmhead_argmax_merge_kernel(const State* partials, int units,
                                                                            int32_t* out_ids, float* out_lp) {
  pdl_enter();
  const State* p = partials + size_t(blockIdx.x) * units;
  State s = empty_state();
  for (int u = threadIdx.x; u < units; u += kMergeThreads) {
    const State t{__ldcg(&p[u].max), __ldcg(&p[u].id), __ldcg(&p[u].sum)};
    s = merge(s, t);
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) s = merge(s, shfl_xor(s, o));
  __shared__ State warps[kMergeThreads / 32];
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    s = threadIdx.x < kMergeThreads / 32 ? warps[threadIdx.x] : empty_state();
#pragma unroll
    for (int o = 16; o > 0; o /= 2) s = merge(s, shfl_xor(s, o));
    if (threadIdx.x == 0) {
      out_ids[blockIdx.x] = s.id;
      if (out_lp) out_lp[blockIdx.x] = -logf(s.sum);
    }
  }
}

size_t kernel_smem() { return size_t(kStages) * kStageBytes + 2 * kStages * 8 + kTok * sizeof(State) + 1024; }

}  // namespace

int lmhead_argmax_units(int vocab) { return (vocab + kRows - 1) / kRows; }
size_t lmhead_argmax_workspace_bytes(int max_rows, int vocab) {
  return size_t(std::max(max_rows, 1)) * size_t(lmhead_argmax_units(vocab)) * sizeof(State);
}

bool lmhead_argmax_supported(int rows, int K, int vocab) {
  static const bool hopper = current_device_sm() / 10 == 9;
  return hopper && rows >= 1 && rows <= kTok && K >= kBK && K % 8 == 0 && vocab >= 1;
}

std::string lmhead_argmax_code(const DeviceInfo& dev) {
  for (const void* k : {reinterpret_cast<const void*>(lmhead_argmax_kernel),
                        reinterpret_cast<const void*>(lmhead_argmax_merge_kernel)})
    if (std::string why = check_kernel_present(k, dev); !why.empty()) return why;
  return "";
}

void lmhead_argmax(const bf16* x, int rows, int K, const bf16* w, int vocab, int32_t* out_ids, float* out_logprobs,
                   void* workspace, cudaStream_t stream) {
  MS_CHECK(lmhead_argmax_supported(rows, K, vocab), "lmhead_argmax: {} rows of K {} over {} (1-{} rows, sm_90)", rows,
           K, vocab, kTok);
  Args a{};
  encode_bf16_tma_2d(&a.xmap, x, rows, K, kTok);
  encode_bf16_tma_2d(&a.wmap, w, vocab, K, kRows);
  a.M = rows, a.K = K, a.V = vocab, a.units = lmhead_argmax_units(vocab);
  a.partials = static_cast<State*>(workspace);
  static const int sms = current_device_multiprocessors();
  const size_t smem = kernel_smem();
  static const bool raised = [&] {
    return cudaFuncSetAttribute(lmhead_argmax_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) ==
           cudaSuccess;
  }();
  MS_CHECK(raised, "lmhead_argmax: the device refuses {} bytes of shared memory a block", smem);
  launch_pdl(lmhead_argmax_kernel, dim3(unsigned(std::min(sms, a.units))), dim3(kThreads), smem, stream, a);
  launch_pdl(lmhead_argmax_merge_kernel, dim3(unsigned(rows)), dim3(kMergeThreads), 0, stream,
             static_cast<const State*>(a.partials), a.units, out_ids, out_logprobs);
}

}  // namespace moeserve::cuda

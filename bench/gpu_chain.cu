// A chain of dependent 1-token GEMVs (each one's output is the next one's input) two ways, to measure what the
// decode step's launch-per-op structure costs against the weights' read floor, before building anything larger:
//   launches    one kernel an op, captured in a CUDA graph with programmatic dependent launch (as the served step
//               runs): each block issues its weight slices into its shared-memory ring before griddepcontrol.wait,
//               so the next op's first bytes load while the op before finishes (the repo's GEMV ring);
//   persistent  one cooperative launch for the whole chain, SMs x P blocks: each block walks its row blocks of
//               every op in order with one ring running across them, so the next op's weights stream while the
//               block waits for the op before (a counter per op: each finished row block adds one; a block starting
//               an op spins until the op before has all its row blocks, then stages its input).
// Both use the same row-block code (16 rows, 8 warps on 64-k slices, CUDA-core FMAs), so the outputs are bitwise
// equal; op 0 is also checked against the CPU. The default chain is q30b8l's layer as four dense GEMVs (q/k/v
// 5120 x 2048, o_proj 2048 x 4096, the 8 experts' gate/up as 12288 x 2048, their down as 2048 x 6144; 113 MB) times
// 8 layers: what the step's attention, routing and norms add on top is not modelled.
// Then the same two ways with the ops cut into items of 32-64 KB that spread every op over all blocks
// (chain_split_kernel, session 65): whether the persistent form's distance from the floor is the persistence or the
// whole-K row blocks' imbalance.
// --routed: the split forms only, over a layer model closer to the decode layer's constraint: gate/up and down read
// 8 of 128 experts (q30b's [128][1536][2048] and [128][2048][768]) chosen by a router stand-in (the top 8 of o_proj's
// first 128 outputs), so their weights can stream only once o_proj is complete, while the next layer's q/k/v weights
// may stream during the experts'; layer 0's routing, gate/up and down are checked against the CPU.
// Session 66 (H100): the split forms are ~1.47x slower than the whole-K ones (592.7 against 403.5 us persistent):
// imbalance is not the persistent chain's distance from the floor.
// --timeline: the whole-K forms only (launches, persistent, and persistent with a release add a row block instead of
// the writers' fences, also with the row blocks dealt round robin across the ops, then without the products - the
// loaders' own rate - and last with the products on the tensor cores), each followed by one run with its clocks
// (%globaltimer a block and op: before its wait, its input staged, its last row block counted) printed as a row an op
// kind: where an op's time goes.
//   gpu_chain [--layers 8] [--reps 20] [--routed | --timeline]   (under `timeout`: a broken counter would spin forever)
// Prints one line a form: time of the chain, us an op, TB/s, x the floor at 4.6 TB/s (bench/gpu_read_bw). A
// benchmark, not a test: the figures go to docs/PERF.md.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/common.h"
#include "cuda/device.h"
#include "cuda/launch.h"
#include "cuda/moe/moe_ptx.cuh"
#include "cuda/pdl.cuh"
#include "bench_ptx.cuh"
#include "bench_ring.cuh"
#include "gpu_timer.h"

namespace mc = moeserve::cuda;

namespace {

using namespace bench_ring;
using bench_ptx::fill_bf16_kernel;
using bench_ptx::global_ns;
using bench_ptx::ld_acquire;

constexpr int kMaxOps = 64;
constexpr double kReadTBs = 4.6;  // bench/gpu_read_bw, H200 (session 20)

struct ChainArgs {
  const bf16* W[kMaxOps];
  int N[kMaxOps], K[kMaxOps];
  bf16* X[kMaxOps + 1];  // X[0] the input, X[j + 1] = bf16(W_j X[j][0:K_j])
  unsigned* done;        // [ops] finished row blocks, counted across runs (epochs)
  int ops;
  // The split-item forms (chain_split_kernel) only:
  float* part;  // [ops][kMaxSplits][max_n] an op's partial sums, a row of max_n a K range
  int max_n;
  // The routed layer model (--routed): ops 4 l + 2 and 4 l + 3 read the experts chosen from op 4 l + 1's outputs.
  int kind[kMaxOps];  // kDense, kRoutedGu (8 experts' gate/up rows), kRoutedDown (their down rows, K = 8 x 768)
  int* ids;           // [layers][kTopK] the chosen experts (every block chooses the same; block 0 writes them)
  // --timeline (the whole-K kernel only): %globaltimer a block and op, [ops][clk_blocks][3]: before its wait for the
  // op before, its input staged, its last row block of the op counted; nullptr: none recorded.
  unsigned long long* clk;
  int clk_blocks;
  // The whole-K persistent form's row block rb of op j goes to block (rb + rb_offset[j]) % grid; all 0: rb % grid
  // (every op starting at block 0). rb_offset[j] = the row blocks of the ops before j: one round robin across ops.
  int rb_offset[kMaxOps];
  int no_products;  // --timeline's last forms: the whole-K kernel streams and waits as ever but skips the products
};
constexpr int kDense = 0, kRoutedGu = 1, kRoutedDown = 2;
constexpr int kExperts = 128, kTopK = 8, kInter = 768, kGuRows = 2 * kInter;  // q30b's experts

// Op `op`'s input into shared memory once the op before is complete: in the persistent form when its row blocks
// (`rb_before` of them) have all been counted this run (epoch), in the launch form by the programmatic wait.
// Waits until the op before `op` is complete: in the persistent form until its `count_before` units (row blocks or
// items) have all been counted this run (epoch), in the launch form by the programmatic wait; then a block barrier.
__device__ __forceinline__ void wait_op_before(const ChainArgs& a, int op, int count_before, int persistent,
                                               unsigned epoch) {
  if (persistent) {
    if (op > 0 && threadIdx.x == 0) {
      const unsigned target = epoch * unsigned(count_before);
      while (ld_acquire(a.done + op - 1) < target) __nanosleep(20);
    }
  } else {
    mc::pdl_wait();  // then the next op's blocks may start and load their weights (launch.h's contract)
    mc::pdl_launch_dependents();
  }
  __syncthreads();
}

// This block's clock `what` (0 before the wait, 1 staged, 2 done) of op `op`, when a timeline is recorded.
__device__ __forceinline__ void stamp(const ChainArgs& a, int op, int what) {
  if (a.clk != nullptr && threadIdx.x == 0) a.clk[(int64_t(op) * a.clk_blocks + blockIdx.x) * 3 + what] = global_ns();
}

__device__ __forceinline__ void wait_and_stage(const ChainArgs& a, int op, int rb_before, int persistent,
                                               unsigned epoch, bf16* xs) {
  stamp(a, op, 0);
  wait_op_before(a, op, rb_before, persistent, epoch);
  for (int i = threadIdx.x; i < a.K[op] / 8; i += kThreads)
    reinterpret_cast<uint4*>(xs)[i] = __ldcg(reinterpret_cast<const uint4*>(a.X[op]) + i);
  __syncthreads();
  stamp(a, op, 1);
}

// RELEASE: a row block's outputs counted by one release add after the block barrier (the warps that wrote them do
// not wait for a fence; the split kernel's way) instead of a fence in each writing thread before the barrier.
// MMA: the products by slice_mma (tensor cores) instead of slice_dot (CUDA cores).
template <int S, bool RELEASE = false, bool MMA = false>
__global__ void __launch_bounds__(kThreads) chain_kernel(const __grid_constant__ ChainArgs a, int op_begin,
                                                        int op_end, int persistent, unsigned epoch) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* ring = reinterpret_cast<bf16*>(smem_raw);                    // [warps][S][16 x 64]
  bf16* xs = ring + kWarps * S * kSliceElems;                        // [K] the op's input
  __shared__ float partial[kWarps][kRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rb_step = persistent ? int(gridDim.x) : 1 << 30;
  bf16* my_ring = ring + warp * S * kSliceElems;
  auto per_warp = [&](int op) { return (a.K[op] / kSliceK + kWarps - 1) / kWarps; };
  auto row_blocks = [&](int op) { return a.N[op] / kRows; };
  // The first item at or after op `op` (rb = blockIdx.x there, less the op's offset in the persistent form);
  // op == op_end: none.
  auto first_rb = [&](int op) {
    const int g = int(gridDim.x);
    return persistent ? (int(blockIdx.x) + g - a.rb_offset[op] % g) % g : int(blockIdx.x);
  };
  auto first_item = [&](int op) {
    while (op < op_end && first_rb(op) >= row_blocks(op)) ++op;
    return Cursor{op, op < op_end ? first_rb(op) : 0, 0};
  };
  auto advance = [&](Cursor& c) {
    if (++c.u < per_warp(c.op)) return;
    c.u = 0;
    c.rb += rb_step;
    if (c.rb >= row_blocks(c.op)) c = first_item(c.op + 1);
  };
  Cursor pc = first_item(op_begin);  // the producer's next slice
  int issued = 0;
  auto issue = [&]() {
    bf16* dst = my_ring + (issued % S) * kSliceElems;
    const bool live = pc.op < op_end;
    const int ks = warp + kWarps * pc.u;  // the slice's k block
    const int K = live ? a.K[pc.op] : 0;
    const bool ok = live && ks * kSliceK < K;
    const bf16* src = ok ? a.W[pc.op] + int64_t(pc.rb * kRows) * K + ks * kSliceK : nullptr;
    load_slice(dst, src, K, ok, lane, a.W[0]);
    ++issued;
    if (live) advance(pc);
  };
  for (int i = 0; i < S; ++i) issue();  // weights are never written: before any wait

  Cursor cc = first_item(op_begin);
  int staged_op = -1, consumed = 0;
  float acc = 0.f, c4[4] = {0.f, 0.f, 0.f, 0.f};
  const int r = lane >> 1, h = lane & 1;
  while (cc.op < op_end) {
    if (cc.op != staged_op) {  // the op's input: after the op before is complete
      wait_and_stage(a, cc.op, cc.op > 0 ? row_blocks(cc.op - 1) : 0, persistent, epoch, xs);
      staged_op = cc.op;
    }
    cp_async_wait<S - 1>();
    __syncwarp();
    const bf16* sl = my_ring + (consumed % S) * kSliceElems;
    const int ks = warp + kWarps * cc.u;
    if (!a.no_products && ks * kSliceK < a.K[cc.op]) {
      if (MMA) slice_mma(c4, sl, xs + ks * kSliceK, lane / 4, lane % 4);
      else slice_dot(acc, sl, xs + ks * kSliceK, r, h);
    }
    Cursor item;
    if (!release_slice(consumed, issue, cc, advance, item)) continue;
    // The item's last slice: the warps' sums, the row block's outputs, its count.
    if (MMA) stash_warp_rows_mma(c4, partial, warp, lane);
    else stash_warp_rows(acc, partial, warp, r, h);
    if (threadIdx.x < kRows) {
      const float s = warp_rows_sum(partial, threadIdx.x);
      a.X[item.op + 1][item.rb * kRows + threadIdx.x] = __float2bfloat16_rn(s);
      if (!RELEASE) __threadfence();
    }
    __syncthreads();
    if (persistent && threadIdx.x == 0) {
      if (RELEASE) bench_ptx::red_release_add(a.done + item.op);
      else atomicAdd(a.done + item.op, 1u);
    }
    stamp(a, item.op, 2);  // (the block's last row block of the op leaves its time)
  }
  cp_async_wait<0>();
}

// The split-item forms (session 65): the same ops cut into items of 16 rows x IS 512-k ranges (IS slices a warp: IS 4
// = 64 KB items, 2 = 32 KB), item i of an op being row block i / splits, K range i % splits, so that an op with few
// row blocks still spreads over every block (whole-K row blocks leave half of 2 x 132 blocks idle in o_proj and down,
// 128 row blocks each). An item writes its rows' partial sums (part[op][split]) with no handshake; a block counts its
// items of an op once, when it moves past the op (a block barrier, then one release add); the next op stages its
// input as bf16 of the splits' partials summed in split order - deterministic, so the launch and persistent forms
// agree bitwise. Whether the persistent chain's distance from the floor (session 22: 1.8x) is its imbalance.
// Session 65, H100, an earlier form (16 KB items, a row block's splits summed by the last of them behind a counter,
// fences and three barriers an item; 6c4762d): correct and 2.1x slower than the whole-K forms - a per-item handshake
// costs more than streaming the item. This form keeps one barrier an item (the warps' sums, double-buffered).
// Routed ops (--routed): a warp issues a routed op's slices only once its block has chosen that layer's experts
// (when it stages the op's input), so the ring runs ahead through dense ops and stops at the routing point.
constexpr int kItemK = kWarps * kSliceK;  // 512: the K range of one slice a warp
constexpr int kMaxSplits = 12;            // K / kItemK for K up to 6,144

template <int S, int IS>
__global__ void __launch_bounds__(kThreads) chain_split_kernel(const __grid_constant__ ChainArgs a, int op_begin,
                                                              int op_end, int persistent, unsigned epoch) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* ring = reinterpret_cast<bf16*>(smem_raw);  // [warps][S][16 x 64]
  bf16* xs = ring + kWarps * S * kSliceElems;      // [K] the op's input
  __shared__ float partial[2][kWarps][kRows];
  __shared__ int s_ids[kTopK], s_ids_layer;  // the routed ops' experts, and the layer they were chosen for
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int step = persistent ? int(gridDim.x) : 1 << 30;
  bf16* my_ring = ring + warp * S * kSliceElems;
  if (threadIdx.x == 0) s_ids_layer = -1;
  __syncthreads();
  auto splits = [&](int op) { return a.K[op] / (IS * kItemK); };
  auto items = [&](int op) { return a.N[op] / kRows * splits(op); };
  auto first_item = [&](int op) {  // the first item at or after op `op`; op == op_end: none
    while (op < op_end && int(blockIdx.x) >= items(op)) ++op;
    return Cursor{op, int(blockIdx.x), 0};  // (rb: the item's index)
  };
  auto advance = [&](Cursor& c) {
    if (++c.u < IS) return;
    c.u = 0;
    c.rb += step;
    if (c.rb >= items(c.op)) c = first_item(c.op + 1);
  };
  Cursor pc = first_item(op_begin);  // the producer's next slice
  int issued = 0, consumed = 0;
  // Issues the producer's next slice into the ring; false (nothing issued) when the ring is full, the ops are done,
  // or the slice belongs to a routed op whose layer has not chosen its experts yet (they are chosen when the block
  // stages the op's input, after the op before it is complete everywhere).
  auto issue = [&]() -> bool {
    if (pc.op >= op_end || issued - consumed >= S) return false;
    const int op = pc.op, kind = a.kind[op], K = a.K[op], sp = splits(op);
    if (kind != kDense && s_ids_layer != op / 4) return false;
    const int row0 = pc.rb / sp * kRows, k0 = (pc.rb % sp) * IS * kItemK + (warp + kWarps * pc.u) * kSliceK;
    const bf16* src;
    int ld = K;
    if (kind == kRoutedGu) {  // rows j 1536 + i: row i of expert ids[j]'s gate/up
      src = a.W[op] + (int64_t(s_ids[row0 / kGuRows]) * kGuRows + row0 % kGuRows) * K + k0;
    } else if (kind == kRoutedDown) {  // k in [768 j, 768 j + 768): expert ids[j]'s down rows, their k - 768 j
      ld = kInter;
      src = a.W[op] + (int64_t(s_ids[k0 / kInter]) * a.N[op] + row0) * kInter + k0 % kInter;
    } else {
      src = a.W[op] + int64_t(row0) * K + k0;
    }
    load_slice(my_ring + (issued % S) * kSliceElems, src, ld, true, lane, a.W[0]);
    ++issued;
    advance(pc);
    return true;
  };
  while (issue()) {
  }  // weights are never written: before any wait (a routed op's only once its experts are known)

  Cursor cc = first_item(op_begin);
  int staged_op = -1, mine = 0, buf = 0;  // mine: this block's items of the staged op
  float acc = 0.f;
  const int r = lane >> 1, h = lane & 1;
  // This block's items of `op` counted (its partials stored before: the barrier orders them before the release).
  auto count_done = [&](int op) {
    __syncthreads();
    if (persistent && threadIdx.x == 0 && mine > 0) {
      bench_ptx::red_release_add(a.done + op, unsigned(mine));
    }
    mine = 0;
  };
  // The sum of op `op`'s split partials at output n (in split order).
  auto output_of = [&](int op, int n) {
    const float* p = a.part + int64_t(op) * kMaxSplits * a.max_n + n;
    float v = 0.f;
    for (int q = 0; q < splits(op); ++q) v += __ldcg(p + int64_t(q) * a.max_n);
    return v;
  };
  while (cc.op < op_end) {
    const int op = cc.op, sp = splits(op);
    if (op != staged_op) {  // the op's input: after the op before is complete
      if (staged_op >= 0) count_done(staged_op);
      wait_op_before(a, op, op > 0 ? items(op - 1) : 0, persistent, epoch);
      for (int k = threadIdx.x; k < a.K[op]; k += kThreads) {
        if (op == 0) {
          xs[k] = a.X[0][k];
        } else if (a.kind[op] == kRoutedDown) {  // act = silu(gate) * up of expert slot k / 768
          const int j = k / kInter, i = k % kInter;
          const float g = output_of(op - 1, j * kGuRows + i), u = output_of(op - 1, j * kGuRows + kInter + i);
          xs[k] = __float2bfloat16_rn(g / (1.0f + __expf(-g)) * u);
        } else {
          xs[k] = __float2bfloat16_rn(output_of(op - 1, k));
        }
      }
      __syncthreads();
      if (a.kind[op] == kRoutedGu && warp == 0) {  // the router stand-in: the top 8 of the input's first 128 values
        float v[kExperts / 32];
#pragma unroll
        for (int q = 0; q < kExperts / 32; ++q) v[q] = __bfloat162float(xs[lane + 32 * q]);
        for (int j = 0; j < kTopK; ++j) {
          float best = -INFINITY;
          int bi = kExperts;
#pragma unroll
          for (int q = 0; q < kExperts / 32; ++q)
            if (v[q] > best) best = v[q], bi = lane + 32 * q;  // (q ascending: the lowest index of a tie)
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ob > best || (ob == best && oi < bi)) best = ob, bi = oi;
          }
          if (bi >= kExperts) bi = j;  // (no finite value left: any expert, in range)
          if (bi % 32 == lane) v[bi / 32] = -INFINITY;
          if (lane == 0) {
            s_ids[j] = bi;
            if (blockIdx.x == 0) a.ids[(op / 4) * kTopK + j] = bi;
          }
        }
        if (lane == 0) s_ids_layer = op / 4;
      }
      if (a.kind[op] == kRoutedDown && s_ids_layer != op / 4) {  // the down launch of the launch form: block 0 of the
        __syncthreads();                                         // gate/up launch chose them (complete: its grid is)
        if (threadIdx.x < kTopK) s_ids[threadIdx.x] = __ldcg(a.ids + (op / 4) * kTopK + threadIdx.x);
        if (threadIdx.x == 0) s_ids_layer = op / 4;
      }
      __syncthreads();
      staged_op = op;
      while (issue()) {
      }  // the ring refilled (a routed op's slices can go now)
    }
    if (issued <= consumed) __trap();  // (a slice consumed before it was issued: a broken schedule, made loud)
    wait_pending(issued - consumed - 1);
    __syncwarp();
    const bf16* sl = my_ring + (consumed % S) * kSliceElems;
    slice_dot(acc, sl, xs + (cc.rb % sp) * IS * kItemK + (warp + kWarps * cc.u) * kSliceK, r, h);
    Cursor item;
    if (!release_slice(consumed, issue, cc, advance, item)) continue;
    // The item's last slice: the warps' sums into its split's partial row (the other buffer's reads, an item ago,
    // are behind this barrier too).
    stash_warp_rows(acc, partial[buf], warp, r, h);
    if (threadIdx.x < kRows)
      a.part[(int64_t(item.op) * kMaxSplits + item.rb % sp) * a.max_n + item.rb / sp * kRows + threadIdx.x] =
          warp_rows_sum(partial[buf], threadIdx.x);
    buf ^= 1;
    ++mine;
  }
  if (staged_op >= 0) count_done(staged_op);
  cp_async_wait<0>();
}

// The clocks of one whole-K run (--timeline) as one row an op kind (q/k/v, o_proj, gate/up, down), medians over
// the layers after the first: the op's span (its last row block counted after the op before's), the span's read
// rate, how long after the op before completed its blocks had staged their input (the first, the median), each
// block's busy time (staged to its last row block counted: median, longest), and the block that completed the op last
// (its lag after the op before, its busy time, its row blocks and their read rate). grid 0: the launch form (a block a
// row block); else the persistent form's grid (row block rb to block rb % grid).
void print_timeline(const std::vector<unsigned long long>& c, const ChainArgs& a, int grid) {
  auto at = [&](int j, int b, int w) { return c[(size_t(j) * a.clk_blocks + b) * 3 + w]; };
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const char* kinds[4] = {"q/k/v", "o_proj", "gate/up", "down"};
  constexpr int kCols = 10;
  std::vector<double> col[4][kCols];
  std::vector<double> done(size_t(a.ops), 0.0);
  for (int j = 0; j < a.ops; ++j) {
    const int rbs = a.N[j] / kRows, blocks = grid > 0 ? grid : rbs;
    unsigned long long last = 0;
    int crit = -1;
    std::vector<double> staged, busy;
    for (int b = 0; b < blocks; ++b) {
      if (at(j, b, 1) == 0 || at(j, b, 2) == 0) continue;  // (no clocks: a block past the op's row blocks)
      if (at(j, b, 2) > last) last = at(j, b, 2), crit = b;
      staged.push_back(double(at(j, b, 1)));
      busy.push_back(double(at(j, b, 2) - at(j, b, 1)) * 1e-3);
    }
    done[size_t(j)] = double(last);
    if (j < 4 || crit < 0) continue;  // (layer 0: the ramp of the run)
    const double before = done[size_t(j) - 1], span = (done[size_t(j)] - before) * 1e-3;
    const double bytes_rb = 2.0 * kRows * a.K[j];
    const int crit_rb0 = grid > 0 ? (crit + grid - a.rb_offset[j] % grid) % grid : 0;
    const int crit_rbs = grid > 0 ? (rbs - crit_rb0 + grid - 1) / grid : 1;
    const double crit_busy = double(at(j, crit, 2) - at(j, crit, 1)) * 1e-3;
    const double v[kCols] = {span,
                             bytes_rb * rbs / (span * 1e-6) * 1e-12,
                             (*std::min_element(staged.begin(), staged.end()) - before) * 1e-3,
                             (median(staged) - before) * 1e-3,
                             median(busy),
                             *std::max_element(busy.begin(), busy.end()),
                             (double(at(j, crit, 1)) - before) * 1e-3,
                             crit_busy,
                             double(crit_rbs),
                             bytes_rb * crit_rbs / (crit_busy * 1e-6) * 1e-9};
    for (int q = 0; q < kCols; ++q) col[j % 4][q].push_back(v[q]);
  }
  std::printf("  %-8s %7s %6s %7s %7s %7s %7s | %9s %8s %4s %7s   (us; medians over layers 1..%d)\n", "op", "span",
              "TB/s", "staged", "med", "busy", "max", "last: lag", "busy", "rbs", "GB/s", a.ops / 4 - 1);
  for (int k = 0; k < 4; ++k) {
    if (col[k][0].empty()) continue;
    double m[kCols];
    for (int q = 0; q < kCols; ++q) m[q] = median(col[k][q]);
    std::printf("  %-8s %7.2f %6.2f %7.2f %7.2f %7.2f %7.2f | %9.2f %8.2f %4.0f %7.1f\n", kinds[k], m[0], m[1], m[2],
                m[3], m[4], m[5], m[6], m[7], m[8], m[9]);
  }
}

size_t smem_bytes(int S, int max_k) { return size_t(kWarps) * S * kSliceElems * 2 + size_t(max_k) * 2; }

float bf2f(uint16_t b) { return moeserve::bf16_to_f32(b); }

}  // namespace

static int run(int argc, char** argv) {
  int layers = 8, reps = 20;
  bool routed = false, timeline = false;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--layers" && i + 1 < argc) layers = std::atoi(argv[++i]);
    else if (s == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (s == "--routed") routed = true;
    else if (s == "--timeline") timeline = true;
    else {
      std::fprintf(stderr, "usage: gpu_chain [--layers 8] [--reps 20] [--routed | --timeline]\n");
      return 2;
    }
  }
  if (layers < 1 || layers * 4 > kMaxOps || reps < 1) {
    std::fprintf(stderr, "--layers must be 1..%d and --reps at least 1\n", kMaxOps / 4);
    return 2;
  }
  const int shapes[4][2] = {{5120, 2048}, {2048, 4096}, {12288, 2048}, {2048, 6144}};  // N, K
  ChainArgs a{};
  a.ops = layers * 4;
  int max_k = 0;
  double bytes = 0;
  std::vector<bf16*> bufs;
  for (int j = 0; j < a.ops; ++j) {
    a.N[j] = shapes[j % 4][0], a.K[j] = shapes[j % 4][1];
    a.kind[j] = !routed ? kDense : j % 4 == 2 ? kRoutedGu : j % 4 == 3 ? kRoutedDown : kDense;
    max_k = std::max(max_k, a.K[j]);
    bytes += 2.0 * a.N[j] * a.K[j];
  }
  for (int j = 0; j + 1 < a.ops; ++j)
    MS_CHECK(a.K[j + 1] <= a.N[j] && a.N[j] % kRows == 0 && a.K[j] % kSliceK == 0, "chain shapes");
  cudaStream_t st;
  MS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  // A routed op holds all 128 experts (gate/up [128][1536][2048], down [128][2048][768]) and reads 8 of them.
  auto weight_elems = [&](int j) {
    return a.kind[j] == kRoutedGu     ? size_t(kExperts) * kGuRows * a.K[j]
           : a.kind[j] == kRoutedDown ? size_t(kExperts) * a.N[j] * kInter
                                      : size_t(a.N[j]) * a.K[j];
  };
  for (int j = 0; j < a.ops; ++j) {
    bf16* w = nullptr;
    MS_CUDA_CHECK(cudaMalloc(&w, weight_elems(j) * 2));
    fill_bf16_kernel<<<1024, 256, 0, st>>>(w, weight_elems(j), std::sqrt(3.0f / float(a.K[j])), 977u * j + 1);
    a.W[j] = w;
    bufs.push_back(w);
  }
  MS_CUDA_CHECK(cudaMalloc(&a.ids, size_t(layers) * kTopK * sizeof(int)));
  for (int j = 0; j <= a.ops; ++j) {
    const int n = j == 0 ? a.K[0] : a.N[j - 1];
    MS_CUDA_CHECK(cudaMalloc(&a.X[j], size_t(n) * 2));
    MS_CUDA_CHECK(cudaMemsetAsync(a.X[j], 0xff, size_t(n) * 2, st));  // NaN until written
    bufs.push_back(a.X[j]);
  }
  fill_bf16_kernel<<<8, 256, 0, st>>>(a.X[0], size_t(a.K[0]), 1.0f, 12345u);
  MS_CUDA_CHECK(cudaMalloc(&a.done, kMaxOps * sizeof(unsigned)));
  MS_CUDA_CHECK(cudaMemsetAsync(a.done, 0, kMaxOps * sizeof(unsigned), st));
  for (int j = 0; j < a.ops; ++j) {  // the split forms' items: 2 and 4 slices a warp
    MS_CHECK(a.K[j] % (4 * kItemK) == 0 && a.K[j] / (2 * kItemK) <= kMaxSplits, "split items: K {}", a.K[j]);
    a.max_n = std::max(a.max_n, a.N[j]);
  }
  MS_CUDA_CHECK(cudaMalloc(&a.part, size_t(a.ops) * kMaxSplits * a.max_n * sizeof(float)));
  MS_CUDA_CHECK(cudaStreamSynchronize(st));

  int dev = 0, sms = 0;
  MS_CUDA_CHECK(cudaGetDevice(&dev));
  MS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  MS_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  const double floor_s = bytes / (kReadTBs * 1e12);
  std::printf("%s, %d SMs: %d dependent GEMVs (%d layers of q/k/v, o_proj, gate/up, down%s), %.1f MB, floor %.1f us at "
              "%.1f TB/s; best of %d\n",
              prop.name, sms, a.ops, layers, routed ? ": the experts routed, 8 of 128" : "", bytes * 1e-6,
              floor_s * 1e6, kReadTBs, reps);
  std::printf("%-26s %10s %10s %8s %8s\n", "form", "chain us", "us an op", "TB/s", "x floor");
  auto row = [&](const char* name, double s) {
    std::printf("%-26s %10.1f %10.2f %8.3f %8.2f\n", name, s * 1e6, s * 1e6 / a.ops, bytes / s * 1e-12, s / floor_s);
  };
  const int last_n = a.N[a.ops - 1];
  auto output = [&]() {
    std::vector<uint16_t> v(static_cast<size_t>(last_n));
    MS_CUDA_CHECK(cudaMemcpy(v.data(), a.X[a.ops], v.size() * 2, cudaMemcpyDeviceToHost));
    return v;
  };
  moeserve::bench::GpuTimer t;
  std::vector<uint16_t> reference;
  int failures = 0;
  // A form's output: finite, and bitwise the first form's of its kind (`ref`, set by the first).
  auto compare = [&](const char* name, const std::vector<uint16_t>& v, std::vector<uint16_t>& ref) {
    for (uint16_t b : v)
      if (!std::isfinite(bf2f(b))) {
        std::printf("  %s: a non-finite output\n", name);
        ++failures;
        return;
      }
    if (ref.empty()) ref = v;
    else if (v != ref) {
      std::printf("  %s: output differs from the first form's of its kind\n", name);
      ++failures;
    }
  };
  auto check = [&](const char* name) { compare(name, output(), reference); };

  // Launches, in a CUDA graph with programmatic edges.
  auto launches = [&](auto kernel, int S, int split_slices = 0) {
    const size_t smem = smem_bytes(S, max_k);
    MS_CHECK(mc::raise_dynamic_smem(reinterpret_cast<const void*>(kernel), smem), "smem {}", smem);
    cudaGraph_t g;
    MS_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int j = 0; j < a.ops; ++j) {
      const int blocks = a.N[j] / kRows * (split_slices > 0 ? a.K[j] / (split_slices * kItemK) : 1);
      mc::launch_pdl(kernel, dim3(unsigned(blocks)), dim3(kThreads), smem, st, a, j, j + 1, 0, 0u);
    }
    MS_CUDA_CHECK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t exec;
    MS_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    const double s = t.best(reps, [&] { MS_CUDA_CHECK(cudaGraphLaunch(exec, st)); }, st);
    MS_CUDA_CHECK(cudaStreamSynchronize(st));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
    return s;
  };
  // One cooperative launch, P blocks an SM.
  unsigned epoch = 0;
  auto persistent = [&](auto kernel, int S, int P) -> double {
    const size_t smem = smem_bytes(S, max_k);
    MS_CHECK(mc::raise_dynamic_smem(reinterpret_cast<const void*>(kernel), smem), "smem {}", smem);
    int per_sm = 0;
    MS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
    if (per_sm < P) return -1;
    // The counters from zero for each form: a form counts row blocks or items of its own size a run.
    MS_CUDA_CHECK(cudaMemsetAsync(a.done, 0, kMaxOps * sizeof(unsigned), st));
    epoch = 0;
    auto once = [&] {
      ++epoch;
      int ob = 0, oe = a.ops, pers = 1;
      unsigned ep = epoch;
      void* params[] = {const_cast<ChainArgs*>(&a), &ob, &oe, &pers, &ep};
      MS_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(unsigned(sms * P)),
                                                dim3(kThreads), params, smem, st));
    };
    return t.best(reps, once, st);
  };
  struct P {
    const char* name;
    int S, per_sm;
  };
  std::vector<uint16_t> op0_core;  // --timeline: op 0's outputs of the CUDA-core forms
  if (timeline && !routed) {
    // One run of each whole-K form with its clocks (after its timed runs): where an op's time goes.
    a.clk_blocks = 2 * sms;
    for (int j = 0; j < a.ops; ++j) a.clk_blocks = std::max(a.clk_blocks, a.N[j] / kRows);
    const size_t n_clk = size_t(a.ops) * a.clk_blocks * 3;
    unsigned long long* clk = nullptr;
    MS_CUDA_CHECK(cudaMalloc(&clk, n_clk * 8));
    std::vector<uint16_t> mma_reference;  // (the tensor cores sum in another order)
    // ref: the outputs' bitwise reference of the form's kind (nullptr: not checked).
    auto traced = [&](const char* name, auto run_once, int grid_persistent, std::vector<uint16_t>* ref) {
      row(name, run_once());
      if (ref != nullptr) compare(name, output(), *ref);
      MS_CUDA_CHECK(cudaMemsetAsync(clk, 0, n_clk * 8, st));
      a.clk = clk;
      run_once();
      a.clk = nullptr;
      std::vector<unsigned long long> c(n_clk);
      MS_CUDA_CHECK(cudaMemcpy(c.data(), clk, n_clk * 8, cudaMemcpyDeviceToHost));
      print_timeline(c, a, grid_persistent);
    };
    traced("launches, 4-stage rings", [&] { return launches(chain_kernel<4>, 4); }, 0, &reference);
    traced("persistent, 2 x 4 stages", [&] { return persistent(chain_kernel<4>, 4, 2); }, 2 * sms, &reference);
    traced("persistent, 1 x 12 stages", [&] { return persistent(chain_kernel<12>, 12, 1); }, sms, &reference);
    traced("pers. 2 x 4, release add", [&] { return persistent(chain_kernel<4, true>, 4, 2); }, 2 * sms, &reference);
    traced("pers. 1 x 12, release add", [&] { return persistent(chain_kernel<12, true>, 12, 1); }, sms, &reference);
    for (int j = 1; j < a.ops; ++j) a.rb_offset[j] = a.rb_offset[j - 1] + a.N[j - 1] / kRows;  // one round robin
    traced("pers. 2 x 4, rel., rotated", [&] { return persistent(chain_kernel<4, true>, 4, 2); }, 2 * sms,
           &reference);
    traced("pers. 1 x 12, rel., rotated", [&] { return persistent(chain_kernel<12, true>, 12, 1); }, sms,
           &reference);
    std::fill(a.rb_offset, a.rb_offset + kMaxOps, 0);
    op0_core.resize(size_t(a.N[0]));  // (checked against the CPU below, with the last form's, the tensor cores')
    MS_CUDA_CHECK(cudaMemcpy(op0_core.data(), a.X[1], op0_core.size() * 2, cudaMemcpyDeviceToHost));
    // The same streams without the products (outputs not checked): the loaders' own rate in this pattern.
    a.no_products = 1;
    traced("launches 4, no products", [&] { return launches(chain_kernel<4>, 4); }, 0, nullptr);
    traced("pers. 2 x 4, no products", [&] { return persistent(chain_kernel<4, true>, 4, 2); }, 2 * sms, nullptr);
    traced("pers. 1 x 12, no products", [&] { return persistent(chain_kernel<12, true>, 12, 1); }, sms, nullptr);
    a.no_products = 0;
    // The products on the tensor cores.
    traced("launches 4, mma", [&] { return launches(chain_kernel<4, false, true>, 4); }, 0, &mma_reference);
    traced("pers. 2 x 4, rel., mma", [&] { return persistent(chain_kernel<4, true, true>, 4, 2); }, 2 * sms,
           &mma_reference);
    traced("pers. 1 x 12, rel., mma", [&] { return persistent(chain_kernel<12, true, true>, 12, 1); }, sms,
           &mma_reference);
    cudaFree(clk);
  } else if (!routed) {  // (the whole-K kernel reads dense weights only)
    row("launches, 4-stage rings", launches(chain_kernel<4>, 4));
    check("launches 4");
    row("launches, 8-stage rings", launches(chain_kernel<8>, 8));
    check("launches 8");
    for (const P p : {P{"persistent, 1 x 4 stages", 4, 1}, P{"persistent, 2 x 4 stages", 4, 2},
                      P{"persistent, 1 x 8 stages", 8, 1}, P{"persistent, 1 x 12 stages", 12, 1}}) {
      double s = -1;
      if (p.S == 4) s = persistent(chain_kernel<4>, 4, p.per_sm);
      else if (p.S == 8) s = persistent(chain_kernel<8>, 8, p.per_sm);
      else s = persistent(chain_kernel<12>, 12, p.per_sm);
      if (s < 0) {
        std::printf("%-26s does not fit\n", p.name);
        continue;
      }
      row(p.name, s);
      check(p.name);
    }
  }
  // The split-item forms (their sums round otherwise than the whole-K forms': references of their own, one an item
  // size). The outputs are an op's partial sums; the chain's result and op 0's are summed here in split order as the
  // device stages them.
  const int last = a.ops - 1;
  auto split_sums = [&](int op, int IS) {  // op's outputs, its split partials summed in order as the device does
    const int sp = a.K[op] / (IS * kItemK);
    std::vector<float> part(size_t(sp) * a.max_n), y(size_t(a.N[op]), 0.f);
    MS_CUDA_CHECK(cudaMemcpy(part.data(), a.part + size_t(op) * kMaxSplits * a.max_n, part.size() * sizeof(float),
                             cudaMemcpyDeviceToHost));
    for (int n = 0; n < a.N[op]; ++n)
      for (int q = 0; q < sp; ++q) y[size_t(n)] += part[size_t(q) * a.max_n + n];
    return y;
  };
  auto split_output = [&](int op, int IS) {
    std::vector<uint16_t> y;
    for (float v : split_sums(op, IS)) y.push_back(moeserve::f32_to_bf16(v));
    return y;
  };
  int last_is = 0;  // the item size of the last split form run (its partials are what the buffers hold)
  std::vector<uint16_t> split_reference[5], split_op0;  // a reference an item size: IS splits round otherwise
  auto split_check = [&](const char* name, int IS) {
    compare(name, split_output(last, IS), split_reference[IS]);
    split_op0 = split_output(0, IS);
  };
  struct SplitForm {
    const char* name;
    int IS, S, per_sm;  // per_sm 0: the launch form
  };
  std::vector<SplitForm> split_forms;  // (none with --timeline)
  if (!timeline)
    split_forms = {SplitForm{"split 64 KB, launches, 4", 4, 4, 0}, SplitForm{"split 64 KB, pers. 2 x 4", 4, 4, 2},
                   SplitForm{"split 64 KB, pers. 2 x 6", 4, 6, 2}, SplitForm{"split 64 KB, pers. 1 x 8", 4, 8, 1},
                   SplitForm{"split 64 KB, pers. 1 x 12", 4, 12, 1}, SplitForm{"split 32 KB, pers. 2 x 6", 2, 6, 2},
                   SplitForm{"split 32 KB, pers. 1 x 12", 2, 12, 1}};
  for (const SplitForm& f : split_forms) {
    double s = -1;
    if (f.per_sm == 0) s = launches(chain_split_kernel<4, 4>, 4, 4);
    else if (f.IS == 4 && f.S == 4) s = persistent(chain_split_kernel<4, 4>, 4, f.per_sm);
    else if (f.IS == 4 && f.S == 6) s = persistent(chain_split_kernel<6, 4>, 6, f.per_sm);
    else if (f.IS == 4 && f.S == 8) s = persistent(chain_split_kernel<8, 4>, 8, f.per_sm);
    else if (f.IS == 4) s = persistent(chain_split_kernel<12, 4>, 12, f.per_sm);
    else if (f.S == 6) s = persistent(chain_split_kernel<6, 2>, 6, f.per_sm);
    else s = persistent(chain_split_kernel<12, 2>, 12, f.per_sm);
    if (s < 0) {
      std::printf("%-26s does not fit\n", f.name);
      continue;
    }
    row(f.name, s);
    split_check(f.name, f.IS);
    last_is = f.IS;
  }
  // Rows against the CPU: y(n) within tolerance of the double sum of w(n, k) x(k) (the chain's later ops depend on
  // the bf16 rounding of each input: those are compared across forms, and the routed layer 0 from the GPU's inputs).
  auto cpu_rows = [&](const char* name, int N, int K, auto w_at, auto x_at, auto y_at) {
    int bad = 0;
    for (int n = 0; n < N; ++n) {
      double want = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        const double p = double(w_at(n, k)) * double(x_at(k));
        want += p;
        mag += std::fabs(p);
      }
      if (!(std::fabs(double(y_at(n)) - want) <= 8e-3 * std::fabs(want) + 1e-4 * mag + 1e-4)) ++bad;
    }
    std::printf("%s against the CPU: %d of %d rows out of tolerance\n", name, bad, N);
    failures += bad > 0;
  };
  {
    std::vector<uint16_t> w(size_t(a.N[0]) * a.K[0]), x(size_t(a.K[0])), y(size_t(a.N[0]));
    MS_CUDA_CHECK(cudaMemcpy(w.data(), a.W[0], w.size() * 2, cudaMemcpyDeviceToHost));
    MS_CUDA_CHECK(cudaMemcpy(x.data(), a.X[0], x.size() * 2, cudaMemcpyDeviceToHost));
    auto w_at = [&](int n, int k) { return bf2f(w[size_t(n) * a.K[0] + k]); };
    auto x_at = [&](int k) { return bf2f(x[size_t(k)]); };
    if (!routed) {
      MS_CUDA_CHECK(cudaMemcpy(y.data(), a.X[1], y.size() * 2, cudaMemcpyDeviceToHost));
      cpu_rows(timeline ? "op 0 (whole-K forms, tensor cores)" : "op 0 (whole-K forms)", a.N[0], a.K[0], w_at, x_at,
               [&](int n) { return bf2f(y[size_t(n)]); });
      if (!op0_core.empty())
        cpu_rows("op 0 (whole-K forms, CUDA cores)", a.N[0], a.K[0], w_at, x_at,
                 [&](int n) { return bf2f(op0_core[size_t(n)]); });
    }
    if (!split_op0.empty())
      cpu_rows("op 0 (split forms)", a.N[0], a.K[0], w_at, x_at, [&](int n) { return bf2f(split_op0[size_t(n)]); });
  }
  if (routed && last_is > 0) {  // layer 0's routing, gate/up and down from the GPU's own inputs to them
    std::vector<float> xc;  // gate/up's input: o_proj's outputs as bf16
    for (float v : split_sums(1, last_is)) xc.push_back(bf2f(moeserve::f32_to_bf16(v)));
    std::vector<int> want_ids, got_ids(kTopK);
    std::vector<float> logits(xc.begin(), xc.begin() + kExperts);
    for (int j = 0; j < kTopK; ++j) {  // the largest, the lowest index of a tie, as the kernel's warp
      const int e = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
      want_ids.push_back(e);
      logits[size_t(e)] = -INFINITY;
    }
    MS_CUDA_CHECK(cudaMemcpy(got_ids.data(), a.ids, kTopK * sizeof(int), cudaMemcpyDeviceToHost));
    std::printf("routed layer 0: experts %s the CPU's top %d\n", got_ids == want_ids ? "are" : "are NOT", kTopK);
    failures += got_ids != want_ids;
    const int K = a.K[2];
    std::vector<uint16_t> gu(size_t(kTopK) * kGuRows * K), dn(size_t(kTopK) * a.N[3] * kInter);
    for (int j = 0; j < kTopK; ++j) {
      MS_CUDA_CHECK(cudaMemcpy(gu.data() + size_t(j) * kGuRows * K, a.W[2] + size_t(got_ids[size_t(j)]) * kGuRows * K,
                               size_t(kGuRows) * K * 2, cudaMemcpyDeviceToHost));
      MS_CUDA_CHECK(cudaMemcpy(dn.data() + size_t(j) * a.N[3] * kInter,
                               a.W[3] + size_t(got_ids[size_t(j)]) * a.N[3] * kInter, size_t(a.N[3]) * kInter * 2,
                               cudaMemcpyDeviceToHost));
    }
    const std::vector<float> c = split_sums(2, last_is), d = split_sums(3, last_is);
    cpu_rows("routed gate/up, layer 0", a.N[2], K, [&](int n, int k) { return bf2f(gu[size_t(n) * K + k]); },
             [&](int k) { return xc[size_t(k)]; }, [&](int n) { return c[size_t(n)]; });
    std::vector<float> act(size_t(a.K[3]));
    for (int k = 0; k < a.K[3]; ++k) {
      const int j = k / kInter, i = k % kInter;
      const float g = c[size_t(j * kGuRows + i)], u = c[size_t(j * kGuRows + kInter + i)];
      act[size_t(k)] = bf2f(moeserve::f32_to_bf16(g / (1.0f + std::exp(-g)) * u));
    }
    cpu_rows("routed down, layer 0", a.N[3], a.K[3],
             [&](int n, int k) { return bf2f(dn[(size_t(k / kInter) * a.N[3] + n) * kInter + k % kInter]); },
             [&](int k) { return act[size_t(k)]; }, [&](int n) { return d[size_t(n)]; });
  }
  for (bf16* p : bufs) cudaFree(p);
  cudaFree(a.done);
  cudaFree(a.part);
  cudaFree(a.ids);
  cudaStreamDestroy(st);
  if (failures) std::printf("FAILED: %d checks\n", failures);
  return failures ? 1 : 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_chain: %s\n", e.what());
    return 1;
  }
}

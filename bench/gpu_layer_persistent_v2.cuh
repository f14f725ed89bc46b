// gpu_layer_persistent v2 (session 67): per-warp cp.async rings and mma.sync products (see gpu_layer_persistent.cu).
#pragma once

#include "gpu_layer_persistent_common.cuh"

namespace {

// ---- v2: the served kernels' streaming inside the persistent layer (session 67) ----
// Session 66's gpu_chain clocks put the persistent chain's loss in its blocks' stream rate, not its boundaries, and
// the served lm_head streams this very slice pattern with mma products at 4.4 TB/s one block an SM. So v2 keeps the
// layer above (stages, counters, attention, merge, routing, outputs and the CPU check) and replaces its streaming:
// no producer warp and no bulk copies; 8 warps a block, each streaming its 64-k slices of whole-K row blocks of 16
// weight rows through its own ring of S cp.async stages (bench_ring.cuh, gpu_chain's engine), the products on the
// tensor cores (or the CUDA cores, for the comparison). A block's ring runs ahead across the stages: o_proj's rows
// stream while the attention and its merge wait, the next layer's q/k/v rows while the experts' down rows are
// consumed; the experts' rows only once the block has routed the layer (one FIFO ring: it stops there).
// Row blocks of each op dealt round robin from where the op before ended (so that the blocks that had fewer of one
// op take the extra ones of the next), counted one release add each; the attention and merge stages count CTAs.
namespace v2 {
using bench_ring::Cursor;
using bench_ring::kSliceElems;
using bench_ring::kSliceK;
constexpr int kRb = bench_ring::kRows;  // 16 rows a row block
static_assert(bench_ring::kWarps == kConsumerWarps, "v2 runs the ring's 8 warps as the consumers");
// The ops of a layer: q/k/v, the router rows (o_proj's rows 2048.., the router stand-in), o_proj, the experts' gate/up,
// their down (K: 8 experts x 768).
enum Kind2 { kOpQkv, kOpRouter, kOpO, kOpGu, kOpDown, kOpsLayer };
__host__ __device__ constexpr int op_rows(int k) {
  return k == kOpQkv ? kQkv : k == kOpRouter ? kORows - kH : k == kOpO ? kH : k == kOpGu ? kTopK * kGu : kH;
}
__host__ __device__ constexpr int op_k(int k) { return k == kOpQkv || k == kOpGu ? kH : k == kOpDown ? kTopK * kI : kQ; }
__host__ __device__ constexpr int op_rbs(int k) { return op_rows(k) / kRb; }
__host__ __device__ constexpr int op_prefix(int k) { return k == 0 ? 0 : op_prefix(k - 1) + op_rbs(k - 1); }
constexpr int kLayerRbs = op_prefix(kOpsLayer);  // 1,352
constexpr int kSlicesDown = kI / kSliceK;        // 12 slices an expert in the down op's K
static_assert(kQkv % kRb == 0 && kORows % kRb == 0 && kGu % kRb == 0 && kH % kRb == 0, "whole row blocks");
// Dynamic shared memory: the rings, the staged input (bf16, the largest K), the attention's q / new k, v (f32) and
// its part's K and V rows.
constexpr size_t smem_bytes(int S) {
  return size_t(kConsumerWarps) * S * kSliceElems * 2 + size_t(kTopK * kI) * 2 + size_t(kGroup * kDim + 2 * kDim) * 4 +
         size_t(2 * kKeysPart * kDim) * 2;
}

// A 16-byte global load that the compiler keeps where it is written (before a wait, so that it is in flight during it).
__device__ __forceinline__ uint4 ld_early(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <int S, bool MMA>
__global__ void __launch_bounds__(kConsumers, S <= 5 ? 2 : 1) layer_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ring = reinterpret_cast<bf16*>(smem);                           // [warps][S][16 x 64]
  bf16* xs = ring + kConsumerWarps * S * kSliceElems;                   // [8 x 768] the op's input
  float* q_s = reinterpret_cast<float*>(xs + kTopK * kI);               // [8][128]
  float* newk = q_s + kGroup * kDim;                                    // [128]
  float* newv = newk + kDim;                                            // [128]
  bf16* kv = reinterpret_cast<bf16*>(newv + kDim);                      // [2][16][128]
  __shared__ float partial[kConsumerWarps][kRb], red[kConsumerWarps];
  __shared__ int ids_s[kTopK], routed;  // ids_s: the experts of layer routed - 1 (0: none yet)
  __shared__ float wts_s[kTopK];
  const int c = blockIdx.x, G = gridDim.x, L = p.layers, end_op = kOpsLayer * L;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  bf16* my_ring = ring + warp * S * kSliceElems;
  if (threadIdx.x == 0) routed = 0;
  __syncthreads();

  // Row block rb of op j (layer j / 4, kind j % 4) belongs to CTA (rb + the row blocks dealt before it) % G.
  auto first_item = [&](int op) {
    for (; op < end_op; ++op) {
      const int off = int((static_cast<long long>(op / kOpsLayer) * kLayerRbs + op_prefix(op % kOpsLayer)) % G);
      const int rb = (c - off + G) % G;
      if (rb < op_rbs(op % kOpsLayer)) return Cursor{op, rb, 0};
    }
    return Cursor{end_op, 0, 0};
  };
  auto advance = [&](Cursor& x) {
    if (++x.u < op_k(x.op % kOpsLayer) / kSliceK / kConsumerWarps) return;
    x.u = 0;
    x.rb += G;
    if (x.rb >= op_rbs(x.op % kOpsLayer)) x = first_item(x.op + 1);
  };
  Cursor pc = first_item(0);  // the warp's next slice to issue
  int issued = 0, consumed = 0;
  const unsigned long long policy = moe_ptx::l2_evict_first_policy();  // (the served weight streams' hint)
  // Issues the warp's next slice; false when the ring is full, all is issued, or the slice is an expert's of a layer
  // this block has not routed yet.
  auto issue = [&]() -> bool {
    if (pc.op >= end_op || issued - consumed >= S) return false;
    const int l = pc.op / kOpsLayer, kind = pc.op % kOpsLayer, ks = warp + kConsumerWarps * pc.u;
    if (kind >= kOpGu && *reinterpret_cast<volatile int*>(&routed) != l + 1) return false;
    const bf16* src;
    int ld = kH;
    if (kind == kOpQkv) {
      src = p.wqkv + (size_t(l) * kQkv + pc.rb * kRb) * kH + ks * kSliceK;
    } else if (kind == kOpRouter || kind == kOpO) {
      const int row0 = (kind == kOpRouter ? kH : 0) + pc.rb * kRb;
      src = p.wo + (size_t(l) * kORows + row0) * kQ + ks * kSliceK, ld = kQ;
    } else if (kind == kOpGu) {  // row block rb: rows [16 (rb % 96), +16) of expert slot rb / 96's gate/up
      const int j = pc.rb / (kGu / kRb), row0 = pc.rb % (kGu / kRb) * kRb;
      src = p.wgu + ((size_t(l) * kExperts + ids_s[j]) * kGu + row0) * kH + ks * kSliceK;
    } else {  // k slice ks: slice ks % 12 of expert slot ks / 12's down rows
      const int j = ks / kSlicesDown;
      src = p.wd + ((size_t(l) * kExperts + ids_s[j]) * kH + pc.rb * kRb) * kI + ks % kSlicesDown * kSliceK, ld = kI;
    }
    bench_ring::load_slice(my_ring + (issued % S) * kSliceElems, src, ld, true, lane, src, p.hint != 0, policy);
    ++issued;
    advance(pc);
    return true;
  };
  while (issue()) {
  }  // weights are never written: before any wait

  auto clock_at = [&](int l, int s) { return p.clocks + ((size_t(c) * L + l) * kStages + s) * 2; };
  auto stamp = [&](int l, int s, int what) {
    if (threadIdx.x == 0) clock_at(l, s)[what] = global_ns();
  };
  // Waits until `cnt` has `units` this run; a wait of over 2 s traps (a broken count fails the launch, never hangs).
  auto wait_for = [&](const unsigned* cnt, int units) {
    if (threadIdx.x == 0) {
      const unsigned long long t0 = global_ns();
      while (ld_acquire(cnt) < p.epoch * unsigned(units))
        if (global_ns() - t0 > 2000000000ull) __trap();
    }
    __syncthreads();
  };
  Cursor cc = first_item(0);
  float acc = 0.f, c4[4] = {0.f, 0.f, 0.f, 0.f};
  const int r = lane >> 1, h2 = lane & 1;
  // This block's row blocks of op `op`: each row's sum to out(row, sum), each row block counted on `cnt`, then
  // after_rb() (the same in every thread).
  auto consume_op = [&](int op, unsigned* cnt, auto out, auto after_rb) {
    const int kind = op % kOpsLayer;
    while (cc.op == op) {
      if (issued <= consumed) __trap();  // (a slice consumed before it was issued: a broken schedule, made loud)
      bench_ring::wait_pending(issued - consumed - 1);
      __syncwarp();
      const bf16* sl = my_ring + (consumed % S) * kSliceElems;
      const int ks = warp + kConsumerWarps * cc.u;
      const bf16* xk = xs + ks * kSliceK;
      if (p.no_compute) {  // (the loads' own rate: the slice is waited for and released, no products)
      } else if (kind == kOpDown) {  // each expert's products weighted by its routing weight
        const float wj = wts_s[ks / kSlicesDown];
        if (MMA) {
          float t[4] = {0.f, 0.f, 0.f, 0.f};
          bench_ring::slice_mma(t, sl, xk, lane / 4, lane % 4);
#pragma unroll
          for (int i = 0; i < 4; ++i) c4[i] = fmaf(wj, t[i], c4[i]);
        } else {
          float t = 0.f;
          bench_ring::slice_dot(t, sl, xk, r, h2);
          acc = fmaf(wj, t, acc);
        }
      } else if (MMA) {
        bench_ring::slice_mma(c4, sl, xk, lane / 4, lane % 4);
      } else {
        bench_ring::slice_dot(acc, sl, xk, r, h2);
      }
      Cursor item;
      if (!bench_ring::release_slice(consumed, issue, cc, advance, item)) continue;
      if (MMA) bench_ring::stash_warp_rows_mma(c4, partial, warp, lane);
      else bench_ring::stash_warp_rows(acc, partial, warp, r, h2);
      if (threadIdx.x < kRb) out(item.rb * kRb + int(threadIdx.x), bench_ring::warp_rows_sum(partial, threadIdx.x));
      __syncthreads();
      if (threadIdx.x == 0) red_release_add(cnt);
      after_rb();
    }
  };
  auto nothing = [] {};
  __shared__ int router_done;  // thread 0's view of the router rows' count, for the whole block
  // Routes layer l unless this block already has: when `poll` only if the router rows are complete (no wait).
  auto route = [&](int l, const unsigned* router_cnt, bool poll) {
    if (routed == l + 1) return;
    if (poll) {
      if (threadIdx.x == 0) router_done = ld_acquire(router_cnt) >= p.epoch * unsigned(op_rbs(kOpRouter));
      __syncthreads();
      if (!router_done) return;
    } else {
      wait_for(router_cnt, op_rbs(kOpRouter));
    }
    route_top8(p, l, c, p.o + size_t(l) * kORows, ids_s, wts_s, &routed);
    __syncthreads();
    while (issue()) {
    }  // the experts' rows may go now
  };
  for (int l = 0; l < L; ++l) {
    unsigned* cnt = p.cnt + l * kStages;
    const float* h = p.h + size_t(l) * kH;
    const float* o = p.o + size_t(l) * kORows;
    const int op0 = kOpsLayer * l;
    // q/k/v
    if (cc.op == op0) {
      if (l > 0) wait_for(p.cnt + (l - 1) * kStages + kStDown, op_rbs(kOpDown));
      stage_norm(h, nullptr, xs, red);
      stamp(l, kStQkv, 0);
      consume_op(op0, cnt + kStQkv, [&](int n, float y) { p.qkv[size_t(l) * kQkv + n] = y; }, nothing);
      stamp(l, kStQkv, 1);
    }
    // attention: the part's cached keys and values loaded before the wait for q/k/v
    if (c < kAttnCtas) {
      const size_t off = ((size_t(l) * kKvHeads + c / kParts) * kCtx + (c % kParts) * kKeysPart) * kDim;
      constexpr int kChunks = kKeysPart * kDim / 8;  // 16-byte chunks of K (and of V): 256, one a thread
      static_assert(kChunks == kConsumers, "one K and one V chunk a thread");
      const uint4 kr = ld_early(p.kc + off + threadIdx.x * 8), vr = ld_early(p.vc + off + threadIdx.x * 8);
      wait_for(cnt + kStQkv, op_rbs(kOpQkv));
      reinterpret_cast<uint4*>(kv)[threadIdx.x] = kr;
      reinterpret_cast<uint4*>(kv)[kChunks + threadIdx.x] = vr;
      stamp(l, kStAttn, 0);
      attention_part(p, l, c, kv, kv + kKeysPart * kDim, q_s, newk, newv);
      __syncthreads();
      if (threadIdx.x == 0) red_release_add(cnt + kStAttn);
      stamp(l, kStAttn, 1);
      wait_for(cnt + kStAttn, kAttnCtas);
      stamp(l, kStMerge, 0);
      attention_merge(p, l, c);
      __syncthreads();
      if (threadIdx.x == 0) red_release_add(cnt + kStMerge);
      stamp(l, kStMerge, 1);
    }
    // the router rows, then o_proj; with early_route the block routes as soon as the router rows are complete (at
    // the start of o_proj or after any of its row blocks), so that the experts' rows stream while o_proj completes
    // (top-k is scale-free: a real router's ids come from logits before the norm's scale, known once o_proj is)
    bool staged = false;
    auto stage_attn = [&] {
      wait_for(cnt + kStMerge, kAttnCtas);
      for (int i = threadIdx.x; i < kQ / 8; i += kConsumers)
        reinterpret_cast<uint4*>(xs)[i] = __ldcg(reinterpret_cast<const uint4*>(p.attn + size_t(l) * kQ) + i);
      __syncthreads();
      staged = true;
    };
    if (cc.op == op0 + kOpRouter) {
      stage_attn();
      stamp(l, kStRouter, 0);
      consume_op(op0 + kOpRouter, cnt + kStRouter, [&](int n, float y) { p.o[size_t(l) * kORows + kH + n] = y; },
                 nothing);
      stamp(l, kStRouter, 1);
    }
    auto try_route = [&] {
      if (p.early_route) route(l, cnt + kStRouter, true);
    };
    if (cc.op == op0 + kOpO) {
      if (!staged) stage_attn();
      stamp(l, kStO, 0);
      try_route();
      consume_op(op0 + kOpO, cnt + kStO, [&](int n, float y) { p.o[size_t(l) * kORows + n] = y; }, try_route);
      stamp(l, kStO, 1);
    }
    // the experts' gate/up (every block has some of their 768 row blocks: G <= 768), routed by now
    route(l, cnt + kStRouter, false);
    wait_for(cnt + kStO, op_rbs(kOpO));
    stage_norm(h, o, xs, red);
    stamp(l, kStGu, 0);
    consume_op(op0 + kOpGu, cnt + kStGu, [&](int n, float y) { p.gu[size_t(l) * kTopK * kGu + n] = y; }, nothing);
    stamp(l, kStGu, 1);
    // down, weighted by the routing, plus the residual and o_proj's output
    if (cc.op == op0 + kOpDown) {
      wait_for(cnt + kStGu, op_rbs(kOpGu));
      stage_act(p, l, xs);
      __syncthreads();
      stamp(l, kStDown, 0);
      consume_op(
          op0 + kOpDown, cnt + kStDown,
          [&](int n, float y) { p.h[size_t(l + 1) * kH + n] = __ldcg(h + n) + __ldcg(o + n) + y; }, nothing);
      stamp(l, kStDown, 1);
    }
  }
  moe_ptx::cp_async_wait<0>();
}
}  // namespace v2
}  // namespace

// gpu_layer_persistent v1 (session 31): a producer warp of bulk copies and two rings (see gpu_layer_persistent.cu).
#pragma once

#include "gpu_layer_persistent_common.cuh"

namespace {

__global__ void __launch_bounds__(kThreads, 1) layer_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ unsigned long long d_full[kMaxRing], d_empty[kMaxRing], e_full[kMaxRing], e_empty[kMaxRing];
  __shared__ SlotDesc dl[kMaxD], el[kMaxE];
  __shared__ int nd, ne, nd_qkv, nd_o, ne_gu, n_own, route_ready;  // nd_o: the first o item
  __shared__ short own_row[kOwnRowsMax];
  __shared__ int ids_s[2][kTopK];
  __shared__ float wts_s[2][kTopK], red[kConsumerWarps], acc[kConsumerWarps][kOwnRowsMax];
  unsigned char* d_ring = smem;
  unsigned char* e_ring = smem + size_t(p.d_slots) * kSlot;
  float* xs = reinterpret_cast<float*>(e_ring + size_t(p.e_slots) * kSlot);
  float* q_s = xs;  // [kGroup][kDim]: the attention stage's, which stages nothing in xs
  float* newk = q_s + kGroup * kDim;
  float* newv = newk + kDim;

  const int c = blockIdx.x, G = gridDim.x, L = p.layers;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    // The CTA's slots of an op of n rows, R rows a slot never crossing a multiple of seg rows, in order: a
    // contiguous range of the rows, or (interleave) slot t of the op to CTA t % G, so that the CTAs read one moving
    // window (seg is then a multiple of R).
    auto own_slots = [&](int n, int R, int seg, auto f) {
      if (p.interleave) {
        for (int t = c; t * R < n; t += G) f(t * R, min(R, n - t * R));
        return;
      }
      const int hi = split_lo(n, c + 1, G);
      for (int v = split_lo(n, c, G); v < hi;) {
        const int rows = min(R, min(hi, (v / seg + 1) * seg) - v);
        f(v, rows);
        v += rows;
      }
    };
    int n = 0;
    own_slots(kQkv, kRowsQkv, kQkv, [&](int v, int rows) { dl[n++] = {kKindQkv, 0, short(v), short(rows), 0}; });
    nd_qkv = n;
    if (c < kAttnCtas) dl[n++] = {kKindKv, 0, 0, 0, 0};
    nd_o = n;
    own_slots(kORows, kRowsO, kORows, [&](int v, int rows) { dl[n++] = {kKindO, 0, short(v), short(rows), 0}; });
    nd = n;
    n = 0;
    own_slots(kTopK * kGu, kRowsGu, kGu, [&](int v, int rows) {
      el[n++] = {kKindGu, short(v / kGu), short(v % kGu), short(rows), 0};
    });
    ne_gu = n;
    for (int j = 0; j < kTopK; ++j) {  // the same own rows of every expert's down matrix
      int own = 0;
      own_slots(kH, kRowsDown, kH, [&](int v, int rows) {
        el[n++] = {kKindDown, short(j), short(v), short(rows), short(own)};
        for (int r = 0; r < rows; ++r) own_row[own + r] = short(v + r);
        own += rows;
      });
      n_own = own;
    }
    ne = n;
    route_ready = 0;
    init_ring_barriers(d_full, p.d_slots, 1);
    init_ring_barriers(e_full, p.e_slots, 1);
    init_ring_barriers(d_empty, p.d_slots, 1);
    init_ring_barriers(e_empty, p.e_slots, 1);
  }
  __syncthreads();

  if (warp == kConsumerWarps) {
    // The producer warp: one lane a ring slot (E slots first, then D), lane s issuing items s, s + slots, ... of its
    // ring, each once its slot is free (and, for E, once the item's layer has routed). One thread issuing every copy
    // managed one every ~0.35 us, ~23 GB/s a CTA with the copies landing ~0.7 us after issue (session 31).
    const bool is_e = lane < p.e_slots;
    if (lane >= p.e_slots + p.d_slots) return;
    const unsigned slot = is_e ? unsigned(lane) : unsigned(lane - p.e_slots);
    const unsigned slots = is_e ? unsigned(p.e_slots) : unsigned(p.d_slots);
    const unsigned per_layer = is_e ? unsigned(ne) : unsigned(nd), total = unsigned(L) * per_layer;
    unsigned long long* empty = is_e ? &e_empty[slot] : &d_empty[slot];
    const unsigned b = smem_addr(is_e ? &e_full[slot] : &d_full[slot]);
    unsigned char* dst = (is_e ? e_ring : d_ring) + size_t(slot) * kSlot;
    const unsigned long long pol = moe_ptx::l2_evict_first_policy();
    int routed = 0;  // layers whose expert ids this lane may read (one fence a layer)
    for (unsigned n = slot; n < total;) {
      const int lay = int(n / per_layer), idx = int(n % per_layer);
      if (is_e && lay >= routed) {
        if (*reinterpret_cast<volatile int*>(&route_ready) <= lay) {
          if (p.producer_sleep) __nanosleep(unsigned(p.producer_sleep));
          continue;
        }
        __threadfence_block();
        routed = lay + 1;
      }
      if (!test_ring_barrier(empty, ((n / slots) & 1u) ^ 1u)) {
        if (p.producer_sleep) __nanosleep(unsigned(p.producer_sleep));  // leave the issue slots to the consumers
        continue;
      }
      const SlotDesc d = is_e ? el[idx] : dl[idx];
      const bf16* src;
      unsigned bytes;
      if (d.kind == kKindKv) {
        const int hk = c / kParts, part = c % kParts;
        const size_t off = ((size_t(lay) * kKvHeads + hk) * kCtx + part * kKeysPart) * kDim;
        arrive_expect_tx(b, 2 * kKeysPart * kDim * 2);
        bulk_copy(dst, p.kc + off, kKeysPart * kDim * 2, b);
        bulk_copy(dst + kKeysPart * kDim * 2, p.vc + off, kKeysPart * kDim * 2, b);
        n += slots;
        continue;
      }
      if (d.kind == kKindQkv) {
        src = p.wqkv + (size_t(lay) * kQkv + d.row0) * kH, bytes = unsigned(d.rows) * kH * 2;
      } else if (d.kind == kKindO) {
        src = p.wo + (size_t(lay) * kORows + d.row0) * kQ, bytes = unsigned(d.rows) * kQ * 2;
      } else if (d.kind == kKindGu) {
        src = p.wgu + ((size_t(lay) * kExperts + ids_s[lay & 1][d.j]) * kGu + d.row0) * kH;
        bytes = unsigned(d.rows) * kH * 2;
      } else {
        src = p.wd + ((size_t(lay) * kExperts + ids_s[lay & 1][d.j]) * kH + d.row0) * kI;
        bytes = unsigned(d.rows) * kI * 2;
      }
      if (is_e && c == 0 && lay == min(1, L - 1)) p.item_clocks[idx] = global_ns();
      arrive_expect_tx(b, bytes);
      if (p.hint) bulk_copy_hint(dst, src, bytes, b, pol);
      else bulk_copy(dst, src, bytes, b);
      n += slots;
    }
    return;
  }

  // The consumers: the stages of every layer in order. Item i of a ring (counted over the layers) lives in slot
  // i % slots and belongs to warp i % 8 (the slot counts are multiples of 8, so a warp owns its slots: it never waits
  // for a phase of a slot whose previous phase another warp may still be reading); the attention's K / V item is
  // read by every warp, after a consumer barrier, and released by its owner after another.
  struct Ring {
    unsigned long long *full, *empty;
    unsigned char* base;
    unsigned slots, per_layer;
  };
  const Ring dr{d_full, d_empty, d_ring, unsigned(p.d_slots), unsigned(nd)},
      er{e_full, e_empty, e_ring, unsigned(p.e_slots), unsigned(ne)};
  auto ring_wait = [&](const Ring& r, unsigned i) -> const bf16* {
    const unsigned s = i % r.slots;
    wait_ring_barrier(&r.full[s], (i / r.slots) & 1u);
    return reinterpret_cast<const bf16*>(r.base + size_t(s) * kSlot);
  };
  auto ring_release = [&](const Ring& r, unsigned i) {
    __syncwarp();
    if (lane == 0) arrive_ring_barrier(&r.empty[i % r.slots]);
  };
  auto mine = [&](unsigned i) { return int(i % kConsumerWarps) == warp; };
  // This warp's items [from, to) of a ring's list for layer l: each slot's rows of K weights against x_of(slot),
  // row r's sum to out(slot, r, y).
  auto items = [&](bool e, int l, int from, int to, int K, auto x_of, auto out) {
    const Ring& ring = e ? er : dr;
    for (int i = from; i < to; ++i) {
      const unsigned item = unsigned(l) * ring.per_layer + unsigned(i);
      if (!mine(item)) continue;
      const SlotDesc d = e ? el[i] : dl[i];
      const bf16* w = ring_wait(ring, item);
      if (e && c == 0 && lane == 0 && l == min(1, L - 1)) p.item_clocks[kMaxE + i] = global_ns();
      if (!p.no_compute) {
        float y[kRowsMax];
        rows_dot(w, d.rows, x_of(d), K, y);
        if (lane == 0)
          for (int r = 0; r < d.rows; ++r) out(d, r, y[r]);
      }
      ring_release(ring, item);
    }
  };
  auto clock_at = [&](int l, int s) { return p.clocks + ((size_t(c) * L + l) * kStages + s) * 2; };
  auto stamp = [&](int l, int s) {
    if (threadIdx.x == 0) *clock_at(l, s) = global_ns();
  };
  const unsigned all = p.epoch * unsigned(G), attn_all = p.epoch * unsigned(kAttnCtas);
  auto x_plain = [&](const SlotDesc&) -> const float* { return xs; };
  for (int l = 0; l < L; ++l) {
    unsigned* cnt = p.cnt + l * kStages;
    const float* h = p.h + size_t(l) * kH;
    const float* o = p.o + size_t(l) * kORows;
    // qkv
    if (l > 0) wait_count(p.cnt + (l - 1) * kStages + kStDown, all, p.no_deps);
    stamp(l, kStQkv);
    stage_norm(h, nullptr, xs, red);
    items(false, l, 0, nd_qkv, kH, x_plain,
          [&](const SlotDesc& d, int r, float y) { p.qkv[size_t(l) * kQkv + d.row0 + r] = y; });
    signal(cnt + kStQkv, clock_at(l, kStQkv) + 1);
    // attn: partial softmax over the CTA's 16 keys for its kv head's 8 query heads
    wait_count(cnt + kStQkv, all, p.no_deps);
    stamp(l, kStAttn);
    if (c < kAttnCtas) {
      const unsigned kv_item = unsigned(l) * unsigned(nd) + unsigned(nd_qkv);
      const bf16* kv = ring_wait(dr, kv_item);
      attention_part(p, l, c, kv, kv + kKeysPart * kDim, q_s, newk, newv);
      consumers_sync();
      if (mine(kv_item)) ring_release(dr, kv_item);
      signal(cnt + kStAttn, clock_at(l, kStAttn) + 1);
    }
    // merge: 32 dims of query head c / 4 from the 32 parts
    wait_count(cnt + kStAttn, attn_all, p.no_deps);
    stamp(l, kStMerge);
    if (c < kAttnCtas) {
      attention_merge(p, l, c);
      signal(cnt + kStMerge, clock_at(l, kStMerge) + 1);
    }
    // o
    wait_count(cnt + kStMerge, attn_all, p.no_deps);
    stamp(l, kStO);
    for (int i = threadIdx.x; i < kQ; i += kConsumers)
      xs[i] = __uint_as_float(unsigned(__ldcg(reinterpret_cast<const unsigned short*>(p.attn) + size_t(l) * kQ + i))
                              << 16);
    consumers_sync();
    items(false, l, nd_o, nd, kQ, x_plain,
          [&](const SlotDesc& d, int r, float y) { p.o[size_t(l) * kORows + d.row0 + r] = y; });
    signal(cnt + kStO, clock_at(l, kStO) + 1);
    // gu: route first (the producer waits for it), then the normalized input
    wait_count(cnt + kStO, all, p.no_deps);
    stamp(l, kStGu);
    route_top8(p, l, c, o, ids_s[l & 1], wts_s[l & 1], &route_ready);
    stage_norm(h, o, xs, red);
    items(true, l, 0, ne_gu, kH, x_plain,
          [&](const SlotDesc& d, int r, float y) { p.gu[(size_t(l) * kTopK + d.j) * kGu + d.row0 + r] = y; });
    signal(cnt + kStGu, clock_at(l, kStGu) + 1);
    // down
    wait_count(cnt + kStGu, all, p.no_deps);
    stamp(l, kStDown);
    stage_act(p, l, xs);
    if (threadIdx.x < kConsumerWarps * kOwnRowsMax) (&acc[0][0])[threadIdx.x] = 0.f;
    consumers_sync();
    items(true, l, ne_gu, ne, kI, [&](const SlotDesc& d) -> const float* { return xs + d.j * kI; },
          [&](const SlotDesc& d, int r, float y) { acc[warp][d.acc0 + r] += wts_s[l & 1][d.j] * y; });
    consumers_sync();
    for (int i = int(threadIdx.x); i < n_own; i += kConsumers) {
      float sum = 0.f;  // the warps' sums in a fixed order: the same bits every run
#pragma unroll
      for (int w = 0; w < kConsumerWarps; ++w) sum += acc[w][i];
      const int r = own_row[i];
      p.h[size_t(l + 1) * kH + r] = __ldcg(h + r) + __ldcg(o + r) + sum;
    }
    signal(cnt + kStDown, clock_at(l, kStDown) + 1);
  }
}
}  // namespace

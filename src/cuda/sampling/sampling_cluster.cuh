// Cluster-wide passes of the GPU sampler (see sampling_kernel.cuh): one thread-block cluster owns a row, each
// of its kClusterBlocks blocks a contiguous slice of it; block 0 gathers, decides and broadcasts.
//
// Four collective operations, each called by every block of the cluster (they synchronise the cluster):
//   gather_then   tokens passing a predicate are copied into block 0 (at most kCap), which then runs a step
//   histogram     per-bin token counts and weights over the row (per-warp private bins, 32-bit atomics)
//   vocab_cut     the first token in vocabulary order whose cumulative weight reaches a target
//   select        the cut of a prefix of the order (key descending, id ascending) that reaches a weight
// Weights are 64-bit fixed point, summed in integers: results do not depend on the order of atomics.
#pragma once

#include "cuda/sampling/sampling_device.cuh"

namespace moeserve::cuda::MOESERVE_SAMPLING_NS {

// Phase-1 results of a block, then of the row.
struct Stats {
  ArgMax best;     // modified logits (penalties and bans applied)
  float x_min;     // smallest modified logit above -inf (+inf: none)
  OnlineSum raw;   // log-sum-exp of the raw logits
  float r_max;     // largest raw logit
  float r_min;     // smallest raw logit above -inf
};

enum Mode : int { kDone, kAll, kPrefix, kBoundary, kRefine, kTie, kNeedTotal, kGeneric, kCross, kNone };

// Block 0's decisions, copied by every block after a cluster barrier. Two slots, used in turn, so that
// block 0 can write the next plan while the other blocks still copy the last one.
struct Plan {
  int mode;
  int bin;        // pass-1 bin of the cut
  uint32_t pref;  // key bits fixed by the refinement passes / the cut key
  int cut;        // cut id (exclusive) / drawn token
  int block, warp;
  int n;          // candidates gathered
  u64 above, target, total;
};

struct WarpHist {
  uint32_t cnt[kWarps][kBins];
  union {
    struct {
      uint32_t lo[kWarps][kBins];  // weight bits 0..19
      uint32_t hi[kWarps][kBins];  // weight bits 20..40
    } split;
    u64 wide[kWarps][kBins];       // rows whose warps see more than 2^11 tokens: 64-bit atomics
  } w;
};

struct SetWork {
  u64 keys[kCap];
  uint16_t idx[kCap];
  uint8_t kept[kCap];
};

struct Smem {
  Stats stats;                              // this block's phase-1 results
  Stats row;                                // the row's (merged by every block)
  Plan plans[2];
  u64 tmp_above;
  int tmp_n, result;
  float wmax_x[kWarps], wmax_r[kWarps];     // per-warp maxima (thresholds that hold >= k tokens)
  float peer_max[kClusterBlocks * kWarps];
  float thresh;
  int pos_min, cand_n;
  u64 scratch[kWarps];
  ArgMax red_best[kWarps];
  float red_f[3][kWarps];
  OnlineSum red_os[kWarps];
  u64 warp_sum[kWarps];                     // per-warp sums of a vocabulary-order pass
  u64 block_total;
  u64 bh_w[kBins];                          // this block's histogram (bin 0: nearest the top of the order)
  uint32_t bh_c[kBins];
  u64 gw[kBins > kClusterBlocks * kWarps ? kBins : kClusterBlocks * kWarps];  // block 0: merged weights
  uint32_t gc[kBins];
  int cand_id[kCap];
  float cand_val[kCap];
  union {
    WarpHist wh;
    SetWork set;
  } u;
};

// One row's slice in this block.
struct Row {
  const float* raw;   // the row's logits
  const float* over;  // the row's penalised / banned values (valid where the bitmap says so)
  const uint32_t* bits;
  int V, lo, hi, slice;
  bool vec, has_over, wide;
  unsigned rank;
  mutable int seq;  // plans published so far (the same in every block)
  __device__ float modify(int v, float r) const {
    return (has_over && ((bits[(v - lo) >> 5] >> ((v - lo) & 31)) & 1u)) ? over[v] : r;
  }
};

// f(v, raw logit) for every token of the slice, spread over the block (the order is unspecified). One block
// per SM (the kernel needs 128 registers a thread): eight 16-byte loads in flight per thread keep 64 KiB
// in flight per SM, what HBM's latency asks for.
template <class F>
__device__ __forceinline__ void for_slice(const Row& c, F f) {
  if (c.vec) {
    const float4* r4 = reinterpret_cast<const float4*>(c.raw);
#pragma unroll 8
    for (int i = c.lo / 4 + int(threadIdx.x); i < c.hi / 4; i += kThreads) {
      const float4 q = __ldg(r4 + i);
      f(4 * i, q.x);
      f(4 * i + 1, q.y);
      f(4 * i + 2, q.z);
      f(4 * i + 3, q.w);
    }
  } else {
#pragma unroll 4
    for (int v = c.lo + int(threadIdx.x); v < c.hi; v += kThreads) f(v, __ldg(c.raw + v));
  }
}

// Each warp owns a contiguous piece of the slice for the vocabulary-order passes (whole float4 per lane).
__device__ __forceinline__ int warp_span(const Row& c) { return ((c.slice + kWarps - 1) / kWarps + 127) / 128 * 128; }
__device__ __forceinline__ int warp_begin(const Row& c, int w) { return min(c.hi, c.lo + w * warp_span(c)); }

// The plan block 0 writes next.
__device__ __forceinline__ Plan& next_plan(const Row& c, Smem& s) { return s.plans[c.seq & 1]; }
// Block 0's plan, as every block sees it after the barrier that followed block 0's writing it.
__device__ __forceinline__ Plan fetch_plan(const Row& c, Smem& s) {
  Plan& slot = s.plans[c.seq & 1];
  if (c.rank != 0) {
    if (threadIdx.x == 0) slot = *cluster_peer(&slot, 0);
    __syncthreads();
  }
  ++c.seq;
  return slot;
}

// Block 0: the first position (of n sorted candidates) where above + the weights up to it reach target, or -1.
template <class W>
__device__ int first_reaching(Smem& s, int n, u64 above, u64 target, W weight) {
  const int per = (n + kThreads - 1) / kThreads, b = min(n, int(threadIdx.x) * per), e = min(n, b + per);
  u64 mine = 0;
  for (int p = b; p < e; ++p) mine += weight(p);
  if (threadIdx.x == 0) s.pos_min = INT_MAX;
  u64 total;
  u64 run = above + block_exclusive_scan(mine, total, s.scratch);
  if (run < target && run + mine >= target)
    for (int p = b; p < e; ++p) {
      run += weight(p);
      if (run >= target) {
        atomicMin(&s.pos_min, p);
        break;
      }
    }
  __syncthreads();
  const int r = s.pos_min;
  __syncthreads();
  return r == INT_MAX ? -1 : r;
}

// Block 0: sorts its n candidates by (key_of(value) descending, id ascending); returns the padded length.
template <class KeyOf>
__device__ int sort_candidates(Smem& s, int n, KeyOf key_of) {
  int N = 2;
  while (N < n) N *= 2;
  for (int i = threadIdx.x; i < N; i += kThreads) {
    s.u.set.keys[i] = i < n ? rank_key(key_of(s.cand_val[i]), s.cand_id[i]) : 0ull;
    s.u.set.idx[i] = uint16_t(i);
  }
  __syncthreads();
  bitonic_sort_desc(s.u.set.keys, s.u.set.idx, N);
  return N;
}

// Copies the tokens with pred(v, value_of(v, raw)) into block 0 (id, value), then block 0 runs
// step(n): n < 0 when more than kCap tokens passed. step fills next_plan(); every block gets that plan back.
template <class Val, class Pred, class Step>
__device__ Plan gather_then(const Row& c, Smem& s, Val value_of, Pred pred, Step step) {
  if (threadIdx.x == 0) s.cand_n = 0;
  __syncthreads();
  for_slice(c, [&](int v, float r) {
    const float x = value_of(v, r);
    if (pred(v, x)) {
      const int i = atomicAdd(&s.cand_n, 1);
      if (i < kCap) {
        s.cand_id[i] = v;
        s.cand_val[i] = x;
      }
    }
  });
  __syncthreads();
  cluster_sync();
  if (c.rank == 0) {
    if (threadIdx.x == 0) {
      int n = 0;
      for (int q = 0; q < kClusterBlocks; ++q) {
        const int m = q == 0 ? s.cand_n : *cluster_peer(&s.cand_n, unsigned(q));
        s.gc[q] = uint32_t(n);
        n = (n > kCap || m > kCap) ? kCap + 1 : n + m;
      }
      next_plan(c, s).n = n > kCap ? -1 : n;
    }
    __syncthreads();
    const int n = next_plan(c, s).n;
    if (n > 0)
      for (int q = 1; q < kClusterBlocks; ++q) {
        const int* pid = cluster_peer(s.cand_id, unsigned(q));
        const float* pval = cluster_peer(s.cand_val, unsigned(q));
        const int m = (q + 1 < kClusterBlocks ? int(s.gc[q + 1]) : n) - int(s.gc[q]);
        for (int i = threadIdx.x; i < m; i += kThreads) {
          s.cand_id[s.gc[q] + i] = pid[i];
          s.cand_val[s.gc[q] + i] = pval[i];
        }
      }
    __syncthreads();
    step(n);
    __syncthreads();
  }
  cluster_sync();
  return fetch_plan(c, s);
}

// bin_w(v, raw, bin, weight): bin in [0, kBins) (lower bins come first in the order) or -1 to skip.
// Leaves this block's counts and weights in s.bh_c / s.bh_w (read by block 0 after a cluster barrier).
template <class BinW>
__device__ void histogram(const Row& c, Smem& s, BinW bin_w) {
  WarpHist& h = s.u.wh;
  for (int i = threadIdx.x; i < kWarps * kBins; i += kThreads) {
    (&h.cnt[0][0])[i] = 0;
    (&h.w.wide[0][0])[i] = 0;
  }
  __syncthreads();
  const int w = threadIdx.x / 32;
  for_slice(c, [&](int v, float r) {
    int b;
    u64 wt;
    bin_w(v, r, b, wt);
    if (b >= 0) {
      atomicAdd(&h.cnt[w][b], 1u);
      if (wt != 0) {
        if (c.wide) {
          atomicAdd(&h.w.wide[w][b], wt);
        } else {
          atomicAdd(&h.w.split.lo[w][b], uint32_t(wt & 0xfffffu));
          atomicAdd(&h.w.split.hi[w][b], uint32_t(wt >> 20));
        }
      }
    }
  });
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    uint32_t n = 0;
    u64 wt = 0;
    for (int q = 0; q < kWarps; ++q) {
      n += h.cnt[q][b];
      wt += c.wide ? h.w.wide[q][b] : u64(h.w.split.lo[q][b]) + (u64(h.w.split.hi[q][b]) << 20);
    }
    s.bh_c[b] = n;
    s.bh_w[b] = wt;
  }
  __syncthreads();
}

// Block 0, after a cluster barrier that follows histogram(): the row's bins in s.gw / s.gc; returns the
// total weight.
__device__ u64 merge_histograms(Smem& s) {
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    uint32_t n = 0;
    u64 wt = 0;
    for (int q = 0; q < kClusterBlocks; ++q) {
      n += *cluster_peer(&s.bh_c[b], unsigned(q));
      wt += *cluster_peer(&s.bh_w[b], unsigned(q));
    }
    s.gc[b] = n;
    s.gw[b] = wt;
  }
  __syncthreads();
  u64 mine = 0;
  for (int b = threadIdx.x; b < kBins; b += kThreads) mine += s.gw[b];
  return block_sum(mine, s.scratch);
}

// Block 0: the bin where above + the weights of bins 0..b reach target (-1: none), with the weight before
// it and the count of tokens in bins 0..b.
__device__ int pick_bin(Smem& s, u64 target, u64& above, int& count_upto) {
  const int per = (kBins + kThreads - 1) / kThreads, b0 = min(kBins, int(threadIdx.x) * per), e0 = min(kBins, b0 + per);
  u64 mine = 0, cmine = 0;
  for (int b = b0; b < e0; ++b) mine += s.gw[b], cmine += s.gc[b];
  u64 total, ctotal;
  u64 run = block_exclusive_scan(mine, total, s.scratch), crun = block_exclusive_scan(cmine, ctotal, s.scratch);
  if (threadIdx.x == 0) s.pos_min = -1;
  __syncthreads();
  if (run < target && run + mine >= target)
    for (int b = b0; b < e0; ++b) {
      crun += s.gc[b];
      if (run + s.gw[b] >= target) {
        s.pos_min = b;
        s.tmp_above = run;
        s.tmp_n = int(min(crun, u64(INT_MAX)));
        break;
      }
      run += s.gw[b];
    }
  __syncthreads();
  const int r = s.pos_min;
  above = s.tmp_above;
  count_upto = s.tmp_n;
  __syncthreads();
  return r;
}

// The first token in vocabulary order whose weight(v, raw) summed from the row's first token reaches
// target_of(total) (0: none); -1 if none. Every block gets the answer.
template <class W, class TargetOf>
__device__ int vocab_cut(const Row& c, Smem& s, W weight, TargetOf target_of) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  {
    const int b = warp_begin(c, w), e = warp_begin(c, w + 1);
    u64 sum = 0;
    if (c.vec) {
      const float4* r4 = reinterpret_cast<const float4*>(c.raw);
      for (int i = b / 4 + lane; i < e / 4; i += 32) {
        const float4 q = __ldg(r4 + i);
        sum += weight(4 * i, q.x) + weight(4 * i + 1, q.y) + weight(4 * i + 2, q.z) + weight(4 * i + 3, q.w);
      }
    } else {
      for (int v = b + lane; v < e; v += 32) sum += weight(v, __ldg(c.raw + v));
    }
    sum = warp_sum(sum);
    if (lane == 0) s.warp_sum[w] = sum;
  }
  __syncthreads();
  cluster_sync();
  if (c.rank == 0) {
    for (int i = threadIdx.x; i < kClusterBlocks * kWarps; i += kThreads)
      s.gw[i] = *cluster_peer(&s.warp_sum[i % kWarps], unsigned(i / kWarps));
    __syncthreads();
    if (threadIdx.x == 0) {
      u64 total = 0;
      for (int i = 0; i < kClusterBlocks * kWarps; ++i) total += s.gw[i];
      const u64 target = target_of(total);
      Plan& pl = next_plan(c, s);
      pl.mode = kNone;
      s.result = -1;
      u64 base = 0;
      for (int i = 0; target != 0 && i < kClusterBlocks * kWarps; ++i) {
        if (base + s.gw[i] >= target) {
          pl.mode = kCross;
          pl.block = i / kWarps;
          pl.warp = i % kWarps;
          pl.above = base;
          pl.target = target;
          break;
        }
        base += s.gw[i];
      }
    }
    __syncthreads();
  }
  cluster_sync();
  const Plan pl = fetch_plan(c, s);
  if (pl.mode == kCross && int(c.rank) == pl.block) {
    // The block scans the crossing warp's piece, each thread a contiguous part of it.
    const int cb = warp_begin(c, pl.warp), ce = warp_begin(c, pl.warp + 1);
    const int per = (ce - cb + kThreads - 1) / kThreads;
    const int pb = min(ce, cb + int(threadIdx.x) * per), pe = min(ce, pb + per);
    u64 mine = 0;
    for (int v = pb; v < pe; ++v) mine += weight(v, __ldg(c.raw + v));
    u64 piece_total;
    u64 run = pl.above + block_exclusive_scan(mine, piece_total, s.scratch);
    if (run < pl.target && run + mine >= pl.target)
      for (int v = pb; v < pe; ++v) {
        run += weight(v, __ldg(c.raw + v));
        if (run >= pl.target) {
          *cluster_peer(&s.result, 0) = v;
          break;
        }
      }
  }
  cluster_sync();
  int r = -1;
  if (pl.mode == kCross) {
    if (threadIdx.x == 0) s.pos_min = *cluster_peer(&s.result, 0);
    __syncthreads();
    r = s.pos_min;
  }
  return r;
}

// What select() found: the prefix that first reaches the target weight, and whether block 0 still holds
// (sorted, in s.u.set) every token of bins 0..plan.bin, a complete prefix of the order that contains it.
struct Selection {
  Prefix cut;
  bool all;      // the target is beyond the total: no cut
  bool has_set;  // block 0's candidates are that complete prefix (n of them), sorted
  u64 total;      // the total weight
  int n;
};

// The shortest prefix of the order (key descending, id ascending) whose weight reaches target_of(total).
// desc(v, value, key, dist, weight) describes a token from its value (value_of(v, raw), the number block 0
// keeps): its order key, its distance below the top of the order (>= 0, monotone in the order: the first
// pass bins it uniformly over [0, span]) and its weight (0: not counted). Pass 1 bins by distance; when the
// bin holding the cut has too many tokens for block 0, passes over 8 key bits each narrow it down; a single
// key with too many tokens is split by id in vocabulary order, as the CPU's stable sort does. far_all: a cut
// in the last bin (tokens beyond `span`, which carry no mass) counts as no cut.
template <class Val, class Desc, class TargetOf>
__device__ Selection select(const Row& c, Smem& s, float span, bool far_all, Val value_of, Desc desc,
                           TargetOf target_of) {
  const float scale = float(kBins - 1) / span;
  const auto bin_of = [&](float dist) { return dist <= span ? min(int(dist * scale), kBins - 2) : kBins - 1; };
  histogram(c, s, [&](int v, float r, int& b, u64& wt) {
    uint32_t key;
    float dist;
    desc(v, value_of(v, r), key, dist, wt);
    b = bin_of(dist);
  });
  cluster_sync();
  if (c.rank == 0) {
    const u64 total = merge_histograms(s);
    const u64 target = target_of(total);
    u64 above = 0;
    int upto = 0;
    const int b = (total == 0 || target > total) ? -1 : pick_bin(s, target, above, upto);
    if (threadIdx.x == 0) {
      Plan& p = next_plan(c, s);
      p.total = total;
      p.target = target;
      p.above = above;
      p.bin = b;
      p.pref = 0;
      p.mode = b < 0 || (far_all && b == kBins - 1) ? kAll
               : upto <= kCap                       ? kPrefix
               : int(s.gc[b]) <= kCap               ? kBoundary
                                                    : kRefine;
    }
    __syncthreads();
  }
  cluster_sync();
  Plan pl = fetch_plan(c, s);
  const u64 total = pl.total;
  if (pl.mode == kAll) return Selection{kEverything, true, false, total, 0};
  const int bin = pl.bin;
  uint32_t mask = 0;
  for (int shift = 24; pl.mode == kRefine; shift -= 8) {
    const uint32_t pref = pl.pref;
    histogram(c, s, [&](int v, float r, int& b, u64& wt) {
      uint32_t key;
      float dist;
      desc(v, value_of(v, r), key, dist, wt);
      b = (bin_of(dist) == bin && (key & mask) == pref) ? kBins - 1 - int((key >> shift) & 255u) : -1;
    });
    mask |= 255u << shift;
    cluster_sync();
    if (c.rank == 0) {
      merge_histograms(s);
      u64 above = 0;
      int upto = 0;
      const int b = pick_bin(s, pl.target - pl.above, above, upto);
      if (threadIdx.x == 0) {
        Plan& p = next_plan(c, s);
        p = pl;
        p.above = pl.above + above;
        p.pref = pref | (uint32_t(kBins - 1 - b) << shift);
        p.mode = int(s.gc[b]) <= kCap ? kBoundary : shift == 0 ? kTie : kRefine;
      }
      __syncthreads();
    }
    cluster_sync();
    pl = fetch_plan(c, s);
  }
  if (pl.mode == kTie) {  // one key, more tokens than block 0 holds: the first ones by id reach the target
    const uint32_t k = pl.pref;
    const u64 rest = pl.target - pl.above;
    const int last = vocab_cut(
        c, s,
        [&](int v, float r) -> u64 {
          uint32_t key;
          float dist;
          u64 wt;
          desc(v, value_of(v, r), key, dist, wt);
          return (key == k && bin_of(dist) == bin) ? wt : 0ull;
        },
        [&](u64) { return rest; });
    return Selection{Prefix{k, last + 1}, false, false, total, 0};
  }
  // Gather the bins up to the cut (or the cut's bin / key prefix alone) and find the cut among them.
  const bool prefix = pl.mode == kPrefix;
  const uint32_t pref = pl.pref;
  const u64 above = prefix ? 0ull : pl.above, target = pl.target;
  pl = gather_then(
      c, s, value_of,
      [&](int v, float x) {
        uint32_t key;
        float dist;
        u64 wt;
        desc(v, x, key, dist, wt);
        const int b = bin_of(dist);
        return prefix ? b <= bin : (b == bin && (key & mask) == pref);
      },
      [&](int n) {
        const auto key_of = [&](float x) {
          uint32_t key;
          float dist;
          u64 wt;
          desc(0, x, key, dist, wt);
          return key;
        };
        sort_candidates(s, n, key_of);
        const auto weight = [&](int p) {
          const int i = s.u.set.idx[p];
          uint32_t key;
          float dist;
          u64 wt;
          desc(s.cand_id[i], s.cand_val[i], key, dist, wt);
          return wt;
        };
        const int p = first_reaching(s, n, above, target, weight);
        if (threadIdx.x == 0) {
          const int i = s.u.set.idx[max(p, 0)];
          next_plan(c, s).pref = p < 0 ? 0u : key_of(s.cand_val[i]);
          next_plan(c, s).cut = p < 0 ? INT_MAX : s.cand_id[i] + 1;
        }
      });
  return Selection{Prefix{pl.pref, pl.cut}, false, prefix, total, pl.n};
}

}  // namespace moeserve::cuda::MOESERVE_SAMPLING_NS

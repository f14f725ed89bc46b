// The GPU sampler's kernel body: one thread-block cluster per logit row, each block a slice of the row.
//
// Phase 1 (every row, one read of the logits): argmax of the modified logits, raw log-sum-exp, extremes and
// per-warp maxima, merged across the cluster. Greedy rows are done.
//
// Sampling keeps exactly the CPU sampler's set: every filter keeps a prefix of the order (modified logit
// descending, id ascending), so the kept set is one cut of it. Probability mass is fixed point (2^40 = the
// top token's exp(0)), summed in 64-bit integers: the same row and random value always give the same token,
// drawn as the first token in VOCABULARY order whose cumulative kept mass exceeds u * kept_total (u from the
// random bits), from the same distribution as the CPU sampler (which walks in probability order).
//   1. A small kept set is found from a threshold that provably lies below it: the k-th largest per-warp
//      maximum for top-k (k tokens reach it), or a floor of min-p's cut. Block 0 gathers the tokens above it
//      (a complete prefix of the order), sorts them and finishes top-k, top-p, min-p and the draw there.
//   2. Otherwise select() finds the top-k / top-p cut with a histogram pass over distance-from-the-top bins
//      (and rarely more), then the draw takes one vocabulary-order pass.
// Top logprobs: the n-th largest per-warp raw maximum bounds the top n from below; block 0 sorts what lies
// above it (select() when too many do).
#pragma once

#include "cuda/sampling/sampling_cluster.cuh"
#include "cuda/sampling/sampling_types.h"

namespace moeserve::cuda::MOESERVE_SAMPLING_NS {

// Tokens per block slice (whole float4s) and the shared memory a block needs for a vocabulary.
__host__ __device__ inline int slice_len(int V) { return ((V + kClusterBlocks - 1) / kClusterBlocks + 3) / 4 * 4; }
__host__ __device__ inline size_t smem_bytes(int V) {
  return sizeof(Smem) + size_t((slice_len(V) + 31) / 32) * sizeof(uint32_t);
}

// exp((x - max) / T) as the CPU computes it, in f32 (equal logits, equal masses), and its fixed point.
struct Mass {
  float T, zmax;
  __device__ float e_of(float x) const { return expf(__fsub_rn(__fdiv_rn(x, T), zmax)); }
  __device__ u64 of(float x) const {
    const float e = e_of(x);
    return e > 0.0f ? __float2ull_rn(fminf(e, 1.0f) * kMassScale) : 0ull;
  }
  // Distance below the top in units of T (monotone in x): select()'s bins.
  __device__ float dist(float x) const { return __fsub_rn(zmax, __fdiv_rn(x, T)); }
};

// A logit below which no token passes min-p (e_of(x) >= min_p), with margins for expf's 2 ulp and roundings.
__device__ inline float min_p_floor(const Mass& ms, float min_p) {
  const double z = double(ms.zmax) + log(double(min_p)) - 1e-4 * (1.0 + fabs(double(ms.zmax))) - 1e-4;
  double x = z * double(ms.T);
  x -= 1e-5 * fabs(x) + 1e-30;
  const float f = float(x);
  return double(f) > x ? nextafterf(f, -INFINITY) : f;
}

// The k-th largest of the cluster's per-warp maxima (wmax: this block's copy in shared memory): at least k
// tokens of the row are >= it. -inf when fewer than k maxima compare.
__device__ float kth_warp_max(Smem& s, const float* wmax, int k) {
  constexpr int m = kClusterBlocks * kWarps;
  for (int i = threadIdx.x; i < m; i += kThreads) s.peer_max[i] = *cluster_peer(wmax + i % kWarps, unsigned(i / kWarps));
  if (threadIdx.x == 0) s.thresh = -INFINITY;
  __syncthreads();
  for (int i = threadIdx.x; i < m; i += kThreads) {
    const float v = s.peer_max[i];
    int gt = 0, ge = 0;
    for (int j = 0; j < m; ++j) {
      gt += s.peer_max[j] > v;
      ge += s.peer_max[j] >= v;
    }
    if (gt < k && k <= ge) s.thresh = v;  // all such threads write the same value
  }
  __syncthreads();
  const float t = s.thresh;
  __syncthreads();
  return t;
}

struct Filters {
  Mass ms;
  int k_pos;      // top-k as a count of sorted candidates (INT_MAX: not among them)
  Prefix keep_k;  // top-k / top-p cuts found by select() (kEverything: none)
  Prefix keep_p;
  bool find_p;    // find the top-p cut among the candidates
  float top_p, min_p;
  u64 top_total;  // top-p's total when it is not the candidates' own top-k mass (0: it is)
  double u;       // the draw's uniform value
};

__device__ inline u64 top_p_target(float top_p, u64 total) {
  // The CPU keeps the shortest sorted prefix whose probability (within the top-k set) reaches top_p.
  const double t = ceil(double(top_p) * double(total));
  return t < 1.0 ? 1ull : min(u64(t), total);
}
__device__ inline u64 draw_target(double u, u64 total) {
  if (total == 0) return 0ull;
  const u64 t = u64(u * double(total));
  return min(t, total - 1) + 1;
}

// Block 0: the token drawn among its n candidates, a complete prefix of the order that holds every kept
// token (-1: no mass). Sorts them by the order, applies the filters, then walks the kept ones by id.
__device__ int draw_in_set(Smem& s, int n, const Filters& f) {
  SetWork& w = s.u.set;
  const int N = sort_candidates(s, n, [](float x) { return order_key(x); });
  const auto in_k = [&](int p) {
    const int i = w.idx[p];
    return p < f.k_pos && f.keep_k.has(s.cand_id[i], order_key(s.cand_val[i]));
  };
  int l_p = INT_MAX;
  if (f.find_p) {
    const auto weight = [&](int p) { return in_k(p) ? f.ms.of(s.cand_val[w.idx[p]]) : 0ull; };
    u64 total = f.top_total;
    if (total == 0) {
      u64 mine = 0;
      for (int p = threadIdx.x; p < n; p += kThreads) mine += weight(p);
      total = block_sum(mine, s.scratch);
    }
    if (total != 0) {
      const int p = first_reaching(s, n, 0ull, top_p_target(f.top_p, total), weight);
      l_p = p < 0 ? INT_MAX : p + 1;
    }
  }
  for (int p = threadIdx.x; p < n; p += kThreads) {
    const int i = w.idx[p];
    const float x = s.cand_val[i];
    const uint32_t key = order_key(x);
    w.kept[i] = in_k(p) && p < l_p && f.keep_p.has(s.cand_id[i], key) && (f.min_p <= 0.0f || f.ms.e_of(x) >= f.min_p);
  }
  __syncthreads();
  // The kept ones by id ascending (the others sort last).
  for (int i = threadIdx.x; i < N; i += kThreads) {
    w.keys[i] = (i < n && w.kept[i]) ? u64(0xffffffffu - uint32_t(s.cand_id[i])) + 1 : 0ull;
    w.idx[i] = uint16_t(i);
  }
  __syncthreads();
  bitonic_sort_desc(w.keys, w.idx, N);
  const auto weight = [&](int p) { return w.keys[p] != 0 ? f.ms.of(s.cand_val[w.idx[p]]) : 0ull; };
  u64 mine = 0;
  for (int p = threadIdx.x; p < n; p += kThreads) mine += weight(p);
  const u64 target = draw_target(f.u, block_sum(mine, s.scratch));
  if (target == 0) return -1;
  const int p = first_reaching(s, n, 0ull, target, weight);
  return p < 0 ? -1 : s.cand_id[w.idx[p]];
}

// Block 0 runs pick() (which returns a token) and every block gets the token.
template <class Pick>
__device__ int decide_on_block0(const Row& c, Smem& s, Pick pick) {
  if (c.rank == 0) {
    const int t = pick();
    if (threadIdx.x == 0) next_plan(c, s).cut = t;
    __syncthreads();
  }
  cluster_sync();
  return fetch_plan(c, s).cut;
}

// The sampled token of a non-greedy row (-1: none drawn, the caller keeps the argmax).
__device__ int sample_row(const Row& c, Smem& s, const SampleRowParams& p, const Stats& g) {
  const int V = c.V;
  const bool kact = p.top_k > 0 && p.top_k < V, pact = p.top_p < 1.0f, mact = p.min_p > 0.0f;
  const int k = kact ? p.top_k : 0;
  Filters f{Mass{p.temperature, __fdiv_rn(g.best.v, p.temperature)}, INT_MAX, kEverything, kEverything, false,
            p.top_p, p.min_p, 0ull, double(p.random >> 11) * 0x1p-53};
  const Mass& ms = f.ms;
  const auto value_of = [&](int v, float r) { return c.modify(v, r); };

  // 1. Small kept sets: gather everything above a threshold that lies below the kept set.
  const bool small = V <= kCap, use_k = kact && k <= kClusterBlocks * kWarps;
  if (small || use_k || mact) {
    float tau = -INFINITY, tau_m = -INFINITY;  // small vocabularies: gather everything
    if (!small) {
      if (use_k) tau = kth_warp_max(s, s.wmax_x, k);
      if (mact) tau = fmaxf(tau, tau_m = min_p_floor(ms, p.min_p));
    }
    const bool covers_m = mact && (small || tau <= tau_m);  // the candidates hold min-p's kept set
    Plan pl = gather_then(
        c, s, value_of, [&](int, float x) { return x >= tau; },
        [&](int n) {
          // Top-k among the candidates; top-p needs the top-k set's mass (all of the row's without top-k).
          const bool k_here = kact && n >= k;
          int mode = kGeneric, t = -1;
          if (n >= 0 && (small || k_here || (covers_m && (!pact || !kact)))) {
            Filters h = f;
            h.k_pos = k_here ? k : INT_MAX;
            h.find_p = pact;
            if (small || k_here || !pact) {
              t = draw_in_set(s, n, h);
              mode = kDone;
            } else {
              mode = kNeedTotal;  // covered by min-p, top-p over the whole row
            }
          }
          if (threadIdx.x == 0) {
            next_plan(c, s).mode = mode;
            next_plan(c, s).cut = t;
          }
        });
    if (pl.mode == kDone) return pl.cut;
    if (pl.mode == kNeedTotal) {
      u64 mine = 0;
      for_slice(c, [&](int v, float r) { mine += ms.of(c.modify(v, r)); });
      const u64 sum = block_sum(mine, s.scratch);
      if (threadIdx.x == 0) s.block_total = sum;
      __syncthreads();
      cluster_sync();
      return decide_on_block0(c, s, [&] {
        u64 total = 0;
        for (int q = 0; q < kClusterBlocks; ++q) total += *cluster_peer(&s.block_total, unsigned(q));
        Filters h = f;
        h.find_p = true;
        h.top_total = total;
        return draw_in_set(s, pl.n, h);  // block 0 still holds the candidates
      });
    }
  }

  // 2. Large kept sets: select() the top-k and top-p cuts, then draw in one pass over the row.
  float span = fminf(kMassRange, ms.dist(g.x_min));
  if (!(span > 0.0f)) span = 1.0f;  // one distinct value (or none below the top)
  if (kact) {
    const Selection sel = select(
        c, s, span, true, value_of,
        [&](int, float x, uint32_t& key, float& dist, u64& wt) {
          key = order_key(x);
          dist = ms.dist(x);
          wt = 1;
        },
        [k](u64) { return u64(k); });
    if (!sel.all) f.keep_k = sel.cut;
    if (sel.has_set)  // block 0 holds a complete prefix with the whole top-k set
      return decide_on_block0(c, s, [&] {
        Filters h = f;
        h.find_p = pact;
        return draw_in_set(s, sel.n, h);
      });
  }
  if (pact) {
    const Prefix keep_k = f.keep_k;
    const Selection sel = select(
        c, s, span, true, value_of,
        [&](int v, float x, uint32_t& key, float& dist, u64& wt) {
          key = order_key(x);
          dist = ms.dist(x);
          wt = keep_k.has(v, key) ? ms.of(x) : 0ull;
        },
        [&](u64 total) { return top_p_target(f.top_p, total); });
    if (!sel.all) f.keep_p = sel.cut;
    if (sel.has_set) return decide_on_block0(c, s, [&] { return draw_in_set(s, sel.n, f); });
  }
  const float min_p = f.min_p;
  return vocab_cut(
      c, s,
      [&](int v, float r) -> u64 {
        const float x = c.modify(v, r);
        const uint32_t key = order_key(x);
        if (!f.keep_k.has(v, key) || !f.keep_p.has(v, key)) return 0ull;
        if (min_p > 0.0f && !(ms.e_of(x) >= min_p)) return 0ull;
        return ms.of(x);
      },
      [&](u64 total) { return draw_target(f.u, total); });
}

// The n most likely tokens by raw logprob (ties: lower id first) into out_ids / out_lp, by block 0.
__device__ void top_logprobs(const Row& c, Smem& s, int n, double lse, const Stats& g, int32_t* out_ids, float* out_lp) {
  const auto lp = [lse](float r) { return float(double(r) - lse); };
  const auto raw_value = [](int, float r) { return r; };
  const auto lp_key = [&](float r) { return order_key(lp(r)); };
  const auto write = [&] {  // block 0, candidates sorted by (logprob descending, id ascending)
    for (int p = threadIdx.x; p < n; p += kThreads) {
      const int i = s.u.set.idx[p];
      out_ids[p] = s.cand_id[i];
      out_lp[p] = lp(s.cand_val[i]);
    }
  };
  float tau = -INFINITY;  // small vocabularies: gather everything
  if (c.V > kCap) tau = kth_warp_max(s, s.wmax_r, n);
  // Equal logprobs can come from different logits: compare logprobs near the threshold.
  const uint32_t key_t = lp_key(tau);
  const float pre = tau == -INFINITY ? -INFINITY : float(double(tau) - (fabs(double(tau)) + fabs(lse)) * 0x1p-20);
  Plan pl = gather_then(
      c, s, raw_value, [&](int, float r) { return r >= pre && lp_key(r) >= key_t; },
      [&](int got) {
        const bool ok = got >= n;
        if (ok) {
          sort_candidates(s, got, lp_key);
          write();
        }
        if (threadIdx.x == 0) next_plan(c, s).mode = ok ? kDone : kGeneric;
      });
  if (pl.mode == kDone) return;
  const float lp_max = lp(g.r_max);
  float span = __fsub_rn(lp_max, lp(g.r_min));
  if (!(span > 0.0f)) span = 1.0f;
  const Selection sel = select(
      c, s, span, false, raw_value,
      [&](int, float r, uint32_t& key, float& dist, u64& wt) {
        const float l = lp(r);
        key = order_key(l);
        dist = __fsub_rn(lp_max, l);
        wt = 1;
      },
      [n](u64) { return u64(n); });
  if (sel.has_set) {
    if (c.rank == 0) write();
    return;
  }
  const Prefix cut = sel.cut;
  gather_then(
      c, s, raw_value, [&](int v, float r) { return cut.has(v, lp_key(r)); },
      [&](int got) {
        if (got > 0) {
          sort_candidates(s, got, lp_key);
          write();
        }
      });
}

// One block of a row's cluster. smem: smem_bytes(vocab) of dynamic shared memory.
__device__ void sample_cluster(const SampleArgs& a, float* overrides, char* smem) {
  Smem& s = *reinterpret_cast<Smem*>(smem);
  uint32_t* bits = reinterpret_cast<uint32_t*>(smem + sizeof(Smem));
  const int row = int(blockIdx.x) / kClusterBlocks, V = a.vocab, tid = threadIdx.x;
  const SampleRowParams p = a.params[row];
  if (p.forced >= 0) return;  // score_forced_rows' row (every block of the cluster leaves: no cluster barrier waits)
  Row c;
  c.raw = a.logits + int64_t(row) * V;
  c.over = overrides + int64_t(row) * V;
  c.bits = bits;
  c.V = V;
  c.slice = slice_len(V);
  c.rank = cluster_rank();
  c.lo = min(V, int(c.rank) * c.slice);
  c.hi = min(V, c.lo + c.slice);
  c.vec = (V & 3) == 0 && (reinterpret_cast<uintptr_t>(a.logits) & 15) == 0;
  c.wide = (c.vec ? (c.slice / 4 + kThreads - 1) / kThreads * 4 : (c.slice + kThreads - 1) / kThreads) * 32 >= 4096;
  c.seq = 0;

  // Penalties (as sample_on_cpu, the same float operations in the same order; __f*_rn keeps nvcc from contracting
  // them into an FMA the CPU does not do), then logit biases and bans; each block those of its slice.
  // The modified values go to the workspace, a bitmap of the slice says which tokens read from there.
  const bool rep = p.repetition_penalty != 1.0f;
  const bool penalise = a.pen_ids && a.pen_counts && (rep || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) &&
                        p.pen_end > p.pen_begin;
  const bool ban = a.ban_ids && p.ban_end > p.ban_begin;
  const bool masked = a.allowed && p.mask_row >= 0;
  c.has_over = penalise || ban || masked;
  if (c.has_over) {
    float* over = overrides + int64_t(row) * V;
    for (int i = tid; i < (c.slice + 31) / 32; i += kThreads) bits[i] = 0;
    __syncthreads();
    if (penalise)
      for (int i = p.pen_begin + tid; i < p.pen_end; i += kThreads) {
        const int t = a.pen_ids[i];
        if (t < c.lo || t >= c.hi) continue;
        float x = c.raw[t];
        if (rep) x = x > 0.0f ? __fdiv_rn(x, p.repetition_penalty) : __fmul_rn(x, p.repetition_penalty);
        const int n = a.pen_counts[i];
        if (n > 0) x = __fsub_rn(x, __fadd_rn(p.presence_penalty, __fmul_rn(p.frequency_penalty, float(n))));
        over[t] = x;
        atomicOr(&bits[(t - c.lo) >> 5], 1u << ((t - c.lo) & 31));
      }
    __syncthreads();
    if (ban)
      for (int i = p.ban_begin + tid; i < p.ban_end; i += kThreads) {
        const int t = a.ban_ids[i];
        if (t < c.lo || t >= c.hi) continue;
        const float add = a.ban_values ? a.ban_values[i] : -INFINITY;
        // A row's entries are unique (the host merges them), so the bit's old value says whether a penalty set
        // over[t] above (its __syncthreads orders that write before this read).
        const unsigned m = 1u << ((t - c.lo) & 31);
        const bool penalised = atomicOr(&bits[(t - c.lo) >> 5], m) & m;
        over[t] = add == -INFINITY ? -INFINITY : __fadd_rn(penalised ? over[t] : c.raw[t], add);
      }
    __syncthreads();
    if (masked) {
      // The grammar's mask last (a token it leaves out is -inf whatever its penalty or bias): a thread a bitmap
      // word, tokens lo + 32 i .. + 31, whose allowed bits straddle two mask words where lo is not a multiple of 32.
      const int words = (V + 31) / 32;
      const uint32_t* allow = a.allowed + int64_t(p.mask_row) * words;
      for (int i = tid; i < (c.hi - c.lo + 31) / 32; i += kThreads) {
        const int t0 = c.lo + 32 * i, w = t0 >> 5, sh = t0 & 31;
        const uint32_t ok = __funnelshift_r(allow[w], sh != 0 && w + 1 < words ? allow[w + 1] : 0u, sh);
        const int n = min(32, c.hi - t0);
        uint32_t out = ~ok & (n == 32 ? ~0u : (1u << n) - 1u);
        bits[i] |= out;  // word i is this thread's alone after the barrier above
        while (out) {
          const int b = __ffs(out) - 1;
          over[t0 + b] = -INFINITY;
          out &= out - 1;
        }
      }
      __syncthreads();
    }
  }

  // Phase 1: argmax of the modified logits, raw log-sum-exp, extremes, per-warp maxima.
  const int n_top = (a.max_top > 0 && a.top_ids && a.top_logprobs) ? max(0, min(p.top_logprobs, a.max_top)) : 0;
  const bool raw_stats = a.out_logprobs != nullptr || n_top > 0;
  {
    ArgMax best{-INFINITY, INT_MAX};
    float x_min = INFINITY, r_max = -INFINITY, r_min = INFINITY, m = -INFINITY, sum = 0.0f;
    for_slice(c, [&](int v, float r) {
      const float x = c.modify(v, r);
      if (x > best.v || (x == best.v && v < best.i)) best = ArgMax{x, v};
      if (x > -INFINITY) x_min = fminf(x_min, x);
      r_max = fmaxf(r_max, r);
      if (r > -INFINITY) {
        r_min = fminf(r_min, r);
        if (raw_stats) {
          if (r > m) {
            sum = sum * expf(m - r) + 1.0f;
            m = r;
          } else {
            sum += expf(r - m);
          }
        }
      }
    });
    OnlineSum os{m, double(sum)};
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      best = better(best, ArgMax{__shfl_xor_sync(kFull, best.v, o), __shfl_xor_sync(kFull, best.i, o)});
      x_min = fminf(x_min, __shfl_xor_sync(kFull, x_min, o));
      r_max = fmaxf(r_max, __shfl_xor_sync(kFull, r_max, o));
      r_min = fminf(r_min, __shfl_xor_sync(kFull, r_min, o));
      os = combine(os, OnlineSum{__shfl_xor_sync(kFull, os.m, o), __shfl_xor_sync(kFull, os.s, o)});
    }
    const int w = tid / 32;
    if (tid % 32 == 0) {
      s.red_best[w] = best;
      s.red_f[0][w] = x_min;
      s.red_f[1][w] = r_max;
      s.red_f[2][w] = r_min;
      s.red_os[w] = os;
      s.wmax_x[w] = best.v;
      s.wmax_r[w] = r_max;
    }
    __syncthreads();
    if (tid == 0) {
      Stats b{s.red_best[0], s.red_f[0][0], s.red_os[0], s.red_f[1][0], s.red_f[2][0]};
      for (int q = 1; q < kWarps; ++q) {
        b.best = better(b.best, s.red_best[q]);
        b.x_min = fminf(b.x_min, s.red_f[0][q]);
        b.raw = combine(b.raw, s.red_os[q]);
        b.r_max = fmaxf(b.r_max, s.red_f[1][q]);
        b.r_min = fminf(b.r_min, s.red_f[2][q]);
      }
      s.stats = b;
    }
    __syncthreads();
  }
  cluster_sync();
  if (tid == 0) {  // every block merges the row's results in the same order
    Stats g = *cluster_peer(&s.stats, 0);
    for (int q = 1; q < kClusterBlocks; ++q) {
      const Stats b = *cluster_peer(&s.stats, unsigned(q));
      g.best = better(g.best, b.best);
      g.x_min = fminf(g.x_min, b.x_min);
      g.raw = combine(g.raw, b.raw);
      g.r_max = fmaxf(g.r_max, b.r_max);
      g.r_min = fminf(g.r_min, b.r_min);
    }
    s.row = g;
  }
  __syncthreads();
  const Stats g = s.row;
  const double lse = double(g.raw.m) + log(g.raw.s);

  int tok = (g.best.i >= 0 && g.best.i < V) ? g.best.i : 0;
  // As the CPU: greedy for temperature <= 0 or top_k == 1; min_p > 1 keeps only the first sorted token.
  const bool greedy = p.temperature <= 0.0f || p.top_k == 1 || p.min_p > 1.0f || g.best.v == -INFINITY;
  if (!greedy) {
    const int drawn = sample_row(c, s, p, g);
    if (drawn >= 0 && drawn < V) tok = drawn;
  }
  if (c.rank == 0 && tid == 0) {
    a.out_ids[row] = tok;
    if (a.out_logprobs) a.out_logprobs[row] = float(double(c.raw[tok]) - lse);
  }
  if (a.max_top > 0 && a.top_ids && a.top_logprobs) {
    int32_t* out_ids = a.top_ids + int64_t(row) * a.max_top;
    float* out_lp = a.top_logprobs + int64_t(row) * a.max_top;
    const int n = min(n_top, V);
    if (n > 0) top_logprobs(c, s, n, lse, g, out_ids, out_lp);
    if (c.rank == 0)
      for (int i = n + tid; i < a.max_top; i += kThreads) {
        out_ids[i] = -1;
        out_lp[i] = -INFINITY;
      }
  }
  cluster_sync();  // no block leaves while another may still read its shared memory
}

}  // namespace moeserve::cuda::MOESERVE_SAMPLING_NS

// GPU sampling: one 1024-thread block per logit row, all rows in one launch, no host synchronisation.
//
// A row cannot live in shared memory (151936 f32 = 593 KiB), so the block makes passes over it in global
// memory (L2-resident after the first). Penalties and bans are not written into the logits: the
// penalised/banned values go to this row's slice of the workspace and a bitmap in shared memory says which
// tokens read from there, so the raw logits stay available for the logprobs.
//
// Filters without a sort. Every filter of the CPU sampler keeps a prefix of the candidates sorted by
// (modified logit descending, id ascending), so the kept set is one "cut": the tokens whose order key is
// above a threshold key, plus the tokens equal to it with id below a cut id. Top-k finds its cut by radix
// select on the key counting tokens (3 passes of 11/11/10 bits); top-p by the same radix select weighting
// tokens by probability mass restricted to the top-k cut; ties at a threshold are split by id exactly as the
// CPU's stable order does. Min-p (p >= min_p * p_max) is a plain predicate: it keeps a prefix too.
//
// Probability mass is fixed point (2^40 = the max token's exp(0)) and summed in 64-bit integers, so sums do
// not depend on the order of atomics: the same row and the same random value always give the same token.
// The draw takes u = (random >> 11) * 2^-53 and picks the first token in VOCABULARY order whose cumulative
// kept mass exceeds u * kept_total. The CPU walks the kept tokens in probability order instead, so both draw
// from the same distribution but not token-for-token for the same random bits.
#include <climits>

#include "cuda/sampling/sampling.h"

namespace moeserve::cuda {
namespace {

using u64 = unsigned long long;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBins = 2048;  // the widest radix digit (11 bits)
constexpr int kMaxTop = 64;     // top logprobs per row (OpenAI allows 20)
constexpr float kMassScale = 1099511627776.0f;  // 2^40: V * 2^40 < 2^64 for V < 2^24
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ int div_up(int a, int b) { return (a + b - 1) / b; }

// 16-byte loads need a row of a multiple of 4 tokens (151936 is) on a 16-byte boundary; they keep four
// times as many bytes in flight per thread, which is what one SM's share of L2 bandwidth asks for.
__device__ __forceinline__ bool rows_vectorizable(const float* raw, int V) {
  return (V & 3) == 0 && (reinterpret_cast<uintptr_t>(raw) & 15) == 0;
}

// f(v, raw[v]) for every token, spread over the block (the order of the calls is unspecified).
template <class F>
__device__ __forceinline__ void for_each_token(const float* raw, int V, F f) {
  if (rows_vectorizable(raw, V)) {
    const float4* r4 = reinterpret_cast<const float4*>(raw);
#pragma unroll 2
    for (int i = threadIdx.x; i < V / 4; i += kThreads) {
      const float4 q = __ldg(r4 + i);
      f(4 * i, q.x);
      f(4 * i + 1, q.y);
      f(4 * i + 2, q.z);
      f(4 * i + 3, q.w);
    }
  } else {
#pragma unroll 4
    for (int v = threadIdx.x; v < V; v += kThreads) f(v, __ldg(raw + v));
  }
}

struct Shared {
  u64 hist[kMaxBins];
  u64 red[kWarps];
  float red_v[kWarps];
  int red_i[kWarps];
  float red_m[kWarps];
  double red_s[kWarps];
  uint32_t sel_digit;
  u64 sel_above, sel_at;
  int found;
  int top_count;
  uint32_t top_key[kMaxTop];
  float top_lp[kMaxTop];
  int top_id[kMaxTop];
};

// Monotone float -> uint32 map (larger float, larger key). -0 and +0 compare equal as floats, so they share
// a key; NaN is left wherever its bits put it (the CPU's comparisons are undefined for it anyway).
__device__ __forceinline__ uint32_t order_key(float x) {
  if (x == 0.0f) x = 0.0f;
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ u64 warp_sum(u64 v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// Exclusive prefix of v over the block in thread order; `total` gets the block's sum.
__device__ u64 block_exclusive_scan(u64 v, u64& total, Shared& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  u64 incl = v;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const u64 n = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) s.red[warp] = incl;
  __syncthreads();
  u64 before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    const u64 t = s.red[w];
    if (w < warp) before += t;
    all += t;
  }
  __syncthreads();
  total = all;
  return before + incl - v;
}

// The largest value, lowest index on ties (as std::max_element / torch.argmax).
struct ArgMax {
  float v;
  int i;
};
__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}

// Running max and sum of exp(x - max) for the raw log-sum-exp.
struct OnlineSum {
  float m;
  double s;
};
__device__ __forceinline__ OnlineSum combine(OnlineSum a, OnlineSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0};
  return {m, a.s * exp(double(a.m) - m) + b.s * exp(double(b.m) - m)};
}

__device__ void block_reduce(ArgMax& best, OnlineSum& os, Shared& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    best = better(best, ArgMax{__shfl_xor_sync(kFull, best.v, o), __shfl_xor_sync(kFull, best.i, o)});
    os = combine(os, OnlineSum{__shfl_xor_sync(kFull, os.m, o), __shfl_xor_sync(kFull, os.s, o)});
  }
  if (lane == 0) {
    s.red_v[warp] = best.v;
    s.red_i[warp] = best.i;
    s.red_m[warp] = os.m;
    s.red_s[warp] = os.s;
  }
  __syncthreads();
  best = ArgMax{s.red_v[0], s.red_i[0]};
  os = OnlineSum{s.red_m[0], s.red_s[0]};
  for (int w = 1; w < kWarps; ++w) {
    best = better(best, ArgMax{s.red_v[w], s.red_i[w]});
    os = combine(os, OnlineSum{s.red_m[w], s.red_s[w]});
  }
  __syncthreads();
}

// Cut of a radix select: the weight of tokens with key > `key` is `above` (< target), with key >= `key` it
// reaches the target; `at_key` is the weight of the tokens whose key equals `key`. `all`: the target is
// beyond the total weight, the cut keeps everything.
struct Cut {
  uint32_t key;
  u64 above, at_key, target;
  bool all;
};

// elem(v, raw logit, key, weight): the token's order key and weight (0: not a candidate). target_of(total)
// maps the total weight (known after the first pass) to the weight the kept prefix must reach (>= 1).
template <class Elem, class TargetOf>
__device__ Cut radix_select(const float* raw, int V, Elem elem, TargetOf target_of, Shared& s) {
  Cut c{0u, 0ull, 0ull, 0ull, false};
  uint32_t prefix = 0, mask = 0;
  int shift = 32;
  for (int pass = 0; pass < 3; ++pass) {
    const int width = pass < 2 ? 11 : 10, nb = 1 << width, per = nb / kThreads;
    shift -= width;
    for (int b = threadIdx.x; b < nb; b += kThreads) s.hist[b] = 0;
    __syncthreads();
    for_each_token(raw, V, [&](int v, float r) {
      uint32_t key;
      u64 w;
      elem(v, r, key, w);
      if (w != 0 && (key & mask) == prefix) atomicAdd(&s.hist[(key >> shift) & (nb - 1)], w);
    });
    __syncthreads();
    // Bins from the highest digit down: thread t owns bins nb-1-t*per .. nb-per-t*per.
    u64 local = 0;
    for (int j = 0; j < per; ++j) local += s.hist[nb - 1 - (threadIdx.x * per + j)];
    u64 total;
    const u64 before = block_exclusive_scan(local, total, s);
    if (pass == 0) {
      c.target = target_of(total);
      if (total == 0 || c.target > total) {
        c.all = true;
        return c;
      }
    }
    u64 run = c.above + before;
    for (int j = 0; j < per; ++j) {
      const int d = nb - 1 - (threadIdx.x * per + j);
      const u64 h = s.hist[d];
      if (run < c.target && run + h >= c.target) {
        s.sel_digit = uint32_t(d);
        s.sel_above = run;
        s.sel_at = h;
      }
      run += h;
    }
    __syncthreads();
    prefix |= s.sel_digit << shift;
    mask |= uint32_t(nb - 1) << shift;
    c.above = s.sel_above;
    c.at_key = s.sel_at;
    __syncthreads();
  }
  c.key = prefix;
  return c;
}

// The first token v in vocabulary order with weight(0) + ... + weight(v) >= target_of(total), or -1;
// weight(v, raw logit). Each warp sums a contiguous chunk; the block then scans the one chunk that holds
// the crossing, each thread a contiguous piece of it.
template <class Weight, class TargetOf>
__device__ int find_cumulative(const float* raw, int V, Weight weight, TargetOf target_of, Shared& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int chunk = div_up(div_up(V, kWarps), 128) * 128;  // whole float4 per lane and step
  {
    const int begin = warp * chunk, end = min(V, begin + chunk);
    u64 sum = 0;
    if (rows_vectorizable(raw, V)) {
      const float4* r4 = reinterpret_cast<const float4*>(raw);
      for (int i = begin / 4 + lane; i < end / 4; i += 32) {
        const float4 q = __ldg(r4 + i);
        sum += weight(4 * i, q.x) + weight(4 * i + 1, q.y) + weight(4 * i + 2, q.z) + weight(4 * i + 3, q.w);
      }
    } else {
      for (int v = begin + lane; v < end; v += 32) sum += weight(v, __ldg(raw + v));
    }
    sum = warp_sum(sum);
    if (lane == 0) s.red[warp] = sum;
    if (threadIdx.x == 0) s.found = -1;
  }
  __syncthreads();
  u64 total = 0;
  for (int w = 0; w < kWarps; ++w) total += s.red[w];
  const u64 target = target_of(total);
  int hit = -1;
  u64 base = 0;
  for (int w = 0; w < kWarps; ++w) {
    const u64 t = s.red[w];
    if (base + t >= target) {
      hit = w;
      break;
    }
    base += t;
  }
  __syncthreads();
  if (target == 0 || hit < 0) return -1;
  const int cb = hit * chunk, ce = min(V, cb + chunk);
  const int per = div_up(chunk, kThreads);
  const int pb = min(ce, cb + int(threadIdx.x) * per), pe = min(ce, pb + per);
  u64 mine = 0;
  for (int v = pb; v < pe; ++v) mine += weight(v, __ldg(raw + v));
  u64 chunk_total;
  u64 run = base + block_exclusive_scan(mine, chunk_total, s);
  if (run < target && run + mine >= target) {
    for (int v = pb; v < pe; ++v) {
      run += weight(v, __ldg(raw + v));
      if (run >= target) {
        s.found = v;
        break;
      }
    }
  }
  __syncthreads();
  const int r = s.found;
  __syncthreads();
  return r;
}

// The kept prefix: key above `key`, or equal to it with id below `cut`.
struct Prefix {
  uint32_t key;
  int cut;
  __device__ bool has(int v, uint32_t k) const { return k > key || (k == key && v < cut); }
};

// The cut of the first `n` tokens (n < V) of the order (key descending, id ascending); key_of(v, raw logit).
template <class KeyOf>
__device__ Prefix top_n_prefix(const float* raw, int V, int n, KeyOf key_of, Shared& s) {
  const Cut c = radix_select(
      raw, V,
      [&](int v, float r, uint32_t& key, u64& w) {
        key = key_of(v, r);
        w = 1;
      },
      [&](u64) { return u64(n); }, s);
  const u64 need = u64(n) - c.above;  // 1 .. at_key tokens of the tie group
  if (need >= c.at_key) return Prefix{c.key, V};
  const uint32_t k = c.key;
  const int last = find_cumulative(
      raw, V, [&](int v, float r) -> u64 { return key_of(v, r) == k; }, [&](u64) { return need; }, s);
  return Prefix{k, last + 1};
}

__global__ void __launch_bounds__(kThreads, 1) sample_kernel(SampleArgs a, float* overrides) {
  extern __shared__ uint32_t modified_bits[];
  __shared__ Shared s;
  const int row = blockIdx.x, V = a.vocab, tid = threadIdx.x;
  const SampleRowParams p = a.params[row];
  const float* raw = a.logits + int64_t(row) * V;
  float* over = overrides + int64_t(row) * V;

  // Penalties (as Scheduler::sample_and_deliver, the same float operations in the same order; __f*_rn keeps
  // nvcc from contracting them into an FMA the CPU does not do), then bans.
  const bool rep = p.repetition_penalty != 1.0f;
  const bool penalise = (rep || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) && p.pen_end > p.pen_begin;
  const bool ban = p.ban_end > p.ban_begin;
  const bool has_over = penalise || ban;
  if (has_over) {
    for (int i = tid; i < (V + 31) / 32; i += kThreads) modified_bits[i] = 0;
    __syncthreads();
    if (penalise)
      for (int i = p.pen_begin + tid; i < p.pen_end; i += kThreads) {
        const int t = a.pen_ids[i];
        if (t < 0 || t >= V) continue;
        float x = raw[t];
        if (rep) x = x > 0.0f ? __fdiv_rn(x, p.repetition_penalty) : __fmul_rn(x, p.repetition_penalty);
        const int n = a.pen_counts[i];
        if (n > 0) x = __fsub_rn(x, __fadd_rn(p.presence_penalty, __fmul_rn(p.frequency_penalty, float(n))));
        over[t] = x;
        atomicOr(&modified_bits[t >> 5], 1u << (t & 31));
      }
    __syncthreads();
    if (ban)
      for (int i = p.ban_begin + tid; i < p.ban_end; i += kThreads) {
        const int t = a.ban_ids[i];
        if (t < 0 || t >= V) continue;
        over[t] = -INFINITY;
        atomicOr(&modified_bits[t >> 5], 1u << (t & 31));
      }
    __syncthreads();
  }
  const auto modify = [&](int v, float x) {
    return (has_over && ((modified_bits[v >> 5] >> (v & 31)) & 1u)) ? over[v] : x;
  };

  // Pass 1: the raw log-sum-exp (logprobs) and the argmax of the modified logits.
  const int n_top = (a.max_top > 0 && a.top_ids && a.top_logprobs) ? max(0, min(p.top_logprobs, a.max_top)) : 0;
  const bool raw_stats = a.out_logprobs != nullptr || n_top > 0;
  ArgMax best{-INFINITY, INT_MAX};
  OnlineSum os{-INFINITY, 0.0};
  {
    float m = -INFINITY, sum = 0.0f;
    for_each_token(raw, V, [&](int v, float r) {
      if (raw_stats && r > -INFINITY) {
        if (r > m) {
          sum = sum * expf(m - r) + 1.0f;
          m = r;
        } else {
          sum += expf(r - m);
        }
      }
      const float x = modify(v, r);
      if (x > best.v || (x == best.v && v < best.i)) best = ArgMax{x, v};
    });
    os = OnlineSum{m, double(sum)};
  }
  block_reduce(best, os, s);
  const double lse = double(os.m) + log(os.s);

  int tok = best.i;
  // As the CPU: greedy for temperature <= 0 or top_k == 1; min_p > 1 keeps only the first sorted token.
  const bool greedy = p.temperature <= 0.0f || p.top_k == 1 || p.min_p > 1.0f || best.v == -INFINITY;
  if (!greedy) {
    const float T = p.temperature, zmax = __fdiv_rn(best.v, T);
    // exp((x - max) / T) of the CPU, in f32; equal logits give equal masses (the tie logic relies on it).
    const auto e_of = [&](float x) { return expf(__fsub_rn(__fdiv_rn(x, T), zmax)); };
    const auto mass_of = [&](float x) -> u64 {
      const float e = e_of(x);
      return e > 0.0f ? __float2ull_rn(fminf(e, 1.0f) * kMassScale) : 0ull;
    };
    Prefix keep{0u, V};  // everything
    if (p.top_k > 0 && p.top_k < V)
      keep = top_n_prefix(raw, V, p.top_k, [&](int v, float r) { return order_key(modify(v, r)); }, s);
    if (p.top_p < 1.0f) {
      const Prefix in = keep;
      const float top_p = p.top_p;
      const Cut c = radix_select(
          raw, V,
          [&](int v, float r, uint32_t& key, u64& w) {
            const float x = modify(v, r);
            key = order_key(x);
            w = in.has(v, key) ? mass_of(x) : 0ull;
          },
          // The CPU keeps the shortest sorted prefix whose probability (within the top-k set) reaches top_p.
          [&](u64 total) -> u64 {
            const double t = ceil(double(top_p) * double(total));
            return t < 1.0 ? 1ull : min(u64(t), total);
          },
          s);
      if (!c.all) {
        const u64 f = mass_of(key_value(c.key));  // every token of the tie group has this mass
        const u64 need = (c.target - c.above + f - 1) / f, ties = c.at_key / f;
        const uint32_t k = c.key;
        if (need >= ties) {
          keep = Prefix{k, k == in.key ? in.cut : V};
        } else {
          const int last = find_cumulative(
              raw, V,
              [&](int v, float r) -> u64 {
                const uint32_t key = order_key(modify(v, r));
                return key == k && in.has(v, key);
              },
              [&](u64) { return need; }, s);
          keep = Prefix{k, last + 1};
        }
      }
    }
    const float min_p = p.min_p;
    const double u = double(p.random >> 11) * 0x1p-53;
    const int drawn = find_cumulative(
        raw, V,
        [&](int v, float r) -> u64 {
          const float x = modify(v, r);
          if (!keep.has(v, order_key(x))) return 0ull;
          if (min_p > 0.0f && !(e_of(x) >= min_p)) return 0ull;
          return mass_of(x);
        },
        [&](u64 total) -> u64 {
          if (total == 0) return 0ull;
          const u64 t = u64(u * double(total));
          return min(t, total - 1) + 1;
        },
        s);
    if (drawn >= 0) tok = drawn;
  }
  const auto logprob = [&](float r) { return float(double(r) - lse); };
  if (tid == 0) {
    a.out_ids[row] = tok;
    if (a.out_logprobs) a.out_logprobs[row] = logprob(raw[tok]);
  }

  // Top logprobs: the first n of the raw logprobs' order (descending, lower id first on ties), sorted.
  if (a.max_top > 0 && a.top_ids && a.top_logprobs) {
    const int n = min(n_top, V);
    int32_t* out_ids = a.top_ids + int64_t(row) * a.max_top;
    float* out_lp = a.top_logprobs + int64_t(row) * a.max_top;
    if (n > 0) {
      const auto key_of = [&](int, float r) { return order_key(logprob(r)); };
      const Prefix top = n < V ? top_n_prefix(raw, V, n, key_of, s) : Prefix{0u, V};
      if (tid == 0) s.top_count = 0;
      __syncthreads();
      for_each_token(raw, V, [&](int v, float r) {
        const float lp = logprob(r);
        const uint32_t key = order_key(lp);
        if (top.has(v, key)) {
          const int i = atomicAdd(&s.top_count, 1);
          if (i < kMaxTop) {
            s.top_key[i] = key;
            s.top_lp[i] = lp;
            s.top_id[i] = v;
          }
        }
      });
      __syncthreads();
      const int count = min(s.top_count, kMaxTop);
      if (tid < count) {
        const uint32_t k = s.top_key[tid];
        const int id = s.top_id[tid];
        int rank = 0;
        for (int j = 0; j < count; ++j)
          rank += s.top_key[j] > k || (s.top_key[j] == k && s.top_id[j] < id);
        if (rank < n) {  // always, unless NaN logits broke the order
          out_ids[rank] = id;
          out_lp[rank] = s.top_lp[tid];
        }
      }
    }
    for (int i = n + tid; i < a.max_top; i += kThreads) {
      out_ids[i] = -1;
      out_lp[i] = -INFINITY;
    }
  }
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

size_t sample_workspace_bytes(int rows, int vocab) {
  // One f32 slot per token and row; only the penalised and banned tokens' slots are ever written.
  return align256(size_t(std::max(rows, 0)) * size_t(std::max(vocab, 0)) * sizeof(float));
}

void sample(const SampleArgs& a, cudaStream_t stream) {
  MS_CHECK(a.rows >= 0, "sample: rows = {}", a.rows);
  if (a.rows == 0) return;
  MS_CHECK(a.vocab > 0 && a.vocab < (1 << 24), "sample: vocabulary size {} outside 1 .. 2^24 - 1", a.vocab);
  MS_CHECK(a.logits && a.params && a.out_ids && a.workspace, "sample: logits, params, out_ids and workspace are required");
  MS_CHECK(a.max_top >= 0 && a.max_top <= kMaxTop, "sample: max_top {} outside 0 .. {}", a.max_top, kMaxTop);
  MS_CHECK(a.max_top == 0 || (a.top_ids && a.top_logprobs), "sample: max_top {} without top_ids / top_logprobs",
           a.max_top);
  const size_t bitmap_bytes = size_t(a.vocab + 31) / 32 * 4;
  // Hopper: 227 KiB of shared memory per block, the bitmap's limit (about 1.7 million tokens).
  MS_CHECK(bitmap_bytes + sizeof(Shared) <= 227 * 1024, "sample: vocabulary size {} too large for the bitmap",
           a.vocab);
  if (bitmap_bytes + sizeof(Shared) > 48 * 1024)
    MS_CUDA_CHECK(cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bitmap_bytes)));
  sample_kernel<<<a.rows, kThreads, bitmap_bytes, stream>>>(a, static_cast<float*>(a.workspace));
  MS_CUDA_LAUNCH_CHECK();
}

}  // namespace moeserve::cuda

// The layer kernels of src/cuda/kernels/ops.h against the CPU references, on fresh random inputs of several
// shapes (odd ones included). Every output buffer is poisoned with 0xFF bytes (NaN in bf16 and f32) first:
// an element the kernel forgot stays NaN and fails; elements it must not touch are checked to stay poisoned.
// Skipped cleanly on machines without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "cuda/device.h"
#include "cuda/kernels/ops.h"
#include "kernels/activation/activation.h"
#include "kernels/attention/attention.h"
#include "kernels/norm/rmsnorm.h"
#include "kernels/rope/rope.h"

using namespace moeserve;
using cuda::bf16;

namespace {

constexpr uint16_t kPoison16 = 0xFFFF;  // bf16 NaN, what cudaMemset(0xFF) leaves

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

// A device buffer of n host-typed elements (uint16_t stands for bf16).
template <typename T>
class DevBuf {
 public:
  explicit DevBuf(size_t n) : n_(n) { ck(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc"); }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { upload(h); }
  ~DevBuf() { cudaFree(p_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  T* get() const { return p_; }
  bf16* bf() const { return reinterpret_cast<bf16*>(p_); }
  void upload(const std::vector<T>& h) {
    ck(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    ck(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
  void poison() {
    ck(cudaMemset(p_, 0xFF, std::max<size_t>(n_, 1) * sizeof(T)), "poison");
    ck(cudaDeviceSynchronize(), "poison");
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

class Stream {
 public:
  // A blocking stream: ordered after the synchronous copies and memsets of the legacy stream.
  Stream() { ck(cudaStreamCreate(&s_), "cudaStreamCreate"); }
  ~Stream() { cudaStreamDestroy(s_); }
  cudaStream_t get() const { return s_; }
  void sync() const {
    ck(cudaGetLastError(), "kernel launch");
    ck(cudaStreamSynchronize(s_), "kernel execution");
  }

 private:
  cudaStream_t s_{};
};

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& g, float mean, float stddev) {
  std::normal_distribution<float> d(mean, stddev);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(d(g));
  return v;
}

std::vector<float> to_f32(const std::vector<uint16_t>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = bf16_to_f32(v[i]);
  return r;
}

bool close(float want, float got, float atol, float rtol) {
  return std::isfinite(got) && std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

// Collects mismatches and reports the first few with their place, then the count.
class Mismatches {
 public:
  explicit Mismatches(std::string ctx) : ctx_(std::move(ctx)) {}
  void add(const std::string& where, float want, float got) {
    if (count_ < 10) msg_ += fmt::format("\n  {}: want {:.6g} got {:.6g}", where, want, got);
    ++count_;
  }
  void add(const std::string& what) {
    if (count_ < 10) msg_ += "\n  " + what;
    ++count_;
  }
  ~Mismatches() {
    if (count_ > 0) ADD_FAILURE() << ctx_ << ": " << count_ << " bad elements" << msg_;
  }

 private:
  std::string ctx_, msg_;
  int64_t count_ = 0;
};

#define REQUIRE_GPU() \
  if (cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device"

// ------------------------------------------------------------------------------------------------------------
TEST(CudaKernels, EmbeddingGathersRows) {
  REQUIRE_GPU();
  Stream st;
  std::mt19937 g(11);
  const int vocab = 97;
  for (auto [T, H] : std::vector<std::pair<int, int>>{{1, 2048}, {7, 1000}, {37, 13}, {300, 2048}, {5, 8}}) {
    auto table = random_bf16(size_t(vocab) * H, g, 0, 1);
    std::vector<int32_t> ids(T);
    std::uniform_int_distribution<int> pick(0, vocab - 1);
    for (auto& i : ids) i = pick(g);
    DevBuf<uint16_t> d_table(table);
    DevBuf<int32_t> d_ids(ids);
    // The same tokens again, about half of them taken from a previous step's samples (prev_rows >= 0) and the
    // placeholders in ids left wrong: every row must come out as before.
    std::vector<int32_t> placeholders = ids, prev_rows(size_t(T), -1), prev_ids(size_t(T) + 3, -7);
    for (int t = 0; t < T; ++t)
      if (g() % 2) {
        prev_rows[size_t(t)] = (t * 5 + 2) % (T + 3);
        prev_ids[size_t(prev_rows[size_t(t)])] = ids[size_t(t)];
        placeholders[size_t(t)] = -1;
      }
    for (int t = 0; t < T; ++t)  // two rows naming the same sample must both keep their token
      if (prev_rows[size_t(t)] >= 0 && prev_ids[size_t(prev_rows[size_t(t)])] != ids[size_t(t)])
        prev_rows[size_t(t)] = -1, placeholders[size_t(t)] = ids[size_t(t)];
    DevBuf<int32_t> d_placeholders(placeholders), d_prev_rows(prev_rows), d_prev_ids(prev_ids);
    for (bool from_prev : {false, true}) {
      DevBuf<float> d_res(size_t(T) * H);
      d_res.poison();
      // With H % 16 == 0, the second pass also asks for the residual fusion's partial sums of squares.
      const bool parts = from_prev && H % 16 == 0;
      DevBuf<float> d_parts(size_t(T) * (H / 16) + 1);
      d_parts.poison();
      if (from_prev)
        cuda::embedding(d_placeholders.get(), d_table.bf(), T, H, d_res.get(), st.get(), d_prev_rows.get(),
                        d_prev_ids.get(), parts ? d_parts.get() : nullptr);
      else
        cuda::embedding(d_ids.get(), d_table.bf(), T, H, d_res.get(), st.get());
      st.sync();
      auto got = d_res.download();
      Mismatches m(fmt::format("embedding T={} H={} from the previous samples {}", T, H, from_prev));
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < H; ++i) {
          float want = bf16_to_f32(table[size_t(ids[t]) * H + i]), x = got[size_t(t) * H + i];
          if (!(x == want)) m.add(fmt::format("token {} col {}", t, i), want, x);
        }
      if (!parts) continue;
      auto got_parts = d_parts.download();
      for (int t = 0; t < T; ++t)
        for (int j = 0; j < H / 16; ++j) {
          double want = 0;
          for (int i = 16 * j; i < 16 * j + 16; ++i) {
            const double v = bf16_to_f32(table[size_t(ids[t]) * H + i]);
            want += v * v;
          }
          const float x = got_parts[size_t(t) * (H / 16) + j];
          if (!(std::fabs(x - want) <= 1e-5 * want + 1e-30)) m.add(fmt::format("token {} part {}", t, j), want, x);
        }
    }
  }
}

// ------------------------------------------------------------------------------------------------------------
struct NormShape {
  int rows, dim;
};
const std::vector<NormShape> kNormShapes = {{1, 2048},  {7, 2048}, {37, 1000}, {300, 2048}, {7, 1001}, {3, 13},
                                            {37, 128},  {5, 8192}, {2, 32768}, {2, 40004},  {16384, 2048}};

TEST(CudaKernels, RmsNormMatchesCpu) {
  REQUIRE_GPU();
  Stream st;
  std::mt19937 g(12);
  std::normal_distribution<float> nd(0, 2);
  for (auto [rows, dim] : kNormShapes) {
    std::vector<float> x(size_t(rows) * dim);
    for (auto& v : x) v = nd(g);
    auto w = random_bf16(dim, g, 1, 0.3f);
    auto wf = to_f32(w);
    std::vector<float> want(x.size());
    kernels::rmsnorm(x.data(), wf.data(), 1e-6f, rows, dim, want.data());
    DevBuf<float> d_x(x);
    DevBuf<uint16_t> d_w(w), d_out(x.size());
    d_out.poison();
    cuda::rmsnorm(d_x.get(), d_w.bf(), 1e-6f, rows, dim, d_out.bf(), st.get());
    st.sync();
    auto got = d_out.download();
    Mismatches m(fmt::format("rmsnorm rows={} dim={}", rows, dim));
    for (size_t i = 0; i < x.size(); ++i)
      if (!close(want[i], bf16_to_f32(got[i]), 1e-2f, 1e-2f))
        m.add(fmt::format("row {} col {}", i / dim, i % dim), want[i], bf16_to_f32(got[i]));
  }
}

TEST(CudaKernels, AddRmsNormMatchesCpu) {
  REQUIRE_GPU();
  Stream st;
  std::mt19937 g(13);
  std::normal_distribution<float> nd(0, 2);
  for (auto [rows, dim] : kNormShapes) {
    std::vector<float> res(size_t(rows) * dim);
    for (auto& v : res) v = nd(g);
    auto x = random_bf16(res.size(), g, 0, 1);
    auto w = random_bf16(dim, g, 1, 0.3f);
    auto xf = to_f32(x), wf = to_f32(w);
    std::vector<float> want_res = res, want(res.size());
    kernels::add_rmsnorm(want_res.data(), xf.data(), wf.data(), 1e-6f, rows, dim, want.data());
    DevBuf<float> d_res(res);
    DevBuf<uint16_t> d_x(x), d_w(w), d_out(res.size());
    d_out.poison();
    cuda::add_rmsnorm(d_res.get(), d_x.bf(), d_w.bf(), 1e-6f, rows, dim, d_out.bf(), st.get());
    st.sync();
    auto got = d_out.download();
    auto got_res = d_res.download();
    Mismatches m(fmt::format("add_rmsnorm rows={} dim={}", rows, dim));
    for (size_t i = 0; i < res.size(); ++i) {
      if (!close(want_res[i], got_res[i], 1e-6f, 1e-6f))
        m.add(fmt::format("residual row {} col {}", i / dim, i % dim), want_res[i], got_res[i]);
      if (!close(want[i], bf16_to_f32(got[i]), 1e-2f, 1e-2f))
        m.add(fmt::format("out row {} col {}", i / dim, i % dim), want[i], bf16_to_f32(got[i]));
    }
  }
}

// ------------------------------------------------------------------------------------------------------------
TEST(CudaKernels, SiluMulMatchesCpu) {
  REQUIRE_GPU();
  Stream st;
  std::mt19937 g(14);
  for (auto [T, I] : std::vector<std::pair<int, int>>{{1, 768}, {7, 1000}, {37, 13}, {300, 768}, {3, 6144}}) {
    auto gu = random_bf16(size_t(T) * 2 * I, g, 0, 2);
    auto guf = to_f32(gu);
    std::vector<float> want(size_t(T) * I);
    for (int t = 0; t < T; ++t)
      kernels::silu_mul(&guf[size_t(t) * 2 * I], &guf[size_t(t) * 2 * I + I], &want[size_t(t) * I], I);
    DevBuf<uint16_t> d_gu(gu), d_out(want.size());
    d_out.poison();
    cuda::silu_mul(d_gu.bf(), T, I, d_out.bf(), st.get());
    st.sync();
    auto got = d_out.download();
    Mismatches m(fmt::format("silu_mul T={} I={}", T, I));
    for (size_t i = 0; i < want.size(); ++i)
      if (!close(want[i], bf16_to_f32(got[i]), 1e-2f, 1e-2f))
        m.add(fmt::format("token {} col {}", i / I, i % I), want[i], bf16_to_f32(got[i]));
  }
}

// ------------------------------------------------------------------------------------------------------------
struct QkConfig {
  int heads, kv_heads, head_dim, rotary_dim;
  bool norm;
  int stride_pad;  // extra elements per qkv row (odd: the scalar path)
  float scaling;
};

TEST(CudaKernels, QkNormRopeStoreKvMatchesCpu) {
  REQUIRE_GPU();
  Stream st;
  std::mt19937 g(15);
  const std::vector<QkConfig> configs = {{32, 4, 128, 128, true, 0, 1.0f}, {16, 2, 64, 64, true, 8, 1.0f},
                                         {8, 2, 256, 64, true, 0, 0.9f},   {6, 3, 128, 0, false, 0, 1.0f},
                                         {4, 4, 128, 96, true, 1, 1.0f},   {5, 1, 64, 32, false, 0, 1.0f},
                                         // head_dims of the small test models: the scalar path
                                         {4, 2, 48, 48, true, 0, 1.0f},    {3, 1, 32, 16, true, 0, 1.0f},
                                         {2, 2, 96, 96, true, 0, 1.0f},
                                         // RoPE over the whole head without norms (the token-major kernel too)
                                         {8, 2, 128, 128, false, 0, 0.9f}};
  // 1,100 tokens: the token-major kernel of long steps (MOESERVE_QKROPE_TOKENS_MIN, default 512) where RoPE covers
  // the whole head of 64 / 128 / 256 and rows are vector-aligned; its last block is partly empty.
  for (const auto& c : configs)
    for (int T : {1, 7, 37, 300, 1100}) {
      const int H = c.heads, KV = c.kv_heads, D = c.head_dim;
      const int64_t width = int64_t(H + 2 * KV) * D, stride = width + c.stride_pad;
      const std::string ctx = fmt::format("qk_norm_rope_store_kv T={} heads={} kv_heads={} head_dim={} rotary={} "
                                          "norm={} stride={}",
                                          T, H, KV, D, c.rotary_dim, c.norm, stride);
      auto qkv = random_bf16(size_t(T) * stride, g, 0, 1.5f);
      auto qn = random_bf16(D, g, 1, 0.3f), kn = random_bf16(D, g, 1, 0.3f);
      std::vector<float> inv_freq(c.rotary_dim / 2);
      for (size_t i = 0; i < inv_freq.size(); ++i)
        inv_freq[i] = 1.0f / std::pow(1e6f, float(2 * i) / float(c.rotary_dim));
      std::vector<int32_t> pos(T);
      std::vector<int64_t> pos64(T);
      std::uniform_int_distribution<int> pd(0, 40000);
      for (int t = 0; t < T; ++t) pos64[t] = pos[t] = pd(g);
      // Cache slots: a shuffled subset of a cache with spare room; about one token in eight not stored.
      const int num_slots = T * 2 + 5;
      std::vector<int32_t> perm(num_slots), slots(T);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), g);
      for (int t = 0; t < T; ++t) slots[t] = (g() % 8 == 0) ? -1 : perm[t];

      // CPU reference in f32: norm then RoPE, as the CPU model does.
      std::vector<float> ref = to_f32(qkv);
      auto qnf = to_f32(qn), knf = to_f32(kn);
      for (int t = 0; t < T; ++t) {
        float* row = &ref[size_t(t) * stride];
        if (c.norm) {
          kernels::rmsnorm(row, qnf.data(), 1e-6f, H, D, row);
          kernels::rmsnorm(row + int64_t(H) * D, knf.data(), 1e-6f, KV, D, row + int64_t(H) * D);
        }
      }
      if (c.rotary_dim > 0) {
        kernels::RopeTable tab{inv_freq, c.scaling};
        kernels::apply_rope(ref.data(), T, stride, H, D, pos64.data(), tab);
        kernels::apply_rope(ref.data() + int64_t(H) * D, T, stride, KV, D, pos64.data(), tab);
      }

      DevBuf<uint16_t> d_qkv(qkv), d_qn(qn), d_kn(kn);
      DevBuf<float> d_freq(std::max<size_t>(inv_freq.size(), 1));
      if (!inv_freq.empty()) d_freq.upload(inv_freq);
      DevBuf<int32_t> d_pos(pos), d_slots(slots);
      const size_t cache_elems = size_t(num_slots) * KV * D;
      DevBuf<uint16_t> d_kc(cache_elems), d_vc(cache_elems);
      d_kc.poison();
      d_vc.poison();
      cuda::RopeArgs rope;
      rope.inv_freq = c.rotary_dim > 0 ? d_freq.get() : nullptr;
      rope.rotary_dim = c.rotary_dim;
      rope.attention_scaling = c.scaling;
      cuda::qk_norm_rope_store_kv(d_qkv.bf(), stride, T, H, KV, D, c.norm ? d_qn.bf() : nullptr,
                                  c.norm ? d_kn.bf() : nullptr, 1e-6f, d_pos.get(), rope, d_slots.get(), d_kc.bf(),
                                  d_vc.bf(), st.get());
      st.sync();
      auto got = d_qkv.download();
      auto kc = d_kc.download(), vc = d_vc.download();
      Mismatches m(ctx);
      for (int t = 0; t < T; ++t)
        for (int64_t col = 0; col < stride; ++col) {
          const size_t i = size_t(t) * stride + col;
          const int head = int(col / D), d = int(col % D);
          if (col >= int64_t(H + KV) * D) {  // v heads and row padding: unchanged
            if (got[i] != qkv[i]) m.add(fmt::format("token {} col {} (v / padding) changed", t, col));
          } else if (!close(ref[i], bf16_to_f32(got[i]), 2e-2f, 1e-2f)) {
            m.add(fmt::format("token {} {} head {} d {}", t, head < H ? "q" : "k", head < H ? head : head - H, d),
                  ref[i], bf16_to_f32(got[i]));
          }
        }
      std::vector<char> written(num_slots, 0);
      for (int t = 0; t < T; ++t) {
        if (slots[t] < 0) continue;
        written[slots[t]] = 1;
        for (int kvh = 0; kvh < KV; ++kvh)
          for (int d = 0; d < D; ++d) {
            const size_t ci = (size_t(slots[t]) * KV + kvh) * D + d;
            const size_t ki = size_t(t) * stride + size_t(H + kvh) * D + d;
            const size_t vi = size_t(t) * stride + size_t(H + KV + kvh) * D + d;
            if (kc[ci] != got[ki])
              m.add(fmt::format("k cache token {} slot {} kv head {} d {}", t, slots[t], kvh, d),
                    bf16_to_f32(got[ki]), bf16_to_f32(kc[ci]));
            if (vc[ci] != qkv[vi])
              m.add(fmt::format("v cache token {} slot {} kv head {} d {}", t, slots[t], kvh, d),
                    bf16_to_f32(qkv[vi]), bf16_to_f32(vc[ci]));
          }
      }
      for (int sl = 0; sl < num_slots; ++sl) {
        if (written[sl]) continue;
        for (size_t e = size_t(sl) * KV * D; e < size_t(sl + 1) * KV * D; ++e)
          if (kc[e] != kPoison16 || vc[e] != kPoison16) {
            m.add(fmt::format("cache slot {} written though no token maps to it", sl));
            break;
          }
      }
    }
}

// ------------------------------------------------------------------------------------------------------------
// Paged attention: a random cache whose pages are handed out in shuffled order, slots past each sequence's
// length left NaN (a kernel reading them fails), q rows with gaps between sequences (the gaps must stay
// poisoned), padding sequences (new_len 0) whose row must stay poisoned too.

struct AttnConfig {
  int heads, kv_heads, head_dim, page_size;
};
struct SeqSpec {
  int start, new_len;  // cached prefix, new tokens
};

struct PagedScenario {
  AttnConfig c;
  std::vector<SeqSpec> seqs;
  int num_pages = 0, max_pages = 0, rows = 0;
  int64_t q_stride = 0, out_stride = 0;
  std::vector<int32_t> block_tables, kv_lens, new_lens, q_rows;
  std::vector<uint16_t> k, v, q;
  std::vector<float> kf, vf, qf;
  float scale = 0;

  std::string name() const {
    std::string s = fmt::format("heads={} kv_heads={} head_dim={} page_size={} seqs(start+new)=", c.heads,
                                c.kv_heads, c.head_dim, c.page_size);
    for (const auto& q : seqs) s += fmt::format("{}+{} ", q.start, q.new_len);
    return s;
  }
};

PagedScenario build_scenario(const AttnConfig& c, const std::vector<SeqSpec>& seqs, uint32_t seed) {
  std::mt19937 g(seed);
  PagedScenario sc;
  sc.c = c;
  sc.seqs = seqs;
  sc.scale = 1.0f / std::sqrt(float(c.head_dim));
  const int P = c.page_size, n = int(seqs.size());
  const int64_t row_elems = int64_t(c.kv_heads) * c.head_dim;
  std::vector<int> pages_of(n);
  for (int s = 0; s < n; ++s) {
    const int kv_len = seqs[s].start + seqs[s].new_len;
    pages_of[s] = (kv_len + P - 1) / P;
    sc.num_pages += pages_of[s];
    sc.max_pages = std::max(sc.max_pages, pages_of[s]);
  }
  sc.num_pages += 3;  // spare pages, never referenced
  sc.max_pages += 2;  // unused table entries: -1
  std::vector<int> perm(sc.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), g);
  sc.block_tables.assign(size_t(n) * sc.max_pages, -1);
  const size_t cache_elems = size_t(sc.num_pages) * P * row_elems;
  sc.k.assign(cache_elems, kPoison16);
  sc.v.assign(cache_elems, kPoison16);
  std::normal_distribution<float> nd(0, 1);
  int next = 0, row = 1;  // row 0: a gap
  for (int s = 0; s < n; ++s) {
    const int kv_len = seqs[s].start + seqs[s].new_len;
    for (int pi = 0; pi < pages_of[s]; ++pi) sc.block_tables[size_t(s) * sc.max_pages + pi] = perm[next++];
    for (int pos = 0; pos < kv_len; ++pos) {
      const int64_t page = sc.block_tables[size_t(s) * sc.max_pages + pos / P];
      const size_t base = size_t((page * P + pos % P) * row_elems);
      for (int64_t e = 0; e < row_elems; ++e) {
        sc.k[base + e] = f32_to_bf16(nd(g));
        sc.v[base + e] = f32_to_bf16(nd(g));
      }
    }
    sc.kv_lens.push_back(kv_len);
    sc.new_lens.push_back(seqs[s].new_len);
    sc.q_rows.push_back(row);
    row += std::max(seqs[s].new_len, 1) + 2;  // a padding sequence still owns a row that must stay untouched
  }
  sc.rows = row;
  sc.q_stride = int64_t(c.heads) * c.head_dim + 8;
  sc.out_stride = int64_t(c.heads) * c.head_dim + 8;
  sc.q = random_bf16(size_t(sc.rows) * sc.q_stride, g, 0, 2);
  sc.kf = to_f32(sc.k);
  sc.vf = to_f32(sc.v);
  sc.qf = to_f32(sc.q);
  return sc;
}

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

std::vector<float> attention_reference(PagedScenario& sc) {
  const auto& c = sc.c;
  kernels::PagedKV kv;
  kv.k = sc.kf.data();
  kv.v = sc.vf.data();
  kv.page_size = c.page_size;
  kv.kv_heads = c.kv_heads;
  kv.head_dim = c.head_dim;
  kv.page_stride = int64_t(c.page_size) * c.kv_heads * c.head_dim;
  std::vector<kernels::AttnSeq> seqs;
  for (size_t s = 0; s < sc.seqs.size(); ++s) {
    if (sc.seqs[s].new_len == 0) continue;
    seqs.push_back({&sc.block_tables[s * sc.max_pages], sc.seqs[s].start, sc.seqs[s].new_len, sc.q_rows[s]});
  }
  std::vector<float> out(size_t(sc.rows) * sc.out_stride, 0.0f);
  kernels::paged_attention(sc.qf.data(), sc.q_stride, c.heads, kv, seqs, sc.scale, out.data(), sc.out_stride,
                           pool());
  return out;
}

void compare_attention(const PagedScenario& sc, const std::vector<float>& want, const std::vector<uint16_t>& got,
                       const std::string& ctx) {
  const int D = sc.c.head_dim, width = sc.c.heads * D;
  std::vector<int> owner(sc.rows, -1);
  for (size_t s = 0; s < sc.seqs.size(); ++s)
    for (int i = 0; i < sc.seqs[s].new_len; ++i) owner[sc.q_rows[s] + i] = int(s);
  Mismatches m(ctx + " " + sc.name());
  for (int r = 0; r < sc.rows; ++r)
    for (int64_t col = 0; col < sc.out_stride; ++col) {
      const size_t i = size_t(r) * sc.out_stride + col;
      if (owner[r] < 0 || col >= width) {
        if (got[i] != kPoison16) {
          m.add(fmt::format("row {} col {} written though no sequence owns it (value {})", r, col,
                            bf16_to_f32(got[i])));
        }
        continue;
      }
      const int s = owner[r], tok = r - sc.q_rows[s];
      const float x = bf16_to_f32(got[i]);
      if (!close(want[i], x, 2e-2f, 2e-2f))
        m.add(fmt::format("seq {} (start {}, new {}) token {} (row {}) head {} d {}", s, sc.seqs[s].start,
                          sc.seqs[s].new_len, tok, r, col / D, col % D),
              want[i], x);
    }
}

// The device copies of a scenario and the AttnMeta that points at them.
struct DeviceScenario {
  DevBuf<uint16_t> q, k, v, out;
  DevBuf<int32_t> tables, kv_lens, new_lens, q_rows;
  cuda::AttnMeta meta;
  cuda::AttnShape shape;
  explicit DeviceScenario(const PagedScenario& sc)
      : q(sc.q), k(sc.k), v(sc.v), out(size_t(sc.rows) * sc.out_stride), tables(sc.block_tables),
        kv_lens(sc.kv_lens), new_lens(sc.new_lens), q_rows(sc.q_rows) {
    meta.block_tables = tables.get();
    meta.max_pages = sc.max_pages;
    meta.kv_lens = kv_lens.get();
    meta.new_lens = new_lens.get();
    meta.q_rows = q_rows.get();
    meta.num_seqs = int(sc.seqs.size());
    meta.page_size = sc.c.page_size;
    shape.heads = sc.c.heads;
    shape.kv_heads = sc.c.kv_heads;
    shape.head_dim = sc.c.head_dim;
    shape.scale = sc.scale;
  }
};

int max_new(const PagedScenario& sc) {
  int m = 0;
  for (const auto& s : sc.seqs) m = std::max(m, s.new_len);
  return m;
}

const std::vector<AttnConfig> kAttnConfigs = {
    {32, 4, 128, 16},  // Qwen3-30B-A3B
    {8, 8, 64, 3},     // MHA, odd page size
    {16, 2, 256, 1},   // head_dim 256, one token a page
    {12, 4, 128, 64},  // group of 3
    {40, 2, 64, 16},   // group of 20: more than one 16-row tile per kv head in decode
};

// Runs paged_attention_prefill on a fresh device copy of the scenario (output poisoned first) and compares it with
// the CPU reference.
void check_prefill(const AttnConfig& c, const std::vector<SeqSpec>& seqs, uint32_t seed, Stream& st) {
  PagedScenario sc = build_scenario(c, seqs, seed);
  auto want = attention_reference(sc);
  DeviceScenario dev(sc);
  dev.out.poison();
  cuda::paged_attention_prefill(dev.q.bf(), sc.q_stride, dev.k.bf(), dev.v.bf(), dev.meta, dev.shape,
                                std::max(max_new(sc), 1), dev.out.bf(), sc.out_stride, st.get());
  st.sync();
  compare_attention(sc, want, dev.out.download(), "prefill");
}

TEST(CudaKernels, PagedAttentionPrefillMatchesCpu) {
  REQUIRE_GPU();
  Stream st;
  // Fresh prefill, decode-in-prefill (new 1), padding, exact page multiples, chunked prefill over a cached
  // prefix, a long sequence.
  const std::vector<SeqSpec> seqs = {{0, 37},   {100, 1}, {5, 0},      {0, 48}, {1200, 300},
                                     {0, 1500}, {33, 7},  {47, 1},     {0, 1},  {64, 128}};
  uint32_t seed = 100;
  for (const auto& c : kAttnConfigs) check_prefill(c, seqs, seed++, st);
}

// Qwen3's head_dim 128 and group of 8 (the wgmma prefill tiles, whose K / V producer steps page and slot per key)
// over page sizes that split a 64-key tile unevenly, with a cached prefix and chunked prompts.
TEST(CudaKernels, PagedAttentionPrefillOddPageSizes) {
  REQUIRE_GPU();
  Stream st;
  const std::vector<SeqSpec> seqs = {{0, 37}, {100, 1}, {0, 130}, {61, 67}, {5, 0}, {0, 1}, {250, 200}};
  uint32_t seed = 150;
  for (int page : {1, 5, 24}) check_prefill({32, 4, 128, page}, seqs, seed++, st);
}

TEST(CudaKernels, PagedAttentionPrefillSmallBatches) {
  REQUIRE_GPU();
  Stream st;
  // One sequence at a time, including the shortest ones, and a batch of decode-like tokens only.
  const std::vector<std::vector<SeqSpec>> batches = {
      {{0, 1}}, {{0, 2}}, {{15, 1}}, {{16, 16}}, {{0, 65}}, {{3, 61}}, {{1, 1}, {2, 1}, {700, 1}, {0, 0}}};
  uint32_t seed = 200;
  for (const auto& c : kAttnConfigs)
    for (const auto& b : batches) check_prefill(c, b, seed++, st);
}

// Steps whose items the warp-specialized prefill kernel hands out from its work list (attention_wgmma_ws.cuh): 64
// decode-like rows riding with two 512-token prompts (66 sequences: the composition whose grid order put every
// prompt row on 8 of 132 CTAs), 33 sequences, and more sequences than the list takes (kWsMaxSeqs: the grid order).
TEST(CudaKernels, PagedAttentionPrefillMixedBatches) {
  REQUIRE_GPU();
  Stream st;
  std::vector<SeqSpec> mixed;
  for (int i = 0; i < 64; ++i) mixed.push_back({300 + 7 * i, 1});
  mixed.push_back({0, 512});
  mixed.push_back({40, 512});
  std::vector<SeqSpec> thirty_three;
  for (int i = 0; i < 33; ++i) thirty_three.push_back(i % 3 == 0 ? SeqSpec{i, 96 + i} : SeqSpec{200 + i, 1});
  std::vector<SeqSpec> many(1030, SeqSpec{3, 1});
  many[5] = {0, 70};
  uint32_t seed = 250;
  for (const auto* b : {&mixed, &thirty_three, &many}) check_prefill(kAttnConfigs[0], *b, seed++, st);
}

const std::vector<SeqSpec> kDecodeSeqs = {{0, 1},    {1, 1},   {14, 1},  {15, 1},  {16, 1}, {99, 1},
                                          {50, 0},   {1499, 1}, {776, 1}, {191, 1}, {2, 0}, {47, 1}};

TEST(CudaKernels, PagedAttentionDecodeMatchesCpu) {
  REQUIRE_GPU();
  Stream st;
  uint32_t seed = 300;
  for (const auto& c : kAttnConfigs) {
    PagedScenario sc = build_scenario(c, kDecodeSeqs, seed++);
    auto want = attention_reference(sc);
    DeviceScenario dev(sc);
    // One workspace for every split count, zeroed once (as the decode graphs of all batch sizes share one).
    const size_t ws_bytes = cuda::decode_workspace_bytes(dev.meta.num_seqs, c.heads, c.head_dim, 16);
    DevBuf<uint8_t> ws(ws_bytes);
    ws.poison();
    cuda::init_decode_workspace(ws.get(), ws_bytes, st.get());
    for (int splits : {1, 3, 4, 16, 3}) {
      dev.out.poison();
      cuda::paged_attention_decode(dev.q.bf(), sc.q_stride, dev.k.bf(), dev.v.bf(), dev.meta, dev.shape, splits,
                                   ws.get(), ws_bytes, dev.out.bf(), sc.out_stride, st.get());
      st.sync();
      compare_attention(sc, want, dev.out.download(), fmt::format("decode num_splits={}", splits));
    }
  }
}

TEST(CudaKernels, PagedAttentionDecodeRingBoundaries) {
  REQUIRE_GPU();
  Stream st;
  // Decode streams the keys through a 3-stage ring of 64-key tiles: parts of 1 .. 9 tiles (every stage wraps),
  // lengths one short of, at and one past tile multiples, and a serving-sized batch (64 sequences of 512).
  std::vector<SeqSpec> seqs;
  for (int tiles = 1; tiles <= 9; ++tiles)
    for (int d : {-1, 0, 1}) seqs.push_back({tiles * 64 + d - 1, 1});
  std::vector<SeqSpec> serving(64, SeqSpec{511, 1});
  serving[7] = {0, 0};  // a padding slot in the middle
  uint32_t seed = 350;
  for (const auto& c : kAttnConfigs) {
    for (const auto* batch : {&seqs, &serving}) {
      if (batch == &serving && c.head_dim != 128) continue;
      PagedScenario sc = build_scenario(c, *batch, seed++);
      auto want = attention_reference(sc);
      DeviceScenario dev(sc);
      for (int splits : {1, 2, 5}) {
        const size_t ws_bytes = cuda::decode_workspace_bytes(dev.meta.num_seqs, c.heads, c.head_dim, splits);
        DevBuf<uint8_t> ws(ws_bytes);
        ws.poison();  // the partial outputs and sums must all be written before the merge reads them
        cuda::init_decode_workspace(ws.get(), ws_bytes, st.get());
        dev.out.poison();
        cuda::paged_attention_decode(dev.q.bf(), sc.q_stride, dev.k.bf(), dev.v.bf(), dev.meta, dev.shape, splits,
                                     ws_bytes ? ws.get() : nullptr, ws_bytes, dev.out.bf(), sc.out_stride, st.get());
        st.sync();
        compare_attention(sc, want, dev.out.download(), fmt::format("decode ring num_splits={}", splits));
      }
    }
  }
}

TEST(CudaKernels, DecodeAndPrefillAgreeOnDecodeBatches) {
  REQUIRE_GPU();
  Stream st;
  // The same decode batch through both paths: two GPU implementations, one answer (to bf16 rounding).
  PagedScenario sc = build_scenario(kAttnConfigs[0], kDecodeSeqs, 400);
  DeviceScenario dev(sc);
  dev.out.poison();
  cuda::paged_attention_prefill(dev.q.bf(), sc.q_stride, dev.k.bf(), dev.v.bf(), dev.meta, dev.shape, 1,
                                dev.out.bf(), sc.out_stride, st.get());
  st.sync();
  auto a = to_f32(dev.out.download());
  const size_t ws_bytes = cuda::decode_workspace_bytes(dev.meta.num_seqs, sc.c.heads, sc.c.head_dim, 8);
  DevBuf<uint8_t> ws(ws_bytes);
  cuda::init_decode_workspace(ws.get(), ws_bytes, st.get());
  dev.out.poison();
  cuda::paged_attention_decode(dev.q.bf(), sc.q_stride, dev.k.bf(), dev.v.bf(), dev.meta, dev.shape, 8, ws.get(),
                               ws_bytes, dev.out.bf(), sc.out_stride, st.get());
  st.sync();
  compare_attention(sc, a, dev.out.download(), "decode(8 splits) vs prefill");
}

// Decode with the input stage fused into the attention launch against the two-launch path (qk_norm_rope_store_kv,
// then paged_attention_decode; both checked against the CPU above): the same outputs and the same cache
// contents. The fused run starts from caches whose new-token slots are NaN, so a read of the slot before it is
// written shows. Starts of 1,499 with one part put the new key in a tile loaded by the main loop (not the
// prologue); a group of 20 has two row tiles per kv head.
TEST(CudaKernels, DecodeWithFusedInputStageMatchesTwoLaunches) {
  REQUIRE_GPU();
  Stream st;
  uint32_t seed = 450;
  for (const auto& c : kAttnConfigs) {
    PagedScenario sc = build_scenario(c, kDecodeSeqs, seed++);
    std::mt19937 g(seed * 7);
    const int H = c.heads, KV = c.kv_heads, D = c.head_dim, P = c.page_size;
    const int64_t stride = int64_t(H + 2 * KV) * D + 8;
    const auto qkv = random_bf16(size_t(sc.rows) * stride, g, 0, 1.5f);
    const auto qn = random_bf16(D, g, 1, 0.3f), kn = random_bf16(D, g, 1, 0.3f);
    std::vector<float> inv_freq(D / 2);
    for (int i = 0; i < D / 2; ++i) inv_freq[i] = 1.0f / std::pow(1e6f, float(2 * i) / float(D));
    std::vector<int32_t> pos(sc.rows, 0), slots(sc.rows, -1);
    auto fresh = sc.k;  // caches with the new tokens' slots poisoned
    auto fresh_v = sc.v;
    for (size_t s = 0; s < sc.seqs.size(); ++s) {
      if (sc.seqs[s].new_len == 0) continue;
      const int at = sc.seqs[s].start, r = sc.q_rows[s];
      pos[r] = at;
      slots[r] = sc.block_tables[s * sc.max_pages + at / P] * P + at % P;
      const size_t base = size_t(slots[r]) * KV * D;
      std::fill(fresh.begin() + base, fresh.begin() + base + size_t(KV) * D, kPoison16);
      std::fill(fresh_v.begin() + base, fresh_v.begin() + base + size_t(KV) * D, kPoison16);
    }
    DevBuf<uint16_t> d_qn(qn), d_kn(kn);
    DevBuf<float> d_freq(inv_freq);
    DevBuf<int32_t> d_pos(pos), d_slots(slots);
    cuda::RopeArgs rope;
    rope.inv_freq = d_freq.get();
    rope.rotary_dim = D;
    rope.attention_scaling = 0.95f;
    for (int splits : {1, 3, 16}) {
      const std::string ctx = fmt::format("fused input stage, num_splits={}, {}", splits, sc.name());
      DeviceScenario two(sc), one(sc);
      const size_t ws_bytes = cuda::decode_workspace_bytes(two.meta.num_seqs, H, D, splits);
      DevBuf<uint8_t> ws(ws_bytes);
      cuda::init_decode_workspace(ws.get(), ws_bytes, st.get());
      DevBuf<uint16_t> qkv_two(qkv), qkv_one(qkv);
      cuda::qk_norm_rope_store_kv(qkv_two.bf(), stride, sc.rows, H, KV, D, d_qn.bf(), d_kn.bf(), 1e-6f, d_pos.get(),
                                  rope, d_slots.get(), two.k.bf(), two.v.bf(), st.get());
      two.out.poison();
      cuda::paged_attention_decode(qkv_two.bf(), stride, two.k.bf(), two.v.bf(), two.meta, two.shape, splits,
                                   ws.get(), ws_bytes, two.out.bf(), sc.out_stride, st.get());
      one.k.upload(fresh);
      one.v.upload(fresh_v);
      one.out.poison();
      const cuda::AttnInputStage stage{d_qn.bf(), d_kn.bf(), 1e-6f, d_pos.get(), rope, d_slots.get()};
      cuda::paged_attention_decode_fused_input(qkv_one.bf(), stride, one.k.bf(), one.v.bf(), one.meta, one.shape,
                                               stage, splits, ws.get(), ws_bytes, one.out.bf(), sc.out_stride,
                                               st.get());
      st.sync();
      compare_attention(sc, to_f32(two.out.download()), one.out.download(), ctx);
      Mismatches m(ctx);
      if (qkv_one.download() != qkv) m.add("the fused launch modified qkv");
      const auto k2 = two.k.download(), k1 = one.k.download(), v2 = two.v.download(), v1 = one.v.download();
      for (size_t e = 0; e < k2.size(); ++e) {
        if (k1[e] != k2[e] && (k1[e] == kPoison16 || k2[e] == kPoison16 ||
                               !close(bf16_to_f32(k2[e]), bf16_to_f32(k1[e]), 1e-2f, 1e-2f)))
          m.add(fmt::format("k cache element {} (slot {})", e, e / (size_t(KV) * D)), bf16_to_f32(k2[e]),
                bf16_to_f32(k1[e]));
        if (v1[e] != v2[e])
          m.add(fmt::format("v cache element {} (slot {})", e, e / (size_t(KV) * D)), bf16_to_f32(v2[e]),
                bf16_to_f32(v1[e]));
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------------------
TEST(CudaKernels, LaunchesAreGraphCapturable) {
  REQUIRE_GPU();
  Stream st;
  PagedScenario sc = build_scenario(kAttnConfigs[0], kDecodeSeqs, 500);
  DeviceScenario dev(sc);
  const size_t ws_bytes = cuda::decode_workspace_bytes(dev.meta.num_seqs, sc.c.heads, sc.c.head_dim, 4);
  DevBuf<uint8_t> ws(ws_bytes);
  cuda::init_decode_workspace(ws.get(), ws_bytes, st.get());
  DevBuf<uint16_t> out_prefill(size_t(sc.rows) * sc.out_stride), out_norm(size_t(sc.rows) * 2048);
  std::mt19937 g(501);
  std::vector<float> x(size_t(sc.rows) * 2048);
  std::normal_distribution<float> nd(0, 1);
  for (auto& e : x) e = nd(g);
  DevBuf<float> d_x(x);
  DevBuf<uint16_t> d_w(random_bf16(2048, g, 1, 0.2f));
  auto run_all = [&] {
    cuda::rmsnorm(d_x.get(), d_w.bf(), 1e-6f, sc.rows, 2048, out_norm.bf(), st.get());
    cuda::paged_attention_prefill(dev.q.bf(), sc.q_stride, dev.k.bf(), dev.v.bf(), dev.meta, dev.shape, 1,
                                  out_prefill.bf(), sc.out_stride, st.get());
    cuda::paged_attention_decode(dev.q.bf(), sc.q_stride, dev.k.bf(), dev.v.bf(), dev.meta, dev.shape, 4, ws.get(),
                                 ws_bytes, dev.out.bf(), sc.out_stride, st.get());
  };
  dev.out.poison();
  out_prefill.poison();
  out_norm.poison();
  run_all();
  st.sync();
  auto eager_dec = dev.out.download(), eager_pre = out_prefill.download(), eager_norm = out_norm.download();

  cudaGraph_t graph{};
  ck(cudaStreamBeginCapture(st.get(), cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  run_all();
  ck(cudaStreamEndCapture(st.get(), &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec{};
  ck(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  dev.out.poison();
  out_prefill.poison();
  out_norm.poison();
  ck(cudaGraphLaunch(exec, st.get()), "cudaGraphLaunch");
  st.sync();
  EXPECT_TRUE(dev.out.download() == eager_dec) << "decode: graph replay differs from the eager run";
  EXPECT_TRUE(out_prefill.download() == eager_pre) << "prefill: graph replay differs from the eager run";
  EXPECT_TRUE(out_norm.download() == eager_norm) << "rmsnorm: graph replay differs from the eager run";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Attention timings for docs/PERF.md and for profiling the kernels alone (ncu on this binary needs little device
// memory). Run with --gtest_also_run_disabled_tests --gtest_filter='*AttentionTiming*'. Qwen3-30B-A3B heads,
// contexts of 512 tokens; events around 50 back-to-back launches, after 5 untimed ones.
TEST(CudaKernelsBench, DISABLED_AttentionTiming) {
  REQUIRE_GPU();
  Stream st;
  struct Case {
    const char* name;
    int seqs, start, new_len, splits;
    int seqs2 = 0, start2 = 0, new_len2 = 0;  // a second group of sequences after the first (mixed steps)
  };
  const Case cases[] = {{"decode bs1 ctx512", 1, 511, 1, 16},   {"decode bs64 ctx512", 64, 511, 1, 1},
                        {"decode bs128 ctx512", 128, 511, 1, 1}, {"prefill 1x512", 1, 0, 512, 0},
                        {"prefill 16x512", 16, 0, 512, 0},       {"mixed 64x1 + 1x512", 64, 511, 1, 0, 1, 0, 512},
                        {"mixed 64x1 + 2x512", 64, 511, 1, 0, 2, 0, 512}, {"mixed 17x1 + 16x512", 17, 511, 1, 0, 16, 0, 512}};
  cudaEvent_t e0{}, e1{};
  ck(cudaEventCreate(&e0), "event");
  ck(cudaEventCreate(&e1), "event");
  for (const Case& c : cases) {
    std::vector<SeqSpec> specs(size_t(c.seqs), SeqSpec{c.start, c.new_len});
    specs.insert(specs.end(), size_t(c.seqs2), SeqSpec{c.start2, c.new_len2});
    PagedScenario sc = build_scenario(kAttnConfigs[0], specs, 900);
    DeviceScenario dev(sc);
    const size_t ws_bytes =
        c.splits > 0 ? cuda::decode_workspace_bytes(dev.meta.num_seqs, sc.c.heads, sc.c.head_dim, c.splits) : 0;
    DevBuf<uint8_t> ws(std::max<size_t>(ws_bytes, 16));
    cuda::init_decode_workspace(ws.get(), ws_bytes, st.get());
    auto launch = [&] {
      if (c.splits > 0)
        cuda::paged_attention_decode(dev.q.bf(), sc.q_stride, dev.k.bf(), dev.v.bf(), dev.meta, dev.shape, c.splits,
                                     ws.get(), ws_bytes, dev.out.bf(), sc.out_stride, st.get());
      else
        cuda::paged_attention_prefill(dev.q.bf(), sc.q_stride, dev.k.bf(), dev.v.bf(), dev.meta, dev.shape,
                                      std::max(c.new_len, c.new_len2), dev.out.bf(), sc.out_stride, st.get());
    };
    for (int i = 0; i < 5; ++i) launch();
    constexpr int kIters = 50;
    ck(cudaEventRecord(e0, st.get()), "record");
    for (int i = 0; i < kIters; ++i) launch();
    ck(cudaEventRecord(e1, st.get()), "record");
    st.sync();
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    std::printf("[ info ] attention %-20s %8.1f us per launch\n", c.name, 1000.0 * ms / kIters);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

// Where a keys-as-M decode block spends its time (for docs/PERF.md): the blocks' clock64 at the phase points of
// attention_decode_gqa.cuh (AttnMeta::phase_clocks), launched back to back as a decode step chains its layers;
// medians over the blocks that ran every phase, in ns. Run with --gtest_also_run_disabled_tests.
TEST(CudaKernelsBench, DISABLED_AttentionDecodePhases) {
  REQUIRE_GPU();
  Stream st;
  int khz = 0;
  ck(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0), "clock rate");
  for (int seqs : {1, 4, 64}) {
    PagedScenario sc = build_scenario(kAttnConfigs[0], std::vector<SeqSpec>(size_t(seqs), SeqSpec{511, 1}), 901);
    DeviceScenario dev(sc);
    const int splits = cuda::paged_attention_decode_splits(dev.shape, seqs, cuda::current_device_multiprocessors(), 16);
    const size_t ws_bytes = cuda::decode_workspace_bytes(dev.meta.num_seqs, sc.c.heads, sc.c.head_dim, splits);
    DevBuf<uint8_t> ws(std::max<size_t>(ws_bytes, 16));
    cuda::init_decode_workspace(ws.get(), ws_bytes, st.get());
    const size_t blocks = size_t(splits) * sc.c.kv_heads * seqs;
    DevBuf<long long> clocks(blocks * cuda::kAttnPhaseCount);
    ck(cudaMemset(clocks.get(), 0, blocks * cuda::kAttnPhaseCount * sizeof(long long)), "memset");
    cuda::AttnMeta meta = dev.meta;
    for (int i = 0; i < 30; ++i) {
      meta.phase_clocks = i == 29 ? clocks.get() : nullptr;
      cuda::paged_attention_decode(dev.q.bf(), sc.q_stride, dev.k.bf(), dev.v.bf(), meta, dev.shape, splits, ws.get(),
                                   ws_bytes, dev.out.bf(), sc.out_stride, st.get());
    }
    st.sync();
    std::vector<long long> c(blocks * cuda::kAttnPhaseCount);
    ck(cudaMemcpy(c.data(), clocks.get(), c.size() * sizeof(long long), cudaMemcpyDeviceToHost), "copy");
    // Phases 6 and 7 are the cluster merge's: without a cluster (one part, or a grid over one block an SM) a block
    // ends at phase 5.
    const int last = splits > 1 && blocks <= size_t(cuda::current_device_multiprocessors()) ? 7 : 5;
    std::vector<std::vector<double>> d(cuda::kAttnPhaseCount);
    for (size_t b = 0; b < blocks; ++b) {
      const long long* r = c.data() + b * cuda::kAttnPhaseCount;
      if (std::any_of(r, r + last + 1, [](long long v) { return v == 0; })) continue;  // a block that left early
      for (int ph = 1; ph <= last; ++ph) d[ph].push_back(double(r[ph] - r[ph - 1]) * 1e6 / khz);
    }
    ASSERT_FALSE(d[1].empty()) << "no block ran every phase";
    std::printf("[ info ] decode bs%d ctx512, %d parts%s, %zu of %zu blocks ran every phase; median ns:\n", seqs, splits,
                last == 7 ? " a cluster" : "", d[1].size(), blocks);
    const char* names[] = {"", "cached keys issued", "wait + input stage", "prologue tiles landed", "key tiles",
                           "warps merged, part out", "cluster barrier 1", "cluster merge + barrier 2"};
    for (int ph = 1; ph <= last; ++ph) {
      std::sort(d[ph].begin(), d[ph].end());
      std::printf("[ info ]   %-28s %8.0f  (min %.0f, max %.0f)\n", names[ph], d[ph][d[ph].size() / 2], d[ph].front(),
                  d[ph].back());
    }
  }
}

// The split-KV part count is host logic (no GPU needed): one wave of two blocks an SM, except that the keys-as-M
// tiles (head_dim 128, groups of up to 8) take as many parts as keep one block an SM, so that their parts merge
// inside a cluster, whenever that is at least 2 parts; never more than max_splits (nor 16 for a cluster).
TEST(CudaKernels, DecodeSplitCountsFollowTheClusterRule) {
  for (const char* name : {"MOESERVE_ATTN_CLUSTER_MERGE", "MOESERVE_ATTN_CLUSTER_SPLITS", "MOESERVE_ATTN_DECODE_GQA_MIN"})
    if (const char* v = std::getenv(name); v != nullptr && std::string(v) == "0")
      GTEST_SKIP() << name << "=0 switches the rule under test off";
  const cuda::AttnShape gqa{32, 4, 128, 1.0f};    // q30b: groups of 8 at head_dim 128 (keys-as-M)
  const cuda::AttnShape wide{32, 2, 128, 1.0f};   // groups of 16: the 16-row tiles
  const cuda::AttnShape big{16, 4, 256, 1.0f};    // head_dim 256: one block an SM
  const int sms = 132;
  // bs 1: min(132 / 4, 16) = 16; bs 4: 132 / 16 = 8; bs 8: 4; bs 16: 2; bs 32: 132 / 128 = 1, so one wave of two an SM.
  const std::vector<std::pair<int, int>> want = {{1, 16}, {2, 16}, {3, 11}, {4, 8}, {8, 4}, {16, 2}, {32, 2}, {64, 1}};
  for (auto [bs, parts] : want)
    EXPECT_EQ(cuda::paged_attention_decode_splits(gqa, bs, sms, 16), parts) << "keys-as-M, " << bs << " sequences";
  EXPECT_EQ(cuda::paged_attention_decode_splits(gqa, 1, sms, 8), 8) << "max_splits caps it";
  // The 16-row tiles: 264 blocks / (bs x kv heads).
  EXPECT_EQ(cuda::paged_attention_decode_splits(wide, 1, sms, 16), 16);
  EXPECT_EQ(cuda::paged_attention_decode_splits(wide, 8, sms, 16), 16);
  EXPECT_EQ(cuda::paged_attention_decode_splits(wide, 32, sms, 16), 4);
  EXPECT_EQ(cuda::paged_attention_decode_splits(wide, 200, sms, 16), 1);
  // head_dim 256: 132 blocks / (bs x kv heads).
  EXPECT_EQ(cuda::paged_attention_decode_splits(big, 4, sms, 16), 8);
  EXPECT_EQ(cuda::paged_attention_decode_splits(big, 64, sms, 16), 1);
}

TEST(CudaKernels, UnsupportedHeadDimIsAnInternalError) {
  REQUIRE_GPU();
  Stream st;
  cuda::AttnMeta meta;
  cuda::AttnShape shape;
  shape.heads = 4;
  shape.kv_heads = 1;
  shape.head_dim = 96;
  DevBuf<uint16_t> buf(1024);
  EXPECT_THROW(cuda::paged_attention_prefill(buf.bf(), 384, buf.bf(), buf.bf(), meta, shape, 1, buf.bf(), 384,
                                             st.get()),
               InternalError);
  EXPECT_THROW(cuda::paged_attention_decode(buf.bf(), 384, buf.bf(), buf.bf(), meta, shape, 1, nullptr, 0,
                                            buf.bf(), 384, st.get()),
               InternalError);
  cuda::RopeArgs rope;
  EXPECT_THROW(cuda::qk_norm_rope_store_kv(buf.bf(), 6 * 320, 1, 4, 1, 320, nullptr, nullptr, 1e-6f, nullptr, rope,
                                           nullptr, nullptr, nullptr, st.get()),
               InternalError);
}

}  // namespace

#include "cuda/model/backends.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/env.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "cuda/kernels/ops.h"
#include "cuda/model/attention_ref.h"
#include "cuda/model/model_kernels.h"
#include "cuda/sampling/lmhead_argmax.h"
#include "cuda/sampling/lmhead_screen.h"
#include "cuda/sampling/sampling.h"
#include "kernels/attention/attention.h"
#include "kernels/sampling/sampling.h"

namespace moeserve::cuda {

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Scoped device buffer for self-tests and trials (these run once at startup, outside the step loop).
struct Scratch {
  void* p = nullptr;
  explicit Scratch(size_t bytes) { MS_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  ~Scratch() { cudaFree(p); }
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

std::string no_code_reason(const std::string& what, const DeviceInfo& dev) {
  if (what.find("NoKernelImage") != std::string::npos || what.find("no kernel image") != std::string::npos ||
      what.find("InvalidDeviceFunction") != std::string::npos)
    return fmt::format("no code for {} in this binary", sm_name(sm_version(dev)));
  return what;
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& g, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(d(g));
  return v;
}

// Attention: prefill (with a cached prefix) and split-KV decode against kernels::paged_attention.
std::string attention_self_test(bool reference, int D, double& max_err) {
  const int heads = 8, kv_heads = 2, page = 16, pages = 24;
  std::mt19937 g(7);
  struct Seq {
    int start, n;
  };
  const std::vector<Seq> prefill{{0, 37}, {21, 5}, {64, 1}};
  const std::vector<Seq> decode{{40, 1}, {0, 1}, {100, 1}};
  const size_t cache_elems = size_t(pages) * page * kv_heads * D;
  std::vector<uint16_t> kc = random_bf16(cache_elems, g, 1.0f), vc = random_bf16(cache_elems, g, 1.0f);
  std::vector<float> kf(cache_elems), vf(cache_elems);
  for (size_t i = 0; i < cache_elems; ++i) kf[i] = bf16_to_f32(kc[i]), vf[i] = bf16_to_f32(vc[i]);
  Scratch dk(cache_elems * 2), dv(cache_elems * 2);
  MS_CUDA_CHECK(cudaMemcpy(dk.p, kc.data(), cache_elems * 2, cudaMemcpyHostToDevice));
  MS_CUDA_CHECK(cudaMemcpy(dv.p, vc.data(), cache_elems * 2, cudaMemcpyHostToDevice));
  // Each sequence gets 8 pages in a scrambled order.
  std::vector<int32_t> perm(pages);
  for (int i = 0; i < pages; ++i) perm[i] = (i * 7 + 3) % pages;
  max_err = 0;
  ThreadPool pool(1);
  for (int mode = 0; mode < 2; ++mode) {
    const auto& seqs = mode == 0 ? prefill : decode;
    const int S = int(seqs.size()), max_pages = 8;
    int T = 0, max_new = 0;
    std::vector<int32_t> bt(size_t(S) * max_pages), kv_lens(S), new_lens(S), q_rows(S);
    std::vector<kernels::AttnSeq> cpu_seqs;
    for (int s = 0; s < S; ++s) {
      for (int p = 0; p < max_pages; ++p) bt[size_t(s) * max_pages + p] = perm[(s * max_pages + p) % pages];
      kv_lens[s] = seqs[s].start + seqs[s].n;
      new_lens[s] = seqs[s].n;
      q_rows[s] = T;
      cpu_seqs.push_back({&bt[size_t(s) * max_pages], seqs[s].start, seqs[s].n, T});
      T += seqs[s].n;
      max_new = std::max(max_new, seqs[s].n);
    }
    const int QS = (heads + 2 * kv_heads) * D;  // q inside a qkv row, as the model passes it
    std::vector<uint16_t> q = random_bf16(size_t(T) * QS, g, 1.0f);
    std::vector<float> qf(q.size());
    for (size_t i = 0; i < q.size(); ++i) qf[i] = bf16_to_f32(q[i]);
    std::vector<float> want(size_t(T) * heads * D);
    kernels::PagedKV pkv{kf.data(), vf.data(), int64_t(page) * kv_heads * D, page, kv_heads, D};
    const float scale = 1.0f / std::sqrt(float(D));
    kernels::paged_attention(qf.data(), QS, heads, pkv, cpu_seqs, scale, want.data(), heads * D, pool);

    std::vector<int32_t> meta;
    for (auto* v : {&bt, &kv_lens, &new_lens, &q_rows}) meta.insert(meta.end(), v->begin(), v->end());
    Scratch dmeta(meta.size() * 4), dq(q.size() * 2), dout(want.size() * 2);
    MS_CUDA_CHECK(cudaMemcpy(dmeta.p, meta.data(), meta.size() * 4, cudaMemcpyHostToDevice));
    MS_CUDA_CHECK(cudaMemcpy(dq.p, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
    MS_CUDA_CHECK(cudaMemset(dout.p, 0xff, want.size() * 2));  // poison: NaN unless written
    AttnMeta m;
    m.block_tables = dmeta.as<int32_t>();
    m.max_pages = max_pages;
    m.kv_lens = m.block_tables + bt.size();
    m.new_lens = m.kv_lens + S;
    m.q_rows = m.new_lens + S;
    m.num_seqs = S;
    m.page_size = page;
    AttnShape sh{heads, kv_heads, D, scale};
    const int splits = 4;
    const size_t ws_bytes = decode_workspace_bytes(S, heads, D, splits);
    Scratch ws(ws_bytes);
    init_decode_workspace(ws.p, ws_bytes, nullptr);
    if (reference)
      paged_attention_reference(dq.as<bf16>(), QS, dk.as<bf16>(), dv.as<bf16>(), m, sh, max_new, dout.as<bf16>(),
                                heads * D, nullptr);
    else if (mode == 0)
      paged_attention_prefill(dq.as<bf16>(), QS, dk.as<bf16>(), dv.as<bf16>(), m, sh, max_new, dout.as<bf16>(),
                              heads * D, nullptr);
    else
      paged_attention_decode(dq.as<bf16>(), QS, dk.as<bf16>(), dv.as<bf16>(), m, sh, splits, ws.p, ws_bytes,
                             dout.as<bf16>(), heads * D, nullptr);
    MS_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> got(want.size());
    MS_CUDA_CHECK(cudaMemcpy(got.data(), dout.p, got.size() * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < got.size(); ++i) {
      float x = bf16_to_f32(got[i]);
      double err = std::fabs(double(x) - want[i]);
      if (!std::isfinite(x) || err > 3e-2 + 3e-2 * std::fabs(want[i]))
        return fmt::format("{} element {}: got {}, want {}", mode == 0 ? "prefill" : "decode", i, x, want[i]);
      max_err = std::max(max_err, err);
    }
  }
  return "";
}

// Sampling: greedy ids and raw logprobs against the CPU sampler.
std::string sampling_self_test(double& max_err) {
  const int rows = 3, V = 1000;
  std::mt19937 g(11);
  std::normal_distribution<float> d(0, 3);
  std::vector<float> lg(size_t(rows) * V);
  for (auto& x : lg) x = d(g);
  std::vector<SampleRowParams> params(rows);
  for (auto& p : params) p.temperature = 0.0f;
  Scratch dl(lg.size() * 4), dp(rows * sizeof(SampleRowParams)), dids(rows * 4), dlp(rows * 4),
      ws(sample_workspace_bytes(rows, V));
  MS_CUDA_CHECK(cudaMemcpy(dl.p, lg.data(), lg.size() * 4, cudaMemcpyHostToDevice));
  MS_CUDA_CHECK(cudaMemcpy(dp.p, params.data(), rows * sizeof(SampleRowParams), cudaMemcpyHostToDevice));
  SampleArgs a;
  a.logits = dl.as<float>();
  a.rows = rows;
  a.vocab = V;
  a.params = dp.as<SampleRowParams>();
  a.out_ids = dids.as<int32_t>();
  a.out_logprobs = dlp.as<float>();
  a.workspace = ws.p;
  sample(a, nullptr);
  MS_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int32_t> ids(rows);
  std::vector<float> lps(rows), ref(V);
  MS_CUDA_CHECK(cudaMemcpy(ids.data(), dids.p, rows * 4, cudaMemcpyDeviceToHost));
  MS_CUDA_CHECK(cudaMemcpy(lps.data(), dlp.p, rows * 4, cudaMemcpyDeviceToHost));
  max_err = 0;
  for (int r = 0; r < rows; ++r) {
    const float* row = lg.data() + size_t(r) * V;
    int32_t want = kernels::argmax(row, V);
    if (ids[r] != want) return fmt::format("row {}: greedy picked {}, want {}", r, ids[r], want);
    kernels::log_softmax(row, V, ref.data());
    double err = std::fabs(double(lps[r]) - ref[want]);
    if (!(err < 1e-3)) return fmt::format("row {}: logprob {}, want {}", r, lps[r], ref[want]);
    max_err = std::max(max_err, err);
  }
  return "";
}

// The double-precision logits of token row m of hx against the f32 copy of the lm_head rows wf ([V, K]): their
// argmax and whether it is clear of the runner-up by more than the f32 summation error (the fast paths' self-tests).
struct HostLogits {
  std::vector<double> lg;
  double max = -INFINITY;
  int arg = 0;
  bool clear = true;
};
HostLogits host_logits(const std::vector<uint16_t>& hx, int m, int K, const std::vector<float>& wf, int V) {
  HostLogits h;
  h.lg.resize(size_t(V));
  std::vector<double> xr(static_cast<size_t>(K));
  for (int k = 0; k < K; ++k) xr[size_t(k)] = bf16_to_f32(hx[size_t(m) * K + k]);
  double second = -INFINITY, scale = 0;
  for (int v = 0; v < V; ++v) {
    double sum = 0;
    const float* wr = wf.data() + size_t(v) * K;
    for (int k = 0; k < K; ++k) sum += xr[size_t(k)] * wr[k];
    h.lg[size_t(v)] = sum;
    scale = std::max(scale, std::fabs(sum));
    if (sum > h.max) second = h.max, h.max = sum, h.arg = v;
    else if (sum > second) second = sum;
  }
  h.clear = h.max - second > 1e-5 * scale + 1e-6;
  return h;
}
// "" when id is a vocabulary row and, where the argmax is clear, the argmax; else why not.
std::string check_argmax(int m, int id, const HostLogits& h, int V) {
  if (id < 0 || id >= V) return fmt::format("row {}: id {} outside the vocabulary of {}", m, id, V);
  if (h.clear && id != h.arg) return fmt::format("row {}: argmax {}, want {}", m, id, h.arg);
  return "";
}

// The lm_head + argmax of greedy steps (lmhead_argmax): ids and raw logprobs against double sums on the CPU, at the
// model's hidden size, 40 rows (the executor's 32-64 band) over a vocabulary that ends inside a 192-row unit; an id
// is checked wherever the top two logits are apart by more than the f32 summation error.
std::string lmhead_argmax_self_test(int K, double& max_err) {
  const int rows = 40, V = 3 * 192 + 1;
  std::mt19937 g(13);
  const std::vector<uint16_t> hx = random_bf16(size_t(rows) * K, g, 1.0f), hw = random_bf16(size_t(V) * K, g, 0.05f);
  Scratch dx(hx.size() * 2), dw(hw.size() * 2), dids(rows * 4), dlp(rows * 4),
      ws(lmhead_argmax_workspace_bytes(rows, V));
  MS_CUDA_CHECK(cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  MS_CUDA_CHECK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  MS_CUDA_CHECK(cudaMemset(dids.p, 0xFF, rows * 4));
  MS_CUDA_CHECK(cudaMemset(dlp.p, 0xFF, rows * 4));  // NaN unless written
  lmhead_argmax(dx.as<bf16>(), rows, K, dw.as<bf16>(), V, dids.as<int32_t>(), dlp.as<float>(), ws.p, nullptr);
  MS_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int32_t> ids(rows);
  std::vector<float> lps(rows);
  MS_CUDA_CHECK(cudaMemcpy(ids.data(), dids.p, rows * 4, cudaMemcpyDeviceToHost));
  MS_CUDA_CHECK(cudaMemcpy(lps.data(), dlp.p, rows * 4, cudaMemcpyDeviceToHost));
  std::vector<float> wf(hw.size());
  for (size_t i = 0; i < hw.size(); ++i) wf[i] = bf16_to_f32(hw[i]);
  max_err = 0;
  for (int m = 0; m < rows; ++m) {
    const HostLogits h = host_logits(hx, m, K, wf, V);
    double z = 0;
    for (double l : h.lg) z += std::exp(l - h.max);
    if (std::string why = check_argmax(m, ids[m], h, V); !why.empty()) return why;
    const double err = std::fabs(double(lps[m]) + std::log(z));
    if (!(err < 2e-3)) return fmt::format("row {}: logprob {}, want {}", m, lps[m], -std::log(z));
    max_err = std::max(max_err, err);
  }
  return "";
}

// The lm_head screen of greedy steps of 1-64 rows (lmhead_screen): ids against double sums on the CPU at the model's
// hidden size (a multiple of 128), 3 rows (the mma.sync form) and 17 (the wgmma form, on sm_90) over a vocabulary
// of two 384-row units and part of a third; an id is checked wherever the top two logits are apart by more than the
// f32 summation error. It quantizes its own small copy.
std::string lmhead_screen_self_test_rows(int K, int rows) {
  const int V = 2 * 384 + 61 * 16 + 5;
  std::mt19937 g(17 + rows);
  const std::vector<uint16_t> hx = random_bf16(size_t(rows) * K, g, 1.0f), hw = random_bf16(size_t(V) * K, g, 0.05f);
  Scratch dx(hx.size() * 2), dw(hw.size() * 2), dids(rows * 4), dq(lmhead_screen_weight_bytes(V, K)),
      ws(lmhead_screen_workspace_bytes(V, K));
  MS_CUDA_CHECK(cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  MS_CUDA_CHECK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  MS_CUDA_CHECK(cudaMemset(dids.p, 0xFF, rows * 4));
  lmhead_screen_quantize(dw.as<bf16>(), V, K, dq.p, nullptr);
  lmhead_screen_workspace_init(ws.p, V, K, nullptr);
  const float amax = lmhead_screen_amax(dq.p, V, K, nullptr);
  lmhead_screen(dx.as<bf16>(), rows, K, dw.as<bf16>(), dq.p, amax, V, dids.as<int32_t>(), ws.p, nullptr);
  MS_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int32_t> ids(rows);
  MS_CUDA_CHECK(cudaMemcpy(ids.data(), dids.p, rows * 4, cudaMemcpyDeviceToHost));
  std::vector<float> wf(hw.size());
  for (size_t i = 0; i < hw.size(); ++i) wf[i] = bf16_to_f32(hw[i]);
  for (int m = 0; m < rows; ++m)
    if (std::string why = check_argmax(m, ids[m], host_logits(hx, m, K, wf, V), V); !why.empty())
      return fmt::format("{} rows, {}", rows, why);
  return "";
}
std::string lmhead_screen_self_test(int K, double& max_err) {
  max_err = 0;
  for (const int rows : {3, 17})  // (~40 M double products on the host at K = 2,048)
    if (lmhead_screen_supported(rows, K, 1000))
      if (std::string why = lmhead_screen_self_test_rows(K, rows); !why.empty()) return why;
  return "";
}

// The screen for sampled steps (lmhead_screen_topk) at the model's hidden size, 5 rows (the 1-8-row form) and 17 (the
// 9-64-row form on sm_90), each cycling through greedy and top_k 20, 5, 64 and 2 with temperatures, top_p and min_p:
// every candidate's exact logit against the double sum on the CPU, every row clearly inside a row's top k among its
// candidates, each drawn id inside its row's top k (a greedy row's the argmax where it is clear).
constexpr int kTopkSelfTestVocab = 2 * 384 + 61 * 16 + 5;
std::string lmhead_screen_topk_self_test_rows(int K, int rows, double& max_err) {
  const int V = kTopkSelfTestVocab;
  std::mt19937 g(23 + unsigned(rows));
  const std::vector<uint16_t> hx = random_bf16(size_t(rows) * K, g, 1.0f), hw = random_bf16(size_t(V) * K, g, 0.05f);
  std::vector<SampleRowParams> hp(rows);
  constexpr int kCases = 5;
  const float temps[kCases] = {0.0f, 0.7f, 1.0f, 1.5f, 0.5f}, top_p[kCases] = {1.0f, 0.95f, 1.0f, 0.8f, 1.0f};
  const int top_k[kCases] = {-1, 20, 5, 64, 2};
  for (int m = 0; m < rows; ++m) {
    hp[size_t(m)].temperature = temps[m % kCases];
    hp[size_t(m)].top_k = top_k[m % kCases];
    hp[size_t(m)].top_p = top_p[m % kCases];
    hp[size_t(m)].min_p = m % kCases == 2 ? 0.05f : 0.0f;
    hp[size_t(m)].random = 0x9e3779b97f4a7c15ull * uint64_t(m + 1);
  }
  Scratch dx(hx.size() * 2), dw(hw.size() * 2), dids(rows * 4), dq(lmhead_screen_weight_bytes(V, K)),
      ws(lmhead_screen_workspace_bytes(V, K)), dp(sizeof(SampleRowParams) * rows);
  MS_CUDA_CHECK(cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  MS_CUDA_CHECK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  MS_CUDA_CHECK(cudaMemcpy(dp.p, hp.data(), sizeof(SampleRowParams) * rows, cudaMemcpyHostToDevice));
  MS_CUDA_CHECK(cudaMemset(dids.p, 0xFF, rows * 4));
  lmhead_screen_quantize(dw.as<bf16>(), V, K, dq.p, nullptr);
  lmhead_screen_workspace_init(ws.p, V, K, nullptr);
  const float amax = lmhead_screen_amax(dq.p, V, K, nullptr);
  lmhead_screen_topk(dx.as<bf16>(), rows, K, dw.as<bf16>(), dq.p, amax, V, static_cast<const SampleRowParams*>(dp.p),
                     dids.as<int32_t>(), ws.p, nullptr);
  MS_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int32_t> ids(rows);
  MS_CUDA_CHECK(cudaMemcpy(ids.data(), dids.p, rows * 4, cudaMemcpyDeviceToHost));
  const auto cands = lmhead_screen_topk_candidates(ws.p, rows, V, K);
  std::vector<float> wf(hw.size());
  for (size_t i = 0; i < hw.size(); ++i) wf[i] = bf16_to_f32(hw[i]);
  for (int m = 0; m < rows; ++m) {
    const HostLogits h = host_logits(hx, m, K, wf, V);
    if (temps[m % kCases] == 0.0f) {
      if (std::string why = check_argmax(m, ids[m], h, V); !why.empty()) return why;
      continue;
    }
    std::vector<double> sorted = h.lg;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    const double scale = std::max(std::fabs(sorted.front()), std::fabs(sorted.back()));
    const double tol = 1e-5 * scale + 1e-6, kth = sorted[size_t(std::min(top_k[m % kCases], V) - 1)];
    std::vector<char> listed(size_t(V), 0);
    for (const auto& [id, v] : cands[size_t(m)]) {
      if (id < 0 || id >= V) return fmt::format("row {}: candidate {} outside the vocabulary of {}", m, id, V);
      const double err = std::fabs(double(v) - h.lg[size_t(id)]);
      max_err = std::max(max_err, err);
      if (!(err <= tol)) return fmt::format("row {}: candidate {}'s logit {} against {}", m, id, v, h.lg[size_t(id)]);
      listed[size_t(id)] = 1;
    }
    for (int v = 0; v < V; ++v)
      if (h.lg[size_t(v)] > kth + tol && !listed[size_t(v)])
        return fmt::format("row {}: row {} (logit {}) of the top {} is not a candidate", m, v, h.lg[size_t(v)],
                           top_k[m % kCases]);
    if (ids[m] < 0 || ids[m] >= V || h.lg[size_t(ids[m])] < kth - tol)
      return fmt::format("row {}: drew {} outside the top {}", m, ids[m], top_k[m % kCases]);
  }
  return "";
}
std::string lmhead_screen_topk_self_test(int K, double& max_err) {
  max_err = 0;
  for (const int rows : {5, 17})
    if (lmhead_screen_topk_supported(rows, K, kTopkSelfTestVocab))
      if (std::string why = lmhead_screen_topk_self_test_rows(K, rows, max_err); !why.empty()) return why;
  return "";
}

// Times fn with CUDA events on the legacy default stream: the mean over `iters` launches after two, in microseconds.
template <class F>
double time_us(F&& fn, int iters = 10) {
  return event_time_us(nullptr, iters, fn);
}

// Time of one call inside a CUDA graph that chains `calls` of them, fn(i, stream) for i < calls (as a decode
// step chains its layers' GEMMs: launch gaps and each kernel's cold start count as they do there). Falls back to
// eager timing when the calls cannot be captured.
template <class F>
double graph_chain_us(F&& fn, size_t calls) {
  cudaStream_t st = nullptr;
  MS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  double us = -1;
  if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    bool ok = true;
    try {
      for (size_t i = 0; i < calls; ++i) fn(i, st);
    } catch (const std::exception&) {
      ok = false;
    }
    const cudaError_t e = cudaStreamEndCapture(st, &graph);
    if (ok && e == cudaSuccess && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess) {
      cudaEvent_t a = nullptr, b = nullptr;
      if (cudaEventCreate(&a) == cudaSuccess && cudaEventCreate(&b) == cudaSuccess &&
          cudaGraphLaunch(exec, st) == cudaSuccess && cudaEventRecord(a, st) == cudaSuccess) {
        constexpr int kReplays = 5;
        bool launched = true;
        for (int r = 0; r < kReplays && launched; ++r) launched = cudaGraphLaunch(exec, st) == cudaSuccess;
        float ms = 0;
        if (launched && cudaEventRecord(b, st) == cudaSuccess && cudaEventSynchronize(b) == cudaSuccess &&
            cudaEventElapsedTime(&ms, a, b) == cudaSuccess)
          us = 1000.0 * ms / (kReplays * double(calls));
      }
      if (a) cudaEventDestroy(a);
      if (b) cudaEventDestroy(b);
    }
  }
  cudaGetLastError();  // a failed capture leaves its error here; the eager timing below reports real failures
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  MS_CUDA_CHECK(cudaStreamSynchronize(st));
  cudaStreamDestroy(st);
  if (us >= 0) return us;
  size_t i = 0;
  return time_us([&] { fn(i++ % calls, nullptr); });
}

// Trial timings cached on disk: key -> microseconds.
class TrialCache {
 public:
  TrialCache() {
    const char* c = std::getenv("MOESERVE_CACHE");
    const char* home = std::getenv("HOME");
    dir_ = c && *c ? std::string(c) : std::string(home ? home : "/tmp") + "/.cache/moeserve";
    path_ = dir_ + "/backend_trials.json";
    std::ifstream f(path_);
    if (f) {
      try {
        f >> j_;
      } catch (...) {
        j_ = nlohmann::json::object();
      }
    }
    if (!j_.is_object()) j_ = nlohmann::json::object();
  }
  bool get(const std::string& key, double& us) const {
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_number()) return false;
    us = it->get<double>();
    return true;
  }
  void put(const std::string& key, double us) {
    j_[key] = us;
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    std::string tmp = path_ + ".tmp" + std::to_string(::getpid());
    std::ofstream f(tmp);
    if (!f) return;  // an unwritable cache only costs the trial next time
    f << j_.dump(1);
    f.close();
    std::filesystem::rename(tmp, path_, ec);
  }

 private:
  std::string dir_, path_;
  nlohmann::json j_;
};

std::string trial_key(const DeviceInfo& dev, const std::string& family, const std::string& name,
                      const std::string& shape) {
  int drv = 0;
  cudaDriverGetVersion(&drv);
  return fmt::format("{}|{}|{}|{}|{}", dev.name, drv, family, name, shape);
}

void run_self_test(BackendStatus& st, const std::function<std::string(double&)>& test, const DeviceInfo& dev) {
  double t0 = now_ms(), err = 0;
  std::string r;
  try {
    r = test(err);
  } catch (const std::exception& e) {
    r = no_code_reason(e.what(), dev);
    cudaGetLastError();
  }
  st.self_test_ms = now_ms() - t0;
  st.self_test_passed = r.empty();
  st.self_test = r.empty() ? fmt::format("pass (max err {:.1e})", err) : "FAIL: " + r;
  if (!r.empty() && r.rfind("no code for", 0) == 0) {
    st.runnable = false;
    st.reason = r;
  }
}

}  // namespace

ModelShapes model_shapes(const ModelConfig& c, int max_tokens) {
  ModelShapes s;
  s.hidden = int(c.hidden_size);
  s.qkv_out = int((c.num_heads + 2 * c.num_kv_heads) * c.head_dim);
  s.attn_width = int(c.num_heads * c.head_dim);
  s.vocab = int(c.vocab_size);
  s.head_dim = int(c.head_dim);
  s.moe = c.is_moe();
  s.max_tokens = std::min(max_tokens, 512);
  if (s.moe)
    s.moe_shape = MoeShape{int(c.num_experts), int(c.hidden_size), int(c.moe_intermediate_size),
                           int(c.num_experts_per_tok), WeightFormat::BF16, max_tokens};
  return s;
}

namespace {
// A fast path of the greedy sampler (sampling family): its architecture and code checks, the hidden size it needs,
// its self-test where it is on (or for the report), its report; chosen where on, runnable and passed. `code`: "" or
// why the binary has no code for the device; `unsupported`: "" or why the model's hidden size is not handled.
bool add_greedy_fast_path(const BackendSpec& spec, const std::string& code, const std::string& unsupported,
                          const char* env, bool on_by_default, const char* when,
                          const std::function<std::string(double&)>& self_test, int hidden, const DeviceInfo& dev,
                          const BackendRequest& req, std::vector<BackendReport>& reports) {
  BackendReport r;
  r.spec = spec;
  r.status.reason = check_arch_claim(r.spec, dev);
  if (r.status.reason.empty()) r.status.reason = code;
  if (r.status.reason.empty() && !unsupported.empty())
    r.status.reason = fmt::format("hidden size {} {}", hidden, unsupported);
  r.status.runnable = r.status.reason.empty();
  r.status.code = r.status.runnable ? fmt::format("{} in binary", sm_name(90, true)) : "absent";
  const bool enabled = env_flag(env, on_by_default);
  if (r.status.runnable && (enabled || req.report_only))  // a server with it off skips the start-up work
    run_self_test(r.status, self_test, dev);
  else
    r.status.self_test = r.status.runnable ? "not run (off)" : "not run";
  bool chosen = false;
  if (!req.report_only) {
    chosen = enabled && r.status.runnable && r.status.self_test_passed;
    r.status.chosen = chosen;
    r.status.why_chosen = chosen              ? std::string(when)
                          : !enabled          ? (on_by_default ? fmt::format("off ({}=0)", env) : fmt::format("off ({}=1 turns it on)", env))
                          : !r.status.runnable ? "cannot run here: " + r.status.reason
                                               : "self-test failed: the lm_head GEMM + gpu_sampler instead";
    if (enabled && r.status.runnable && !r.status.self_test_passed)
      log_warn("{} failed its self-test ({}); its steps use the lm_head GEMM + gpu_sampler", spec.name,
               r.status.self_test);
  }
  reports.push_back(r);
  return chosen;
}
}  // namespace

SelectedBackends select_backends(const DeviceInfo& dev, const ModelShapes& shapes, const BackendRequest& req) {
  SelectedBackends out;
  TrialCache cache;
  const bool trials = req.timed_trials && !req.report_only;

  // Attention: the tensor-core kernels for the common head sizes, the plain kernel for any other (listed
  // second: auto takes it only where the first cannot run).
  {
    std::vector<BackendReport> reps;
    for (bool reference : {false, true}) {
      BackendReport r;
      r.spec = reference ? BackendSpec{"reference_paged", OpFamily::Attention, {}, {"bf16"}, false, true,
                                       "one warp per query row; any head_dim <= 256"}
                         : BackendSpec{"flash_paged", OpFamily::Attention, {}, {"bf16"}, false, true,
                                       "tensor-core flash prefill, split-KV decode; head_dim 64/128/256"};
      r.status.reason = check_arch_claim(r.spec, dev);
      if (r.status.reason.empty() && !reference && shapes.head_dim != 64 && shapes.head_dim != 128 &&
          shapes.head_dim != 256)
        r.status.reason = fmt::format("head_dim {} not supported (64, 128 or 256)", shapes.head_dim);
      r.status.runnable = r.status.reason.empty();
      r.status.code = fmt::format("{} in binary", sm_name(90, true));
      const int D = reference ? (shapes.head_dim <= 256 ? shapes.head_dim : 24) : shapes.head_dim;
      if (r.status.runnable)
        run_self_test(r.status, [&](double& err) { return attention_self_test(reference, D, err); }, dev);
      else r.status.self_test = "not run";
      reps.push_back(r);
    }
    if (!req.report_only) out.attention = reps[choose_backend(reps, req.attention, "--attention-backend")].spec.name;
    for (auto& r : reps) out.reports.push_back(r);
  }
  // Sampling.
  {
    BackendReport r;
    r.spec = {"gpu_sampler", OpFamily::Sampling, {}, {"f32"}, false, true,
              "penalties, greedy / top-k / top-p / min-p on the GPU; only ids go back"};
    r.status.reason = check_arch_claim(r.spec, dev);
    r.status.runnable = r.status.reason.empty();
    r.status.code = fmt::format("{} in binary", sm_name(90, true));
    if (r.status.runnable) run_self_test(r.status, sampling_self_test, dev);
    else r.status.self_test = "not run";
    std::vector<BackendReport> one{r};
    if (!req.report_only) choose_backend(one, "auto", "sampling");
    out.reports.push_back(one[0]);
  }
  // The greedy sampler's fast paths, each used only where it passed its self-test and its switch is on; else the
  // lm_head GEMM + the sampler above. 32-64 rows: the lm_head with the argmax in its epilogue (MOESERVE_LMHEAD_ARGMAX=0
  // off). 1-64 rows without logprobs: an int8 screen of the lm_head, then the BF16 logits of the rows it cannot rule
  // out (session 45: faster at every size it takes; MOESERVE_LMHEAD_SCREEN=0 off). It writes no logprob: a greedy
  // step of 1-64 rows that wants one takes the greedy path without it (the executor's kGreedyLogprob graphs).
  out.lmhead_argmax = add_greedy_fast_path(
      {"lmhead_argmax", OpFamily::Sampling, {90}, {"bf16"}, false, true,
       "greedy steps of 32-64 rows: the lm_head GEMM with the argmax and logprob in its epilogue"},
      lmhead_argmax_code(dev),
      lmhead_argmax_supported(64, shapes.hidden, shapes.vocab) ? ""
                                                                : "not supported (a multiple of 8, at least 64)",
      "MOESERVE_LMHEAD_ARGMAX", true, "greedy steps of 32-64 rows",
      [&](double& err) { return lmhead_argmax_self_test(shapes.hidden, err); }, shapes.hidden, dev, req, out.reports);
  out.lmhead_screen = add_greedy_fast_path(
      {"lmhead_screen", OpFamily::Sampling, {90}, {"bf16"}, false, true,
       "greedy steps of 1-64 rows without logprobs: an int8 screen of the lm_head, the BF16 logits of the rows it "
       "cannot rule out"},
      lmhead_screen_code(dev),
      lmhead_screen_supported(8, shapes.hidden, shapes.vocab) ? "" : "not supported (a multiple of 128 up to 8,192)",
      "MOESERVE_LMHEAD_SCREEN", true, "greedy steps of 1-64 rows without logprobs",
      [&](double& err) { return lmhead_screen_self_test(shapes.hidden, err); }, shapes.hidden, dev, req, out.reports);
  out.lmhead_screen_topk = add_greedy_fast_path(
      {"lmhead_screen_topk", OpFamily::Sampling, {90}, {"bf16"}, false, true,
       "sampled steps of 1-64 rows with top_k <= 64 (or greedy) and no logprobs or penalties: the lm_head screen keeps "
       "the rows that may be in a row's top k, their BF16 logits, the sampler's draw over them"},
      lmhead_screen_code(dev),
      lmhead_screen_topk_supported(5, shapes.hidden, shapes.vocab) ? "" : "not supported (a multiple of 128 up to 8,192)",
      "MOESERVE_LMHEAD_SCREEN_TOPK", true, "sampled steps of 1-64 rows with top_k <= 64, no logprobs or penalties",
      [&](double& err) { return lmhead_screen_topk_self_test(shapes.hidden, err); }, shapes.hidden, dev, req,
      out.reports);
  // Dense GEMM.
  {
    out.gemms = make_gemm_backends();
    std::vector<BackendReport> reps;
    for (auto& b : out.gemms) {
      BackendReport r;
      r.spec = b->spec();
      r.status.reason = check_arch_claim(r.spec, dev);
      if (r.status.reason.empty()) {
        try {
          r.status.reason = b->prepare(dev, r.status.code);
        } catch (const std::exception& e) {
          r.status.reason = no_code_reason(e.what(), dev);
        }
      }
      r.status.runnable = r.status.reason.empty();
      if (r.status.runnable) run_self_test(r.status, [&](double& err) { return gemm_self_test(*b, err); }, dev);
      else r.status.self_test = "not run";
      if (trials && r.status.runnable && r.status.self_test_passed) {
        // Decode shapes (where the backends differ; prefill-sized M is cuBLASLt's in both gemv and cublaslt),
        // timed as a decode step runs them: a CUDA graph chaining each layer's GEMMs (q/k/v, o_proj, router) on
        // copies of the weights larger than L2 (every layer's weights arrive cold from HBM), with a small
        // programmatic-dependent kernel between them as the norms / RoPE / attention are in the model. That
        // neighbour counts: a GEMM kernel that takes part in programmatic launch overlaps its start with it, one
        // that does not adds a launch gap on both sides. Timing the GEMMs alone picked cuBLASLt where gemv is
        // faster in the model (served step at batch 1: 832 against 786 us; q30b decode 236 against 259 tok/s).
        const int E = shapes.moe ? shapes.moe_shape.num_experts : 0;
        const std::string shape = fmt::format("M1,2,4,8,64|H{}|QKV{}|A{}|E{}|layer-chain", shapes.hidden,
                                              shapes.qkv_out, shapes.attn_width, E);
        // (The backend's code description in the key: another kernel set, e.g. MOESERVE_GEMM_SKINNY, is another trial.)
        const std::string key = trial_key(dev, "gemm", r.spec.name + "|" + r.status.code, shape);
        if (!cache.get(key, r.status.trial_us)) {
          const int H = shapes.hidden, QKV = shapes.qkv_out, A = shapes.attn_width, T = shapes.max_tokens;
          const size_t qkv_w = size_t(QKV) * H, o_w = size_t(H) * A, router_w = size_t(E) * H;
          const size_t layer_bytes = (qkv_w + o_w + router_w) * 2;
          const size_t layers = std::clamp<size_t>((size_t(160) << 20) / std::max<size_t>(layer_bytes, 1) + 1, 2, 64);
          Scratch w(layer_bytes * layers), x(size_t(T) * H * 2), xa(size_t(T) * A * 2), y(size_t(T) * QKV * 2),
              yo(size_t(T) * H * 2), logits(size_t(T) * std::max(E, 1) * 4), rows(size_t(T) * 4);
          MS_CUDA_CHECK(cudaMemset(w.p, 0x3c, layer_bytes * layers));
          MS_CUDA_CHECK(cudaMemset(x.p, 0x3c, size_t(T) * H * 2));
          MS_CUDA_CHECK(cudaMemset(rows.p, 0, size_t(T) * 4));  // the stand-in copies row 0 into every row
          double us = 0;
          for (int M : {1, 2, 4, 8, 64})
            us += graph_chain_us(
                [&](size_t l, cudaStream_t st) {
                  const bf16* wl = reinterpret_cast<const bf16*>(static_cast<const char*>(w.p) + l * layer_bytes);
                  b->run(x.as<bf16>(), H, M, H, wl, QKV, y.p, QKV, OutType::BF16, st);
                  gather_rows(y.as<bf16>(), QKV, rows.as<int32_t>(), M, A, xa.as<bf16>(), st);
                  b->run(xa.as<bf16>(), A, M, A, wl + qkv_w, H, yo.p, H, OutType::BF16, st);
                  gather_rows(yo.as<bf16>(), H, rows.as<int32_t>(), M, H, x.as<bf16>(), st);
                  if (E > 0) b->run(x.as<bf16>(), H, M, H, wl + qkv_w + o_w, E, logits.p, E, OutType::F32, st);
                },
                layers);
          r.status.trial_us = us;
          cache.put(key, us);
        }
      }
      reps.push_back(r);
    }
    if (!req.report_only) out.gemm = out.gemms[choose_backend(reps, req.gemm, "--gemm-backend")].get();
    for (auto& r : reps) out.reports.push_back(r);
  }
  // MoE.
  {
    out.moes = make_moe_backends();
    std::vector<BackendReport> reps;
    MoeShape ms = shapes.moe_shape;
    for (auto& b : out.moes) {
      BackendReport r;
      r.spec = b->spec();
      r.status.reason = check_arch_claim(r.spec, dev);
      if (r.status.reason.empty()) {
        try {
          r.status.reason = b->prepare(dev, ms, r.status.code);
        } catch (const std::exception& e) {
          r.status.reason = no_code_reason(e.what(), dev);
        }
      }
      if (r.status.code.empty()) r.status.code = r.spec.jit ? "JIT not compiled" : "absent";
      r.status.runnable = r.status.reason.empty();
      if (r.status.runnable) run_self_test(r.status, [&](double& err) { return moe_self_test(*b, ms, err); }, dev);
      else r.status.self_test = "not run";
      if (trials && shapes.moe && r.status.runnable && r.status.self_test_passed) {
        const std::string shape = fmt::format("E{}|H{}|I{}|k{}|T1,64,{}", ms.num_experts, ms.hidden, ms.inter,
                                              ms.top_k, ms.max_tokens);
        const std::string key = trial_key(dev, "moe", r.spec.name, shape);
        if (!cache.get(key, r.status.trial_us)) {
          const size_t E = size_t(ms.num_experts), H = size_t(ms.hidden), I = size_t(ms.inter);
          Scratch gu(E * 2 * I * H * 2), dn(E * H * I * 2), x(size_t(ms.max_tokens) * H * 2),
              o(size_t(ms.max_tokens) * H * 2), ids(size_t(ms.max_tokens) * ms.top_k * 4),
              wts(size_t(ms.max_tokens) * ms.top_k * 4), ws(b->workspace_bytes(ms));
          MS_CUDA_CHECK(cudaMemset(gu.p, 0x3c, E * 2 * I * H * 2));
          MS_CUDA_CHECK(cudaMemset(dn.p, 0x3c, E * H * I * 2));
          MS_CUDA_CHECK(cudaMemset(x.p, 0x3c, size_t(ms.max_tokens) * H * 2));
          // Spread routing: token t uses experts (t * k + j) mod E, as balanced as real routers aim for.
          std::vector<int32_t> hid(size_t(ms.max_tokens) * ms.top_k);
          std::vector<float> hw(hid.size(), 1.0f / float(ms.top_k));
          std::mt19937 g(3);
          for (size_t i = 0; i < hid.size(); ++i) hid[i] = int32_t(g() % E);
          for (int t = 0; t < ms.max_tokens; ++t)  // distinct experts within a token
            for (int j = 0; j < ms.top_k; ++j) hid[size_t(t) * ms.top_k + j] = int32_t((size_t(t) * 37 + j * (E / ms.top_k)) % E);
          MS_CUDA_CHECK(cudaMemcpy(ids.p, hid.data(), hid.size() * 4, cudaMemcpyHostToDevice));
          MS_CUDA_CHECK(cudaMemcpy(wts.p, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
          MoeWeights mw;
          mw.gate_up = gu.p;
          mw.down = dn.p;
          double us = 0;
          for (int T : {1, std::min(64, ms.max_tokens), ms.max_tokens})
            us += time_us([&] { b->run(x.as<bf16>(), T, ids.as<int32_t>(), wts.as<float>(), mw, o.as<bf16>(), ws.p, nullptr); }, 5);
          r.status.trial_us = us;
          cache.put(key, us);
        }
      }
      reps.push_back(r);
    }
    if (!req.report_only && shapes.moe) {
      size_t i = choose_backend(reps, req.moe, "--moe-runner-backend");
      out.moe = out.moes[i].get();
      if (!reps[i].spec.capturable) {
        out.capturable = false;
        log_warn("MoE backend {} cannot be captured in a CUDA graph (host sync per call): decode runs without graphs",
                 reps[i].spec.name);
      }
    }
    for (auto& r : reps) out.reports.push_back(r);
  }
  for (auto& r : out.reports)
    if (r.status.chosen)
      log_info("backend {} {}: {} [{}; self-test {}]", op_family_name(r.spec.family), r.spec.name, r.status.why_chosen,
               r.status.code, r.status.self_test);
  return out;
}

std::string format_backend_table(const std::vector<BackendReport>& reports) {
  std::string s = fmt::format("{:<20} {:<10} {:<12} {:<14} {:<36} {:<34} {:>9} {:>10}  {}\n", "backend", "family",
                              "archs", "formats", "code for this GPU", "self-test", "test ms", "trial us", "chosen");
  for (auto& r : reports) {
    std::string archs, formats;
    for (int a : r.spec.archs) archs += (archs.empty() ? "" : ",") + sm_name(a);
    if (archs.empty()) archs = "sm_80+";
    for (auto& f : r.spec.formats) formats += (formats.empty() ? "" : ",") + f;
    std::string code = r.status.runnable ? r.status.code : "NOT RUNNABLE: " + r.status.reason;
    s += fmt::format("{:<20} {:<10} {:<12} {:<14} {:<36} {:<34} {:>9.1f} {:>10}  {}\n", r.spec.name,
                     op_family_name(r.spec.family), archs, formats, code, r.status.self_test, r.status.self_test_ms,
                     r.status.trial_us > 0 ? fmt::format("{:.1f}", r.status.trial_us) : "-",
                     r.status.chosen ? r.status.why_chosen : "");
  }
  return s;
}

}  // namespace moeserve::cuda

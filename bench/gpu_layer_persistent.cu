// A decode step of one token through q30b-shaped MoE layers as ONE persistent kernel: the prototype that decides
// whether a persistent decode layer is worth building into the engine (docs/PERF.md, session 31).
//
// Why: the served step at one request spends ~48 us of chain a layer against ~25 us of weight reads (the layer's
// six-odd launches each pay a ramp, a drain and a dependency latency while HBM idles), and gpu_chain's persistent
// form (session 22) gained only 8% because (1) each CTA streamed through a cp.async ring, ~26 GB/s a CTA, below the
// HBM rate at one CTA an SM, and (2) its one FIFO ring stalled at every dependency. Here:
//   - one CTA an SM (cooperative launch), 8 consumer warps and a producer warp whose lanes issue 1-D bulk copies
//     (cp.async.bulk, L2 evict_first) of 8 KB slots, one lane a ring slot (a single issuing thread managed only one
//     copy every ~0.35 us);
//   - two rings: D for what is known before the step (q/k/v and o_proj rows, the cached keys and values), E for the
//     experts' rows, known only once the layer has routed. The producer fills E first whenever it may and D
//     otherwise, so HBM keeps streaming the next layer's dense rows while the consumers wait at a dependency;
//   - the dependencies are counters in global memory (one a layer and stage; a CTA spins on an acquire load).
// The layer, every CTA c of G (>= 128) taking its share of each stage's rows:
//   qkv     x = bf16(rmsnorm(h)); qkv = Wqkv x  (5120 x 2048)
//   attn    CTAs 0-127: kv head c / 32, keys [16 p, 16 p + 16) for p = c % 32, its 8 query heads: partial softmax
//   merge   CTAs 0-127: 32 output dims of query head c / 4 from the 32 partials (a second grid dependency; the engine
//           merges inside a thread-block cluster instead, so this stage is the prototype's extra cost)
//   o       o = Wo attn (2176 x 4096: rows 2048.. stand for the router, whose logits the engine folds into its GEMVs)
//   gu      every CTA routes (top-8 of the 128 logits, softmax over them) and tells the producer, which then streams
//           the 8 experts' gate/up rows (8 x 1536 x 2048 of 128 experts); x2 = bf16(rmsnorm(h + o))
//   down    act = bf16(silu(g) u); h' = h + o + sum_j w_j Wd_j act_j (8 experts' 2048 x 768)
// Not modelled: q/k norm and RoPE, the KV store of the new token, the lm_head and the sampler.
// --no-deps: no stage waits for the one before (wrong outputs, no check): the producer / consumer pipeline's own
// streaming rate; --no-hint: the weight copies without the L2 evict_first policy; --interleave: slot t of an op
// (its rows [t R, t R + R)) to CTA t % G, so that the CTAs stream one moving window of each matrix instead of G
// ranges far apart; --no-compute: the consumers wait for each slot and release it without its products (the copy
// side's own rate); --producer-sleep NS: a producer lane that cannot issue backs off NS ns instead of spinning.
//   gpu_layer_persistent [--layers 8] [--reps 20] [--d-slots 8] [--e-slots 16] [--no-check] [--no-deps] [--no-hint] [--interleave] [--no-compute] [--producer-sleep NS]
// --v2 [--stages 4|8|12] [--per-sm 1|2] [--core] [--early-route] (session 67): the same layer and check with the served
// kernels' streaming instead (see v2 below): every warp its own cp.async ring of S 2 KB slices, whole-K row blocks of
// 16 rows, tensor-core products (--core: CUDA-core), 1 or 2 CTAs an SM (2: S 4 only fits); --early-route: a block
// routes once the router rows are complete, so the experts' rows stream while o_proj completes; --no-hint: the weight
// copies without the L2 evict_first policy (the served streams' default, v2's too); --graph: each run a CUDA graph
// replay (a memset node zeroing the counters, the kernel as a captured cooperative launch), as an engine would run it;
// --no-compute: each slice waited for and released without its products (the loads' own rate in the layer; no check).
// Prints the step time, us a layer, TB/s over the bytes read, x the read floor (4.6 TB/s), each stage's work (start
// to done) over the CTAs, CTA 0's expert copies of layer 1 (issue, landing), and checks every stage of every layer
// against the CPU (from the GPU's own inputs to the stage). A benchmark, not a test: the figures go to docs/PERF.md.
// Session 31 on the H200: correct, 65.9-74.0 us a layer against the served launch chain's ~48.5 (a CTA's bulk
// copies arrive at ~27 GB/s, the CUDA-core products cost 2-5 us a stage, and the attention / routing phases leave
// HBM idle): the design as it stands does not pay; docs/PERF.md says what a next form would need.
// Session 68 on an H100: v2 correct on 8 and 48 layers, 76-81 us a layer against the served chain's 57 on the same
// machine, 73.5 with no products at all (the rings fill and stop at every dependency point): the persistent decode
// layer is not built into the engine (docs/PERF.md, session 68). Kept as the record and for re-measurement.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/common.h"
#include "cuda/device.h"
#include "gpu_layer_persistent_v1.cuh"
#include "gpu_layer_persistent_v2.cuh"
#include "gpu_timer.h"

namespace mc = moeserve::cuda;

namespace {


float bf2f(uint16_t b) { return moeserve::bf16_to_f32(b); }
float bf16_round(float x) { return moeserve::bf16_to_f32(moeserve::f32_to_bf16(x)); }  // as __float2bfloat16_rn

template <typename T>
std::vector<T> down_load(const T* src, size_t n) {
  std::vector<T> v(n);
  MS_CUDA_CHECK(cudaMemcpy(v.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// y[n] = W[n] . x for W rows of K bf16 (device) and x on the host; mag[n] = sum |W x| (the tolerance's scale).
void cpu_gemv(const bf16* w_dev, int N, int K, const std::vector<float>& x, std::vector<double>& y,
              std::vector<double>& mag) {
  const auto w = down_load(reinterpret_cast<const uint16_t*>(w_dev), size_t(N) * K);
  y.assign(size_t(N), 0.0);
  mag.assign(size_t(N), 0.0);
  for (int n = 0; n < N; ++n) {
    double s = 0, m = 0;
    for (int k = 0; k < K; ++k) {
      const double t = double(bf2f(w[size_t(n) * K + k])) * x[size_t(k)];
      s += t;
      m += std::fabs(t);
    }
    y[size_t(n)] = s, mag[size_t(n)] = m;
  }
}

struct Checker {
  int bad = 0, total = 0;
  void near(const char* what, int layer, int i, double got, double want, double scale) {
    ++total;
    if (std::isfinite(got) && std::fabs(got - want) <= 1e-2 * scale + 1e-4) return;
    if (bad < 10) std::printf("  layer %d %s[%d]: %.6g, CPU %.6g\n", layer, what, i, got, want);
    ++bad;
  }
};

std::vector<float> cpu_norm(const std::vector<float>& a, const float* b) {
  double ss = 0;
  std::vector<float> v(static_cast<size_t>(kH));
  for (int k = 0; k < kH; ++k) v[size_t(k)] = a[size_t(k)] + (b ? b[k] : 0.f), ss += double(v[size_t(k)]) * v[size_t(k)];
  const float r = float(1.0 / std::sqrt(ss / kH + 1e-6));
  for (auto& x : v) x = bf16_round(x * r);
  return v;
}

}  // namespace

static const char* const kUsage =
    "usage: gpu_layer_persistent [--layers 8] [--reps 20] [--d-slots 8] [--e-slots 16] [--no-check] [--no-deps] "
    "[--no-hint] [--interleave] [--no-compute] [--producer-sleep NS] | [--v2 [--stages 4|8|12] [--per-sm 1|2] [--core] "
    "[--early-route] [--graph]]";

static int run(int argc, char** argv) {
  int layers = 8, reps = 20, d_slots = 8, e_slots = 16;
  bool check = true;
  int no_deps = 0, hint = 1, interleave = 0, no_compute = 0, producer_sleep = 0;
  bool use_v2 = false, v2_core = false, early_route = false, use_graph = false;
  int v2_stages = 8, v2_per_sm = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--layers" && i + 1 < argc) layers = std::atoi(argv[++i]);
    else if (s == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (s == "--d-slots" && i + 1 < argc) d_slots = std::atoi(argv[++i]);
    else if (s == "--e-slots" && i + 1 < argc) e_slots = std::atoi(argv[++i]);
    else if (s == "--no-check") check = false;
    else if (s == "--no-deps") no_deps = 1;
    else if (s == "--no-hint") hint = 0;
    else if (s == "--interleave") interleave = 1;
    else if (s == "--no-compute") no_compute = 1;
    else if (s == "--producer-sleep" && i + 1 < argc) producer_sleep = std::atoi(argv[++i]);
    else if (s == "--v2") use_v2 = true;
    else if (s == "--stages" && i + 1 < argc) v2_stages = std::atoi(argv[++i]);
    else if (s == "--per-sm" && i + 1 < argc) v2_per_sm = std::atoi(argv[++i]);
    else if (s == "--core") v2_core = true;
    else if (s == "--early-route") early_route = true;
    else if (s == "--graph") use_graph = true;
    else {
      std::fprintf(stderr, "%s\n", kUsage);
      return 2;
    }
  }
  if (layers < 1 || layers > kMaxLayers || reps < 1 || d_slots < kConsumerWarps || d_slots > kMaxRing ||
      d_slots % kConsumerWarps || e_slots < kConsumerWarps || e_slots > kMaxRing || e_slots % kConsumerWarps ||
      d_slots + e_slots > 32) {
    std::fprintf(stderr, "--layers 1..%d, --reps >= 1, --d-slots / --e-slots multiples of 8 up to %d, 32 together\n", kMaxLayers,
                 kMaxRing);
    return 2;
  }
  if ((early_route || use_graph) && !use_v2) {
    std::fprintf(stderr, "--early-route and --graph are v2's\n");
    return 2;
  }
  if (use_v2 && ((v2_stages != 4 && v2_stages != 8 && v2_stages != 12) || v2_per_sm < 1 || v2_per_sm > 2 || no_deps ||
                 interleave || producer_sleep)) {
    std::fprintf(stderr, "--v2 takes --stages 4, 8 or 12 and --per-sm 1 or 2 (--no-deps, --interleave and "
                         "--producer-sleep are v1's)\n");
    return 2;
  }
  int dev = 0, sms = 0;
  MS_CUDA_CHECK(cudaGetDevice(&dev));
  MS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (sms < kAttnCtas || kH / sms + 1 > kOwnRowsMax) {
    std::fprintf(stderr, "needs at least %d SMs (this GPU has %d)\n", kAttnCtas, sms);
    return 2;
  }
  cudaDeviceProp prop{};
  MS_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  cudaStream_t st;
  MS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  const size_t L = size_t(layers);
  const size_t n_qkv = L * kQkv * kH, n_o = L * kORows * kQ, n_gu = L * kExperts * kGu * kH,
               n_d = L * kExperts * kH * kI, n_kv = L * kKvHeads * kCtx * kDim;
  std::vector<void*> bufs;
  auto alloc = [&](size_t bytes) {
    void* q = nullptr;
    MS_CUDA_CHECK(cudaMalloc(&q, bytes));
    bufs.push_back(q);
    return q;
  };
  auto weights = [&](size_t n, int K, unsigned seed) {
    bf16* w = static_cast<bf16*>(alloc(n * 2));
    fill_bf16_kernel<<<2048, 256, 0, st>>>(w, n, K > 0 ? std::sqrt(3.0f / float(K)) : 1.0f, seed);
    return w;
  };
  Params p{};
  p.wqkv = weights(n_qkv, kH, 11);
  p.wo = weights(n_o, kQ, 23);
  p.wgu = weights(n_gu, kH, 37);
  p.wd = weights(n_d, kI, 41);
  p.kc = weights(n_kv, 0, 53);
  p.vc = weights(n_kv, 0, 59);
  p.h = static_cast<float*>(alloc((L + 1) * kH * 4));
  p.qkv = static_cast<float*>(alloc(L * kQkv * 4));
  p.part = static_cast<float*>(alloc(L * kKvHeads * kParts * kGroup * kPartFloats * 4));
  p.attn = static_cast<bf16*>(alloc(L * kQ * 2));
  p.o = static_cast<float*>(alloc(L * kORows * 4));
  p.gu = static_cast<float*>(alloc(L * kTopK * kGu * 4));
  p.ids = static_cast<int*>(alloc(L * kTopK * 4));
  p.wts = static_cast<float*>(alloc(L * kTopK * 4));
  p.cnt = static_cast<unsigned*>(alloc(L * kStages * 4));
  const size_t max_grid = size_t(sms) * std::max(1, v2_per_sm);
  p.clocks = static_cast<unsigned long long*>(alloc(max_grid * L * kStages * 2 * 8));
  MS_CUDA_CHECK(cudaMemsetAsync(p.clocks, 0, max_grid * L * kStages * 2 * 8, st));
  p.item_clocks = static_cast<unsigned long long*>(alloc(2 * kMaxE * 8));
  MS_CUDA_CHECK(cudaMemsetAsync(p.item_clocks, 0, 2 * kMaxE * 8, st));
  MS_CUDA_CHECK(cudaMemsetAsync(p.cnt, 0, L * kStages * 4, st));
  {
    std::vector<float> h0(static_cast<size_t>(kH));
    for (int k = 0; k < kH; ++k) h0[size_t(k)] = std::sin(0.37f * float(k) + 1.0f) * 2.0f;
    MS_CUDA_CHECK(cudaMemcpyAsync(p.h, h0.data(), kH * 4, cudaMemcpyHostToDevice, st));
  }
  MS_CUDA_CHECK(cudaStreamSynchronize(st));
  p.layers = layers, p.d_slots = d_slots, p.e_slots = e_slots, p.no_deps = no_deps, p.hint = hint;
  p.interleave = interleave, p.no_compute = no_compute, p.producer_sleep = std::max(0, producer_sleep);
  p.early_route = early_route ? 1 : 0;
  if (no_compute) check = false;
  if (no_deps) check = false;  // the stages then read inputs not yet written

  static_assert(kGroup * kDim + 2 * kDim <= kXsElems, "the attention's staging lives in xs");
  // The kernel, its block size, grid and shared memory: v1 one CTA an SM with the two slot rings; v2 `v2_per_sm`
  // CTAs an SM with a ring of `v2_stages` 2 KB slices a warp.
  const void* kernel = reinterpret_cast<const void*>(layer_kernel);
  size_t smem = size_t(d_slots + e_slots) * kSlot + kXsElems * 4;
  int threads = kThreads, grid = sms;
  if (use_v2) {
    using KernelFn = void (*)(Params);
    KernelFn k2 = nullptr;
    if (v2_stages == 4) k2 = v2_core ? v2::layer_kernel<4, false> : v2::layer_kernel<4, true>;
    else if (v2_stages == 8) k2 = v2_core ? v2::layer_kernel<8, false> : v2::layer_kernel<8, true>;
    else k2 = v2_core ? v2::layer_kernel<12, false> : v2::layer_kernel<12, true>;
    kernel = reinterpret_cast<const void*>(k2);
    smem = v2::smem_bytes(v2_stages);
    threads = kConsumers;
    grid = sms * v2_per_sm;
  }
  MS_CHECK(mc::raise_dynamic_smem(kernel, smem), "{} bytes of shared memory a CTA do not fit", smem);
  int per_sm = 0;
  MS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  MS_CHECK(per_sm >= grid / sms, "{} CTAs an SM do not fit with {} bytes of shared memory each ({} do)", grid / sms,
           smem, per_sm);
  auto once = [&] {
    ++p.epoch;
    void* args[] = {&p};
    MS_CUDA_CHECK(cudaLaunchCooperativeKernel(kernel, dim3(unsigned(grid)), dim3(unsigned(threads)), args, smem, st));
  };
  // --graph (v2): the step as a served step would run it - a CUDA graph of a memset node that zeroes the counters and
  // the kernel as a cooperative kernel node (cudaLaunchKernelEx with the cooperative attribute, captured), epoch 1.
  cudaGraphExec_t graph_exec = nullptr;
  if (use_graph) {
    p.epoch = 1;
    cudaGraph_t g = nullptr;
    MS_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    MS_CUDA_CHECK(cudaMemsetAsync(p.cnt, 0, L * kStages * 4, st));
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(grid));
    cfg.blockDim = dim3(unsigned(threads));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    void* args[] = {&p};
    const cudaError_t launched = cudaLaunchKernelExC(&cfg, kernel, args);
    const cudaError_t ended = cudaStreamEndCapture(st, &g);
    MS_CUDA_CHECK(launched);
    MS_CUDA_CHECK(ended);
    MS_CUDA_CHECK(cudaGraphInstantiate(&graph_exec, g, 0));
    MS_CUDA_CHECK(cudaGraphDestroy(g));
  }
  auto replay = [&] { MS_CUDA_CHECK(cudaGraphLaunch(graph_exec, st)); };
  // Bytes a step reads: q/k/v, o (+ router stand-in), the 8 experts' gate/up and down rows, the keys and values.
  const double bytes =
      double(layers) * 2.0 * (double(kQkv) * kH + double(kORows) * kQ + kTopK * (double(kGu) * kH + double(kH) * kI) +
                              2.0 * kKvHeads * kCtx * kDim);
  const double floor_s = bytes / (kReadTBs * 1e12);
  moeserve::bench::GpuTimer t;
  const double s = use_graph ? t.best(reps, replay, st) : t.best(reps, once, st);
  if (use_v2)
    std::printf("%s, %d SMs: %d layers, v2: %d CTAs an SM, %d-stage rings of 2 KB a warp, %s products, %s route%s "
                "(%zu bytes of shared memory a CTA)%s\n",
                prop.name, sms, layers, v2_per_sm, v2_stages,
                no_compute ? "no" : v2_core ? "CUDA-core" : "tensor-core", early_route ? "early" : "late",
                hint ? "" : ", no L2 hint", smem, use_graph ? ", graph replays" : "");
  else
    std::printf("%s, %d SMs: %d layers, D ring %d x 8 KB, E ring %d x 8 KB (%zu bytes of shared memory)%s%s%s%s\n",
                prop.name, sms, layers, d_slots, e_slots, smem, no_deps ? ", no dependencies" : "",
                hint ? "" : ", no L2 hint", interleave ? ", interleaved slots" : "", no_compute ? ", no products" : "");
  if (producer_sleep > 0) std::printf("producer lanes back off %d ns when they cannot issue\n", producer_sleep);
  std::printf("step %.1f us, %.2f us a layer, %.1f MB read: %.3f TB/s, %.2f x the floor (%.1f us at %.1f TB/s)\n",
              s * 1e6, s * 1e6 / layers, bytes * 1e-6, bytes / s * 1e-12, s / floor_s, floor_s * 1e6, kReadTBs);
  {  // every CTA's stage starts and work-done times of the last run, layers 1.. (layer 0 starts cold)
    const auto ck = down_load(p.clocks, size_t(grid) * L * kStages * 2);
    auto at = [&](int cta, int l, int st2, int k) { return ck[((size_t(cta) * L + size_t(l)) * kStages + size_t(st2)) * 2 + size_t(k)]; };
    const char* names[kStages] = {"qkv", "attn", "merge", "router", "o", use_v2 ? "gu" : "route+gu", "down"};
    std::printf("us a layer (mean over layers%s): stage, work (%s -> done) mean / max over CTAs, then from the last "
                "CTA's done to the mean start of the next stage, and the span (the stage's last done after the stage "
                "before's)\n", layers > 1 ? " 1.." : "", use_v2 ? "input staged" : "start");
    auto last_done_of = [&](int l, int st2) {
      unsigned long long d = 0;
      for (int cta = 0; cta < grid; ++cta) d = std::max(d, at(cta, l, st2, 1));
      return d;
    };
    for (int st2 = 0; st2 < kStages; ++st2) {
      double work = 0, wmax = 0, gap = 0, span = 0;
      int n = 0, nl = 0, ns = 0;
      for (int l = layers > 1 ? 1 : 0; l < layers; ++l) {
        const unsigned long long last_done = last_done_of(l, st2);
        double next = 0;
        int nn = 0;
        unsigned long long before = 0;  // the last done of the latest stage before with clocks (v1 has no router)
        for (int b = st2 - 1; b >= -1 && before == 0; --b)
          before = b >= 0 ? last_done_of(l, b) : last_done_of(l - 1, kStages - 1);
        if (before != 0 && last_done > before) span += double(last_done - before) * 1e-3, ++ns;
        for (int cta = 0; cta < grid; ++cta) {
          const unsigned long long a = at(cta, l, st2, 0), d = at(cta, l, st2, 1);
          if (a == 0 || d < a) continue;  // a stage this CTA has no part in
          work += double(d - a) * 1e-3, wmax = std::max(wmax, double(d - a) * 1e-3), ++n;
        }
        const int nst = st2 + 1 < kStages ? st2 + 1 : 0, nlay = st2 + 1 < kStages ? l : l + 1;
        if (nlay >= layers) continue;
        for (int cta = 0; cta < grid; ++cta)
          if (const unsigned long long a = at(cta, nlay, nst, 0); a != 0) next += double(a), ++nn;
        if (nn) gap += (next / nn - double(last_done)) * 1e-3, ++nl;
      }
      std::printf("  %-9s work %6.2f / %6.2f   to the next stage %6.2f   span %6.2f\n", names[st2], n ? work / n : 0.0,
                  wmax, nl ? gap / nl : 0.0, ns ? span / ns : 0.0);
    }
  }
  if (!use_v2) {  // CTA 0's expert items of layer 1: issue and landing times from the first issue (us)
    const auto ic = down_load(p.item_clocks, size_t(2 * kMaxE));
    const unsigned long long t0 = ic[0];
    std::printf("CTA 0, layer %d's expert items, us from the first issue: issued / landed (latency)\n ",
                std::min(1, layers - 1));
    for (int i = 0; i < kMaxE && ic[size_t(i)] != 0; ++i)
      std::printf(" %d:%.2f/%.2f(%.2f)", i, double(ic[size_t(i)] - t0) * 1e-3, double(ic[size_t(kMaxE + i)] - t0) * 1e-3,
                  double(ic[size_t(kMaxE + i)] - ic[size_t(i)]) * 1e-3);
    std::printf("\n");
  }
  int failures = 0;
  if (check) {
    Checker ck;
    const auto h_all = down_load(p.h, (L + 1) * kH);
    const auto qkv_all = down_load(p.qkv, L * kQkv);
    const auto attn_all = down_load(reinterpret_cast<const uint16_t*>(p.attn), L * kQ);
    const auto o_all = down_load(p.o, L * kORows);
    const auto gu_all = down_load(p.gu, L * kTopK * kGu);
    const auto ids = down_load(p.ids, L * kTopK);
    const auto wts = down_load(p.wts, L * kTopK);
    std::vector<double> y, mag;
    for (int l = 0; l < layers; ++l) {
      const std::vector<float> h(h_all.begin() + l * kH, h_all.begin() + (l + 1) * kH);
      const float* qkv = qkv_all.data() + size_t(l) * kQkv;
      const float* o = o_all.data() + size_t(l) * kORows;
      // qkv
      cpu_gemv(p.wqkv + size_t(l) * kQkv * kH, kQkv, kH, cpu_norm(h, nullptr), y, mag);
      for (int n = 0; n < kQkv; ++n) ck.near("qkv", l, n, qkv[n], y[size_t(n)], mag[size_t(n)]);
      // attention, from the GPU's q/k/v
      const auto kc = down_load(reinterpret_cast<const uint16_t*>(p.kc) + size_t(l) * kKvHeads * kCtx * kDim,
                                size_t(kKvHeads) * kCtx * kDim);
      const auto vc = down_load(reinterpret_cast<const uint16_t*>(p.vc) + size_t(l) * kKvHeads * kCtx * kDim,
                                size_t(kKvHeads) * kCtx * kDim);
      for (int qh = 0; qh < kHeads; ++qh) {
        const int hk = qh / kGroup;
        std::vector<double> sc(static_cast<size_t>(kCtx));
        double mx = -1e300;
        for (int t2 = 0; t2 < kCtx; ++t2) {
          double s2 = 0;
          for (int d = 0; d < kDim; ++d) {
            const double kd = t2 == kCtx - 1 ? qkv[kQ + hk * kDim + d]
                                             : bf2f(kc[(size_t(hk) * kCtx + t2) * kDim + d]);
            s2 += double(qkv[qh * kDim + d]) * kd;
          }
          sc[size_t(t2)] = s2 / std::sqrt(double(kDim));
          mx = std::max(mx, sc[size_t(t2)]);
        }
        double sum = 0;
        for (auto& v : sc) v = std::exp(v - mx), sum += v;
        for (int d = 0; d < kDim; ++d) {
          double a = 0, m = 0;
          for (int t2 = 0; t2 < kCtx; ++t2) {
            const double vd = t2 == kCtx - 1 ? qkv[kQ + kKvHeads * kDim + hk * kDim + d]
                                             : bf2f(vc[(size_t(hk) * kCtx + t2) * kDim + d]);
            a += sc[size_t(t2)] * vd, m += sc[size_t(t2)] * std::fabs(vd);
          }
          ck.near("attn", l, qh * kDim + d, bf2f(attn_all[size_t(l) * kQ + size_t(qh) * kDim + size_t(d)]), a / sum,
                  m / sum);
        }
      }
      // o, from the GPU's attention output
      std::vector<float> a(static_cast<size_t>(kQ));
      for (int k = 0; k < kQ; ++k) a[size_t(k)] = bf2f(attn_all[size_t(l) * kQ + size_t(k)]);
      cpu_gemv(p.wo + size_t(l) * kORows * kQ, kORows, kQ, a, y, mag);
      for (int n = 0; n < kORows; ++n) ck.near("o", l, n, o[n], y[size_t(n)], mag[size_t(n)]);
      // routing, from the GPU's logits
      std::vector<int> order(kExperts);
      for (int e = 0; e < kExperts; ++e) order[size_t(e)] = e;
      std::stable_sort(order.begin(), order.end(), [&](int x, int z) { return o[kH + x] > o[kH + z]; });
      double den = 0;
      for (int k = 0; k < kTopK; ++k) den += std::exp(double(o[kH + order[size_t(k)]]) - o[kH + order[0]]);
      for (int k = 0; k < kTopK; ++k) {
        ck.near("expert id", l, k, ids[size_t(l) * kTopK + size_t(k)], order[size_t(k)], 0.0);
        ck.near("expert weight", l, k, wts[size_t(l) * kTopK + size_t(k)],
                std::exp(double(o[kH + order[size_t(k)]]) - o[kH + order[0]]) / den, 0.0);
      }
      // gate/up of the GPU's experts, from h + o
      const auto x2 = cpu_norm(h, o);
      const float* gu = gu_all.data() + size_t(l) * kTopK * kGu;
      std::vector<double> down_sum(size_t(kH), 0.0), down_mag(size_t(kH), 0.0);
      for (int j = 0; j < kTopK; ++j) {
        const int e = ids[size_t(l) * kTopK + size_t(j)];
        cpu_gemv(p.wgu + (size_t(l) * kExperts + size_t(e)) * kGu * kH, kGu, kH, x2, y, mag);
        for (int n = 0; n < kGu; ++n) ck.near("gate/up", l, j * kGu + n, gu[j * kGu + n], y[size_t(n)], mag[size_t(n)]);
        std::vector<float> act(static_cast<size_t>(kI));
        for (int k = 0; k < kI; ++k) {
          const float g = gu[j * kGu + k], u = gu[j * kGu + kI + k];
          act[size_t(k)] = bf16_round(g / (1.f + std::exp(-g)) * u);
        }
        cpu_gemv(p.wd + (size_t(l) * kExperts + size_t(e)) * kH * kI, kH, kI, act, y, mag);
        const double wj = wts[size_t(l) * kTopK + size_t(j)];
        for (int n = 0; n < kH; ++n) down_sum[size_t(n)] += wj * y[size_t(n)], down_mag[size_t(n)] += wj * mag[size_t(n)];
      }
      for (int n = 0; n < kH; ++n)
        ck.near("h", l + 1, n, h_all[size_t(l + 1) * kH + size_t(n)], double(h[size_t(n)]) + o[n] + down_sum[size_t(n)],
                std::fabs(h[size_t(n)]) + std::fabs(o[n]) + down_mag[size_t(n)]);
    }
    std::printf("check against the CPU: %d of %d values out of tolerance\n", ck.bad, ck.total);
    failures += ck.bad > 0;
  }
  if (graph_exec != nullptr) cudaGraphExecDestroy(graph_exec);
  for (void* q : bufs) cudaFree(q);
  cudaStreamDestroy(st);
  if (failures) std::printf("FAILED\n");
  return failures ? 1 : 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_layer_persistent: %s\n", e.what());
    return 1;
  }
}

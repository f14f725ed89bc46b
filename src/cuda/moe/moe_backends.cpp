// The MoE backend list and the self-test every backend passes before it may serve.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/threadpool.h"
#include "cuda/moe/moe_internal.h"
#include "kernels/activation/activation.h"
#include "kernels/gemm/linear.h"
#include "kernels/moe/moe.h"

namespace moeserve::cuda {

void MoeBackend::run_combine_norm(const bf16*, int T, const int32_t*, const float*, const MoeWeights&, bf16*, float*,
                                  const bf16*, float, bf16*, void*, cudaStream_t) {
  MS_CHECK(false, "moe backend {} has no norm epilogue for {} tokens (check combine_norm_supported first)",
           spec().name, T);
}

void MoeBackend::run_residual(const bf16*, int T, const int32_t*, const float*, const MoeWeights&, bf16*, float*,
                              float*, void*, cudaStream_t) {
  MS_CHECK(false, "moe backend {} has no residual epilogue for {} tokens (check residual_parts first)", spec().name, T);
}

std::vector<std::unique_ptr<MoeBackend>> make_moe_backends() {
  std::vector<std::unique_ptr<MoeBackend>> v;
  v.push_back(make_cublas_ref_backend());
  v.push_back(make_fused_sm90_backend());
  v.push_back(make_jit_backend());
  v.push_back(make_fused_sm100_build_backend());
  return v;
}

void moe_cpu_reference(const uint16_t* x, int T, int H, int I, const uint16_t* gate_up, const uint16_t* down,
                       const int32_t* ids, const float* weights, int k, float* out, ThreadPool& pool) {
  auto view = [](const uint16_t* p, int64_t rows, int64_t cols) {
    kernels::LinearWeight w;
    w.weight.dtype = DType::BF16;
    w.weight.shape = {rows, cols};
    w.weight.data = const_cast<uint16_t*>(p);
    return w;
  };
  int E = 0;
  for (int i = 0; i < T * k; ++i) E = std::max(E, ids[i] + 1);
  // Pairs grouped by expert, so each expert's rows are one linear call (as kernels::moe_forward does).
  std::vector<std::vector<int>> by_expert(E);
  for (int i = 0; i < T * k; ++i)
    if (ids[i] >= 0) by_expert[ids[i]].push_back(i);
  std::vector<float> contrib(size_t(T) * k * H, 0.0f);  // [pair, H]: weight * expert(x)
  for (int e = 0; e < E; ++e) {
    const auto& pairs = by_expert[e];
    if (pairs.empty()) continue;
    const int n = int(pairs.size());
    std::vector<float> xs(size_t(n) * H), g(size_t(n) * I), u(size_t(n) * I), d(size_t(n) * H);
    for (int r = 0; r < n; ++r)
      for (int h = 0; h < H; ++h) xs[size_t(r) * H + h] = bf16_to_f32(x[size_t(pairs[r] / k) * H + h]);
    const uint16_t* wgu = gate_up + size_t(e) * 2 * I * H;
    const auto wg = view(wgu, I, H), wu = view(wgu + size_t(I) * H, I, H), wd = view(down + size_t(e) * H * I, H, I);
    kernels::linear(xs.data(), n, H, wg, g.data(), I, pool);
    kernels::linear(xs.data(), n, H, wu, u.data(), I, pool);
    kernels::silu_mul(g.data(), u.data(), g.data(), int64_t(n) * I);
    kernels::linear(g.data(), n, I, wd, d.data(), H, pool);
    for (int r = 0; r < n; ++r)
      for (int h = 0; h < H; ++h) contrib[size_t(pairs[r]) * H + h] = weights[pairs[r]] * d[size_t(r) * H + h];
  }
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      float s = 0;
      for (int j = 0; j < k; ++j) s += contrib[(size_t(t) * k + j) * H + h];
      out[size_t(t) * H + h] = s;
    }
}

std::string moe_compare(const uint16_t* got, const float* want, int T, int H, double tol, double& max_err,
                        const std::vector<int>* token_of_row) {
  auto token = [&](size_t row) { return token_of_row ? (*token_of_row)[row] : int(row); };
  double scale = 0;
  for (size_t i = 0; i < size_t(T) * H; ++i) scale = std::max(scale, double(std::fabs(want[i])));
  scale = std::max(scale, 1e-6);
  max_err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < size_t(T) * H; ++i) {
    const float g = bf16_to_f32(got[i]);
    if (std::isnan(g) || std::isinf(g))
      return fmt::format("non-finite output {} at token {}, column {} (want {:.4g})", g, token(i / H), i % H, want[i]);
    const double err = std::fabs(double(g) - want[i]) / scale;
    if (err > max_err) max_err = err, worst = i;
  }
  if (max_err > tol)
    return fmt::format("max error {:.3g} of the output scale {:.3g} (tolerance {:.1g}) at token {}, column {}: "
                       "got {:.5g}, want {:.5g}",
                       max_err, scale, tol, token(worst / H), worst % H, bf16_to_f32(got[worst]), want[worst]);
  return "";
}

namespace {

// Deterministic uniform numbers in [-1, 1) (splitmix64), fast enough for tens of millions of weights.
struct Rng {
  uint64_t s;
  float next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return float(double(z >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  }
};

// Frees on every path out of the self-test, exceptions included.
struct DeviceAllocs {
  std::vector<void*> ptrs;
  ~DeviceAllocs() {
    for (void* p : ptrs) cudaFree(p);
  }
  template <typename T>
  T* alloc(size_t bytes) {
    void* p = nullptr;
    MS_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    ptrs.push_back(p);
    return static_cast<T*>(p);
  }
};

struct StreamGuard {
  cudaStream_t s = nullptr;
  ~StreamGuard() {
    if (s) cudaStreamDestroy(s);
  }
};

std::string self_test_impl(MoeBackend& b, const MoeShape& shape, double& max_err) {
  const int H = shape.hidden, I = shape.inter, k = shape.top_k;
  // A few experts suffice to exercise the grouping; ids stay below `pool_experts`, so only that many experts'
  // weights are random. The device buffers hold all num_experts (zeros past the pool): a backend may read any
  // expert's weights before the routing is known (the batched-decode gate/up GEMM's first slices, static slots).
  const int pool_experts = std::min(shape.num_experts, std::max(6, k + 2));
  // One step in every band of tokens an expert the fused backends pick a tile configuration by
  // (fused_config_for: direct 1-token tiles, <= 5, 6-12, 13-40, 41-256 and above 256 at the model's experts and
  // top_k), so that every configuration this model can run is checked before it serves: the counts are those of
  // 128 experts at top-8 (1, 37, 129, 321, 1,601 and 4,801 tokens: odd, partial token tiles and experts spanning
  // several tiles) scaled to this model's tokens an expert, as many as max_tokens allows. Of each step a sample
  // of tokens is checked against the CPU reference (every token's output depends on its own rows only) and all
  // for finiteness.
  std::vector<int> token_counts;
  const double scale = double(shape.num_experts) / std::max(1, k) / 16.0;
  for (int T0 : {1, 37, 129, 321, 1601, 4801}) {
    const int T = T0 == 1 ? 1 : int(std::lround(T0 * scale)) | 1;
    token_counts.push_back(std::max(1, std::min(T, shape.max_tokens)));
  }
  std::sort(token_counts.begin(), token_counts.end());
  token_counts.erase(std::unique(token_counts.begin(), token_counts.end()), token_counts.end());
  const int max_t = token_counts.back();
  constexpr int kCheckedTokens = 48;

  Rng rng{0x6d6f6573656c66ull};
  auto fill = [&](std::vector<uint16_t>& v, float scale) {
    for (auto& e : v) e = f32_to_bf16(scale * rng.next());
  };
  std::vector<uint16_t> gate_up(size_t(pool_experts) * 2 * I * H), down(size_t(pool_experts) * H * I);
  fill(gate_up, std::sqrt(3.0f / H));  // unit-variance inputs -> unit-scale gate/up and outputs
  fill(down, std::sqrt(3.0f / I));

  // Everything on one stream: a plain cudaMemcpy / cudaMemset would run on the legacy default stream, which a
  // non-blocking stream does not wait for.
  StreamGuard stream;
  MS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream.s, cudaStreamNonBlocking));
  DeviceAllocs dev;
  MoeShape test_shape = shape;
  test_shape.max_tokens = max_t;  // every backend here lays its workspace out by T (moe_internal.h)
  const size_t all_gu = size_t(shape.num_experts) * 2 * I * H, all_dn = size_t(shape.num_experts) * H * I;
  auto* d_gu = dev.alloc<uint16_t>(all_gu * 2);
  auto* d_dn = dev.alloc<uint16_t>(all_dn * 2);
  MS_CUDA_CHECK(cudaMemsetAsync(d_gu, 0, all_gu * 2, stream.s));
  MS_CUDA_CHECK(cudaMemsetAsync(d_dn, 0, all_dn * 2, stream.s));
  auto* d_x = dev.alloc<uint16_t>(size_t(max_t) * H * 2);
  auto* d_out = dev.alloc<uint16_t>(size_t(max_t) * H * 2);
  auto* d_ids = dev.alloc<int32_t>(size_t(max_t) * k * 4);
  auto* d_w = dev.alloc<float>(size_t(max_t) * k * 4);
  void* d_ws = dev.alloc<char>(b.workspace_bytes(test_shape));
  MS_CUDA_CHECK(cudaMemcpyAsync(d_gu, gate_up.data(), gate_up.size() * 2, cudaMemcpyHostToDevice, stream.s));
  MS_CUDA_CHECK(cudaMemcpyAsync(d_dn, down.data(), down.size() * 2, cudaMemcpyHostToDevice, stream.s));
  MoeWeights w;
  w.format = WeightFormat::BF16;
  w.gate_up = d_gu;
  w.down = d_dn;

  ThreadPool pool;
  max_err = 0;
  for (int T : token_counts) {
    std::vector<uint16_t> x(size_t(T) * H), got(size_t(T) * H);
    fill(x, 1.7f);
    std::vector<float> logits(size_t(T) * pool_experts), wts(size_t(T) * k);
    for (auto& l : logits) l = 3.0f * rng.next();
    std::vector<int32_t> ids(size_t(T) * k);
    kernels::route_topk(logits.data(), T, pool_experts, k, true, ids.data(), wts.data());
    MS_CUDA_CHECK(cudaMemcpyAsync(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice, stream.s));
    MS_CUDA_CHECK(cudaMemcpyAsync(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice, stream.s));
    MS_CUDA_CHECK(cudaMemcpyAsync(d_w, wts.data(), wts.size() * 4, cudaMemcpyHostToDevice, stream.s));
    MS_CUDA_CHECK(cudaMemsetAsync(d_out, 0xff, size_t(T) * H * 2, stream.s));  // NaN wherever nothing is written
    b.run(reinterpret_cast<const bf16*>(d_x), T, d_ids, d_w, w, reinterpret_cast<bf16*>(d_out), d_ws, stream.s);
    MS_CUDA_CHECK(cudaMemcpyAsync(got.data(), d_out, got.size() * 2, cudaMemcpyDeviceToHost, stream.s));
    MS_CUDA_CHECK(cudaStreamSynchronize(stream.s));  // also keeps x / ids / wts alive until their copies are done
    for (size_t i = 0; i < got.size(); ++i) {
      const float g = bf16_to_f32(got[i]);
      if (!std::isfinite(g))
        return fmt::format("T={}: non-finite output {} at token {}, column {}", T, g, i / H, i % H);
    }
    std::vector<int> tokens;  // evenly spaced, first and last included
    const int checked = std::min(T, kCheckedTokens);
    for (int j = 0; j < checked; ++j) tokens.push_back(checked == 1 ? 0 : int(int64_t(j) * (T - 1) / (checked - 1)));
    std::vector<uint16_t> xs, gs;
    std::vector<int32_t> is;
    std::vector<float> ws;
    for (int t : tokens) {
      xs.insert(xs.end(), x.begin() + size_t(t) * H, x.begin() + size_t(t + 1) * H);
      gs.insert(gs.end(), got.begin() + size_t(t) * H, got.begin() + size_t(t + 1) * H);
      is.insert(is.end(), ids.begin() + size_t(t) * k, ids.begin() + size_t(t + 1) * k);
      ws.insert(ws.end(), wts.begin() + size_t(t) * k, wts.begin() + size_t(t + 1) * k);
    }
    std::vector<float> want(size_t(checked) * H);
    moe_cpu_reference(xs.data(), checked, H, I, gate_up.data(), down.data(), is.data(), ws.data(), k, want.data(),
                      pool);
    double err = 0;
    std::string r = moe_compare(gs.data(), want.data(), checked, H, kMoeSelfTestTolerance, err, &tokens);
    max_err = std::max(max_err, err);
    if (!r.empty()) return fmt::format("T={} ({} experts, top_k {}): {}", T, pool_experts, k, r);
  }
  MS_CUDA_CHECK(cudaGetLastError());
  return "";
}

}  // namespace

std::string moe_self_test(MoeBackend& b, const MoeShape& shape, double& max_err) {
  max_err = 0;
  try {
    return self_test_impl(b, shape, max_err);
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace moeserve::cuda

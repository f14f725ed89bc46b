// Helpers of the MoE GPU tests (test_cuda_moe.cpp and moe_routing_tests.cpp, one binary): device buffers, random
// bf16 weights and steps routed as Qwen3 routes, the CPU reference, one checked step on a backend.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "cuda/device.h"
#include "cuda/moe/moe.h"
#include "cuda/moe/moe_internal.h"
#include "kernels/moe/moe.h"

namespace moeserve::cuda::moe_test {

inline DeviceInfo device() { return list_devices().at(0); }
inline bool is_hopper() { return sm_version(device()) == 90; }

// Device memory freed at scope exit.
template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { MS_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count * sizeof(T), 16))); }
  DevBuf(const DevBuf&) = delete;
  ~DevBuf() { cudaFree(p); }
  void upload(const std::vector<T>& v) {
    ASSERT_LE(v.size(), n);
    MS_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download(size_t count) const {
    std::vector<T> v(count);
    MS_CUDA_CHECK(cudaMemcpy(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

// A blocking stream: it orders with the legacy default stream that cudaMemcpy / cudaMemset use here, so uploads
// and poisoning finish before the backend's kernels start.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { MS_CUDA_CHECK(cudaStreamCreate(&s)); }
  ~Stream() { cudaStreamDestroy(s); }
};

inline std::vector<uint16_t> random_bf16(size_t n, float scale, uint64_t seed) {
  std::vector<uint16_t> v(n);
  uint64_t s = seed;
  for (auto& e : v) {  // splitmix64: fast for the ~600 M weights of the 128-expert case
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    e = f32_to_bf16(scale * float(double(z >> 11) * 0x1.0p-53 * 2.0 - 1.0));
  }
  return v;
}

struct Case {
  int E, k, H, I;
};
inline std::string case_name(const Case& c) { return fmt::format("E{}_k{}_H{}_I{}", c.E, c.k, c.H, c.I); }

// One model layer's expert weights, on the host (for the reference) and on the device.
struct Layer {
  Case c;
  std::vector<uint16_t> gate_up, down;
  DevBuf<uint16_t> d_gate_up, d_down;
  explicit Layer(const Case& cs, uint64_t seed)
      : c(cs),
        gate_up(random_bf16(size_t(cs.E) * 2 * cs.I * cs.H, std::sqrt(3.0f / cs.H), seed)),
        down(random_bf16(size_t(cs.E) * cs.H * cs.I, std::sqrt(3.0f / cs.I), seed + 1)),
        d_gate_up(gate_up.size()),
        d_down(down.size()) {
    d_gate_up.upload(gate_up);
    d_down.upload(down);
  }
  MoeShape shape(int max_tokens) const {
    MoeShape s;
    s.num_experts = c.E, s.hidden = c.H, s.inter = c.I, s.top_k = c.k, s.max_tokens = max_tokens;
    return s;
  }
  MoeWeights weights() const {
    MoeWeights w;
    w.gate_up = d_gate_up.p;
    w.down = d_down.p;
    return w;
  }
};

// A step's inputs: activations and a routing from random logits (renormalised top-k, as Qwen3 does).
struct Step {
  int T;
  std::vector<uint16_t> x;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};
inline Step make_step(const Case& c, int T, uint64_t seed) {
  Step s{T, random_bf16(size_t(T) * c.H, 1.7f, seed), std::vector<int32_t>(size_t(T) * c.k),
         std::vector<float>(size_t(T) * c.k)};
  std::mt19937 g{uint32_t(seed)};
  std::normal_distribution<float> n(0, 2);
  std::vector<float> logits(size_t(T) * c.E);
  for (auto& l : logits) l = n(g);
  kernels::route_topk(logits.data(), T, c.E, c.k, true, s.ids.data(), s.weights.data());
  return s;
}

inline std::vector<float> reference(const Layer& L, const Step& s) {
  static ThreadPool pool;
  std::vector<float> out(size_t(s.T) * L.c.H);
  moe_cpu_reference(s.x.data(), s.T, L.c.H, L.c.I, L.gate_up.data(), L.down.data(), s.ids.data(), s.weights.data(),
                    L.c.k, out.data(), pool);
  return out;
}

// Device buffers for up to max_t tokens of one layer.
struct StepBuffers {
  DevBuf<uint16_t> x, out;
  DevBuf<int32_t> ids;
  DevBuf<float> w;
  StepBuffers(const Case& c, int max_t)
      : x(size_t(max_t) * c.H), out(size_t(max_t) * c.H), ids(size_t(max_t) * c.k), w(size_t(max_t) * c.k) {}
  void upload(const Step& s) {
    x.upload(s.x);
    ids.upload(s.ids);
    w.upload(s.weights);
    MS_CUDA_CHECK(cudaMemset(out.p, 0xff, out.n * sizeof(uint16_t)));  // NaN wherever nothing is written
  }
};

// Runs one step on `b` (poisoned output) and compares with `want` (the CPU reference). "" on pass.
inline std::string check_step(MoeBackend& b, const Layer& L, const Step& s, const std::vector<float>& want,
                              StepBuffers& buf, void* ws, cudaStream_t st) {
  buf.upload(s);
  b.run(reinterpret_cast<const bf16*>(buf.x.p), s.T, buf.ids.p, buf.w.p, L.weights(),
        reinterpret_cast<bf16*>(buf.out.p), ws, st);
  MS_CUDA_CHECK(cudaStreamSynchronize(st));
  MS_CUDA_CHECK(cudaGetLastError());
  auto got = buf.out.download(size_t(s.T) * L.c.H);
  double err = 0;
  std::string r = moe_compare(got.data(), want.data(), s.T, L.c.H, kMoeSelfTestTolerance, err);
  return r.empty() ? r : fmt::format("{} {} T={}: {}", b.spec().name, case_name(L.c), s.T, r);
}

// Backends expected to run on this device (the sm_100a-only build is not, on Hopper).
inline bool must_run_here(const MoeBackend& b) {
  if (b.spec().name == "fused_sm100_build") return sm_version(device()) == 100;
  if (b.spec().name == "fused_sm90") return sm_version(device()) == 90;
  return true;  // cublas_ref, jit: any sm_80+
}

// Prepares b for shape: true when it can run (code: what prepare() says of the code it loaded, if asked); otherwise
// expects that b need not run on this device and says why.
inline bool prepared_here(MoeBackend& b, const MoeShape& shape, std::string* code = nullptr) {
  std::string loaded;
  const std::string r = b.prepare(device(), shape, code ? *code : loaded);
  if (r.empty()) return true;
  EXPECT_FALSE(must_run_here(b)) << b.spec().name << ": " << r;
  return false;
}

}  // namespace moeserve::cuda::moe_test

// The router inside the MoE's own launches (MoeBackend::run_routed: dense mode, GemmParams::dense_tokens): the
// routing it writes against the CPU's top-k of the CPU's logits (near-ties allowed to differ), the output against
// the CPU reference of that routing, bitwise repeats, and CUDA graph replays with fresh activations. Skipped
// cleanly on machines without a GPU; the host-side choice of T is tested everywhere.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/threadpool.h"
#include "cuda/moe/moe.h"
#include "cuda/moe/moe_internal.h"
#include "cuda_test_util.h"
#include "kernels/moe/moe.h"

using namespace moeserve;
using namespace moeserve::cuda;
using moeserve::cuda_test::Dev;
using moeserve::cuda_test::Stream;

namespace {

std::vector<uint16_t> random_bf16(size_t n, float scale, std::mt19937& g) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = f32_to_bf16(u(g));
  return v;
}

struct Case {
  int E, k, H, I;
};

// One layer's experts and router on the host and the device.
struct Layer {
  Case c;
  std::vector<uint16_t> gate_up, down, router;
  Dev<uint16_t> d_gate_up, d_down, d_router;
  Layer(const Case& cs, std::mt19937& g)
      : c(cs),
        gate_up(random_bf16(size_t(cs.E) * 2 * cs.I * cs.H, std::sqrt(3.0f / cs.H), g)),
        down(random_bf16(size_t(cs.E) * cs.H * cs.I, std::sqrt(3.0f / cs.I), g)),
        // logits of about unit-2 spread for inputs of +-1.7
        router(random_bf16(size_t(cs.E) * cs.H, std::sqrt(12.0f / cs.H), g)),
        d_gate_up(gate_up),
        d_down(down),
        d_router(router) {}
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

std::string check_routing(const Layer& L, const std::vector<uint16_t>& x, int T, const std::vector<int32_t>& ids,
                          const std::vector<float>& wts) {
  return moe_check_routing(x.data(), T, L.c.H, L.router.data(), L.c.E, L.c.k, true, ids.data(), wts.data());
}

// The output against the CPU reference of the routing the GPU chose. "" or the first difference.
std::string check_output(const Layer& L, const std::vector<uint16_t>& x, int T, const std::vector<int32_t>& ids,
                         const std::vector<float>& wts, const std::vector<uint16_t>& got) {
  static ThreadPool pool;
  std::vector<float> want(size_t(T) * L.c.H);
  moe_cpu_reference(x.data(), T, L.c.H, L.c.I, L.gate_up.data(), L.down.data(), ids.data(), wts.data(), L.c.k,
                    want.data(), pool);
  double err = 0;
  return moe_compare(got.data(), want.data(), T, L.c.H, kMoeSelfTestTolerance, err);
}

bool dense_switched_off() {
  const char* v = std::getenv("MOESERVE_MOE_DENSE_MAX");
  return v != nullptr && std::string(v) == "0";
}

}  // namespace

// Which T take dense mode: a wgmma table, at most 128 experts, 48-64 tokens by default. Host only.
TEST(CudaMoeDense, TokenCountsThatRouteInside) {
  if (dense_switched_off()) GTEST_SKIP() << "MOESERVE_MOE_DENSE_MAX=0";
  MoeShape s;
  s.num_experts = 128, s.top_k = 8, s.hidden = 2048, s.inter = 768, s.max_tokens = 256;
  for (int T : {1, 8, 47, 65, 128}) EXPECT_FALSE(fused_dense_for(s, T, true)) << "T=" << T;
  for (int T : {48, 57, 64}) {
    EXPECT_TRUE(fused_dense_for(s, T, true)) << "T=" << T;
    EXPECT_FALSE(fused_dense_for(s, T, false)) << "T=" << T << " without wgmma";
    // act holds every expert's tile of all T tokens, and the workspace still only grows with T
    EXPECT_GE(fused_layout(s, T).y - fused_layout(s, T).act, size_t(s.num_experts) * T * s.inter * 2);
    EXPECT_LE(fused_layout(s, T).total, fused_layout(s, T + 1).total);
  }
  s.num_experts = 129;
  EXPECT_FALSE(fused_dense_for(s, 64, true)) << "more experts than the router unit's 128 rows";
}

TEST(CudaMoeDense, RouterInsideMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 g(20261203);
  int dense_runs = 0;
  for (const Case c : {Case{128, 8, 512, 256}, Case{60, 4, 320, 192}}) {
    Layer L(c, g);
    const MoeShape shape = L.shape(64);
    for (auto& b : make_moe_backends()) {
      std::string code;
      if (!b->prepare(list_devices().at(0), shape, code).empty()) continue;
      if (!b->routes_inside(64)) {
        EXPECT_TRUE(b->spec().name == "cublas_ref" || sm_version(list_devices().at(0)) != 90 || dense_switched_off())
            << b->spec().name << " should route inside at 64 tokens on Hopper";
        continue;
      }
      Dev<char> ws(b->workspace_bytes(shape));
      Dev<uint16_t> d_x(size_t(64) * c.H), d_out(size_t(64) * c.H);
      Dev<int32_t> d_ids(size_t(64) * c.k);
      Dev<float> d_w(size_t(64) * c.k);
      Stream st;
      const std::string where = fmt::format("{} E{} k{} H{} I{}", b->spec().name, c.E, c.k, c.H, c.I);
      auto run = [&](int T) {
        b->run_routed(reinterpret_cast<const bf16*>(d_x.p), T, reinterpret_cast<const bf16*>(L.d_router.p), true,
                      d_ids.p, d_w.p, L.weights(), reinterpret_cast<bf16*>(d_out.p), ws.p, st.s);
      };
      for (int T : {48, 57, 64}) {
        const auto x = random_bf16(size_t(T) * c.H, 1.7f, g);
        d_x.upload(x);
        d_out.poison(), d_ids.poison(), d_w.poison();
        run(T);
        MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
        MS_CUDA_CHECK(cudaGetLastError());
        auto ids = d_ids.download();
        auto out = d_out.download();
        auto wts = d_w.download();
        ids.resize(size_t(T) * c.k), wts.resize(size_t(T) * c.k), out.resize(size_t(T) * c.H);
        EXPECT_EQ(check_routing(L, x, T, ids, wts), "") << where << " T=" << T;
        EXPECT_EQ(check_output(L, x, T, ids, wts, out), "") << where << " T=" << T;
        ++dense_runs;
        d_out.poison();
        run(T);
        MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
        auto again = d_out.download();
        again.resize(out.size());
        EXPECT_TRUE(again == out) << where << " T=" << T << ": not bitwise repeatable";
      }
      // Captured once, replayed with fresh activations (the routing is the graph's own work).
      if (!b->spec().capturable) continue;
      const int T = 64;
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      MS_CUDA_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
      run(T);
      MS_CUDA_CHECK(cudaStreamEndCapture(st.s, &graph));
      MS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      for (int replay = 0; replay < 2; ++replay) {
        const auto x = random_bf16(size_t(T) * c.H, 1.7f, g);
        d_x.upload(x);
        d_out.poison(), d_ids.poison(), d_w.poison();
        MS_CUDA_CHECK(cudaGraphLaunch(exec, st.s));
        MS_CUDA_CHECK(cudaStreamSynchronize(st.s));
        const auto ids = d_ids.download();
        const auto out = d_out.download();
        const auto wts = d_w.download();
        EXPECT_EQ(check_routing(L, x, T, ids, wts), "") << where << " graph replay " << replay;
        EXPECT_EQ(check_output(L, x, T, ids, wts, out), "") << where << " graph replay " << replay;
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
  }
  if (sm_version(list_devices().at(0)) == 90 && !dense_switched_off()) {
    EXPECT_GT(dense_runs, 0);
  }
}

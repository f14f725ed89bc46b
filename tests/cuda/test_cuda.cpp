// GPU kernels against the CPU reference; skipped cleanly on machines without a GPU (CI). The backend registry's
// choice rules (Registry.*) need no GPU and run everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/device.h"
#include "cuda/registry.h"
#include "kernels/norm/rmsnorm.h"

using namespace moeserve;

namespace {
bool have_gpu() { return !cuda::list_devices().empty(); }
}  // namespace

TEST(Cuda, DevicesAndCompiledArchitectures) {
  auto devs = cuda::list_devices();
  if (devs.empty()) GTEST_SKIP() << "no CUDA device";
  for (auto& d : devs) {
    EXPECT_GT(d.multiprocessors, 0);
    EXPECT_GT(d.total_memory, 0u);
  }
  auto archs = cuda::compiled_architectures();
  if (devs[0].sm_major == 9) {
    ASSERT_EQ(archs.size(), 1u);
    EXPECT_EQ(archs[0], 90);
  }
}

TEST(Cuda, RmsNormMatchesCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 g(1);
  std::normal_distribution<float> n(0, 2);
  for (int dim : {1, 33, 128, 2049}) {
    const int rows = 5;
    std::vector<float> x(rows * dim), w(dim), out(rows * dim), want(rows * dim);
    for (auto& v : x) v = n(g);
    for (auto& v : w) v = n(g);
    cuda::rmsnorm_f32(x.data(), w.data(), 1e-6f, rows, dim, out.data());
    kernels::rmsnorm(x.data(), w.data(), 1e-6f, rows, dim, want.data());
    for (int i = 0; i < rows * dim; ++i) {
      ASSERT_FALSE(std::isnan(out[i])) << i;
      ASSERT_NEAR(out[i], want[i], 1e-4f * (1 + std::fabs(want[i]))) << "dim " << dim << " i " << i;
    }
  }
}

// Programmatic dependent launch as the decode kernels use it: the dependent's wait must wait (always), eagerly
// and in a captured graph; whether its blocks started during the predecessor (the overlap the launches are
// for) is reported, not asserted: the scheduler decides.
TEST(Cuda, ProgrammaticDependentWaitsForItsPredecessor) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const cuda::PdlProbe p = cuda::pdl_overlap_probe(50.0);
  EXPECT_GE(p.eager_b_after_wait_us, 0.0) << "eager: the dependent passed its wait before the predecessor ended";
  EXPECT_GE(p.graph_b_after_wait_us, 0.0) << "graph: the dependent passed its wait before the predecessor ended";
  std::printf("[ info ] PDL probe (A spins 50 us; B times relative to A's end): eager entry %.1f us, after wait "
              "%.1f us; graph entry %.1f us, after wait %.1f us (entry < 0: B ran during A)\n",
              p.eager_b_entry_us, p.eager_b_after_wait_us, p.graph_b_entry_us, p.graph_b_after_wait_us);
}

// choose_backend (no GPU needed): the rules of `auto` and of an explicit choice, on made-up reports.
namespace {
moeserve::cuda::BackendReport report(const char* name, bool runnable, bool passed, double trial_us) {
  moeserve::cuda::BackendReport r;
  r.spec.name = name;
  r.status.runnable = runnable;
  r.status.reason = runnable ? "" : "no code for sm_90 in this binary";
  r.status.self_test_passed = passed;
  r.status.self_test = passed ? "pass" : "FAIL: max err 1.0e+00";
  r.status.trial_us = trial_us;
  return r;
}
}  // namespace

TEST(Registry, AutoPicksTheFastestThatPassedAndSaysWhy) {
  using moeserve::cuda::choose_backend;
  // A faster backend that failed its self-test or cannot run here is never chosen.
  std::vector<moeserve::cuda::BackendReport> r{report("ref", true, true, 6300),
                                               report("fast_but_wrong", true, false, 100),
                                               report("absent", false, false, 0), report("aot", true, true, 662.1),
                                               report("jit", true, true, 600.0)};
  EXPECT_EQ(choose_backend(r, "auto", "--moe-runner-backend"), 4u);
  EXPECT_TRUE(r[4].status.chosen);
  EXPECT_FALSE(r[3].status.chosen || r[1].status.chosen);
  const std::string& why = r[4].status.why_chosen;
  EXPECT_NE(why.find("fastest in the timed trial (600.0 us"), std::string::npos) << why;
  EXPECT_NE(why.find("aot 662.1 us"), std::string::npos) << why;
}

TEST(Registry, AutoBreaksTiesByListOrderAndWithoutTrialsTakesTheFirstThatPassed) {
  using moeserve::cuda::choose_backend;
  // Equal trials: the earlier in list (preference) order; 1% faster: the faster one.
  std::vector<moeserve::cuda::BackendReport> r{report("ref", true, true, 6300), report("aot", true, true, 662.1),
                                               report("jit", true, true, 662.1)};
  EXPECT_EQ(choose_backend(r, "auto", "--moe-runner-backend"), 1u);
  std::vector<moeserve::cuda::BackendReport> f{report("aot", true, true, 662.1), report("jit", true, true, 655.8)};
  EXPECT_EQ(choose_backend(f, "auto", "--moe-runner-backend"), 1u);
  // Without trials: the first that passed.
  std::vector<moeserve::cuda::BackendReport> u{report("bad", true, false, 0), report("a", true, true, 0),
                                               report("b", true, true, 0)};
  EXPECT_EQ(choose_backend(u, "auto", "sampling"), 1u);
  EXPECT_EQ(u[1].status.why_chosen, "auto: the first backend that passed its self-test");
}

TEST(Registry, ExplicitChoicesAreRefusedWithTheReasonAndTheAlternatives) {
  using moeserve::cuda::choose_backend;
  std::vector<moeserve::cuda::BackendReport> r{report("aot", true, true, 662.1), report("sm100", false, false, 0),
                                               report("wrong", true, false, 500.0)};
  auto message = [&](const std::string& name) {
    try {
      choose_backend(r, name, "--moe-runner-backend");
    } catch (const moeserve::UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string absent = message("sm100");
  EXPECT_NE(absent.find("--moe-runner-backend sm100: cannot run here: no code for sm_90"), std::string::npos)
      << absent;
  EXPECT_NE(absent.find("Backends that can: aot"), std::string::npos) << absent;
  const std::string wrong = message("wrong");
  EXPECT_NE(wrong.find("self-test against the reference failed"), std::string::npos) << wrong;
  const std::string unknown = message("nope");
  EXPECT_NE(unknown.find("unknown backend; valid choices: auto, aot, sm100, wrong"), std::string::npos) << unknown;
  EXPECT_EQ(choose_backend(r, "aot", "--moe-runner-backend"), 0u);
  EXPECT_EQ(r[0].status.why_chosen, "requested");
  std::vector<moeserve::cuda::BackendReport> none{report("sm100", false, false, 0)};
  EXPECT_THROW(choose_backend(none, "auto", "--moe-runner-backend"), moeserve::UserError);
}

// GPU kernels against the CPU reference; skipped cleanly on machines without a GPU (CI).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "cuda/device.h"
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

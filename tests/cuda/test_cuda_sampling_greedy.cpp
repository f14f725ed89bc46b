// The all-greedy fast sampler against the CPU: argmax (lowest id on ties) and its raw logprob, on vocabularies
// whose rows start unaligned, with ties and -inf entries, in its cluster form and (with a workspace, up to 128 rows)
// its grid form, twice in a row (the grid form's counters must be left at zero). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>

#include "cuda/device.h"
#include "cuda/sampling/greedy.h"
#include "kernels/sampling/sampling.h"

using namespace moeserve;

TEST(CudaGreedySampler, MatchesCpuArgmaxAndLogprob) {
  if (cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  // The grid form up to 128 rows is the default (MOESERVE_GREEDY_GRID=2, read once at the first call); the binary
  // keeps a setting from outside (scripts/gpu-check.sh runs it with =1 and =0 too) and sets 2 otherwise.
  setenv("MOESERVE_GREEDY_GRID", "2", 0);
  std::mt19937 g(17);
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, cuda::greedy_workspace_bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(ws, 0, cuda::greedy_workspace_bytes()), cudaSuccess);
  for (bool with_ws : {false, true}) {
    for (int V : {1, 3, 7, 1000, 50257, 151936}) {
      // Clusters of 8, 8, 8, 8, 4, 4, 2 and 1 blocks a row on 132 SMs; with the workspace rows up to 64 take the
      // grid form (64, 64, 64, 51, 6 and 4 blocks a row; vocabularies of at least 4 per block), 130 and 300 the
      // cluster form.
      for (int rows : {1, 2, 4, 5, 40, 64, 130, 300}) {
        std::normal_distribution<float> d(0, 4);
        std::vector<float> lg(size_t(rows) * V);
        for (auto& x : lg) x = std::round(d(g) * 8) / 8;  // coarse grid: ties are common
        for (int r = 0; r < rows; ++r) {
          if (V > 10) lg[size_t(r) * V + size_t(g() % V)] = -INFINITY;
          if (r % 3 == 0 && V > 20) {  // an exact tie for the maximum, the lower id must win
            const size_t a = size_t(r) * V + 5, b = size_t(r) * V + size_t(V) - 2;
            lg[a] = lg[b] = 1000.0f;
          }
        }
        float *dl = nullptr, *dlp = nullptr;
        int32_t* dids = nullptr;
        ASSERT_EQ(cudaMalloc(&dl, lg.size() * 4), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&dlp, size_t(rows) * 4), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&dids, size_t(rows) * 4), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(dl, lg.data(), lg.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
        for (int call = 0; call < 2; ++call) {  // the grid form's counters must be back at zero
          ASSERT_EQ(cudaMemset(dlp, 0xff, size_t(rows) * 4), cudaSuccess);
          ASSERT_EQ(cudaMemset(dids, 0xff, size_t(rows) * 4), cudaSuccess);
          cuda::sample_greedy(dl, rows, V, dids, dlp, nullptr, with_ws ? ws : nullptr);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          std::vector<int32_t> ids(static_cast<size_t>(rows));
          std::vector<float> lps(static_cast<size_t>(rows)), ref(static_cast<size_t>(V));
          ASSERT_EQ(cudaMemcpy(ids.data(), dids, ids.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(lps.data(), dlp, lps.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
          const std::string where = "V " + std::to_string(V) + " rows " + std::to_string(rows) + " workspace " +
                                    std::to_string(with_ws) + " call " + std::to_string(call);
          for (int r = 0; r < rows; ++r) {
            const float* row = lg.data() + size_t(r) * V;
            const int32_t want = kernels::argmax(row, V);
            ASSERT_EQ(ids[size_t(r)], want) << where << " row " << r;
            kernels::log_softmax(row, V, ref.data());
            ASSERT_TRUE(std::isfinite(lps[size_t(r)])) << where << " row " << r;
            EXPECT_NEAR(lps[size_t(r)], ref[size_t(want)], 1e-4) << where << " row " << r;
          }
        }
        cudaFree(dl);
        cudaFree(dlp);
        cudaFree(dids);
      }
    }
  }
  cudaFree(ws);
}

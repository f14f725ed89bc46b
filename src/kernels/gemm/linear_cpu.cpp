#include <algorithm>

#include "core/error.h"
#include "core/threadpool.h"
#include "kernels/gemm/linear.h"
#include "kernels/simd_cpu.h"

namespace moeserve::kernels {

namespace {
void check_weight(const LinearWeight& w) {
  MS_CHECK(w.weight.dim() == 2, "linear: weight must be 2-D, got {}", shape_str(w.weight.shape));
  MS_CHECK(w.weight.dtype == DType::F32 || w.weight.dtype == DType::BF16 || w.weight.dtype == DType::F16,
           "linear: CPU path has no kernel for weight dtype {}", dtype_name(w.weight.dtype));
  MS_CHECK(!w.scale.defined(), "linear: scaled (quantized) weights are not supported on the CPU yet");
  MS_CHECK(!w.bias.defined() || (w.bias.dtype == DType::F32 && w.bias.numel() == w.out_features()),
           "linear: bias must be f32 [{}]", w.out_features());
}
}  // namespace

// Rows [nb, ne) of one linear.
static void linear_rows(const LinearGroup& g, int64_t nb, int64_t ne) {
  const LinearWeight& w = *g.w;
  const int64_t K = w.in_features();
  const size_t row_bytes = size_t(K) * dtype_size(w.weight.dtype);
  const char* W = static_cast<const char*>(w.weight.data);
  const float* bias = w.bias.defined() ? w.bias.ptr<float>() : nullptr;
  // Token tiles keep a block of activations in L2 while a block of weight rows streams past it once.
  constexpr int64_t kTokenTile = 32;
  for (int64_t t0 = 0; t0 < g.T; t0 += kTokenTile) {
    int64_t t1 = std::min(g.T, t0 + kTokenTile);
    for (int64_t n = nb; n < ne; ++n) {
      const void* row = W + size_t(n) * row_bytes;
      for (int64_t t = t0; t < t1; t += 4) {
        int nt = int(std::min<int64_t>(4, t1 - t));
        const float* xs[4];
        for (int i = 0; i < nt; ++i) xs[i] = g.x + (t + i) * g.x_stride;
        float out[4];
        dot_row(w.weight.dtype, row, K, xs, nt, out);
        for (int i = 0; i < nt; ++i) g.y[(t + i) * g.y_stride + n] = out[i] + (bias ? bias[n] : 0.0f);
      }
    }
  }
}

void linear(const float* x, int64_t T, int64_t x_stride, const LinearWeight& w, float* y, int64_t y_stride,
            ThreadPool& pool) {
  check_weight(w);
  LinearGroup g{x, T, x_stride, &w, y, y_stride};
  pool.parallel_for(w.out_features(), 8, [&](int64_t nb, int64_t ne) { linear_rows(g, nb, ne); });
}

void grouped_linear(const std::vector<LinearGroup>& groups, ThreadPool& pool) {
  struct Block {
    int64_t group, nb, ne;
  };
  std::vector<Block> blocks;
  int64_t total_rows = 0;
  for (auto& g : groups) {
    check_weight(*g.w);
    total_rows += g.w->out_features();
  }
  // About 8 blocks per thread across all groups.
  int64_t rows_per_block = std::max<int64_t>(8, total_rows / (int64_t(pool.num_threads()) * 8));
  for (size_t i = 0; i < groups.size(); ++i) {
    int64_t N = groups[i].w->out_features();
    if (groups[i].T == 0) continue;
    for (int64_t b = 0; b < N; b += rows_per_block) blocks.push_back({int64_t(i), b, std::min(N, b + rows_per_block)});
  }
  pool.parallel_for(int64_t(blocks.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) linear_rows(groups[blocks[i].group], blocks[i].nb, blocks[i].ne);
  });
}

void linear_reference(const float* x, int64_t T, int64_t x_stride, const LinearWeight& w, float* y,
                      int64_t y_stride) {
  check_weight(w);
  Tensor wf = to_f32(w.weight);
  const int64_t N = w.out_features(), K = w.in_features();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += double(wf.ptr<float>()[n * K + k]) * x[t * x_stride + k];
      y[t * y_stride + n] = float(acc) + (w.bias.defined() ? w.bias.ptr<float>()[n] : 0.0f);
    }
}

}  // namespace moeserve::kernels

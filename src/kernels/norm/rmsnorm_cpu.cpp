#include <cmath>

#include "kernels/norm/rmsnorm.h"

namespace moeserve::kernels {

void rmsnorm(const float* x, const float* weight, float eps, int64_t rows, int64_t dim, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    // Accumulate in double: the sum of squares is the one place where f32 order effects would show.
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
    float inv = 1.0f / std::sqrt(float(ss / double(dim)) + eps);
    for (int64_t i = 0; i < dim; ++i) o[i] = weight[i] * (xr[i] * inv);
  }
}

void add_rmsnorm(float* residual, const float* x, const float* weight, float eps, int64_t rows, int64_t dim,
                 float* out) {
  for (int64_t i = 0; i < rows * dim; ++i) residual[i] += x[i];
  rmsnorm(residual, weight, eps, rows, dim, out);
}

}  // namespace moeserve::kernels

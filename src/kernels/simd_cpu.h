// Vectorised inner loops for the CPU kernels: dot products of one weight row (F32 / BF16 / F16) against up to
// four f32 activation vectors. AVX2+FMA code is chosen at run time when the CPU has it; the scalar code is the
// reference and the fallback. Internal to src/kernels.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace moeserve::kernels {

bool cpu_has_avx2();

// out[t] = sum_k w[k] * x[t][k] for t < nt (nt <= 4). w has dtype wt (F32, BF16 or F16).
void dot_row(DType wt, const void* w, int64_t K, const float* const* x, int nt, float* out);

// y[k] += a * x[k] (f32), y[k] = sum over a list: the building blocks of attention's weighted sum.
void axpy_f32(float a, const float* x, float* y, int64_t n);
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace moeserve::kernels

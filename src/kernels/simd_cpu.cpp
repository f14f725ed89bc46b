#include "kernels/simd_cpu.h"

#include <immintrin.h>

#include "core/error.h"

namespace moeserve::kernels {

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return has;
}

namespace {

inline float load_w(DType wt, const void* w, int64_t k) {
  switch (wt) {
    case DType::F32: return static_cast<const float*>(w)[k];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(w)[k]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(w)[k]);
    default: MS_CHECK(false, "dot_row: unsupported weight dtype {}", dtype_name(wt));
  }
}

void dot_row_scalar(DType wt, const void* w, int64_t K, const float* const* x, int nt, float* out) {
  for (int t = 0; t < nt; ++t) out[t] = 0;
  for (int64_t k = 0; k < K; ++k) {
    float wk = load_w(wt, w, k);
    for (int t = 0; t < nt; ++t) out[t] += wk * x[t][k];
  }
}

__attribute__((target("avx2,fma,f16c"))) inline __m256 load8(DType wt, const void* w, int64_t k) {
  if (wt == DType::F32) return _mm256_loadu_ps(static_cast<const float*>(w) + k);
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + k));
  if (wt == DType::F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int NT>
__attribute__((target("avx2,fma,f16c"))) void dot_row_avx2(DType wt, const void* w, int64_t K, const float* const* x,
                                                           float* out) {
  // Two accumulators per token hide the FMA latency.
  __m256 acc0[NT], acc1[NT];
  for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m256 w0 = load8(wt, w, k), w1 = load8(wt, w, k + 8);
    for (int t = 0; t < NT; ++t) {
      acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + k), acc0[t]);
      acc1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[t] + k + 8), acc1[t]);
    }
  }
  for (; k + 8 <= K; k += 8) {
    __m256 w0 = load8(wt, w, k);
    for (int t = 0; t < NT; ++t) acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + k), acc0[t]);
  }
  for (int t = 0; t < NT; ++t) out[t] = hsum(_mm256_add_ps(acc0[t], acc1[t]));
  for (; k < K; ++k) {
    float wk = load_w(wt, w, k);
    for (int t = 0; t < NT; ++t) out[t] += wk * x[t][k];
  }
}

__attribute__((target("avx2,fma"))) void axpy_avx2(float a, const float* x, float* y, int64_t n) {
  __m256 va = _mm256_set1_ps(a);
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) _mm256_storeu_ps(y + k, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + k), _mm256_loadu_ps(y + k)));
  for (; k < n; ++k) y[k] += a * x[k];
}

}  // namespace

void dot_row(DType wt, const void* w, int64_t K, const float* const* x, int nt, float* out) {
  MS_CHECK(nt >= 1 && nt <= 4, "dot_row: nt={}", nt);
  if (!cpu_has_avx2()) return dot_row_scalar(wt, w, K, x, nt, out);
  switch (nt) {
    case 1: return dot_row_avx2<1>(wt, w, K, x, out);
    case 2: return dot_row_avx2<2>(wt, w, K, x, out);
    case 3: return dot_row_avx2<3>(wt, w, K, x, out);
    default: return dot_row_avx2<4>(wt, w, K, x, out);
  }
}

void axpy_f32(float a, const float* x, float* y, int64_t n) {
  if (cpu_has_avx2()) return axpy_avx2(a, x, y, n);
  for (int64_t k = 0; k < n; ++k) y[k] += a * x[k];
}

float dot_f32(const float* a, const float* b, int64_t n) {
  float r;
  const float* xs[1] = {b};
  dot_row(DType::F32, a, n, xs, 1, &r);
  return r;
}

}  // namespace moeserve::kernels

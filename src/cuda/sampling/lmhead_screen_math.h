// The arithmetic of the lm_head screen (lmhead_screen.cu), shared by its kernels and the host (its CPU test and the
// self-test), so that the bound the kernels use is the one the tests check.
//
// The screen picks the greedy token of a step from an int8 copy of the lm_head first, then computes the exact BF16
// logits only of the rows that could still be the argmax:
//   row r's weights w_r (bf16) are stored as q_r (int8) and a scale s_r = amax_r / 127, q = rint(w / s), with e_r the
//   largest |w - s q| of the row (computed at load, rounded up);
//   a token's approximate logit of row r is a_r = s_r * sum_k x16_k q_rk (x16: the token row converted to fp16, whose
//   error against the bf16 row is at most e_x an element);
//   |a_r - exact_r| <= B_r = c_r X1 + 1.01 e_x K A + 2^-20 |a_r|, where exact_r is the exact pass's f32 evaluation
//   of sum_k x_k w_rk (exact_logit: a lane's K / 32 round-to-nearest FMAs, then 5 shuffle additions: a chain of
//   K / 32 + 5 operations, each erring by at most 2^-24 of the sum of |x_k w_rk|; counted as K / 32 + 8 at 2^-22),
//   X1 = sum_k |x_k| rounded up, c_r = e_r + (K 2^-20 + (K / 32 + 8) 2^-22) amax_r rounded up (2^-20 an addition
//   for the screen's own tensor-core sums: 16 times f32's unit roundoff, a margin for their truncating accumulation),
//   A = the largest amax of all rows (the 1.01 covers e_x's products with e_r and the sums' errors);
//   L = max_r (a_r - B_r) is a lower bound of max_r exact_r, so every row with a_r + B_r < L is below the exact
//   maximum: the argmax over the candidates {r : a_r + B_r >= L} of their exact logits is the argmax over all rows.
// On q30b8l-shaped random weights a token keeps ~1-20 of its 151,936 rows (B ~0.26 standard deviations of the
// logits); a NaN or an infinite x (B infinite) keeps every row, which the exact pass then evaluates: slow, not wrong.
#pragma once

#include <cmath>
#include <cstdint>

#ifndef __CUDACC__
#define MS_SCREEN_HD inline
#else
#define MS_SCREEN_HD __host__ __device__ __forceinline__
#endif

namespace moeserve::cuda::screen {

constexpr int kQMax = 127;                       // q in [-127, 127]
constexpr float kScreenUlp = 9.5367431640625e-07f;  // 2^-20: an addition of the screen's tensor-core sums
constexpr float kExactUlp = 2.384185791015625e-07f;  // 2^-22: an operation of the exact pass's chain (K / 32 + 8)
constexpr float kApproxRel = 9.5367431640625e-07f;   // 2^-20: the scale multiply and the bound's own roundings
constexpr float kRoundUp = 1.0f + 9.5367431640625e-07f;

struct RowMeta {
  float scale;  // s_r
  float c;      // c_r: the bound's coefficient of X1
};

// The per-row coefficient c_r from the row's largest quantization error e and largest |w| (both f32), rounded up.
MS_SCREEN_HD float row_coefficient(float e, float amax, int K) {
  return (e + (float(K) * kScreenUlp + float(K / 32 + 8) * kExactUlp) * amax) * kRoundUp + 1e-37f;
}

// s_r and the int8 value of one weight (w / s rounded to nearest, clamped); s = 0 for an all-zero row (q = 0).
MS_SCREEN_HD float row_scale(float amax) { return amax > 0.0f ? amax / float(kQMax) : 0.0f; }
MS_SCREEN_HD int quantize(float w, float scale) {
  if (!(scale > 0.0f)) return 0;
  const float v = rintf(w / scale);
  return int(v > float(kQMax) ? float(kQMax) : v < -float(kQMax) ? -float(kQMax) : v);
}
// |w - s q| of one weight, rounded up (the product and the difference each round once: 2 ulps of amax cover both).
MS_SCREEN_HD float quant_error(float w, float scale, int q, float amax) {
  return fabsf(w - scale * float(q)) + 2.0f * 1.1920928955078125e-07f * amax;
}

// B_r for one (token, row): x1 = X1 (rounded up), ex_ka = 1.01 e_x K A (ex_term).
MS_SCREEN_HD float bound(float approx, float c, float x1, float ex_ka) {
  return (c * x1 + ex_ka + kApproxRel * fabsf(approx)) * kRoundUp;
}
MS_SCREEN_HD float ex_term(float e_x, int K, float amax_all) { return 1.01f * e_x * float(K) * amax_all; }
// The screen for sampled steps (lmhead_screen_topk): a row's threshold is the k-th largest of G group maxima of the
// screen blocks' lower bounds (max a - B over a block's rows). The groups are disjoint runs of blocks, so their maxima
// are k distinct rows' a - B and at least k rows' exact logits lie at or above the k-th largest of them: a row whose
// a + B stays below it is not in the top k. G: the smallest power of two of at least 32 and 2k, at most max_groups, at
// most the blocks (one group a block); group g holds blocks [topk_group_begin(g), topk_group_begin(g + 1)).
MS_SCREEN_HD int topk_group_count(int k, int blocks, int max_groups) {
  int G = 32;
  while (G < 2 * k && G < max_groups) G *= 2;
  return blocks < G ? blocks : G;
}
MS_SCREEN_HD int topk_group_begin(int g, int groups, int blocks) {
  return int(static_cast<long long>(g) * blocks / groups);
}

// X1 from a sum of |x| in f32 over K elements: rounded up by K ulps.
MS_SCREEN_HD float round_up_l1(float sum, int K) { return sum * (1.0f + float(K) * 1.1920928955078125e-07f); }

}  // namespace moeserve::cuda::screen

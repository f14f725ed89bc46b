#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/threadpool.h"
#include "kernels/activation/activation.h"
#include "kernels/moe/moe.h"

namespace moeserve::kernels {

void route_topk(const float* logits, int64_t T, int64_t E, int64_t top_k, bool renormalize, int32_t* ids,
                float* weights) {
  MS_CHECK(top_k >= 1 && top_k <= E, "route_topk: top_k {} of {} experts", top_k, E);
  std::vector<float> p(E);
  std::vector<int32_t> order(E);
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    float mx = *std::max_element(l, l + E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(double(l[e] - mx));
    for (int64_t e = 0; e < E; ++e) p[e] = float(std::exp(double(l[e] - mx)) / sum);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float s = 0;
    for (int64_t k = 0; k < top_k; ++k) s += p[order[k]];
    for (int64_t k = 0; k < top_k; ++k) {
      ids[t * top_k + k] = order[k];
      weights[t * top_k + k] = renormalize ? p[order[k]] / s : p[order[k]];
    }
  }
}

void moe_forward(const float* x, int64_t T, int64_t H, const MoEWeights& w, float* out, ThreadPool& pool,
                 const RouterLogitsHook* hook) {
  const int64_t E = int64_t(w.experts.size()), K = w.top_k;
  MS_CHECK(E > 0 && w.router.out_features() == E, "moe: router has {} rows for {} experts", w.router.out_features(), E);
  std::vector<float> logits(T * E);
  linear(x, T, H, w.router, logits.data(), E, pool);
  if (hook != nullptr && *hook) (*hook)(logits.data(), T, E);
  std::vector<int32_t> ids(T * K);
  std::vector<float> wts(T * K);
  route_topk(logits.data(), T, E, K, w.norm_topk_prob, ids.data(), wts.data());

  // Group (token, slot) pairs by expert.
  std::vector<std::vector<int64_t>> by_expert(E);
  for (int64_t i = 0; i < T * K; ++i) by_expert[ids[i]].push_back(i);
  const int64_t I = w.experts[0].gate.out_features();
  std::vector<int64_t> offset(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) offset[e + 1] = offset[e] + int64_t(by_expert[e].size());
  const int64_t rows = offset[E];
  std::vector<float> xg(rows * H), gate(rows * I), up(rows * I), down(rows * H);
  for (int64_t e = 0; e < E; ++e)
    for (size_t j = 0; j < by_expert[e].size(); ++j)
      std::copy_n(x + (by_expert[e][j] / K) * H, H, xg.data() + (offset[e] + int64_t(j)) * H);

  std::vector<LinearGroup> gu;
  for (int64_t e = 0; e < E; ++e) {
    int64_t n = offset[e + 1] - offset[e];
    if (!n) continue;
    gu.push_back({xg.data() + offset[e] * H, n, H, &w.experts[e].gate, gate.data() + offset[e] * I, I});
    gu.push_back({xg.data() + offset[e] * H, n, H, &w.experts[e].up, up.data() + offset[e] * I, I});
  }
  grouped_linear(gu, pool);
  silu_mul(gate.data(), up.data(), gate.data(), rows * I);
  std::vector<LinearGroup> dn;
  for (int64_t e = 0; e < E; ++e) {
    int64_t n = offset[e + 1] - offset[e];
    if (n) dn.push_back({gate.data() + offset[e] * I, n, I, &w.experts[e].down, down.data() + offset[e] * H, H});
  }
  grouped_linear(dn, pool);

  // Combine in expert order, as transformers' index_add_ loop does.
  std::fill(out, out + T * H, 0.0f);
  for (int64_t e = 0; e < E; ++e)
    for (size_t j = 0; j < by_expert[e].size(); ++j) {
      int64_t pair = by_expert[e][j], t = pair / K;
      const float* d = down.data() + (offset[e] + int64_t(j)) * H;
      float wt = wts[pair];
      float* o = out + t * H;
      for (int64_t h = 0; h < H; ++h) o[h] += d[h] * wt;
    }
}

}  // namespace moeserve::kernels

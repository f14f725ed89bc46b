#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/sampling/sampling.h"

namespace moeserve::kernels {

void log_softmax(const float* logits, int64_t V, float* logprobs) {
  float mx = *std::max_element(logits, logits + V);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(double(logits[v]) - mx);
  double lse = double(mx) + std::log(sum);
  for (int64_t v = 0; v < V; ++v) logprobs[v] = float(double(logits[v]) - lse);
}

std::vector<TokenLogprob> top_logprobs(const float* logprobs, int64_t V, int64_t n) {
  n = std::min(n, V);
  std::vector<int32_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
    return logprobs[a] > logprobs[b] || (logprobs[a] == logprobs[b] && a < b);
  });
  std::vector<TokenLogprob> r;
  for (int64_t i = 0; i < n; ++i) r.push_back({idx[i], logprobs[idx[i]]});
  return r;
}

int32_t argmax(const float* logits, int64_t V) {
  return int32_t(std::max_element(logits, logits + V) - logits);  // first maximum
}

KeptSet kept_set(const float* logits, int64_t V, const SamplerParams& p) {
  // Candidates sorted by logit; the filters below all act on that order.
  KeptSet k;
  std::vector<int32_t>& idx = k.ids;
  idx.resize(size_t(V));
  std::iota(idx.begin(), idx.end(), 0);
  int64_t keep = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  idx.resize(size_t(keep));
  std::vector<double>& prob = k.prob;
  prob.resize(size_t(keep));
  double mx = logits[idx[0]] / p.temperature, sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += prob[i] = std::exp(double(logits[idx[i]]) / p.temperature - mx);
  for (auto& q : prob) q /= sum;
  int64_t n = keep;
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (int64_t i = 0; i < keep; ++i) {
      cum += prob[i];
      if (cum >= p.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    double floor = prob[0] * p.min_p;
    int64_t m = 1;
    while (m < n && prob[m] >= floor) ++m;
    n = m;
  }
  idx.resize(size_t(n));
  prob.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) k.total += prob[i];
  return k;
}

int32_t sample_token(const float* logits, int64_t V, const SamplerParams& p, std::mt19937_64& rng) {
  if (p.temperature <= 0.0f || p.top_k == 1) return argmax(logits, V);
  const KeptSet k = kept_set(logits, V, p);
  const int64_t n = int64_t(k.ids.size());
  double r = std::uniform_real_distribution<double>(0.0, k.total)(rng);
  for (int64_t i = 0; i < n; ++i) {
    r -= k.prob[size_t(i)];
    if (r <= 0) return k.ids[size_t(i)];
  }
  return k.ids[size_t(n - 1)];
}

}  // namespace moeserve::kernels

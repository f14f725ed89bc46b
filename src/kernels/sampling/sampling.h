// Token selection from logits on the CPU: log-softmax and top logprobs, greedy and random sampling with
// temperature, top-k, top-p and min-p.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace moeserve::kernels {

struct TokenLogprob {
  int32_t id;
  float logprob;
};

// logprobs[v] = logits[v] - logsumexp(logits), accumulated in double.
void log_softmax(const float* logits, int64_t V, float* logprobs);
// The n most likely tokens, most likely first (ties: lower id first).
std::vector<TokenLogprob> top_logprobs(const float* logprobs, int64_t V, int64_t n);
// Index of the largest logit (lowest index on ties), as torch.argmax.
int32_t argmax(const float* logits, int64_t V);

struct SamplerParams {
  float temperature = 1.0f;  // 0: greedy
  int64_t top_k = -1;        // <= 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
};

// The tokens a non-greedy draw can take, in the order (logit descending, id ascending), after top-k, top-p and min-p,
// with their probabilities within the top-k set (prob sums to total, at most 1: top-p and min-p cut it, nothing
// renormalizes); sample_token draws from these.
struct KeptSet {
  std::vector<int32_t> ids;
  std::vector<double> prob;
  double total = 0;
};
KeptSet kept_set(const float* logits, int64_t V, const SamplerParams& p);

// Samples one token. Greedy when temperature == 0 (or top_k == 1).
int32_t sample_token(const float* logits, int64_t V, const SamplerParams& p, std::mt19937_64& rng);

}  // namespace moeserve::kernels

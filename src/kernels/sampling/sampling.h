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

// Samples one token. Greedy when temperature == 0 (or top_k == 1).
int32_t sample_token(const float* logits, int64_t V, const SamplerParams& p, std::mt19937_64& rng);

}  // namespace moeserve::kernels

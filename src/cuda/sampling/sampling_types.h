// The GPU sampler's argument structs, apart from the CUDA runtime headers (sampling.h includes them).
#pragma once

#include <cstdint>

namespace moeserve::cuda {

// Per logit row, as the host fills it each step.
struct SampleRowParams {
  float temperature = 1.0f;  // 0: greedy (argmax, lowest index on ties)
  int32_t top_k = -1;        // <= 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float presence_penalty = 0.0f, frequency_penalty = 0.0f, repetition_penalty = 1.0f;
  uint64_t random = 0;       // 64 random bits drawn by the host from the request's generator
  int32_t pen_begin = 0, pen_end = 0;  // range in the penalty arrays (tokens seen in prompt or output)
  int32_t ban_begin = 0, ban_end = 0;  // range in ban_ids / ban_values: tokens whose logit gets a value added
                                       // (logit_bias) or becomes -inf (eos under min_tokens); unique in a row
  int32_t mask_row = -1;     // >= 0: the row of SampleArgs::allowed holding the tokens it may pick; -1: every token
  int32_t top_logprobs = 0;  // how many top logprobs to return (<= max_top)
  // >= 0: the row's token is this one (a scored prompt position, SampleSpec::forced_token): score_forced_rows()
  // writes its outputs and sample() leaves the row alone.
  int32_t forced = -1;
};

struct SampleArgs {
  const float* logits = nullptr;  // [rows, vocab] f32; read only (the logprobs need the raw values)
  int rows = 0, vocab = 0;
  const SampleRowParams* params = nullptr;  // [rows] device
  const int32_t* pen_ids = nullptr;    // token ids seen (prompt or output), unique per row
  const int32_t* pen_counts = nullptr; // times each was generated (0 if only in the prompt)
  const int32_t* ban_ids = nullptr;
  const float* ban_values = nullptr;   // added to ban_ids' logits after the penalties (-inf: banned); null: all -inf
  // Grammar masks, (vocab + 31) / 32 words a mask row: bit t % 32 of word t / 32 set where token t may be picked;
  // applied after the penalties and bans (a token left out becomes -inf). Read only by rows with mask_row >= 0.
  const uint32_t* allowed = nullptr;
  int max_top = 0;                     // row stride of top_ids / top_logprobs
  // Outputs, device:
  int32_t* out_ids = nullptr;          // [rows]
  float* out_logprobs = nullptr;       // [rows] logprob of the chosen token (raw logits); may be null
  int32_t* top_ids = nullptr;          // [rows, max_top], most likely first (ties: lower id)
  float* top_logprobs = nullptr;       // [rows, max_top]
  int32_t* out_ranks = nullptr;        // [rows] score_forced_rows: the forced token's rank (may be null)
  void* workspace = nullptr;           // sample_workspace_bytes(rows, vocab): penalised / banned values
};

}  // namespace moeserve::cuda

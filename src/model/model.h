// The interface every architecture implements, and the loader that picks one from config.json.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/attention/attention.h"
#include "model/config.h"

namespace moeserve {

class KVPool;
class ThreadPool;

// One forward step over several sequences: their new tokens concatenated, with positions and KV pages.
struct ForwardBatch {
  std::vector<int32_t> tokens;
  std::vector<int64_t> positions;
  std::vector<kernels::AttnSeq> seqs;   // rows of each sequence in `tokens`
  std::vector<int64_t> logit_rows;      // rows whose next-token logits are wanted
  // The overlap schedule (Executor::launch): empty, or one entry a token: r >= 0 means token i is the token
  // sampled for logit row r of the step launched just before this one (still on the device when this step is
  // launched; tokens[i] is a placeholder), -1 that tokens[i] is the token.
  std::vector<int32_t> previous_samples;
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual const ModelConfig& config() const = 0;
  // logits: [logit_rows.size(), vocab_size] f32. Writes the batch's keys and values into the pool.
  virtual void forward(const ForwardBatch& batch, KVPool& kv, float* logits, ThreadPool& pool) = 0;
  // Bytes of weights read per decoded token (the memory-bandwidth floor of decode).
  virtual size_t active_weight_bytes() const = 0;
};

// Reads config.json, checks the architecture is supported, and loads the weights (zero-copy where the
// checkpoint is already in the compute dtype). UserError for anything wrong with the folder.
std::unique_ptr<CausalLM> load_model(const std::string& model_dir);

}  // namespace moeserve

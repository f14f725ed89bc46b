// Synthetic Hugging Face checkpoints of any supported architecture and size: config.json,
// generation_config.json, safetensors shards with an index, optional tokenizer files. Deterministic from
// the seed (every element is a hash of seed, tensor name and index, so thread count does not matter).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve {

class ThreadPool;

struct GenModelSpec {
  std::string model_type = "qwen3_moe";  // qwen3 | qwen3_moe
  int64_t vocab_size = 151936, hidden_size = 512, num_layers = 4, num_heads = 8, num_kv_heads = 4, head_dim = 64;
  int64_t intermediate_size = 1024, moe_intermediate_size = 256, num_experts = 16, num_experts_per_tok = 4;
  bool norm_topk_prob = true, tie_word_embeddings = true, fused_experts = false;
  int64_t max_position_embeddings = 32768;
  double rope_theta = 1e6, rms_norm_eps = 1e-6;
  std::string dtype = "bfloat16";  // float32 | bfloat16 | float16
  uint64_t seed = 0;
  size_t max_shard_bytes = size_t(4) << 30;
  std::string tokenizer_dir;  // copy tokenizer.json / tokenizer_config.json from here ("" = none)
  std::vector<int64_t> eos_token_ids = {151645, 151643};
  int64_t bos_token_id = 151643;
};

// Named presets: demo, q30b8l, q30b, tiny-qwen3, tiny-moe. UserError names the valid ones.
GenModelSpec gen_model_preset(const std::string& name);
std::vector<std::string> gen_model_preset_names();
nlohmann::json gen_model_config_json(const GenModelSpec& s);
uint64_t gen_model_param_count(const GenModelSpec& s);

// Writes the checkpoint into `dir` (created if needed). Returns bytes of weights written.
size_t write_gen_model(const GenModelSpec& s, const std::string& dir, ThreadPool& pool);

}  // namespace moeserve

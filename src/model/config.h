// The model configuration: every config.json field that changes the math, parsed and validated once.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace moeserve {

// The JSON document of a checkpoint file read from `in` (opened by the caller): a UserError naming `path` when it
// is not valid JSON or nests deeper than core/json_depth.h's limit.
nlohmann::json read_json_file(std::istream& in, const std::string& path);

struct RopeConfig {
  std::string type = "default";  // default | linear | yarn | llama3
  double theta = 10000.0;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32, beta_slow = 1;             // yarn
  double attention_factor = -1;                    // yarn; <0: derived from factor (and mscale)
  double mscale = 0, mscale_all_dim = 0;           // yarn (DeepSeek style)
  bool truncate = true;                            // yarn
  double low_freq_factor = 1, high_freq_factor = 4;  // llama3
  double partial_rotary_factor = 1.0;

  // inv_freq[i] for i in [0, rotary_dim/2), computed as transformers does (fp32 values).
  std::vector<float> inv_freq(int head_dim) const;
  // Factor applied to cos and sin (yarn's attention scaling; 1 otherwise).
  float attention_scaling() const;
  int rotary_dim(int head_dim) const { return int(head_dim * partial_rotary_factor); }
};

struct ModelConfig {
  std::string architecture;  // e.g. Qwen3MoeForCausalLM
  std::string model_type;    // qwen3 | qwen3_moe
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // dense MLP layers
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  RopeConfig rope;
  DType dtype = DType::BF16;  // torch_dtype / dtype: the checkpoint's compute dtype

  // MoE (num_experts == 0: dense model)
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;

  // Token ids from config.json (generation_config.json overrides eos).
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;

  bool is_moe() const { return num_experts > 0; }
  // transformers' Qwen3MoeDecoderLayer rule.
  bool is_moe_layer(int64_t layer) const;

  // `where` names the file in error messages.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& where);
  static ModelConfig from_file(const std::string& path);
  nlohmann::json to_json() const;  // the resolved values (for /get_model_info and gen-model)
  std::string summary() const;     // one line for logs
};

// generation_config.json: default sampling parameters and stop ids.
struct GenerationDefaults {
  std::vector<int64_t> eos_token_ids;
  double temperature = 1.0, top_p = 1.0, min_p = 0.0, repetition_penalty = 1.0;
  int64_t top_k = -1;
  bool do_sample = true;
  bool present = false;  // the file existed
  static GenerationDefaults from_dir(const std::string& model_dir);  // present = false without the file
  static GenerationDefaults from_json(const nlohmann::json& j, const std::string& path);  // UserError naming path
};

}  // namespace moeserve

#include "model/gen_model.h"

#include <array>
#include <cmath>
#include <memory>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/dtype.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace moeserve {

using nlohmann::json;
namespace fs = std::filesystem;

std::vector<std::string> gen_model_preset_names() { return {"demo", "q30b8l", "q30b", "tiny-qwen3", "tiny-moe"}; }

GenModelSpec gen_model_preset(const std::string& name) {
  GenModelSpec s;  // the defaults are the demo model
  if (name == "demo") return s;
  if (name == "q30b8l" || name == "q30b") {
    // Qwen3-30B-A3B shapes.
    s.hidden_size = 2048;
    s.num_heads = 32;
    s.num_kv_heads = 4;
    s.head_dim = 128;
    s.num_experts = 128;
    s.num_experts_per_tok = 8;
    s.moe_intermediate_size = 768;
    s.intermediate_size = 6144;
    s.tie_word_embeddings = false;
    s.max_position_embeddings = 40960;
    s.num_layers = name == "q30b" ? 48 : 8;
    return s;
  }
  if (name == "tiny-qwen3" || name == "tiny-moe") {
    s.model_type = name == "tiny-qwen3" ? "qwen3" : "qwen3_moe";
    s.vocab_size = 1024;
    s.hidden_size = 64;
    s.num_layers = 2;
    s.num_heads = 4;
    s.num_kv_heads = 2;
    s.head_dim = 16;
    s.intermediate_size = 128;
    s.moe_intermediate_size = 32;
    s.num_experts = 8;
    s.num_experts_per_tok = 2;
    s.max_position_embeddings = 4096;
    s.eos_token_ids = {1};
    s.bos_token_id = 0;
    return s;
  }
  std::string valid;
  for (auto& n : gen_model_preset_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw_user("--preset: unknown preset '{}' (valid: {})", name, valid);
}

json gen_model_config_json(const GenModelSpec& s) {
  bool moe = s.model_type == "qwen3_moe";
  json j = {
      {"architectures", {moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"}},
      {"model_type", s.model_type},
      {"vocab_size", s.vocab_size},
      {"hidden_size", s.hidden_size},
      {"intermediate_size", s.intermediate_size},
      {"num_hidden_layers", s.num_layers},
      {"num_attention_heads", s.num_heads},
      {"num_key_value_heads", s.num_kv_heads},
      {"head_dim", s.head_dim},
      {"hidden_act", "silu"},
      {"max_position_embeddings", s.max_position_embeddings},
      {"rms_norm_eps", s.rms_norm_eps},
      {"rope_theta", s.rope_theta},
      {"rope_scaling", nullptr},
      {"tie_word_embeddings", s.tie_word_embeddings},
      {"attention_bias", false},
      {"use_sliding_window", false},
      {"torch_dtype", s.dtype},
      {"bos_token_id", s.bos_token_id},
      {"eos_token_id", s.eos_token_ids.empty() ? json(nullptr) : json(s.eos_token_ids[0])},
  };
  if (moe) {
    j["num_experts"] = s.num_experts;
    j["num_experts_per_tok"] = s.num_experts_per_tok;
    j["moe_intermediate_size"] = s.moe_intermediate_size;
    j["norm_topk_prob"] = s.norm_topk_prob;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = json::array();
  }
  return j;
}

uint64_t gen_model_param_count(const GenModelSpec& s) {
  uint64_t H = s.hidden_size, D = s.head_dim;
  uint64_t attn = H * s.num_heads * D * 2 + H * s.num_kv_heads * D * 2 + 2 * D + 2 * H;
  uint64_t mlp = s.model_type == "qwen3_moe"
                     ? uint64_t(s.num_experts) * 3 * H * s.moe_intermediate_size + uint64_t(s.num_experts) * H
                     : 3 * H * s.intermediate_size;
  uint64_t n = uint64_t(s.num_layers) * (attn + mlp) + uint64_t(s.vocab_size) * H + H;
  if (!s.tie_word_embeddings) n += uint64_t(s.vocab_size) * H;
  return n;
}

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t name_hash(const std::string& n, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ splitmix(seed);
  for (unsigned char ch : n) h = (h ^ ch) * 1099511628211ull;
  return splitmix(h);
}

// Uniform over 256 levels in [center - half_width, center + half_width]; element i of a tensor is byte i % 8 of
// splitmix(base + i / 8): a pure function of (seed, name, i), so any split across threads writes the same bytes.
// One hash per 8 elements keeps generation well below disk speed (bf16 has 8 bits of mantissa anyway).
TensorSpec make_tensor(const std::string& name, DType dt, Shape shape, uint64_t seed, float center, float half_width) {
  TensorSpec t{name, dt, std::move(shape), nullptr};
  uint64_t base = name_hash(name, seed);
  auto levels = std::make_shared<std::array<uint16_t, 256>>();
  auto levels_f32 = std::make_shared<std::array<float, 256>>();
  for (int b = 0; b < 256; ++b) {
    float v = center + half_width * ((2.0f * float(b) + 1.0f) / 256.0f - 1.0f);
    (*levels_f32)[b] = v;
    (*levels)[b] = dt == DType::BF16 ? f32_to_bf16(v) : dt == DType::F16 ? f32_to_f16(v) : 0;
  }
  t.fill = [dt, base, levels, levels_f32](void* dst, int64_t first, int64_t count) {
    int64_t i = 0;
    while (i < count) {
      uint64_t idx = uint64_t(first + i);
      uint64_t word = splitmix(base + idx / 8);
      for (unsigned k = unsigned(idx % 8); k < 8 && i < count; ++k, ++i) {
        unsigned b = unsigned(word >> (8 * k)) & 255u;
        if (dt == DType::F32) static_cast<float*>(dst)[i] = (*levels_f32)[b];
        else static_cast<uint16_t*>(dst)[i] = (*levels)[b];
      }
    }
  };
  return t;
}

void write_json(const std::string& path, const json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) throw_user("cannot write {}", path);
}

}  // namespace

size_t write_gen_model(const GenModelSpec& s, const std::string& dir, ThreadPool& pool) {
  json cfg_json = gen_model_config_json(s);
  ModelConfig cfg = ModelConfig::from_json(cfg_json, "gen-model spec");  // same validation as loading
  auto dt_opt = dtype_from_torch_name(s.dtype);
  if (!dt_opt) throw_user("--dtype: '{}' is not supported (float32, bfloat16, float16)", s.dtype);
  DType dt = *dt_opt;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_user("cannot create {}: {}", dir, ec.message());

  const int64_t H = s.hidden_size, D = s.head_dim;
  const float sqrt3 = std::sqrt(3.0f);
  auto mat = [&](const std::string& name, int64_t out, int64_t in, float gain = 1.0f) {
    return make_tensor(name, dt, {out, in}, s.seed, 0.0f, gain * sqrt3 / std::sqrt(float(in)));
  };
  auto norm = [&](const std::string& name, int64_t n) { return make_tensor(name, dt, {n}, s.seed, 1.0f, 0.1f); };
  std::vector<TensorSpec> ts;
  // Embedding rows of norm ~2: as a tied lm_head this gives logits of std ~2 (varied, not degenerate output);
  // as an input the first RMSNorm rescales them anyway.
  ts.push_back(make_tensor("model.embed_tokens.weight", dt, {s.vocab_size, H}, s.seed, 0.0f, 2.0f * sqrt3 / std::sqrt(float(H))));
  if (!s.tie_word_embeddings) ts.push_back(mat("lm_head.weight", s.vocab_size, H, 4.0f));
  ts.push_back(norm("model.norm.weight", H));
  for (int64_t l = 0; l < s.num_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    ts.push_back(mat(p + "self_attn.q_proj.weight", s.num_heads * D, H));
    ts.push_back(mat(p + "self_attn.k_proj.weight", s.num_kv_heads * D, H));
    ts.push_back(mat(p + "self_attn.v_proj.weight", s.num_kv_heads * D, H));
    ts.push_back(mat(p + "self_attn.o_proj.weight", H, s.num_heads * D));
    ts.push_back(norm(p + "self_attn.q_norm.weight", D));
    ts.push_back(norm(p + "self_attn.k_norm.weight", D));
    ts.push_back(norm(p + "input_layernorm.weight", H));
    ts.push_back(norm(p + "post_attention_layernorm.weight", H));
    if (cfg.is_moe_layer(l)) {
      const int64_t E = s.num_experts, I = s.moe_intermediate_size;
      ts.push_back(mat(p + "mlp.gate.weight", E, H, 3.0f));
      if (s.fused_experts) {
        ts.push_back(make_tensor(p + "mlp.experts.gate_up_proj", dt, {E, 2 * I, H}, s.seed, 0.0f, sqrt3 / std::sqrt(float(H))));
        ts.push_back(make_tensor(p + "mlp.experts.down_proj", dt, {E, H, I}, s.seed, 0.0f, sqrt3 / std::sqrt(float(I))));
      } else {
        for (int64_t e = 0; e < E; ++e) {
          std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
          ts.push_back(mat(ep + "gate_proj.weight", I, H));
          ts.push_back(mat(ep + "up_proj.weight", I, H));
          ts.push_back(mat(ep + "down_proj.weight", H, I));
        }
      }
    } else {
      ts.push_back(mat(p + "mlp.gate_proj.weight", s.intermediate_size, H));
      ts.push_back(mat(p + "mlp.up_proj.weight", s.intermediate_size, H));
      ts.push_back(mat(p + "mlp.down_proj.weight", H, s.intermediate_size));
    }
  }
  // The size first (in long double: absurd shapes must not wrap around), against the free space of the folder, so
  // that a typo in a size is an error now rather than a disk filled or an hour of writing.
  long double total = 0;
  for (auto& t : ts) {
    long double n = dtype_size(t.dtype);
    for (int64_t d : t.shape) n *= (long double)d;
    total += n;
  }
  const fs::space_info space = fs::space(dir, ec);
  if (total > (long double)(int64_t(1) << 60) || (!ec && total > (long double)space.available))
    throw_user("gen-model: the checkpoint would take {:.1f} GiB, and {} has {:.1f} GiB free",
               double(total / (1ull << 30)), dir, ec ? 0.0 : double(space.available) / double(1ull << 30));
  const size_t bytes = size_t(total);
  write_checkpoint_shards(dir, ts, s.max_shard_bytes, pool);
  write_json(dir + "/config.json", cfg_json);
  json gen = {{"bos_token_id", s.bos_token_id}, {"eos_token_id", s.eos_token_ids}, {"do_sample", true},
              {"temperature", 0.6}, {"top_k", 20}, {"top_p", 0.95}};
  write_json(dir + "/generation_config.json", gen);
  if (!s.tokenizer_dir.empty()) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::path src = fs::path(s.tokenizer_dir) / f;
      if (!fs::exists(src)) throw_user("--tokenizer-from {}: no {} there", s.tokenizer_dir, f);
      fs::copy_file(src, fs::path(dir) / f, fs::copy_options::overwrite_existing, ec);
      if (ec) throw_user("cannot copy {} into {}: {}", src.string(), dir, ec.message());
    }
  }
  return bytes;
}

}  // namespace moeserve

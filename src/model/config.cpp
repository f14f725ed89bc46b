#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/fs_lookup.h"
#include "core/json_depth.h"
#include "core/json_int.h"

namespace moeserve {

using nlohmann::json;

namespace {

// Typed field access with messages that name the file and the field.
struct Fields {
  const json& j;
  const std::string& where;

  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  int64_t i64(const char* k, int64_t def, bool required = false) const {
    if (!has(k)) {
      if (required) throw_user("{}: missing required field '{}'", where, k);
      return def;
    }
    int64_t v = 0;
    const JsonInt got = json_to_int64(j[k], v);
    if (got == JsonInt::NotInteger) throw_user("{}: field '{}' must be an integer, got {}", where, k, j[k].dump());
    if (got == JsonInt::OutOfRange) throw_user("{}: field '{}' is out of the int64 range: {}", where, k, j[k].dump());
    return v;
  }
  double f64(const char* k, double def) const {
    if (!has(k)) return def;
    if (!j[k].is_number()) throw_user("{}: field '{}' must be a number, got {}", where, k, j[k].dump());
    return j[k].get<double>();
  }
  bool boolean(const char* k, bool def) const {
    if (!has(k)) return def;
    if (!j[k].is_boolean()) throw_user("{}: field '{}' must be true or false, got {}", where, k, j[k].dump());
    return j[k].get<bool>();
  }
  std::string str(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    if (!j[k].is_string()) throw_user("{}: field '{}' must be a string, got {}", where, k, j[k].dump());
    return j[k].get<std::string>();
  }
  std::vector<int64_t> ids(const char* k) const {
    std::vector<int64_t> r;
    if (!has(k)) return r;
    if (j[k].is_number_integer()) return {j[k].get<int64_t>()};
    if (!j[k].is_array()) throw_user("{}: field '{}' must be an integer or a list of integers", where, k);
    for (const auto& v : j[k]) {
      if (!v.is_number_integer()) throw_user("{}: field '{}' must hold integers, got {}", where, k, v.dump());
      r.push_back(v.get<int64_t>());
    }
    return r;
  }
};

void positive(int64_t v, const char* name, const std::string& where) {
  if (v <= 0) throw_user("{}: '{}' must be positive, got {}", where, name, v);
}
constexpr int64_t kMaxDim = int64_t(1) << 30, kMaxCount = int64_t(1) << 16;
void at_most(int64_t v, int64_t most, const char* name, const std::string& where) {
  if (v > most) throw_user("{}: '{}' is {}, more than any model this server can load ({})", where, name, v, most);
}

RopeConfig parse_rope(const json& j, const std::string& where) {
  Fields f{j, where};
  RopeConfig r;
  // transformers 5 writes rope_parameters {rope_type, rope_theta, ...}; 4.x wrote rope_theta + rope_scaling.
  json params = json::object();
  if (f.has("rope_parameters") && j["rope_parameters"].is_object()) params = j["rope_parameters"];
  if (f.has("rope_scaling")) {
    if (!j["rope_scaling"].is_object()) throw_user("{}: 'rope_scaling' must be an object", where);
    for (auto& [k, v] : j["rope_scaling"].items())
      if (!params.contains(k)) params[k] = v;
  }
  if (params.contains("full_attention") && params["full_attention"].is_object())
    params = params["full_attention"];  // per-layer-type form; Qwen3 has only full attention
  std::string rw = where + " rope parameters";
  Fields p{params, rw};
  r.theta = p.f64("rope_theta", f.f64("rope_theta", 10000.0));
  r.type = p.str("rope_type", p.str("type", "default"));
  r.partial_rotary_factor = p.f64("partial_rotary_factor", f.f64("partial_rotary_factor", 1.0));
  if (r.type == "default") return r;
  if (r.type == "linear") {
    r.factor = p.f64("factor", 1.0);
  } else if (r.type == "yarn") {
    r.factor = p.f64("factor", 0);
    r.original_max_position_embeddings =
        p.i64("original_max_position_embeddings", f.i64("max_position_embeddings", 0));
    if (r.factor <= 0 && r.original_max_position_embeddings > 0)
      r.factor = double(f.i64("max_position_embeddings", 0)) / double(r.original_max_position_embeddings);
    if (r.factor <= 0) throw_user("{}: yarn rope needs 'factor'", where);
    if (r.original_max_position_embeddings <= 0)
      throw_user("{}: yarn rope needs 'original_max_position_embeddings'", where);
    r.beta_fast = p.f64("beta_fast", 0) ? p.f64("beta_fast", 0) : 32;
    r.beta_slow = p.f64("beta_slow", 0) ? p.f64("beta_slow", 0) : 1;
    r.attention_factor = p.has("attention_factor") ? p.f64("attention_factor", -1) : -1;
    r.mscale = p.f64("mscale", 0);
    r.mscale_all_dim = p.f64("mscale_all_dim", 0);
    r.truncate = p.boolean("truncate", true);
  } else if (r.type == "llama3") {
    r.factor = p.f64("factor", 8);
    r.low_freq_factor = p.f64("low_freq_factor", 1);
    r.high_freq_factor = p.f64("high_freq_factor", 4);
    r.original_max_position_embeddings = p.i64("original_max_position_embeddings", 8192);
  } else {
    throw_user("{}: rope type '{}' is not supported (supported: default, linear, yarn, llama3)", where, r.type);
  }
  return r;
}

double yarn_mscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

std::vector<float> RopeConfig::inv_freq(int head_dim) const {
  int dim = rotary_dim(head_dim);
  int half = dim / 2;
  std::vector<float> inv(half);
  // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), in fp32.
  for (int i = 0; i < half; ++i) {
    float expo = float(2 * i) / float(dim);
    inv[i] = 1.0f / std::pow(float(theta), expo);
  }
  if (type == "linear") {
    for (auto& v : inv) v = float(v / factor);
  } else if (type == "yarn") {
    auto correction_dim = [&](double rot) {
      return (dim * std::log(double(original_max_position_embeddings) / (rot * 2 * M_PI))) / (2 * std::log(theta));
    };
    double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
    if (truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, double(dim - 1));
    if (low == high) high += 0.001;
    for (int i = 0; i < half; ++i) {
      float pos_freq = std::pow(float(theta), float(2 * i) / float(dim));
      float extrap = 1.0f / pos_freq;
      float interp = 1.0f / (float(factor) * pos_freq);
      float ramp = std::clamp(float((double(i) - low) / (high - low)), 0.0f, 1.0f);
      float extrap_factor = 1.0f - ramp;
      inv[i] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
    }
  } else if (type == "llama3") {
    double low_wavelen = original_max_position_embeddings / low_freq_factor;
    double high_wavelen = original_max_position_embeddings / high_freq_factor;
    for (auto& v : inv) {
      double wavelen = 2 * M_PI / v;
      double scaled = wavelen > low_wavelen ? v / factor : v;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        double smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
        scaled = (1 - smooth) * scaled / factor + smooth * scaled;
      }
      v = float(scaled);
    }
  }
  return inv;
}

float RopeConfig::attention_scaling() const {
  if (type != "yarn") return 1.0f;
  if (attention_factor >= 0) return float(attention_factor);
  if (mscale != 0 && mscale_all_dim != 0) return float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim));
  return float(yarn_mscale(factor, 1.0));
}

namespace {
// The rope parameters give positive, finite frequencies and scaling (transformers does not check; a zero or negative
// theta or factor would turn every position into NaN, silently): checked on the values the model will use.
void check_rope(const RopeConfig& r, int head_dim, const std::string& where) {
  if (!(std::isfinite(r.theta) && r.theta > 0))
    throw_user("{}: rope_theta must be a positive number, got {}", where, r.theta);
  if (!(r.partial_rotary_factor > 0 && r.partial_rotary_factor <= 1))
    throw_user("{}: partial_rotary_factor must be in (0, 1], got {}", where, r.partial_rotary_factor);
  if (r.type != "default" && !(std::isfinite(r.factor) && r.factor > 0))
    throw_user("{}: rope scaling factor must be a positive number, got {} (rope_type {})", where, r.factor, r.type);
  const std::vector<float> inv = r.inv_freq(head_dim);
  for (size_t i = 0; i < inv.size(); ++i)
    if (!(std::isfinite(inv[i]) && inv[i] > 0))
      throw_user("{}: the rope parameters (rope_type {}, rope_theta {}, factor {}) give frequency {} at index {}: "
                 "not a positive finite number", where, r.type, r.theta, r.factor, inv[i], i);
  const float scale = r.attention_scaling();
  if (!(std::isfinite(scale) && scale > 0))
    throw_user("{}: the rope parameters (rope_type {}) give attention scaling {}: not a positive finite number", where,
               r.type, scale);
}
}  // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

ModelConfig ModelConfig::from_json(const json& root, const std::string& where) {
  if (!root.is_object()) throw_user("{}: expected a JSON object", where);
  const json* jp = &root;
  std::string arch;
  if (root.contains("architectures") && root["architectures"].is_array() && !root["architectures"].empty() &&
      root["architectures"][0].is_string())
    arch = root["architectures"][0].get<std::string>();
  std::string model_type =
      root.contains("model_type") && root["model_type"].is_string() ? root["model_type"].get<std::string>() : "";
  const json& j = *jp;
  Fields f{j, where};
  ModelConfig c;
  c.architecture = arch;
  c.model_type = model_type;
  static const char* kSupported = "Qwen3ForCausalLM (qwen3), Qwen3MoeForCausalLM (qwen3_moe)";
  bool known_type = model_type == "qwen3" || model_type == "qwen3_moe";
  bool known_arch = arch.empty() || arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM";
  if (!known_type || !known_arch)
    throw_user("{}: unsupported architecture '{}' (model_type '{}'); supported: {}", where,
               arch.empty() ? "?" : arch, model_type, kSupported);
  if (c.architecture.empty()) c.architecture = model_type == "qwen3" ? "Qwen3ForCausalLM" : "Qwen3MoeForCausalLM";

  c.vocab_size = f.i64("vocab_size", 0, true);
  c.hidden_size = f.i64("hidden_size", 0, true);
  c.num_layers = f.i64("num_hidden_layers", 0, true);
  c.num_heads = f.i64("num_attention_heads", 0, true);
  c.num_kv_heads = f.i64("num_key_value_heads", c.num_heads);
  c.head_dim = f.i64("head_dim", c.num_heads > 0 ? c.hidden_size / c.num_heads : 0);
  c.intermediate_size = f.i64("intermediate_size", 0);
  c.max_position_embeddings = f.i64("max_position_embeddings", 32768);
  c.rms_norm_eps = f.f64("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.attention_bias = f.boolean("attention_bias", false);
  c.rope = parse_rope(j, where);
  std::string dt = f.str("dtype", f.str("torch_dtype", "bfloat16"));
  auto d = dtype_from_torch_name(dt);
  if (!d) throw_user("{}: dtype '{}' is not supported (float32, bfloat16, float16)", where, dt);
  c.dtype = *d;
  std::string act = f.str("hidden_act", "silu");
  if (act != "silu") throw_user("{}: hidden_act '{}' is not supported (only silu)", where, act);
  if (f.boolean("use_sliding_window", false))
    throw_user("{}: use_sliding_window=true is not supported yet", where);
  c.eos_token_ids = f.ids("eos_token_id");
  c.bos_token_id = f.has("bos_token_id") && j["bos_token_id"].is_number_integer() ? j["bos_token_id"].get<int64_t>() : -1;

  if (model_type == "qwen3_moe") {
    // transformers 5 saves num_local_experts; earlier versions num_experts.
    c.num_experts = f.i64("num_experts", f.i64("num_local_experts", 0));
    c.num_experts_per_tok = f.i64("num_experts_per_tok", 0, true);
    c.moe_intermediate_size = f.i64("moe_intermediate_size", 0, true);
    c.norm_topk_prob = f.boolean("norm_topk_prob", false);
    c.decoder_sparse_step = f.i64("decoder_sparse_step", 1);
    c.mlp_only_layers = f.ids("mlp_only_layers");
    positive(c.num_experts, "num_experts", where);
    positive(c.num_experts_per_tok, "num_experts_per_tok", where);
    positive(c.moe_intermediate_size, "moe_intermediate_size", where);
    positive(c.decoder_sparse_step, "decoder_sparse_step", where);
    if (c.num_experts_per_tok > c.num_experts)
      throw_user("{}: num_experts_per_tok ({}) exceeds num_experts ({})", where, c.num_experts_per_tok, c.num_experts);
  }
  positive(c.vocab_size, "vocab_size", where);
  positive(c.hidden_size, "hidden_size", where);
  positive(c.num_layers, "num_hidden_layers", where);
  positive(c.num_heads, "num_attention_heads", where);
  positive(c.num_kv_heads, "num_key_value_heads", where);
  positive(c.head_dim, "head_dim", where);
  positive(c.max_position_embeddings, "max_position_embeddings", where);
  // Upper bounds far past any real model, so that sizes, their products and int casts cannot overflow downstream.
  at_most(c.vocab_size, kMaxDim, "vocab_size", where);
  at_most(c.hidden_size, kMaxDim, "hidden_size", where);
  at_most(c.intermediate_size, kMaxDim, "intermediate_size", where);
  at_most(c.moe_intermediate_size, kMaxDim, "moe_intermediate_size", where);
  at_most(c.num_heads, kMaxCount, "num_attention_heads", where);
  at_most(c.head_dim, kMaxCount, "head_dim", where);
  at_most(c.num_layers, kMaxCount, "num_hidden_layers", where);
  at_most(c.num_experts, kMaxCount, "num_experts", where);
  check_rope(c.rope, int(c.head_dim), where);
  if (c.num_heads % c.num_kv_heads != 0)
    throw_user("{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", where, c.num_heads,
               c.num_kv_heads);
  if (c.rope.rotary_dim(int(c.head_dim)) % 2 != 0 || c.rope.rotary_dim(int(c.head_dim)) > c.head_dim)
    throw_user("{}: rotary dimension {} must be even and at most head_dim {}", where,
               c.rope.rotary_dim(int(c.head_dim)), c.head_dim);
  bool any_dense = false;
  for (int64_t l = 0; l < c.num_layers; ++l) any_dense |= !c.is_moe_layer(l);
  if (any_dense) positive(c.intermediate_size, "intermediate_size", where);
  if (!(c.rms_norm_eps > 0)) throw_user("{}: rms_norm_eps must be positive", where);
  return c;
}

json read_json_file(std::istream& in, const std::string& path) {
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (json_nesting_exceeds(text))
    throw_user("{}: nests arrays and objects more than {} levels deep", path, kMaxJsonDepth);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw_user("{}: invalid JSON: {}", path, e.what());
  }
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_user("cannot open {}: {}", path, path_exists(path, "config") ? "permission denied" : "no such file");
  return from_json(read_json_file(in, path), path);
}

json ModelConfig::to_json() const {
  json j = {{"architecture", architecture}, {"model_type", model_type}, {"vocab_size", vocab_size},
            {"hidden_size", hidden_size}, {"intermediate_size", intermediate_size}, {"num_hidden_layers", num_layers},
            {"num_attention_heads", num_heads}, {"num_key_value_heads", num_kv_heads}, {"head_dim", head_dim},
            {"max_position_embeddings", max_position_embeddings}, {"rms_norm_eps", rms_norm_eps},
            {"tie_word_embeddings", tie_word_embeddings}, {"attention_bias", attention_bias},
            {"rope_type", rope.type}, {"rope_theta", rope.theta}, {"dtype", dtype_name(dtype)}};
  if (is_moe()) {
    j["num_experts"] = num_experts;
    j["num_experts_per_tok"] = num_experts_per_tok;
    j["moe_intermediate_size"] = moe_intermediate_size;
    j["norm_topk_prob"] = norm_topk_prob;
    j["decoder_sparse_step"] = decoder_sparse_step;
    j["mlp_only_layers"] = mlp_only_layers;
  }
  return j;
}

std::string ModelConfig::summary() const {
  std::string s = fmt::format("{}: {} layers, hidden {}, {} q / {} kv heads x {}, vocab {}, {}", architecture,
                              num_layers, hidden_size, num_heads, num_kv_heads, head_dim, vocab_size,
                              dtype_name(dtype));
  if (is_moe())
    s += fmt::format(", {} experts top-{} (intermediate {})", num_experts, num_experts_per_tok, moe_intermediate_size);
  return s;
}

GenerationDefaults GenerationDefaults::from_dir(const std::string& model_dir) {
  GenerationDefaults g;
  std::string path = model_dir + "/generation_config.json";
  std::ifstream in(path);
  if (!in) return g;
  return from_json(read_json_file(in, path), path);
}

GenerationDefaults GenerationDefaults::from_json(const json& j, const std::string& path) {
  GenerationDefaults g;
  if (!j.is_object()) throw_user("{}: expected a JSON object", path);
  Fields f{j, path};
  g.present = true;
  g.eos_token_ids = f.ids("eos_token_id");
  g.temperature = f.f64("temperature", 1.0);
  g.top_p = f.f64("top_p", 1.0);
  g.top_k = f.i64("top_k", -1);
  g.min_p = f.f64("min_p", 0.0);
  g.repetition_penalty = f.f64("repetition_penalty", 1.0);
  g.do_sample = f.boolean("do_sample", true);
  // These become every request's defaults, which skip the request checks: the same ranges as a request's fields.
  auto in_range = [&](const char* k, double v, double lo, double hi, bool lo_open) {
    if (!(lo_open ? v > lo : v >= lo) || !(v <= hi))
      throw_user("{}: '{}' must be in {}{}, {}], got {} (the server's default sampling parameters come from this "
                 "file: fix the value or remove the field)", path, k, lo_open ? "(" : "[", lo, hi, v);
  };
  in_range("temperature", g.temperature, 0.0, 100.0, false);
  in_range("top_p", g.top_p, 0.0, 1.0, true);
  in_range("min_p", g.min_p, 0.0, 1.0, false);
  in_range("repetition_penalty", g.repetition_penalty, 0.0, 10.0, true);
  return g;
}

}  // namespace moeserve

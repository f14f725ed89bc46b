// The model_config fuzz target's check: a checkpoint's config.json or generation_config.json, as the loader reads
// it (model/config.h). Kept apart from fuzz_checks.h because it needs the model library's config parser.
//
// Input layout: byte 0 = flags (bit 0: 0 config.json, 1 generation_config.json), the rest the file's bytes.
//
// What must hold: only a moeserve::UserError escapes (the server refuses to start with its message); a config
// that parses is one the loader can size and the kernels can index: dimensions positive and bounded, heads a
// multiple of the KV heads, top-k within the experts, an even rotary dimension within head_dim, positive finite rope
// frequencies and attention scaling, and its to_json() parses back to the same values; generation defaults inside
// the request ranges.
#pragma once

#include <cmath>
#include <sstream>
#include <string>
#include <string_view>

#include "fuzz_checks.h"
#include "model/config.h"

namespace moeserve::fuzz {

inline void check_model_config(std::string_view data) {
  if (data.empty()) return;
  const bool generation = (static_cast<unsigned char>(data[0]) & 1) != 0;
  std::istringstream in{std::string(data.substr(1))};
  if (generation) {
    GenerationDefaults g;
    try {
      g = GenerationDefaults::from_json(read_json_file(in, "generation_config.json"), "generation_config.json");
    } catch (const UserError&) {
      return;
    }
    FUZZ_CHECK(g.temperature >= 0 && g.temperature <= 100, "temperature {}", g.temperature);
    FUZZ_CHECK(g.top_p > 0 && g.top_p <= 1, "top_p {}", g.top_p);
    FUZZ_CHECK(g.min_p >= 0 && g.min_p <= 1, "min_p {}", g.min_p);
    FUZZ_CHECK(g.repetition_penalty > 0 && g.repetition_penalty <= 10, "repetition_penalty {}", g.repetition_penalty);
    return;
  }
  ModelConfig c;
  try {
    c = ModelConfig::from_json(read_json_file(in, "config.json"), "config.json");
  } catch (const UserError&) {
    return;
  }
  for (const int64_t v : {c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim,
                          c.max_position_embeddings})
    FUZZ_CHECK(v > 0, "a non-positive dimension {} in {}", v, c.summary());
  FUZZ_CHECK(c.vocab_size <= (int64_t(1) << 30) && c.hidden_size <= (int64_t(1) << 30) && c.head_dim <= 65536 &&
                 c.num_layers <= 65536 && c.num_heads <= 65536,
             "unbounded dimensions: {}", c.summary());
  FUZZ_CHECK(c.num_heads % c.num_kv_heads == 0, "{} heads over {} KV heads", c.num_heads, c.num_kv_heads);
  if (c.is_moe()) {
    FUZZ_CHECK(c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= c.num_experts && c.num_experts <= 65536,
               "top-{} of {} experts", c.num_experts_per_tok, c.num_experts);
    FUZZ_CHECK(c.moe_intermediate_size > 0 && c.decoder_sparse_step > 0, "{}", c.summary());
  }
  bool any_dense = false;
  for (int64_t l = 0; l < c.num_layers; ++l) any_dense |= !c.is_moe_layer(l);
  if (any_dense) FUZZ_CHECK(c.intermediate_size > 0, "dense layers with intermediate_size {}", c.intermediate_size);
  FUZZ_CHECK(c.rms_norm_eps > 0, "rms_norm_eps {}", c.rms_norm_eps);
  const int rot = c.rope.rotary_dim(int(c.head_dim));
  FUZZ_CHECK(rot >= 0 && rot % 2 == 0 && rot <= c.head_dim, "rotary dimension {} of head_dim {}", rot, c.head_dim);
  const std::vector<float> inv = c.rope.inv_freq(int(c.head_dim));
  FUZZ_CHECK(int(inv.size()) == rot / 2, "{} frequencies for rotary dimension {}", inv.size(), rot);
  for (float f : inv) FUZZ_CHECK(std::isfinite(f) && f > 0, "rope frequency {} ({})", f, c.rope.type);
  const float scale = c.rope.attention_scaling();
  FUZZ_CHECK(std::isfinite(scale) && scale > 0, "attention scaling {}", scale);
  // The resolved values (what /get_model_info reports) describe the same model when read back (all but the rope's
  // scaling, which to_json() names by type only; the dtype in its torch spelling).
  nlohmann::json back = c.to_json();
  back["architectures"] = nlohmann::json::array({c.architecture});
  back.erase("rope_type");
  back["partial_rotary_factor"] = c.rope.partial_rotary_factor;  // nor does it write this one
  // to_json() writes the safetensors spelling ("BF16"); config.json takes torch's.
  back["dtype"] = c.dtype == DType::F32 ? "float32" : c.dtype == DType::F16 ? "float16" : "bfloat16";
  ModelConfig c2;
  try {
    c2 = ModelConfig::from_json(back, "to_json");
  } catch (const UserError& e) {
    throw CheckFailure(fmt::format("to_json() does not parse back: {}: {}", e.what(), back.dump()));
  }
  nlohmann::json a = c.to_json(), b = c2.to_json();
  a.erase("rope_type"), b.erase("rope_type");
  FUZZ_CHECK(a == b, "to_json() round trip: {} vs {}", b.dump(), a.dump());
}

}  // namespace moeserve::fuzz

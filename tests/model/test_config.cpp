// config.json parsing: both transformers spellings, every field that changes the math, clear errors.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "model/config.h"

using namespace moeserve;
using nlohmann::json;

namespace {
json qwen3_moe_v4() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 1000, "hidden_size": 64,
    "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 6,
    "num_key_value_heads": 2, "head_dim": 24, "num_experts": 8, "num_experts_per_tok": 3, "norm_topk_prob": false,
    "decoder_sparse_step": 2, "mlp_only_layers": [3], "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 2048, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "eos_token_id": 7,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}})");
}
std::string err(const json& j) {
  try {
    ModelConfig::from_json(j, "config.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Config, ParsesEveryMathField) {
  ModelConfig c = ModelConfig::from_json(qwen3_moe_v4(), "config.json");
  EXPECT_EQ(c.head_dim, 24);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 3);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.dtype, DType::BF16);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e4);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 512);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{7});
  // decoder_sparse_step 2 and mlp_only_layers [3]: layers 1 and 3 would be sparse, 3 is forced dense.
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_FALSE(c.is_moe_layer(3));
}

TEST(Config, Transformers5Spelling) {
  json j = qwen3_moe_v4();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j.erase("num_experts");
  j.erase("torch_dtype");
  j["num_local_experts"] = 8;
  j["dtype"] = "float32";
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  ModelConfig c = ModelConfig::from_json(j, "config.json");
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.dtype, DType::F32);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
}

TEST(Config, YarnFrequenciesAndScaling) {
  ModelConfig c = ModelConfig::from_json(qwen3_moe_v4(), "config.json");
  auto inv = c.rope.inv_freq(24);
  ASSERT_EQ(inv.size(), 12u);
  // High-frequency dims are extrapolated (unchanged), low-frequency ones interpolated (divided by factor).
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[11], 1.0f / std::pow(1e4f, 22.0f / 24.0f) / 4.0f, 1e-9);
  EXPECT_NEAR(c.rope.attention_scaling(), 0.1 * std::log(4.0) + 1.0, 1e-6);
  RopeConfig plain;
  EXPECT_EQ(plain.attention_scaling(), 1.0f);
}

TEST(Config, ClearErrors) {
  json j = qwen3_moe_v4();
  j["num_attention_heads"] = 5;
  EXPECT_NE(err(j).find("multiple of num_key_value_heads"), std::string::npos);
  j = qwen3_moe_v4();
  j.erase("hidden_size");
  EXPECT_NE(err(j).find("missing required field 'hidden_size'"), std::string::npos);
  j = qwen3_moe_v4();
  j["num_experts_per_tok"] = 9;
  EXPECT_NE(err(j).find("exceeds num_experts"), std::string::npos);
  j = qwen3_moe_v4();
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  EXPECT_NE(err(j).find("rope type 'dynamic' is not supported"), std::string::npos);
  j = qwen3_moe_v4();
  j["model_type"] = "mixtral";
  j["architectures"] = {"MixtralForCausalLM"};
  EXPECT_NE(err(j).find("unsupported architecture 'MixtralForCausalLM'"), std::string::npos);
  j = qwen3_moe_v4();
  j["hidden_size"] = "64";
  EXPECT_NE(err(j).find("'hidden_size' must be an integer"), std::string::npos);
  j = qwen3_moe_v4();
  j["hidden_act"] = "gelu";
  EXPECT_NE(err(j).find("hidden_act 'gelu'"), std::string::npos);
  EXPECT_NE(err(json::array()).find("JSON object"), std::string::npos);
}

// Values that parse as JSON but would turn every position into NaN, overflow a size or an int cast, or convert a
// double outside int64 (UB): each refused with the field's name (the fuzz target model_config's properties).
TEST(Config, RefusesValuesThatBreakTheMath) {
  auto expect = [](json j, const char* field, const char* value_json, const char* message) {
    j[field] = json::parse(value_json);
    const std::string e = err(j);
    EXPECT_NE(e.find(message), std::string::npos) << field << " = " << value_json << ": got '" << e << "'";
  };
  expect(qwen3_moe_v4(), "rope_theta", "-5", "rope_theta must be a positive number");
  expect(qwen3_moe_v4(), "rope_theta", "1e-300", "not a positive finite number");  // 1 / theta^x overflows
  expect(qwen3_moe_v4(), "partial_rotary_factor", "-1.0", "partial_rotary_factor must be in (0, 1]");
  expect(qwen3_moe_v4(), "partial_rotary_factor", "1e300", "partial_rotary_factor must be in (0, 1]");
  expect(qwen3_moe_v4(), "rope_scaling", R"({"rope_type": "linear", "factor": -1})", "factor must be a positive");
  expect(qwen3_moe_v4(), "head_dim", "4294967312", "'head_dim' is 4294967312, more than");
  expect(qwen3_moe_v4(), "vocab_size", "9000000000000", "'vocab_size' is 9000000000000, more than");
  expect(qwen3_moe_v4(), "num_hidden_layers", "1e300", "'num_hidden_layers' is out of the int64 range");
  expect(qwen3_moe_v4(), "num_hidden_layers", "9223372036854775808.0", "out of the int64 range");
  expect(qwen3_moe_v4(), "hidden_size", "18446744073709551615", "out of the int64 range");
  expect(qwen3_moe_v4(), "model_type", "5", "unsupported architecture");  // not a type error
  // Still accepted: an integral float, yarn's own scaling.
  json j = qwen3_moe_v4();
  j["num_hidden_layers"] = 4.0;
  EXPECT_EQ(err(j), "");
}

TEST(Config, GenerationDefaultsInRequestRanges) {
  auto gerr = [](const char* text) {
    try {
      GenerationDefaults::from_json(json::parse(text), "generation_config.json");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(gerr(R"({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0, "repetition_penalty": 1.05})"), "");
  EXPECT_EQ(gerr(R"({"temperature": 0, "do_sample": false})"), "");
  EXPECT_NE(gerr(R"({"temperature": -3})").find("'temperature' must be in [0, 100], got -3"), std::string::npos);
  EXPECT_NE(gerr(R"({"top_p": 0})").find("'top_p' must be in (0, 1]"), std::string::npos);
  EXPECT_NE(gerr(R"({"min_p": 7})").find("'min_p' must be in [0, 1]"), std::string::npos);
  EXPECT_NE(gerr(R"({"repetition_penalty": -1})").find("'repetition_penalty' must be in (0, 10]"), std::string::npos);
  EXPECT_NE(gerr("[]").find("JSON object"), std::string::npos);
}

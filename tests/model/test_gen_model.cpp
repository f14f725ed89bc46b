// gen-model: deterministic from the seed, loadable, both expert layouts, sharding.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/threadpool.h"
#include "executor/model_runner.h"
#include "model/gen_model.h"
#include "model/safetensors.h"
#include "temp_dir.h"

using namespace moeserve;
namespace fs = std::filesystem;

namespace {
std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
GenerateResult greedy(const std::string& dir, std::vector<int32_t> prompt) {
  ModelRunner r(load_model(dir), RunnerOptions{256, 16, 512, 2});
  GenerateRequest req;
  req.input_ids = std::move(prompt);
  req.max_new_tokens = 6;
  req.sampling.temperature = 0;
  req.ignore_eos = true;
  return r.generate(req);
}
}  // namespace

TEST(GenModel, DeterministicFromSeedWhateverTheThreads) {
  GenModelSpec s = gen_model_preset("tiny-moe");
  const test_util::TempDir a("gen_a"), b("gen_b"), c("gen_c");
  ThreadPool one(1), two(2);
  write_gen_model(s, a.string(), one);
  write_gen_model(s, b.string(), two);
  s.seed = 1;
  write_gen_model(s, c.string(), two);
  EXPECT_EQ(slurp(a / "model.safetensors"), slurp(b / "model.safetensors"));
  EXPECT_NE(slurp(a / "model.safetensors"), slurp(c / "model.safetensors"));
  EXPECT_TRUE(fs::exists(a / "config.json"));
  EXPECT_TRUE(fs::exists(a / "generation_config.json"));
}

TEST(GenModel, EveryPresetShapeLoadsAndRuns) {
  for (std::string preset : {"tiny-qwen3", "tiny-moe"}) {
    for (bool fused : {false, true}) {
      GenModelSpec s = gen_model_preset(preset);
      s.fused_experts = fused;
      s.max_shard_bytes = 100 << 10;  // several shards + index
      const test_util::TempDir d("gen_" + preset + (fused ? "_fused" : ""));
      ThreadPool pool(2);
      write_gen_model(s, d.string(), pool);
      EXPECT_TRUE(fs::exists(d / "model.safetensors.index.json"));
      Checkpoint ck = Checkpoint::open(d.string());
      EXPECT_EQ(ck.contains("model.layers.0.mlp.experts.gate_up_proj"), preset == "tiny-moe" && fused);
      auto r = greedy(d.string(), {1, 2, 3, 4});
      EXPECT_EQ(r.output_ids.size(), 6u);
    }
  }
}

TEST(GenModel, BenchmarkPresetsHaveTheSpecShapes) {
  GenModelSpec s = gen_model_preset("q30b8l");
  EXPECT_EQ(s.hidden_size, 2048);
  EXPECT_EQ(s.num_heads, 32);
  EXPECT_EQ(s.num_kv_heads, 4);
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.num_experts, 128);
  EXPECT_EQ(s.num_experts_per_tok, 8);
  EXPECT_EQ(s.moe_intermediate_size, 768);
  EXPECT_EQ(s.vocab_size, 151936);
  EXPECT_FALSE(s.tie_word_embeddings);
  EXPECT_EQ(s.num_layers, 8);
  EXPECT_NEAR(double(gen_model_param_count(s)) / 1e9, 5.6, 0.1);
  EXPECT_EQ(gen_model_preset("q30b").num_layers, 48);
  EXPECT_THROW(gen_model_preset("nope"), UserError);
}

// A size typo (a hidden size of 10^9, or one whose byte count overflows 64 bits) is an error naming the size (and the
// free space) before anything is written, not a disk filled or an hour of writing.
TEST(GenModel, RefusesACheckpointLargerThanTheFreeSpace) {
  ThreadPool pool(1);
  for (int64_t hidden : {int64_t(1000000000), int64_t(4000000000000000000)}) {
    GenModelSpec s = gen_model_preset("tiny-moe");
    s.hidden_size = hidden;
    const test_util::TempDir d("gen_huge");
    try {
      write_gen_model(s, d.string(), pool);
      FAIL() << "hidden " << hidden << " was written";
    } catch (const UserError& e) {
      // 10^9 fits the config's bounds and fails on the free space; 4 x 10^18 is past them (config.json's check).
      const char* want = hidden < (int64_t(1) << 30) ? "GiB free" : "more than any model this server can load";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(d / "model.safetensors"));
  }
}

// The CPU engine against transformers: greedy tokens and top-5 logprobs of random fp32 checkpoints made by
// tools/reference/make_parity_fixtures.py (transformers 5.17). Tolerances from the engine-core issue.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "executor/model_runner.h"

using namespace moeserve;
using nlohmann::json;

namespace {

json load_reference() {
  std::ifstream in(std::string(MOESERVE_TEST_DATA) + "/parity/reference.json");
  EXPECT_TRUE(in.good()) << "tests/data/parity/reference.json is missing";
  return json::parse(in);
}

struct Variant {
  int64_t page_size, chunk;
};

void check_case(const json& c, const std::string& dir, Variant var) {
  RunnerOptions ro;
  ro.threads = 2;
  ro.page_size = var.page_size;
  ro.chunked_prefill_size = var.chunk;
  ro.max_total_tokens = 512;
  ModelRunner runner(load_model(std::string(MOESERVE_TEST_DATA) + "/parity/" + dir), ro);
  int compared_tokens = 0;
  for (const auto& p : c["prompts"]) {
    GenerateRequest req;
    for (auto id : p["input_ids"]) req.input_ids.push_back(id.get<int32_t>());
    const auto& steps = p["steps"];
    req.max_new_tokens = int64_t(steps.size());
    req.sampling.temperature = 0;
    req.top_logprobs = 5;
    req.ignore_eos = true;
    GenerateResult r = runner.generate(req);
    ASSERT_EQ(r.output_ids.size(), steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      const auto& s = steps[i];
      std::string where = dir + " prompt of " + std::to_string(req.input_ids.size()) + " tokens, step " + std::to_string(i);
      // Logprobs of the reference's top-5 tokens, looked up among ours.
      std::map<int32_t, float> ours;
      for (auto& t : r.top_logprobs[i]) ours[t.id] = t.logprob;
      float our_fifth = r.top_logprobs[i].back().logprob;
      for (size_t k = 0; k < s["top_ids"].size(); ++k) {
        int32_t id = s["top_ids"][k];
        double ref = s["top_logprobs"][k];
        auto it = ours.find(id);
        if (it == ours.end()) {
          // Only a near-tie at the edge of the top-5 may swap membership.
          EXPECT_NEAR(ref, our_fifth, 1e-3) << where << ": reference token " << id << " missing from our top-5";
        } else {
          EXPECT_NEAR(it->second, ref, 1e-3) << where << ": logprob of token " << id;
        }
      }
      if (s["top2_gap"].get<double>() > 1e-3) {
        EXPECT_EQ(r.output_ids[i], s["token"].get<int32_t>()) << where;
        ++compared_tokens;
      }
      if (r.output_ids[i] != s["token"].get<int32_t>()) break;  // contexts differ from here on
    }
  }
  EXPECT_GT(compared_tokens, 0) << dir << ": no step had a clear greedy choice";
  EXPECT_EQ(runner.kv().allocator().num_free(), runner.kv().allocator().num_pages()) << "KV pages leaked";
}

}  // namespace

class Parity : public ::testing::TestWithParam<int> {};

TEST_P(Parity, MatchesTransformers) {
  json ref = load_reference();
  ASSERT_LT(GetParam(), int(ref["cases"].size()));
  const json& c = ref["cases"][GetParam()];
  for (const auto& d : c["dirs"]) {
    SCOPED_TRACE(d.get<std::string>());
    check_case(c, d.get<std::string>(), {16, 512});
  }
}

// Paging and chunked prefill must not change the numbers: odd page size, prefill in chunks of 5 tokens.
TEST_P(Parity, SmallPagesAndChunkedPrefill) {
  json ref = load_reference();
  const json& c = ref["cases"][GetParam()];
  check_case(c, c["dirs"][0].get<std::string>(), {3, 5});
}

INSTANTIATE_TEST_SUITE_P(AllCases, Parity, ::testing::Range(0, 10), [](const ::testing::TestParamInfo<int>& info) {
  json ref = load_reference();
  return ref["cases"][info.param]["name"].get<std::string>();
});

TEST(ParityFixtures, CoverTheRequiredShapes) {
  json ref = load_reference();
  EXPECT_EQ(ref["cases"].size(), 10u);
  bool fused = false, per_expert = false, sharded = false;
  for (auto& c : ref["cases"])
    for (auto& k : c.value("alt_keys", c["keys"])) {
      std::string s = k;
      fused |= s.find("experts.gate_up_proj") != std::string::npos;
      per_expert |= s.find("experts.0.gate_proj") != std::string::npos;
    }
  std::ifstream idx(std::string(MOESERVE_TEST_DATA) + "/parity/moe_basic/model.safetensors.index.json");
  sharded = idx.good();
  EXPECT_TRUE(fused);
  EXPECT_TRUE(per_expert);
  EXPECT_TRUE(sharded);
}

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>

#include "benchclient/dataset.h"
#include "core/error.h"

namespace moeserve::bench {
namespace {

using nlohmann::json;

TEST(RandomDataset, LengthsWithinRangeAndIdsInVocab) {
  RandomDatasetOptions o;
  o.num_prompts = 500;
  o.input_len = 100;
  o.output_len = 40;
  o.range_ratio = 0.5;
  o.vocab_size = 321;
  o.seed = 7;
  auto reqs = make_random_dataset(o);
  ASSERT_EQ(reqs.size(), 500u);
  int64_t min_in = 1 << 30, max_in = 0, min_out = 1 << 30, max_out = 0;
  for (auto& r : reqs) {
    ASSERT_TRUE(r.is_ids);
    ASSERT_EQ(int64_t(r.prompt_ids.size()), r.prompt_len);
    for (int32_t id : r.prompt_ids) ASSERT_TRUE(id >= 0 && id < 321);
    min_in = std::min(min_in, r.prompt_len), max_in = std::max(max_in, r.prompt_len);
    min_out = std::min(min_out, r.output_len), max_out = std::max(max_out, r.output_len);
  }
  // Uniform on [50, 100] and [20, 40]: 500 draws reach both ends.
  EXPECT_EQ(min_in, 50);
  EXPECT_EQ(max_in, 100);
  EXPECT_EQ(min_out, 20);
  EXPECT_EQ(max_out, 40);
}

// A workload too large to hold (10^12 prompts, or 10^11-token prompts) is a clear error before any allocation.
TEST(RandomDataset, RefusesWorkloadsThatCannotFitInMemory) {
  RandomDatasetOptions o;
  o.vocab_size = 100;
  o.num_prompts = 1000000000000;
  o.input_len = 512;
  EXPECT_THROW(make_random_dataset(o), UserError);
  o.num_prompts = 2;
  o.input_len = 100000000000;
  try {
    make_random_dataset(o);
    FAIL() << "10^11-token prompts were made";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--random-input-len"), std::string::npos) << e.what();
  }
}

TEST(RandomDataset, RangeRatioOneIsFixedAndZeroStartsAtOne) {
  RandomDatasetOptions o;
  o.num_prompts = 300;
  o.input_len = 16;
  o.output_len = 8;
  o.vocab_size = 50;
  o.range_ratio = 1.0;
  for (auto& r : make_random_dataset(o)) {
    EXPECT_EQ(r.prompt_len, 16);
    EXPECT_EQ(r.output_len, 8);
  }
  o.range_ratio = 0.0;  // SGLang: [max(int(len*0), 1), len]
  int64_t lo = 100;
  for (auto& r : make_random_dataset(o)) lo = std::min(lo, r.output_len);
  EXPECT_EQ(lo, 1);
  o.range_ratio = 0.3;  // int(8 * 0.3) = 2
  lo = 100;
  for (auto& r : make_random_dataset(o)) lo = std::min(lo, r.output_len);
  EXPECT_EQ(lo, 2);
}

TEST(RandomDataset, DeterministicFromSeed) {
  RandomDatasetOptions o;
  o.num_prompts = 20;
  o.input_len = 64;
  o.output_len = 16;
  o.vocab_size = 151936;
  o.seed = 42;
  auto a = make_random_dataset(o), b = make_random_dataset(o);
  o.seed = 43;
  auto c = make_random_dataset(o);
  bool any_diff = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt_ids, b[i].prompt_ids);
    EXPECT_EQ(a[i].output_len, b[i].output_len);
    any_diff |= a[i].prompt_ids != c[i].prompt_ids;
  }
  EXPECT_TRUE(any_diff);
}

TEST(RandomDataset, TextPromptsHaveOneWordPerToken) {
  RandomDatasetOptions o;
  o.num_prompts = 10;
  o.input_len = 30;
  o.output_len = 5;
  o.range_ratio = 1;
  o.as_text = true;
  for (auto& r : make_random_dataset(o)) {
    EXPECT_FALSE(r.is_ids);
    EXPECT_EQ(r.prompt_len, 30);
    EXPECT_EQ(std::count(r.prompt_text.begin(), r.prompt_text.end(), ' '), 29);
  }
}

TEST(RandomDataset, BadOptionsAreUserErrors) {
  RandomDatasetOptions o;
  o.vocab_size = 0;  // ids without a vocabulary
  EXPECT_THROW(make_random_dataset(o), UserError);
  o.vocab_size = 10;
  o.range_ratio = 1.5;
  EXPECT_THROW(make_random_dataset(o), UserError);
}

json conversation(const std::string& human, const std::string& gpt) {
  return {{"id", "x"},
          {"conversations", json::array({{{"from", "human"}, {"value", human}}, {{"from", "gpt"}, {"value", gpt}}})}};
}

TEST(ShareGpt, FirstHumanTurnAndEstimatedOutputLength) {
  json data = json::array();
  data.push_back(conversation(std::string(40, 'a'), std::string(80, 'b')));  // 10 prompt, 20 output tokens
  data.push_back({{"conversations", json::array({{{"from", "system"}, {"value", "sys"}},
                                                 {{"from", "human"}, {"value", std::string(400, 'c')}},
                                                 {{"from", "gpt"}, {"value", std::string(16, 'd')}}})}});
  data.push_back({{"conversations", json::array({{{"from", "human"}, {"value", "only one turn"}}})}});
  ShareGptOptions o;
  o.num_prompts = 10;
  auto reqs = sharegpt_from_json(data, o);
  ASSERT_EQ(reqs.size(), 2u);  // the one-turn conversation is skipped
  std::sort(reqs.begin(), reqs.end(), [](auto& a, auto& b) { return a.prompt_len < b.prompt_len; });
  EXPECT_EQ(reqs[0].prompt_text, std::string(40, 'a'));
  EXPECT_EQ(reqs[0].prompt_len, 10);
  EXPECT_EQ(reqs[0].output_len, 20);
  EXPECT_EQ(reqs[1].prompt_len, 100);
  EXPECT_EQ(reqs[1].output_len, 4);
  EXPECT_FALSE(reqs[0].is_ids);
}

TEST(ShareGpt, FiltersTooShortAndTooLongLikeSglang) {
  json data = json::array();
  data.push_back(conversation("hi", std::string(100, 'x')));                  // prompt 1 token: too short
  data.push_back(conversation(std::string(100, 'p'), "ok"));                  // output 1 token: too short
  data.push_back(conversation(std::string(5000, 'p'), std::string(40, 'x')));  // prompt 1250 > 1024
  data.push_back(conversation(std::string(4000, 'p'), std::string(4400, 'x')));  // 1000 + 1100 > 2048
  data.push_back(conversation(std::string(100, 'p'), std::string(100, 'x')));  // kept
  ShareGptOptions o;
  o.num_prompts = 10;
  EXPECT_EQ(sharegpt_from_json(data, o).size(), 1u);
  o.fixed_output_len = 64;  // output lengths no longer filter; the prompt limit still does
  auto fixed = sharegpt_from_json(data, o);
  EXPECT_EQ(fixed.size(), 3u);
  for (auto& r : fixed) EXPECT_EQ(r.output_len, 64);
  o.fixed_output_len = 0;
  o.context_len = 100000;  // explicit context: only prompt + output above it, and the short ones, go
  EXPECT_EQ(sharegpt_from_json(data, o).size(), 3u);
}

TEST(ShareGpt, NumPromptsShuffleDeterministicAndFileErrors) {
  json data = json::array();
  for (int i = 0; i < 50; ++i)
    data.push_back(conversation(fmt::format("prompt number {:04}", i), std::string(40, 'x')));
  ShareGptOptions o;
  o.num_prompts = 10;
  o.seed = 3;
  auto a = sharegpt_from_json(data, o), b = sharegpt_from_json(data, o);
  ASSERT_EQ(a.size(), 10u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].prompt_text, b[i].prompt_text);
  std::string path = ::testing::TempDir() + "/sharegpt_test_" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << data.dump();
  auto c = load_sharegpt_dataset(path, o);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].prompt_text, c[i].prompt_text);
  std::remove(path.c_str());
  EXPECT_THROW(load_sharegpt_dataset("/nonexistent/sharegpt.json", o), UserError);
  EXPECT_THROW(load_sharegpt_dataset("", o), UserError);
  EXPECT_THROW(sharegpt_from_json(json::object(), o), UserError);
}

TEST(Arrivals, InfiniteRateSendsEverythingAtOnce) {
  auto t = make_arrival_times(5, INFINITY, 1.0, 1);
  EXPECT_EQ(t, std::vector<double>(5, 0.0));
}

TEST(Arrivals, PoissonGapsHaveMeanOneOverRate) {
  const int n = 20001;
  const double rate = 8.0;
  auto t = make_arrival_times(n, rate, 1.0, 123);
  EXPECT_EQ(t[0], 0.0);
  std::vector<double> gaps(n - 1);
  for (int i = 1; i < n; ++i) {
    gaps[i - 1] = t[i] - t[i - 1];
    ASSERT_GE(gaps[i - 1], 0.0);
  }
  double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / gaps.size();
  double var = 0;
  for (double g : gaps) var += (g - mean) * (g - mean);
  double sd = std::sqrt(var / gaps.size());
  // The standard error of the mean is 1/(rate sqrt(n)) = 0.0009; an exponential has sd = mean.
  EXPECT_NEAR(mean, 1.0 / rate, 0.005);
  EXPECT_NEAR(sd / mean, 1.0, 0.05);
  EXPECT_EQ(t, make_arrival_times(n, rate, 1.0, 123));
}

TEST(Arrivals, BurstinessKeepsTheMeanAndChangesTheSpread) {
  auto t = make_arrival_times(20001, 4.0, 4.0, 9);  // gamma shape 4: cv = 1/2
  double mean = t.back() / 20000;
  EXPECT_NEAR(mean, 0.25, 0.01);
  double var = 0;
  for (size_t i = 1; i < t.size(); ++i) var += (t[i] - t[i - 1] - mean) * (t[i] - t[i - 1] - mean);
  EXPECT_NEAR(std::sqrt(var / 20000) / mean, 0.5, 0.05);
  EXPECT_THROW(make_arrival_times(3, 0.0, 1.0, 1), UserError);
}

}  // namespace
}  // namespace moeserve::bench

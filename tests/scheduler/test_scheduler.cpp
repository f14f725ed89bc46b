// Continuous batching must never change results: greedy outputs alone == among many, under preemption from a
// tiny KV cache, with prefix-cache hits; aborts free everything; the cache contract holds after every test.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <sstream>

#include "core/error.h"
#include "core/threadpool.h"
#include "model/gen_model.h"
#include "scheduler/engine.h"
#include "temp_dir.h"

using namespace moeserve;
namespace fs = std::filesystem;

namespace {

const std::string& tiny_model() {
  static const test_util::TempDir d("sched");  // removed at exit
  static std::string dir = [] {
    GenModelSpec s = gen_model_preset("tiny-moe");
    s.dtype = "float32";
    s.vocab_size = 512;
    ThreadPool pool(2);
    write_gen_model(s, d.string(), pool);
    return d.string();
  }();
  return dir;
}

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<kernels::TokenLogprob> tops;  // the first top logprob of each output token (when asked)
  std::vector<float> prompt_logprobs;
  std::vector<std::vector<kernels::TokenLogprob>> prompt_tops;
  std::vector<int32_t> prompt_ranks;
  FinishReason finish = FinishReason::None;
  int64_t cached = 0;
  bool prompt_logprobs_after_tokens = false;  // a prompt logprob delivered after an output token (a bug)
};

// Runs requests through a scheduler stepped on this thread.
struct Harness {
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<Scheduler> sched;
  std::map<uint64_t, Collected> results;
  uint64_t next_id = 1;

  Harness(int64_t max_total_tokens, int64_t page_size, SchedulerOptions so = {}) {
    runner = std::make_unique<ModelRunner>(load_model(tiny_model()), RunnerOptions{max_total_tokens, page_size, 512, 2});
    runner->set_eos_ids({});
    sched = std::make_unique<Scheduler>(*runner, so);
  }
  std::shared_ptr<Request> make(std::vector<int32_t> prompt, int64_t max_new, float temperature = 0,
                                std::optional<uint64_t> seed = std::nullopt,
                                const std::function<void(SamplingParams&)>& configure = nullptr) {
    auto r = std::make_shared<Request>();
    r->id = next_id++;
    r->prompt = std::move(prompt);
    r->params.max_new_tokens = max_new;
    r->params.temperature = temperature;
    r->params.seed = seed;
    r->params.return_logprob = true;
    if (configure) configure(r->params);
    uint64_t id = r->id;
    r->sink = [this, id](const RequestOutput& o) {
      auto& c = results[id];
      c.tokens.insert(c.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      c.logprobs.insert(c.logprobs.end(), o.new_logprobs.begin(), o.new_logprobs.end());
      for (auto& t : o.new_top_logprobs) c.tops.push_back(t.at(0));
      c.prompt_logprobs_after_tokens |= !o.new_prompt_logprobs.empty() && !c.tokens.empty() &&
                                        c.tokens.size() != o.new_tokens.size();
      c.prompt_logprobs.insert(c.prompt_logprobs.end(), o.new_prompt_logprobs.begin(), o.new_prompt_logprobs.end());
      c.prompt_tops.insert(c.prompt_tops.end(), o.new_prompt_top_logprobs.begin(), o.new_prompt_top_logprobs.end());
      c.prompt_ranks.insert(c.prompt_ranks.end(), o.new_prompt_ranks.begin(), o.new_prompt_ranks.end());
      if (o.finish != FinishReason::None) c.finish = o.finish;
      c.cached = o.cached_tokens;
    };
    sched->validate(*r);
    sched->add(r);
    return r;
  }
  void run() {
    for (int i = 0; i < 100000 && !sched->idle(); ++i) {
      sched->step();
      sched->check_integrity();
    }
    ASSERT_TRUE(sched->idle());
  }
};

std::vector<int32_t> prompt_of(int i, int len) {
  std::vector<int32_t> p;
  for (int k = 0; k < len; ++k) p.push_back((i * 131 + k * 17 + 7) % 512);
  return p;
}

// Every scheduler test runs with and without the overlap schedule (SchedulerOptions::overlap_schedule).
class SchedulerP : public ::testing::TestWithParam<bool> {
 protected:
  SchedulerOptions opts(int64_t max_running = 64, int64_t chunk = 512, bool cache = true) const {
    SchedulerOptions so{max_running, chunk, cache};
    so.overlap_schedule = GetParam();
    return so;
  }
};

}  // namespace

INSTANTIATE_TEST_SUITE_P(Overlap, SchedulerP, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "overlap" : "serial"; });

TEST_P(SchedulerP, BatchingNeverChangesGreedyResults) {
  const int N = 64;
  std::vector<Collected> solo(N);
  {
    Harness h(4096, 16, opts());
    for (int i = 0; i < N; ++i) {
      auto r = h.make(prompt_of(i, 5 + i % 23), 6 + i % 5);
      h.run();
      solo[i] = h.results[r->id];
    }
  }
  Harness h(4096, 16, opts());
  std::vector<std::shared_ptr<Request>> rs;
  for (int i = 0; i < N; ++i) rs.push_back(h.make(prompt_of(i, 5 + i % 23), 6 + i % 5));
  h.run();
  for (int i = 0; i < N; ++i) {
    auto& got = h.results[rs[i]->id];
    EXPECT_EQ(got.tokens, solo[i].tokens) << "request " << i;
    EXPECT_EQ(got.logprobs, solo[i].logprobs) << "request " << i;
    EXPECT_EQ(got.finish, FinishReason::Length);
  }
  EXPECT_GT(h.sched->stats().steps, 0);
  if (GetParam()) EXPECT_GT(h.sched->stats().overlapped_steps, h.sched->stats().steps / 4);
  else EXPECT_EQ(h.sched->stats().overlapped_steps, 0);
}

// The overlap schedule launches step n + 1 before it knows step n's tokens: requests that stop on an eos token in
// step n have a row of n + 1 dropped, requests with penalties or eos bans (min_new_tokens) run one step at a time.
// Every output must equal the serial schedule's, token for token.
TEST(SchedulerOverlap, StopsPenaltiesAndBansMatchTheSerialSchedule) {
  // An eos id that greedy decoding really produces early in several requests.
  std::map<int32_t, int> first_seen;
  {
    Harness h(4096, 16);
    std::vector<std::shared_ptr<Request>> rs;
    for (int i = 0; i < 24; ++i) rs.push_back(h.make(prompt_of(i, 7 + i % 11), 12));
    h.run();
    for (auto& r : rs) {
      const auto& t = h.results[r->id].tokens;
      for (size_t k = 1; k + 2 < t.size(); ++k) first_seen[t[k]]++;
    }
  }
  int32_t eos = -1;
  for (auto& [tok, n] : first_seen)
    if (eos < 0 || n > first_seen[eos]) eos = tok;
  ASSERT_GE(eos, 0);
  // With `blockers`, request 5 (penalized) and request 7 (eos banned for 6 tokens) keep everyone serial while
  // they need it; without, eos stops fall inside overlapped streaks.
  auto run = [&](bool overlap, bool blockers, int64_t& overlapped) {
    SchedulerOptions so;
    so.overlap_schedule = overlap;
    Harness h(4096, 16, so);
    h.runner->set_eos_ids({eos});
    std::vector<std::shared_ptr<Request>> rs;
    for (int i = 0; i < 24; ++i) {
      auto r = h.make(prompt_of(i, 7 + i % 11), 12, i % 3 == 2 ? 0.8f : 0.0f, uint64_t(i));
      if (blockers && i == 5) r->params.repetition_penalty = 1.3f, r->params.max_new_tokens = 4;
      if (blockers && i == 7) r->params.min_new_tokens = 6;
      rs.push_back(r);
    }
    h.run();
    overlapped = h.sched->stats().overlapped_steps;
    std::vector<Collected> out;
    for (auto& r : rs) out.push_back(h.results[r->id]);
    h.sched->flush_prefix_cache();
    EXPECT_EQ(h.sched->stats().kv_pages_used, 0);
    return out;
  };
  for (bool blockers : {false, true}) {
    SCOPED_TRACE(blockers ? "with a penalized and an eos-banned request" : "plain requests");
    int64_t ov_serial = 0, ov = 0;
    const auto serial = run(false, blockers, ov_serial);
    const auto overlapped = run(true, blockers, ov);
    EXPECT_EQ(ov_serial, 0);
    EXPECT_GT(ov, 0);
    int stopped = 0;
    for (size_t i = 0; i < serial.size(); ++i) {
      EXPECT_EQ(overlapped[i].tokens, serial[i].tokens) << "request " << i;
      EXPECT_EQ(overlapped[i].logprobs, serial[i].logprobs) << "request " << i;
      EXPECT_EQ(overlapped[i].finish, serial[i].finish) << "request " << i;
      stopped += serial[i].finish == FinishReason::Stop && serial[i].tokens.size() < 12;
    }
    EXPECT_GE(stopped, 2);  // the eos really ended requests early
    if (blockers) {
      EXPECT_GE(serial[7].tokens.size(), 6u);
    }
  }
}

// Constrained requests (a JSON grammar over a vocabulary whose ids 0-255 are the single bytes) beside plain ones,
// with and without the overlap schedule: every constrained output is a complete document of the schema ended by
// the eos token; every output (greedy or seeded) equals the serial schedule's. Under the overlap schedule the
// constrained requests' steps are launched ahead too, their masks given once the step before is in
// (Executor::complete_launch).
TEST(SchedulerOverlap, JsonConstrainedRequestsFollowTheirGrammar) {
  constexpr int32_t kEos = 300;
  std::vector<std::optional<std::string>> bytes(512);
  for (int b = 0; b < 256; ++b) bytes[size_t(b)] = std::string(1, char(b));
  auto spec = std::make_shared<grammar::ConstraintSpec>();
  spec->schema = grammar::JsonSchema::compile(nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string", "maxLength": 3},
          "b": {"enum": [true, "x", 12]}}, "required": ["n", "s", "b"]})"));
  spec->vocab = std::make_shared<const grammar::TokenVocabulary>(bytes);
  auto run = [&](bool overlap, int64_t& overlapped, int64_t& steps) {
    SchedulerOptions so;
    so.overlap_schedule = overlap;
    Harness h(8192, 16, so);
    h.runner->set_eos_ids({kEos});
    std::vector<std::shared_ptr<Request>> rs;
    for (int i = 0; i < 12; ++i)
      rs.push_back(h.make(prompt_of(i, 5 + i % 7), i % 3 == 0 ? 600 : 10, i % 2 ? 0.9f : 0.0f, uint64_t(i),
                          [&](SamplingParams& p) {
                            if (i % 3 == 0) p.grammar = spec;
                          }));
    h.run();
    overlapped = h.sched->stats().overlapped_steps;
    steps = h.sched->stats().steps;
    std::vector<Collected> out;
    for (auto& r : rs) out.push_back(h.results[r->id]);
    return out;
  };
  int64_t ov_serial = 0, ov = 0, steps_serial = 0, steps = 0;
  const auto serial = run(false, ov_serial, steps_serial);
  const auto overlapped = run(true, ov, steps);
  EXPECT_EQ(ov_serial, 0);
  // Most steps run only the constrained requests (the plain ones end after 10 tokens): launched ahead all the same.
  EXPECT_GT(ov, steps * 3 / 4) << steps << " steps";
  for (size_t i = 0; i < serial.size(); ++i) {
    EXPECT_EQ(overlapped[i].tokens, serial[i].tokens) << "request " << i;
    if (i % 3 != 0) continue;
    for (const auto* c : {&serial[i], &overlapped[i]}) {
      std::string seen;
      for (int32_t t : c->tokens) seen += t < 256 ? std::string(1, char(t)) : "<" + std::to_string(t) + ">";
      ASSERT_EQ(c->finish, FinishReason::Stop) << "request " << i << ": " << nlohmann::json(seen).dump();
      ASSERT_EQ(c->tokens.back(), kEos);
      std::string text;
      for (size_t k = 0; k + 1 < c->tokens.size(); ++k) {
        ASSERT_LT(c->tokens[k], 256) << "request " << i << " token " << k;
        text.push_back(char(c->tokens[k]));
      }
      grammar::JsonMatcher m(spec->schema);
      EXPECT_TRUE(m.feed(text) && m.can_finish()) << "request " << i << ": " << text;
      const auto j = nlohmann::json::parse(text);
      EXPECT_TRUE(j.at("n").is_number() && j.at("s").is_string()) << text;  // (24 digits: past int64)
    }
  }
}

// Prefill-heavy traffic under the overlap schedule: look-ahead steps carry prompt chunks (split over several
// steps by a small chunk budget), admit waiting requests and feed the running step's samples to the requests
// whose prompt it finishes. Outputs must equal the serial schedule's, and nearly every step must be launched
// ahead (with all-decode look-ahead only, the prefill phases run serially).
TEST(SchedulerOverlap, PrefillChunksAndAdmissionsOverlapAndMatchTheSerialSchedule) {
  auto run = [](bool overlap, bool mixed, SchedulerStats& stats) {
    SchedulerOptions so;
    so.max_running_requests = 6;
    so.chunked_prefill_size = 48;
    so.overlap_schedule = overlap;
    so.overlap_mixed_steps = mixed;
    Harness h(8192, 16, so);
    std::vector<std::shared_ptr<Request>> rs;
    for (int i = 0; i < 20; ++i)
      rs.push_back(h.make(prompt_of(i, 9 + (i * 37) % 110), 3 + i % 6, i % 4 == 3 ? 0.7f : 0.0f, uint64_t(i)));
    h.run();
    stats = h.sched->stats();
    std::vector<Collected> out;
    for (auto& r : rs) out.push_back(h.results[r->id]);
    h.sched->flush_prefix_cache();
    EXPECT_EQ(h.sched->stats().kv_pages_used, 0);
    return out;
  };
  SchedulerStats serial_stats, mixed_stats, decode_only_stats;
  const auto serial = run(false, false, serial_stats);
  const auto mixed = run(true, true, mixed_stats);
  const auto decode_only = run(true, false, decode_only_stats);
  for (size_t i = 0; i < serial.size(); ++i) {
    EXPECT_EQ(mixed[i].tokens, serial[i].tokens) << "request " << i;
    EXPECT_EQ(mixed[i].logprobs, serial[i].logprobs) << "request " << i;
    EXPECT_EQ(mixed[i].finish, serial[i].finish) << "request " << i;
    EXPECT_EQ(decode_only[i].tokens, serial[i].tokens) << "request " << i;
    EXPECT_EQ(mixed[i].tokens.size(), size_t(3 + i % 6)) << "request " << i;
  }
  EXPECT_EQ(serial_stats.overlapped_steps, 0);
  // Every step but the first and those after a drained pipeline is launched ahead.
  EXPECT_GE(mixed_stats.overlapped_steps * 10, mixed_stats.steps * 8)
      << mixed_stats.overlapped_steps << " of " << mixed_stats.steps;
  EXPECT_LT(decode_only_stats.overlapped_steps * 2, decode_only_stats.steps)
      << decode_only_stats.overlapped_steps << " of " << decode_only_stats.steps;
}

// The executor contract behind look-ahead steps: ForwardBatch::previous_samples takes token i from sample r of
// the step in flight (any order, any subset) and leaves -1 entries as given; the result equals the same step run
// with those tokens written in. A sample index past the running step's rows is an internal error.
TEST(SchedulerOverlap, PreviousSamplesFeedTheNamedRows) {
  auto run = [](bool look_ahead, std::vector<Sampled>& first, std::vector<Sampled>& second) {
    Harness h(4096, 16);
    ModelRunner& r = *h.runner;
    std::vector<std::vector<int32_t>> pages;
    for (int i = 0; i < 3; ++i) pages.push_back(r.kv().allocator().allocate(2));
    const std::vector<int32_t> p0 = prompt_of(1, 5), p1 = prompt_of(2, 3), p2 = prompt_of(3, 4);
    std::vector<std::mt19937_64> rngs(4);
    std::vector<SampleSpec> specs(2);
    for (size_t i = 0; i < specs.size(); ++i) specs[i].logprob = true, specs[i].rng = &rngs[i];
    // Step A: the prompts of sequences 0 and 1, one logit row each.
    ForwardBatch a;
    for (int t : p0) a.tokens.push_back(t);
    for (int t : p1) a.tokens.push_back(t);
    for (int i = 0; i < 8; ++i) a.positions.push_back(i < 5 ? i : i - 5);
    a.seqs = {{pages[0].data(), 0, 5, 0}, {pages[1].data(), 0, 3, 5}};
    a.logit_rows = {4, 7};
    // Step B: sequence 1's next token (A's row 1), sequence 0's (A's row 0), then sequence 2's prompt.
    ForwardBatch b;
    b.tokens = {0, 0};
    b.positions = {3, 5};
    for (int i = 0; i < 4; ++i) b.tokens.push_back(p2[i]), b.positions.push_back(i);
    b.seqs = {{pages[1].data(), 3, 1, 0}, {pages[0].data(), 5, 1, 1}, {pages[2].data(), 0, 4, 2}};
    b.logit_rows = {0, 1, 5};
    std::vector<SampleSpec> specs_b(3);
    for (size_t i = 0; i < specs_b.size(); ++i) specs_b[i].logprob = true, specs_b[i].rng = &rngs[i + 1];
    if (look_ahead) {
      b.previous_samples = {1, 0, -1, -1, -1, -1};
      r.launch(a, specs);
      r.launch(b, specs_b);
      r.collect(first);
      r.collect(second);
    } else {
      r.step(a, specs, first);
      b.tokens[0] = first[1].token, b.tokens[1] = first[0].token;
      r.step(b, specs_b, second);
    }
  };
  std::vector<Sampled> a1, b1, a2, b2;
  run(true, a1, b1);
  run(false, a2, b2);
  ASSERT_EQ(b1.size(), 3u);
  ASSERT_EQ(b2.size(), 3u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(a1[i].token, a2[i].token);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(b1[i].token, b2[i].token) << "row " << i;
    EXPECT_EQ(b1[i].logprob, b2[i].logprob) << "row " << i;
  }

  Harness h(4096, 16);
  auto pages = h.runner->kv().allocator().allocate(1);
  ForwardBatch one;
  one.tokens = {7};
  one.positions = {0};
  one.seqs = {{pages.data(), 0, 1, 0}};
  one.logit_rows = {0};
  std::mt19937_64 rng;
  std::vector<SampleSpec> spec(1);
  spec[0].rng = &rng;
  h.runner->launch(one, spec);
  ForwardBatch bad = one;
  bad.positions = {1};
  bad.seqs = {{pages.data(), 1, 1, 0}};
  bad.previous_samples = {1};  // the running step has one row
  EXPECT_THROW(h.runner->launch(bad, spec), InternalError);
}

// Prompt logprobs (SamplingParams::prompt_logprob_start): prompt token p's logprob from the logits after tokens
// [0, p), against the same model asked for every logprob of its next token after the prompt [0, p) (top_logprobs =
// the vocabulary); computed in chunks of 7, from 0 and from a later start, after a plain request cached the prompt
// (the cache may serve only the positions before the first scored one), and with more positions than a step's logit
// rows (the CPU executor's 256: the prompt is scored over several steps, as a run in chunks of 7 scores it). The
// outputs stay the plain request's.
TEST_P(SchedulerP, PromptLogprobsMatchTheNextTokenDistribution) {
  const std::vector<int32_t> prompt = prompt_of(3, 40);
  // The reference: every logprob after each prefix, from a request of that prefix; with the whole distribution
  // (the vocabulary is 512), the bounds of the prompt token's rank: 1 + the tokens clearly above it, and 1 + those
  // not clearly below it (ties within float noise may fall either way).
  std::vector<float> want(prompt.size(), 0.0f);
  std::vector<int> rank_lo(prompt.size(), 0), rank_hi(prompt.size(), 0);
  {
    Harness h(4096, 16, opts());
    for (size_t p = 1; p < prompt.size(); ++p) {
      auto r = std::make_shared<Request>();
      r->id = 1000 + p;
      r->prompt.assign(prompt.begin(), prompt.begin() + int64_t(p));
      r->params.max_new_tokens = 1;
      r->params.temperature = 0;
      r->params.top_logprobs = 512;
      const int32_t target = prompt[p];
      float* slot = &want[p];
      int *lo = &rank_lo[p], *hi = &rank_hi[p];
      r->sink = [slot, target, lo, hi](const RequestOutput& o) {
        for (auto& tops : o.new_top_logprobs) {
          for (auto& t : tops)
            if (t.id == target) *slot = t.logprob;
          *lo = *hi = 1;
          for (auto& t : tops) *lo += t.logprob > *slot + 1e-5f, *hi += t.id != target && t.logprob > *slot - 1e-5f;
        }
      };
      h.sched->add(r);
    }
    h.run();
  }
  for (size_t p = 1; p < prompt.size(); ++p) ASSERT_LT(want[p], 0.0f) << "no reference at " << p;

  Harness h(4096, 16, opts(64, 7));
  auto plain = h.make(prompt, 4);
  h.run();
  auto from0 = h.make(prompt, 4, 0, std::nullopt, [](SamplingParams& s) { s.prompt_logprob_start = 0, s.top_logprobs = 3; });
  // vLLM's prompt_logprobs: the prompt's own top n (here 5), the output's none.
  auto own_n = h.make(prompt, 4, 0, std::nullopt, [](SamplingParams& s) { s.prompt_logprob_start = 0, s.prompt_top_logprobs = 5; });
  auto from20 = h.make(prompt, 4, 0, std::nullopt, [](SamplingParams& s) { s.prompt_logprob_start = 20; });
  h.run();
  const auto& a = h.results[from0->id];
  const auto& b = h.results[from20->id];
  ASSERT_EQ(a.prompt_logprobs.size(), prompt.size() - 1);
  ASSERT_EQ(a.prompt_tops.size(), prompt.size() - 1);
  ASSERT_EQ(b.prompt_logprobs.size(), prompt.size() - 20);
  EXPECT_TRUE(b.prompt_tops.empty());
  for (size_t p = 1; p < prompt.size(); ++p) {
    EXPECT_NEAR(a.prompt_logprobs[p - 1], want[p], 1e-4) << "position " << p;
    ASSERT_EQ(a.prompt_tops[p - 1].size(), 3u);
    EXPECT_GE(a.prompt_tops[p - 1][0].logprob, a.prompt_logprobs[p - 1] - 1e-6f) << "position " << p;
    ASSERT_EQ(a.prompt_ranks.size(), prompt.size() - 1);
    EXPECT_GE(a.prompt_ranks[p - 1], rank_lo[p]) << "position " << p;
    EXPECT_LE(a.prompt_ranks[p - 1], rank_hi[p]) << "position " << p;
    if (p >= 20) {
      EXPECT_NEAR(b.prompt_logprobs[p - 20], want[p], 1e-4) << "position " << p;
    }
  }
  const auto& o = h.results[own_n->id];
  ASSERT_EQ(o.prompt_tops.size(), prompt.size() - 1);
  for (size_t p = 1; p < prompt.size(); ++p) {
    ASSERT_EQ(o.prompt_tops[p - 1].size(), 5u) << "position " << p;
    EXPECT_NEAR(o.prompt_tops[p - 1][0].logprob, a.prompt_tops[p - 1][0].logprob, 1e-5) << "position " << p;
    EXPECT_EQ(o.prompt_ranks[p - 1], a.prompt_ranks[p - 1]) << "position " << p;
  }
  EXPECT_TRUE(o.tops.empty());
  // The prefix cache served only what precedes the first scored position (the plain request cached all 40).
  EXPECT_EQ(a.cached, 0);
  EXPECT_EQ(b.cached, 16);  // pages of 16: the whole pages before position 19
  for (auto* c : {&a, &b}) {
    EXPECT_EQ(c->tokens, h.results[plain->id].tokens);
    EXPECT_EQ(c->logprobs, h.results[plain->id].logprobs);
    EXPECT_FALSE(c->prompt_logprobs_after_tokens);
  }

  // More scored positions than a step's logit rows (256 on the CPU), and the prompt only (max_new_tokens 0).
  const std::vector<int32_t> longp = prompt_of(5, 300);
  Harness hl(4096, 16, opts(64, 512));
  auto score_all = [](SamplingParams& s) { s.prompt_logprob_start = 0; };
  auto whole = hl.make(longp, 0, 0, std::nullopt, score_all);
  hl.run();
  Harness hs(4096, 16, opts(64, 7));
  auto small = hs.make(longp, 0, 0, std::nullopt, score_all);
  hs.run();
  const auto& w = hl.results[whole->id];
  EXPECT_TRUE(w.tokens.empty());
  EXPECT_EQ(w.finish, FinishReason::Length);
  ASSERT_EQ(w.prompt_logprobs.size(), 299u);
  ASSERT_EQ(hs.results[small->id].prompt_logprobs.size(), 299u);
  for (size_t i = 0; i < 299; ++i)
    EXPECT_NEAR(w.prompt_logprobs[i], hs.results[small->id].prompt_logprobs[i], 1e-4) << "position " << i + 1;
  EXPECT_GE(hl.sched->stats().steps, 2);
}

TEST_P(SchedulerP, TinyKVCachePreemptsAndStillMatches) {
  const int N = 12;
  std::vector<Collected> solo(N);
  // Every third request also scores its prompt: a preemption must neither repeat nor skip a scored position.
  auto scoring = [](int i) -> std::function<void(SamplingParams&)> {
    if (i % 3 != 0) return nullptr;
    return [](SamplingParams& s) { s.prompt_logprob_start = 0; };
  };
  {
    Harness h(4096, 4, opts());
    for (int i = 0; i < N; ++i) {
      auto r = h.make(prompt_of(i, 20), 20, 0, std::nullopt, scoring(i));
      h.run();
      solo[i] = h.results[r->id];
    }
  }
  // 64 tokens of KV for 12 requests needing 40 each: constant preemption and recomputation.
  Harness h(64, 4, opts(8, 16, true));
  std::vector<std::shared_ptr<Request>> rs;
  for (int i = 0; i < N; ++i) rs.push_back(h.make(prompt_of(i, 20), 20, 0, std::nullopt, scoring(i)));
  h.run();
  for (int i = 0; i < N; ++i) {
    const Collected& got = h.results[rs[i]->id];
    EXPECT_EQ(got.tokens, solo[i].tokens) << "request " << i;
    ASSERT_EQ(got.prompt_logprobs.size(), i % 3 == 0 ? 19u : 0u) << "request " << i;
    for (size_t p = 0; p < got.prompt_logprobs.size(); ++p)
      EXPECT_NEAR(got.prompt_logprobs[p], solo[i].prompt_logprobs[p], 1e-4) << "request " << i << " position " << p + 1;
  }
  EXPECT_GT(h.sched->stats().preemptions, 0);
  EXPECT_EQ(h.sched->stats().kv_pages_used, h.sched->stats().kv_pages_cached);
}

// A request preempted while it scores its prompt (the newest admitted, prompt chunks of one token, while an older
// request's decodes need its pages): re-admitted, the prefix cache serves only what precedes its next scored position
// and every position is scored once, as in a run with room to spare. (Serial: the look-ahead leaves scoring
// requests to the ordinary path anyway, and it times the pages' pressure differently.)
TEST(Scheduler, PromptScoringSurvivesPreemption) {
  auto score = [](SamplingParams& s) { s.prompt_logprob_start = 0; };
  Collected want;
  {
    Harness h(4096, 4);
    auto b = h.make(prompt_of(2, 40), 4, 0, std::nullopt, score);
    h.run();
    want = h.results[b->id];
  }
  Harness h(64, 4, SchedulerOptions{8, 2, true});
  auto a = h.make(prompt_of(1, 8), 40);
  auto b = h.make(prompt_of(2, 40), 4, 0, std::nullopt, score);
  h.run();
  const Collected& got = h.results[b->id];
  EXPECT_GT(h.sched->stats().preemptions, 0);
  EXPECT_GT(got.cached, 0) << "not re-admitted from its own cached prefix: the preemption missed it";
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.prompt_logprobs.size(), 39u);
  for (size_t p = 0; p < 39; ++p) EXPECT_NEAR(got.prompt_logprobs[p], want.prompt_logprobs[p], 1e-4) << "position " << p + 1;
  EXPECT_EQ(h.results[a->id].tokens.size(), 40u);
}

TEST_P(SchedulerP, PrefixCacheHitSkipsPrefillAndKeepsResults) {
  Harness h(4096, 4, opts());
  auto p = prompt_of(3, 30);
  auto a = h.make(p, 8);
  h.run();
  auto b = h.make(p, 8);
  h.run();
  EXPECT_EQ(h.results[a->id].cached, 0);
  EXPECT_EQ(h.results[b->id].cached, 28);  // whole pages, leaving the last prompt token to compute
  EXPECT_EQ(h.results[a->id].tokens, h.results[b->id].tokens);
  EXPECT_EQ(h.results[a->id].logprobs, h.results[b->id].logprobs);
  EXPECT_GT(h.sched->flush_prefix_cache(), 0);
  EXPECT_EQ(h.sched->stats().kv_pages_used, 0);
}

// A running request's computed prompt pages join the prefix cache while it runs: a request arriving later with the
// same prompt (and a suffix of its own) reuses them before the first one finishes, and computes what it computes
// alone.
TEST_P(SchedulerP, PromptPagesAreSharedWhileTheirRequestRuns) {
  const std::vector<int32_t> p = prompt_of(5, 30);
  std::vector<int32_t> q = p;
  q.insert(q.end(), {11, 12, 13, 14, 15});
  Collected alone;
  {
    Harness h(4096, 4, opts(64, 512, false));
    auto b = h.make(q, 6);
    h.run();
    alone = h.results[b->id];
  }
  Harness h(4096, 4, opts());
  auto a = h.make(p, 40);
  for (int i = 0; i < 4; ++i) {  // a's prompt computed, a decoding
    h.sched->step();
    h.sched->check_integrity();
  }
  ASSERT_TRUE(h.results[a->id].finish == FinishReason::None);
  auto b = h.make(q, 6);
  h.run();
  EXPECT_EQ(h.results[b->id].cached, 28);  // a's 7 full prompt pages
  EXPECT_EQ(h.results[b->id].tokens, alone.tokens);
  EXPECT_EQ(h.results[b->id].logprobs, alone.logprobs);
  EXPECT_EQ(h.results[a->id].finish, FinishReason::Length);
  EXPECT_GT(h.sched->flush_prefix_cache(), 0);
  EXPECT_EQ(h.sched->stats().kv_pages_used, 0);
}

// The n choices of one request (or any requests that arrive together with a long common prompt) prefill the prompt
// once: the first computes it, the others wait for that prefill and then take its pages from the cache. Requests
// sharing less than 32 tokens are not held back.
TEST_P(SchedulerP, RequestsArrivingTogetherPrefillTheirCommonPromptOnce) {
  const std::vector<int32_t> p = prompt_of(7, 50);
  Harness h(4096, 4, opts());
  std::vector<std::shared_ptr<Request>> rs;
  for (int i = 0; i < 4; ++i) rs.push_back(h.make(p, 5));
  std::vector<int32_t> other = prompt_of(8, 50);
  other[0] = p[0];  // one token in common: no reason to wait
  auto o = h.make(other, 5);
  h.run();
  EXPECT_EQ(h.results[rs[0]->id].cached, 0);
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(h.results[rs[i]->id].cached, 48) << "choice " << i;  // 12 full pages, the last prompt token computed
    EXPECT_EQ(h.results[rs[i]->id].tokens, h.results[rs[0]->id].tokens) << "choice " << i;
  }
  EXPECT_EQ(h.results[o->id].cached, 0);
  EXPECT_EQ(h.sched->stats().cached_prompt_tokens, 3 * 48);
  EXPECT_GT(h.sched->flush_prefix_cache(), 0);
  EXPECT_EQ(h.sched->stats().kv_pages_used, 0);
}

TEST_P(SchedulerP, DisabledPrefixCacheFreesEverything) {
  Harness h(4096, 4, opts(64, 512, false));
  auto p = prompt_of(3, 30);
  h.make(p, 8);
  h.run();
  auto b = h.make(p, 8);
  h.run();
  EXPECT_EQ(h.results[b->id].cached, 0);
  EXPECT_EQ(h.sched->stats().kv_pages_used, 0);
}

TEST_P(SchedulerP, SameSeedSameSampleAloneOrBatched) {
  Collected alone;
  {
    Harness h(4096, 16, opts());
    auto r = h.make(prompt_of(1, 9), 12, 1.0f, 1234);
    h.run();
    alone = h.results[r->id];
  }
  Harness h(4096, 16, opts());
  std::vector<std::shared_ptr<Request>> rs;
  for (int i = 0; i < 8; ++i) rs.push_back(h.make(prompt_of(i == 3 ? 1 : i + 10, 9), 12, 1.0f, i == 3 ? 1234 : i));
  h.run();
  EXPECT_EQ(h.results[rs[3]->id].tokens, alone.tokens);
}

TEST_P(SchedulerP, AbortFreesPagesAndReportsAbort) {
  Harness h(4096, 4, opts());
  auto a = h.make(prompt_of(1, 10), 1000);
  auto b = h.make(prompt_of(2, 10), 5);
  for (int i = 0; i < 3; ++i) h.sched->step();
  a->abort_requested = true;
  h.run();
  EXPECT_EQ(h.results[a->id].finish, FinishReason::Abort);
  EXPECT_EQ(h.results[b->id].finish, FinishReason::Length);
  EXPECT_EQ(h.results[b->id].tokens.size(), 5u);
  EXPECT_EQ(h.sched->stats().running, 0);
  h.sched->flush_prefix_cache();
  EXPECT_EQ(h.sched->stats().kv_pages_used, 0);
}

TEST(Scheduler, ValidationErrors) {
  Harness h(64, 4);
  auto bad = [&](std::vector<int32_t> p) {
    Request r;
    r.prompt = std::move(p);
    try {
      h.sched->validate(r);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(bad({}).find("empty"), std::string::npos);
  EXPECT_NE(bad({1, 600}).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(bad(std::vector<int32_t>(100, 1)).find("KV cache"), std::string::npos);
}

// The engine thread with and without the overlap schedule (the server's default is on).
class EngineP : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Overlap, EngineP, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "overlap" : "serial"; });

TEST_P(EngineP, ConcurrentSubmissionsFromManyThreads) {
  RunnerOptions ro{4096, 16, 512, 2};
  auto runner = std::make_unique<ModelRunner>(load_model(tiny_model()), ro);
  runner->set_eos_ids({});
  SchedulerOptions so;
  so.overlap_schedule = GetParam();
  Engine engine(std::move(runner), so);
  const int N = 32;
  std::vector<std::promise<std::vector<int32_t>>> done(N);
  std::vector<std::thread> ts;
  for (int i = 0; i < N; ++i)
    ts.emplace_back([&, i] {
      auto r = std::make_shared<Request>();
      r->id = uint64_t(i + 1);
      r->prompt = prompt_of(i, 8);
      r->params.max_new_tokens = 4;
      r->params.temperature = 0;
      auto acc = std::make_shared<std::vector<int32_t>>();
      r->sink = [acc, &done, i](const RequestOutput& o) {
        acc->insert(acc->end(), o.new_tokens.begin(), o.new_tokens.end());
        if (o.finish != FinishReason::None) done[i].set_value(*acc);
      };
      engine.submit(r);
    });
  for (auto& t : ts) t.join();
  // The same prompts through a scheduler stepped by hand, one step at a time: greedy outputs must agree.
  Harness h(4096, 16);
  std::vector<std::shared_ptr<Request>> ref;
  for (int i = 0; i < N; ++i) ref.push_back(h.make(prompt_of(i, 8), 4));
  h.run();
  for (int i = 0; i < N; ++i) {
    auto f = done[i].get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    const std::vector<int32_t> got = f.get();
    EXPECT_EQ(got.size(), 4u);
    EXPECT_EQ(got, h.results[ref[i]->id].tokens) << "request " << i;
  }
  EXPECT_FALSE(engine.failed());
}

// The step trace (MOESERVE_STEP_TRACE): one CSV line a collected step whose decodes, prompt tokens and samples add up
// to what the requests computed, with launch and collect times in order.
TEST_P(SchedulerP, StepTraceAccountsForEveryToken) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("moeserve_step_trace_" + std::to_string(::getpid()) + ".csv")).string();
  const int N = 5, P = 37, M = 4;
  {
    SchedulerOptions so = opts(64, 64);  // 64-token chunks: prompts span several steps
    so.step_trace_path = path;
    Harness h(4096, 16, so);
    for (int i = 0; i < N; ++i) h.make(prompt_of(i, P), M);
    h.run();
  }  // the scheduler closes the file
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line, "launched_s,launch_ms,collected_s,decodes,prompt_tokens,prompt_seqs,sampled,running,waiting");
  int64_t decodes = 0, prompt_tokens = 0, sampled = 0, steps = 0;
  double last_collected = 0;
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    std::vector<double> f;
    for (std::string cell; std::getline(ss, cell, ',');) f.push_back(std::stod(cell));
    ASSERT_EQ(f.size(), 9u) << line;
    EXPECT_GE(f[1], 0.0) << line;
    // launched, then collected; each of the three cells is rounded to the microsecond when printed (up to 1.5 us in all)
    EXPECT_LE(f[0] + f[1] * 1e-3, f[2] + 2e-6) << line;
    EXPECT_GE(f[2], last_collected) << line;
    last_collected = f[2];
    decodes += int64_t(f[3]), prompt_tokens += int64_t(f[4]), sampled += int64_t(f[6]);
    ++steps;
  }
  std::filesystem::remove(path);
  EXPECT_GT(steps, 1);
  EXPECT_EQ(prompt_tokens, N * P);
  // The first token of each request comes from its last prompt chunk, the other M - 1 from decode steps.
  EXPECT_EQ(decodes, N * (M - 1));
  EXPECT_EQ(sampled, N * M);
}

// A KV capacity past the machine's memory is refused before the pool is allocated (it sat allocating for as long as the host allowed,
// or past int64 its byte count overflowed and std::bad_alloc was all the operator saw).
TEST(ModelRunnerKv, CapacityPastTheMachinesMemoryIsAClearError) {
  for (int64_t tokens : {int64_t(1) << 40, int64_t(9000000000000000000)}) {
    try {
      ModelRunner r(load_model(tiny_model()), RunnerOptions{tokens, 16, 512, 2});
      FAIL() << tokens << " tokens were accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("--max-total-tokens"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("GiB of memory"), std::string::npos) << e.what();
    }
  }
}

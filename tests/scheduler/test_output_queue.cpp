// The delivery thread: every request's outputs reach its sink in order, flush() waits for what was pushed, a
// sink that throws has its request marked for abort while the others are still delivered, and destruction
// delivers what is queued.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "scheduler/scheduler.h"

using namespace moeserve;

namespace {

std::shared_ptr<Request> request_with_sink(uint64_t id, std::vector<int32_t>& seen, std::mutex& mu) {
  auto r = std::make_shared<Request>();
  r->id = id;
  r->sink = [&seen, &mu](const RequestOutput& o) {
    std::lock_guard<std::mutex> lk(mu);
    for (int32_t t : o.new_tokens) seen.push_back(t);
  };
  return r;
}

RequestOutput token(int32_t t) {
  RequestOutput o;
  o.new_tokens = {t};
  return o;
}

}  // namespace

TEST(OutputQueue, DeliversEachRequestInOrderAndFlushWaits) {
  std::mutex mu;
  std::vector<int32_t> a, b;
  auto ra = request_with_sink(1, a, mu), rb = request_with_sink(2, b, mu);
  OutputQueue q;
  for (int32_t i = 0; i < 500; ++i) q.push({{ra, token(i)}, {rb, token(1000 + i)}});
  q.flush();
  std::lock_guard<std::mutex> lk(mu);
  ASSERT_EQ(a.size(), 500u);
  ASSERT_EQ(b.size(), 500u);
  for (int32_t i = 0; i < 500; ++i) {
    EXPECT_EQ(a[size_t(i)], i);
    EXPECT_EQ(b[size_t(i)], 1000 + i);
  }
  EXPECT_GE(q.seconds(), 0.0);
}

TEST(OutputQueue, ThrowingSinkAbortsOnlyItsRequest) {
  std::mutex mu;
  std::vector<int32_t> good_seen;
  auto good = request_with_sink(1, good_seen, mu);
  auto bad = std::make_shared<Request>();
  bad->id = 2;
  bad->sink = [](const RequestOutput&) { throw std::runtime_error("broken handler"); };
  OutputQueue q;
  q.push({{bad, token(1)}, {good, token(7)}});
  q.flush();
  EXPECT_TRUE(bad->abort_requested.load());
  EXPECT_FALSE(good->abort_requested.load());
  std::lock_guard<std::mutex> lk(mu);
  EXPECT_EQ(good_seen, std::vector<int32_t>({7}));
}

TEST(OutputQueue, DestructionDeliversWhatIsQueued) {
  std::atomic<int> delivered{0};
  auto r = std::make_shared<Request>();
  r->sink = [&delivered](const RequestOutput&) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    ++delivered;
  };
  {
    OutputQueue q;
    for (int i = 0; i < 50; ++i) q.push({{r, token(i)}});
  }
  EXPECT_EQ(delivered.load(), 50);
}

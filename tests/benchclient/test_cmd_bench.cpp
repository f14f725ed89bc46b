// The `moeserve bench` command line, end to end against the fake server.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fake_server.h"

namespace moeserve::cli {
int cmd_bench(const std::vector<std::string>& args);
}

namespace moeserve::bench {
namespace {

TEST(CmdBench, RunsFromFlagsAndAppendsJson) {
  testing::FakeServerOptions o;
  o.ttft_s = 0.005;
  o.itl_s = 0.002;
  testing::FakeServer server(o);
  std::string out = ::testing::TempDir() + "/cmd_bench_" + std::to_string(::getpid()) + ".jsonl";
  std::remove(out.c_str());
  std::vector<std::string> args = {
      "--backend", "sglang", "--base-url", fmt::format("http://127.0.0.1:{}", server.port()), "--dataset-name",
      "random", "--num-prompts", "6", "--random-input-len", "8", "--random-output-len", "4", "--random-range-ratio",
      "1", "--request-rate", "inf", "--max-concurrency", "2", "--warmup-requests", "2", "--disable-tqdm",
      "--output-file", out, "--seed", "3"};
  EXPECT_EQ(cli::cmd_bench(args), 0);
  args.push_back("--request_rate=200");  // SGLang spelling with underscores
  args.push_back("--dataset-name=random-ids");
  args.push_back("--tokenizer=/models/x");  // accepted, ignored
  EXPECT_EQ(cli::cmd_bench(args), 0);
  std::ifstream in(out);
  std::string line;
  std::vector<nlohmann::json> lines;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["completed"], 6);
  EXPECT_EQ(lines[0]["total_output_tokens"], 24);
  EXPECT_EQ(lines[0]["request_rate"], "inf");
  EXPECT_EQ(lines[1]["request_rate"], 200.0);
  EXPECT_EQ(server.generation_requests(), 2 * (6 + 2));
  std::remove(out.c_str());
}

TEST(CmdBench, HelpAndBadFlags) {
  EXPECT_EQ(cli::cmd_bench({"--help"}), 0);
  EXPECT_THROW(cli::cmd_bench({"--backend", "tgi"}), UserError);
  EXPECT_THROW(cli::cmd_bench({"--request-rate", "0"}), UserError);
  EXPECT_THROW(cli::cmd_bench({"--num-prompt", "3"}), UserError);
  EXPECT_THROW(cli::cmd_bench({"--dataset-name", "sharegpt", "--port", "1", "--warmup-requests", "0"}), UserError);
}

}  // namespace
}  // namespace moeserve::bench

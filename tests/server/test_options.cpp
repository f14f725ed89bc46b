// serve's flags as the server resolves them: the CUDA graph sizes (--cuda-graph-bs bounds each size, and its largest
// sets --cuda-graph-max-bs unless that flag was given, which the sizes may then not exceed).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/flags.h"
#include "core/error.h"
#include "server/options.h"

namespace moeserve::server {
namespace {

// Parses serve's flags and resolves them as `moeserve serve` does; the UserError's message, or "" when accepted.
std::string resolve(const std::vector<std::string>& args, ServeOptions& o) {
  cli::FlagSet f("serve", "test");
  register_serve_flags(f, o);
  try {
    f.parse(args);
    validate_serve_options(o, f.was_set("cuda-graph-max-bs"));
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(ServeOptions, CudaGraphSizesSetTheLargestCapturedBatch) {
  ServeOptions o;
  EXPECT_EQ(resolve({}, o), "");
  EXPECT_EQ(o.cuda_graph_max_bs, 160);  // the default when neither flag is given
  ServeOptions a;
  EXPECT_EQ(resolve({"--cuda-graph-bs", "1,2,4,200"}, a), "");
  EXPECT_EQ(a.cuda_graph_max_bs, 200);  // as SGLang: the list decides (200 was dropped silently before)
  ServeOptions b;
  EXPECT_EQ(resolve({"--cuda-graph-bs", "1,2,4", "--cuda-graph-max-bs", "64"}, b), "");
  EXPECT_EQ(b.cuda_graph_max_bs, 64);
  ServeOptions c;
  EXPECT_NE(resolve({"--cuda-graph-bs", "1,128", "--cuda-graph-max-bs", "64"}, c).find("larger than --cuda-graph-max-bs"),
            std::string::npos);
  for (const char* bad : {"0", "1,-2", "5000", "4294967297"}) {
    ServeOptions d;
    EXPECT_NE(resolve({"--cuda-graph-bs", bad}, d).find("--cuda-graph-bs: must be between 1 and 4096"),
              std::string::npos)
        << bad;
  }
}

// Sizes the engine holds in int (the CUDA executor's step limits) or that no machine could hold are refused at the
// flag (--chunked-prefill-size 4294967296 became 0 tokens a step on the GPU).
TEST(ServeOptions, StepAndCacheSizesAreBounded) {
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--chunked-prefill-size", "4294967296"}, {"--max-running-requests", "4294967297"},
           {"--context-length", "9000000000000000000"}, {"--max-total-tokens", "9000000000000000000"}}) {
    ServeOptions o;
    EXPECT_NE(resolve({flag, value}, o).find(flag + ": must be between 0 and"), std::string::npos) << flag;
  }
  ServeOptions o;
  EXPECT_EQ(resolve({"--chunked-prefill-size", "16384", "--max-running-requests", "1024"}, o), "");
  EXPECT_EQ(o.chunked_prefill_size, 16384);
}

}  // namespace
}  // namespace moeserve::server

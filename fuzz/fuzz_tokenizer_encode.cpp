// libFuzzer target: tokenizer_encode on the real Qwen3 tokenizer (see fuzz_checks.h for the input layout).
#include "fuzz_main.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  moeserve::fuzz::qwen3_tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moeserve::fuzz::run_or_abort("tokenizer_encode", [&] {
    moeserve::fuzz::check_tokenizer_encode(moeserve::fuzz::qwen3_tokenizer(), moeserve::fuzz::as_view(data, size));
  });
  return 0;
}

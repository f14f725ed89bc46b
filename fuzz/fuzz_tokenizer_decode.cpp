// libFuzzer target: tokenizer_decode on the real Qwen3 tokenizer (see fuzz_checks.h for the input layout).
#include "fuzz_main.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  moeserve::fuzz::qwen3_tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moeserve::fuzz::run_or_abort("tokenizer_decode", [&] {
    moeserve::fuzz::check_tokenizer_decode(moeserve::fuzz::qwen3_tokenizer(), moeserve::fuzz::as_view(data, size));
  });
  return 0;
}

// libFuzzer target: reasoning (see fuzz_checks.h for the input layout).
#include "fuzz_main.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moeserve::fuzz::run_or_abort("reasoning", [&] { moeserve::fuzz::check_reasoning(moeserve::fuzz::as_view(data, size)); });
  return 0;
}

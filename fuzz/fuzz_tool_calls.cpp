// libFuzzer target: tool_calls (see fuzz_checks.h for the input layout).
#include "fuzz_main.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moeserve::fuzz::run_or_abort("tool_calls", [&] { moeserve::fuzz::check_tool_calls(moeserve::fuzz::as_view(data, size)); });
  return 0;
}

// libFuzzer target: sglang_event (see fuzz_bench_checks.h for the input layout).
#include "fuzz_bench_checks.h"
#include "fuzz_main.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moeserve::fuzz::run_or_abort("sglang_event", [&] { moeserve::fuzz::check_sglang_event(moeserve::fuzz::as_view(data, size)); });
  return 0;
}

// libFuzzer target: safetensors (see fuzz_safetensors_checks.h for the input layout).
#include "fuzz_main.h"
#include "fuzz_safetensors_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moeserve::fuzz::run_or_abort("safetensors",
                               [&] { moeserve::fuzz::check_safetensors(moeserve::fuzz::as_view(data, size)); });
  return 0;
}

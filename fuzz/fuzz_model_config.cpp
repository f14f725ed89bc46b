// libFuzzer target: model_config (see fuzz_config_checks.h for the input layout).
#include "fuzz_config_checks.h"
#include "fuzz_main.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moeserve::fuzz::run_or_abort("model_config",
                               [&] { moeserve::fuzz::check_model_config(moeserve::fuzz::as_view(data, size)); });
  return 0;
}

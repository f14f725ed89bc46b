// libFuzzer target: http_request (see fuzz_http_checks.h for the input layout).
#include "fuzz_http_checks.h"
#include "fuzz_main.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moeserve::fuzz::run_or_abort("http_request", [&] { moeserve::fuzz::check_http_request(moeserve::fuzz::as_view(data, size)); });
  return 0;
}

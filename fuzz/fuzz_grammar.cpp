// libFuzzer target: grammar (see fuzz_grammar_checks.h for the input layout).
#include "fuzz_grammar_checks.h"
#include "fuzz_main.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moeserve::fuzz::run_or_abort("grammar", [&] { moeserve::fuzz::check_grammar(moeserve::fuzz::as_view(data, size)); });
  return 0;
}

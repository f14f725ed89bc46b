// A fast path for SGLang /generate stream events. Their "text" is cumulative, so over a 1,000-token answer the
// client receives O(n^2) bytes; building a JSON DOM for each event (~50 us for 2.5 KB) would make the
// benchmark's single I/O thread the bottleneck. This skims one event in a single pass without allocating and
// pulls out only what the measurement needs. It declines (returns false) on anything it does not handle --
// malformed JSON as RFC 8259 defines it (control characters, ill-formed UTF-8, bad escapes, unpaired surrogates,
// leading zeros, numbers past a double: what nlohmann::json refuses), a key with an escape, an "error", a non-null
// finish_reason (the last event; it may be an abort) -- and the caller then uses the full parser, which handles and
// reports every case. The sglang_event fuzz target checks that an accepted event reads the same in both.
#pragma once

#include <cstdint>
#include <string_view>

namespace moeserve::bench {

struct SglangEventFields {
  int64_t text_bytes = -1;         // decoded UTF-8 length of top-level "text"; -1 if absent or not a string
  int64_t completion_tokens = -1;  // meta_info.completion_tokens; -1 if absent
  int64_t prompt_tokens = -1;      // meta_info.prompt_tokens; -1 if absent
};

bool skim_sglang_event(std::string_view json, SglangEventFields& out);

}  // namespace moeserve::bench

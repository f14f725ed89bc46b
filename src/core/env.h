// Engine switches read from the environment: kill switches and A/B experiments of the CUDA backend
// (MOESERVE_PDL, MOESERVE_ATTN_FUSED_IN, ...). Settings an operator is meant to use are CLI flags, not these.
// A value that does not parse never stops the engine: a warning names the variable, the value and what it
// accepts, and the default is used.
#pragma once

#include <optional>
#include <string_view>

namespace moeserve {

// "1", "true", "on", "yes" -> true; "0", "false", "off", "no" -> false (any case); anything else: nullopt.
std::optional<bool> parse_env_flag(std::string_view value);
// A decimal integer (optional sign, nothing after it) within [lo, hi]; anything else: nullopt.
std::optional<long> parse_env_int(std::string_view value, long lo, long hi);

// Unset or empty: fallback. Otherwise the parsed value, or fallback with a warning when it does not parse.
bool env_flag(const char* name, bool fallback);
long env_int(const char* name, long fallback, long lo, long hi);

}  // namespace moeserve

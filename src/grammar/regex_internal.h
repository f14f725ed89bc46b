// The regular-expression grammar's internals shared by its compiler's two halves: the byte NFA that
// regex_compile.cpp builds from the pattern, and the minimal DFA that regex_dfa.cpp makes of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "grammar/regex_grammar.h"

namespace moeserve::grammar::regex_detail {

// The length of the valid UTF-8 sequence at s[i] (its code point in cp), or 0 if there is none (overlong forms,
// surrogates and code points above U+10FFFF are not valid).
int decode_utf8(std::string_view s, size_t i, uint32_t& cp);
// Writes the UTF-8 of code point cp (at most U+10FFFF) to out; returns its length (1-4).
int encode_utf8(uint32_t cp, uint8_t* out);

// A Thompson NFA state over bytes.
struct NState {
  enum Kind : uint8_t { kEps, kByte, kMatch };
  int32_t out = -1, out2 = -1;  // kEps: up to two epsilon edges; kByte: out on a byte in lo..hi
  uint8_t lo = 0, hi = 0;
  Kind kind = kEps;
};

struct Nfa {
  std::vector<NState> st;
  int32_t start = -1, match = -1;  // match: the one kMatch state
};

// The minimal DFA of the NFA's language over byte equivalence classes: live states only (start 0, dead -1).
// UserError where the language is empty or beyond the bounds (kMaxRegexStates, the construction's work budget).
Regex::Dfa build_dfa(const Nfa& nfa);

}  // namespace moeserve::grammar::regex_detail

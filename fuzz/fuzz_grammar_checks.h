// The grammar fuzz target's check: the constrained-decoding compilers on text a client sends (grammar/): an EBNF
// grammar, a regular expression or a JSON schema, then a matcher walked over bytes of the input itself.
//
// Input layout: byte 0 selects the compiler (% 3: 0 EBNF, 1 regex, 2 JSON schema, parsed from the rest as JSON);
// the rest is the grammar.
//
// What must hold: only a moeserve::UserError escapes a compile; a compiled grammar's matcher accepts a byte iff it
// moves (feed is exact: refusing leaves the state as it was), and whatever it accepted it accepts again from a copy.
#pragma once

#include <string_view>

#include "core/json_depth.h"
#include "fuzz_checks.h"
#include "grammar/ebnf.h"
#include "grammar/json_grammar.h"
#include "grammar/regex_grammar.h"

namespace moeserve::fuzz {

template <class Matcher>
void walk_matcher(Matcher m, std::string_view bytes) {
  const Matcher start = m;
  std::string taken;
  for (const char c : bytes)  // (a refused byte must leave the state as it was: the replay below checks it)
    if (m.feed(std::string_view(&c, 1))) taken.push_back(c);
  Matcher again = start;
  FUZZ_CHECK(again.feed(taken), "the {} bytes a matcher took one at a time are refused together", taken.size());
  FUZZ_CHECK(again.can_finish() == m.can_finish(), "two walks over the same bytes end in different states");
}

inline void check_grammar(std::string_view d) {
  if (d.empty()) return;
  const int kind = static_cast<unsigned char>(d[0]) % 3;
  const std::string_view text = d.substr(1);
  try {
    if (kind == 0) {
      walk_matcher(grammar::RegexMatcher(grammar::compile_ebnf(text)), text);
    } else if (kind == 1) {
      walk_matcher(grammar::RegexMatcher(grammar::Regex::compile(text)), text);
    } else {
      if (json_nesting_exceeds(text, 64)) return;  // (the server refuses deeper bodies at its edge)
      const auto j = nlohmann::ordered_json::parse(text, nullptr, false);
      if (j.is_discarded()) return;
      walk_matcher(grammar::JsonMatcher(grammar::JsonSchema::compile(j)), text);
    }
  } catch (const UserError&) {
  }
}

}  // namespace moeserve::fuzz

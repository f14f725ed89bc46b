// Tokenizer with jinja2's exact whitespace rules for trim_blocks=True, lstrip_blocks=True.
//
// Byte-for-byte compatibility depends on the lexer more than anything else: which newline a block tag eats,
// which indentation lstrip_blocks removes, and how {%- -%} strip. The rules below follow jinja2 3.1's
// lexer (its root regex, OptionalLStrip and the "line starting" state) rather than a simplified reading.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moeserve::tpl {

enum class TokType { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  TokType type = TokType::Eof;
  std::string value;  // data text, name, decoded string literal, or operator spelling
  int line = 1;
  int64_t ival = 0;
  double fval = 0;
};

// Throws UserError("chat template syntax error at line N: ...") on malformed input.
std::vector<Token> tokenize(const std::string& source);

const char* describe(TokType t);

}  // namespace moeserve::tpl

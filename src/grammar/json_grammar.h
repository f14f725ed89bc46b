// Constrained decoding's JSON grammar: a JSON Schema (the subset below) compiled once per request, and a
// byte-level matcher that says which byte strings may come next. grammar/token_mask.h turns a matcher state
// into the set of vocabulary tokens allowed at a step.
//
// Supported schema keywords: type (a name or a list of names: object, array, string, integer, number, boolean,
// null), properties, required, additionalProperties (false, true or a schema), items (a schema), minItems,
// maxItems, minLength, maxLength (in code points), pattern, enum, const, anyOf, oneOf (as anyOf), allOf of one
// schema, $ref to "#", "#/$defs/NAME" or "#/definitions/NAME" (recursion allowed), $defs / definitions; format on
// strings (below). Annotations are ignored: title, description, default, examples, $schema, $id, $comment, format
// (other than below), deprecated, readOnly, writeOnly, contentMediaType, contentEncoding, discriminator, strict.
// Any other keyword (minimum, maximum, multipleOf, uniqueItems, prefixItems, patternProperties, not,
// if/then/else, ...) is a UserError that names it: a constraint we cannot enforce is refused, never silently
// dropped.
//
// pattern (on a string schema; like minLength it implies "type": "string" when there is no type): the string's
// VALUE - its code points after JSON escapes (\n, \", \u00e9, surrogate pairs) are decoded - must match, in the
// syntax of grammar/regex_grammar.h (ASCII \d \w \s; `.` excludes only \n). As in ECMAScript (JSON Schema's
// dialect) the pattern is searched, not implicitly anchored: each top-level alternative that starts with ^ is
// anchored at the value's start, one that ends with an unescaped $ at its end, and [\s\S]* (any code points)
// fills each side that is not - "abc" means "contains abc", "^a+" "starts with a+", "^\d+$" "only digits",
// "^a|b$" "starts with a or ends with b". ^ or $ anywhere else (inside a group, mid-pattern: "(^a)", "a$|b" is
// fine but "a^b" is not) is a UserError, as is whatever the regex compiler refuses (backreferences, lookaround,
// ...). With minLength / maxLength both must hold, exactly: a string schema whose pattern no string within its
// length bounds matches (pattern "^a{5}$" with maxLength 3) is treated like a `false` schema - pruned where it is
// optional (an anyOf branch, an optional property), a UserError ("no JSON value satisfies") at the root or where
// required; a pattern with length bounds whose DFA states times min(maxLength, minLength + states) exceeds 2^26 is
// a UserError. An enum / const value whose string does not match is dropped, as other values failing their schema
// are. A string with a pattern never takes the plain-string fast path (in_plain_string() false).
//
// format (only where the schema compiles a string and has no pattern of its own; a format on a schema of no
// string type, or without "type" and other string keywords, stays an annotation), as whole-match patterns:
//   date       \d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])            (no per-month day check)
//   time       (?:[01]\d|2[0-3]):[0-5]\d:(?:[0-5]\d|60)(?:\.\d+)?(?:[Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)   (RFC 3339)
//   date-time  the date, [Tt], the time
//   uuid       [0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}
//   email      [^@\s]+@[^@\s]+\.[^@\s]+
//   ipv4       OCTET(?:\.OCTET){3} with OCTET = (?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d) (no leading zeros)
//   hostname   LABEL(?:\.LABEL)* with LABEL = [A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])? (the 253-byte total
//              is not checked)
// Other formats (ipv6, uri, duration, regex, ...) are ignored annotations, as JSON Schema allows.
//
// What the matcher accepts (as xgrammar / vLLM / SGLang do in their default strict mode):
//  - an object's properties in the schema's order; each required one present, optional ones may be skipped;
//    no other keys when `properties` is given (additionalProperties counts only for an object without
//    `properties`: then any keys, each value matching additionalProperties' schema, or any JSON value when it is
//    true or absent); a free-form object's keys are not checked for duplicates;
//  - a schema without `type`: the type its keywords imply (properties / required / additionalProperties: object;
//    items / minItems / maxItems: array; minLength / maxLength: string), else, with only annotations, any JSON
//    value; enum / const keep the values that also satisfy the rest of the schema; parts no value can satisfy are
//    pruned at compile time (an optional property or anyOf branch is never offered; an unsatisfiable root is a
//    UserError), so every prefix the matcher accepts can still be completed;
//  - whitespace: at most kMaxWhitespaceRun bytes (' ', '\n', '\t', '\r') in a row between tokens of the JSON
//    text and before the root value, with at most one line break ("\n", "\r" or "\r\n") in a run - pretty
//    printing fits, blank lines do not (a model unsure of the next token could otherwise fill its budget with
//    them); none inside numbers or literals, none after the root value;
//  - integers and numbers in JSON's syntax, at most kMaxNumberDigits digits in each of the integer part, the
//    fraction and the exponent (so generation cannot run away inside a number); integer: no fraction, no exponent;
//  - strings: valid UTF-8 (a multi-byte character may be split across tokens), escapes \" \\ \/ \b \f \n \r \t
//    \uXXXX (surrogates paired), no raw control characters (< 0x20); minLength / maxLength count code points
//    (an escape is one, a surrogate pair one); with a pattern, every byte keeps some completion of the value that
//    matches within the length bounds (inside an escape: some completion of the escape whose code point does),
//    and the closing quote comes only where the value matches;
//  - enum / const: the values' compact JSON texts (nlohmann's dump()), as literals;
//  - at most kMaxAlternatives alternatives live at once (a byte that would open more is refused).
// A schema of more than kMaxSchemaNodes subschemas is a UserError.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace moeserve::grammar {

constexpr int kMaxWhitespaceRun = 32;
constexpr int kMaxNumberDigits = 24;
// Bounds that keep a request's grammar from slowing the engine: subschemas a schema compiles to (a UserError
// above), and live alternatives (anyOf branches still open) after a byte (the byte is refused above).
constexpr int kMaxSchemaNodes = 4096;
constexpr int kMaxAlternatives = 64;

struct SchemaNode;  // json_grammar.cpp

// An immutable compiled schema, shared by the matchers of a request (and across requests if the caller likes).
class JsonSchema {
 public:
  // UserError for an unsupported keyword (named, with its JSON pointer), a bad value (e.g. "type": 3), an
  // unresolvable $ref, or a schema no JSON value can satisfy at the top level where that is obvious.
  // ignore_unsupported: an unsupported keyword is skipped as an annotation instead (the grammar then allows more
  // than the schema: for schemas the client did not write as a constraint, such as a tool's parameters).
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::ordered_json& schema,
                                                   bool ignore_unsupported = false);
  // OpenAI's response_format {"type": "json_object"}: any JSON object.
  static std::shared_ptr<const JsonSchema> any_object();
  ~JsonSchema();

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  explicit JsonSchema(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The state of matching a JSON text against a schema, byte by byte. A value type: copy it to try a continuation
// and keep the original. Nondeterminism (anyOf, an enum literal that may continue) is tracked internally as a set
// of alternatives, so feed() is exact: it accepts a byte iff some valid document has the bytes so far as a prefix.
class JsonMatcher {
 public:
  explicit JsonMatcher(std::shared_ptr<const JsonSchema> schema);
  JsonMatcher(const JsonMatcher&);
  JsonMatcher& operator=(const JsonMatcher&);
  JsonMatcher(JsonMatcher&&) noexcept;
  JsonMatcher& operator=(JsonMatcher&&) noexcept;
  ~JsonMatcher();

  // Advances by one byte; false (and the state unchanged) if no valid document continues with it.
  bool feed(unsigned char byte);
  // Advances by every byte in order; false (and the state unchanged) if any is rejected.
  bool feed(std::string_view bytes);
  // Whether the bytes so far are a complete document (the generation may end here).
  bool can_finish() const;
  // Whether the bytes so far are a complete document that no byte can continue (only the end may come).
  bool finished() const;
  // Whether every live alternative is inside a string value or key whose continuation depends only on string
  // content: no pending escape or partial UTF-8 character, and no maxLength within `bytes` code points of its
  // bound. Then any byte string free of '"', '\\' and bytes < 0x20, that is valid UTF-8 (a trailing partial
  // character allowed, but not a leading continuation byte), of at most `bytes` bytes, is accepted (the mask
  // computation's fast path).
  bool in_plain_string(int bytes) const;
  // The same state seen as a budget: when every live alternative is inside such a string with the same room under
  // its maxLength, that room in code points (INT32_MAX without a bound), else -1. A byte string as above is then
  // accepted iff its code points (its bytes that are not UTF-8 continuation bytes) are at most the room.
  int32_t plain_string_room() const;
  // When one alternative is live and it sits between the characters of a string with a `pattern` (or format): that
  // string's pattern (a json_grammar_internal.h StringPattern), its DFA state and its code points so far. A byte
  // string free of '"', '\\' and bytes < 0x20 is then accepted iff the pattern's DFA steps through it with every
  // state viable (the mask computation's fast path for such strings).
  struct PatternString {
    const void* pattern;  // const detail::StringPattern*
    int32_t state;
    uint32_t count;
  };
  bool pattern_string(PatternString& out) const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace moeserve::grammar

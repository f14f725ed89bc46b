// Internals of the JSON grammar shared by its two sources: the compiled schema's node graph (json_schema_compile.cpp
// builds it) and the matcher's state and step function (json_matcher.cpp; the compiler uses it to filter enum
// values). Not a public interface: include json_grammar.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "grammar/json_grammar.h"
#include "grammar/regex_grammar.h"

namespace moeserve::grammar {
namespace detail {

constexpr uint32_t kNone = UINT32_MAX;
constexpr uint32_t kUnbounded = UINT32_MAX;

enum class Kind : uint8_t { Any, Object, Array, String, Integer, Number, Literal, AnyOf, Alias };

// A string schema's `pattern` (or `format`) with its length bounds (json_string_pattern.cpp): the DFA over the
// string's decoded value (UTF-8 of its code points, escapes decoded), and what the matcher needs to stay exact when
// bounds and pattern meet: lens, per DFA state, the numbers k of code points still to start (lead bytes) on some
// path to an accepting state, as a bitset of k = 0 .. bound (empty without bounds: then any live state can finish).
struct StringPattern {
  std::shared_ptr<const Regex> re;
  uint32_t min_len = 0, max_len = UINT32_MAX;
  uint32_t bound = 0;  // lens covers k = 0 .. bound (min(maxLength, minLength + states); see viable())
  uint32_t words = 0;  // 64-bit words of lens per state
  std::vector<uint64_t> lens;

  // Whether DFA state `state` (-1: dead), reached with `count` code points started, has a completion: more code
  // points that lead to an accepting state with the total count within [min_len, max_len].
  bool viable(int32_t state, uint32_t count) const;
  // Whether some code point in [lo, hi] (surrogates skipped), taken from `state` (between code points), reaches a
  // state viable() with `count` (the code point included).
  bool viable_cp(int32_t state, uint32_t count, uint32_t lo, uint32_t hi) const;
  // The state after the UTF-8 of code point cp (-1 if dead).
  int32_t run_cp(int32_t state, uint32_t cp) const;
};

// The regex a JSON Schema `pattern` compiles to (ECMAScript search semantics made a whole match: each top-level
// alternative gets [\s\S]* on each side that its ^ / $ does not anchor).
std::string pattern_as_whole_match(std::string_view pattern);
// The pattern a `format` stands for, or empty for a format we do not enforce.
std::string_view format_pattern(std::string_view format);
// UserError when the regex is refused or the length table too large for its bounds; `what`: the keyword and its
// JSON pointer, for messages.
std::shared_ptr<const StringPattern> compile_string_pattern(const std::string& regex, uint32_t min_len,
                                                            uint32_t max_len, const std::string& what);

struct Prop {
  std::string key;  // the key as it must appear: the name's compact JSON text, quotes included
  uint32_t node;
  bool required;
};

// Nodes every compiled schema has, at these indices: the shapes of an unconstrained value.
enum Builtin : uint32_t { kAny, kAnyObject, kAnyArray, kAnyString, kAnyNumber, kAnyInteger, kBool, kNull,
                          kWords /* true, false, null: what a bare word of an unconstrained value can be */,
                          kBuiltins };

}  // namespace detail

struct SchemaNode {
  detail::Kind kind = detail::Kind::Any;
  // Object: the properties in schema order, or (free_form) any keys, each value
  // matching `additional`. An object that is neither (no properties, additionalProperties false) admits only {}.
  std::vector<detail::Prop> props;
  std::vector<uint32_t> keys_sorted;    // props indices ordered by key text: a key prefix narrows to a range
  std::vector<uint32_t> next_required;  // [i]: the first required index >= i (props.size() if none); props + 1
  bool free_form = false;
  uint32_t additional = detail::kNone;
  // Array.
  uint32_t items = detail::kNone;
  uint32_t min_items = 0, max_items = detail::kUnbounded;
  // String: bounds in code points.
  uint32_t min_len = 0, max_len = detail::kUnbounded;
  std::shared_ptr<const detail::StringPattern> pattern;  // `pattern` / `format`, or null
  // Literal: the alternatives' texts, sorted and unique (texts sharing a prefix form a range).
  std::vector<std::string> texts;
  // AnyOf: the alternatives (after compilation: flattened, none an AnyOf or Alias). Alias: a $ref's target.
  std::vector<uint32_t> alts;
  uint32_t target = detail::kNone;
  std::string ref;  // Alias: the $ref text, for messages
};

struct JsonSchema::Impl {
  std::vector<SchemaNode> nodes;
  uint32_t root = detail::kAny;
};

namespace detail {

// A vector with inline room for N elements: copying a matcher state of typical depth allocates nothing.
template <typename T, uint32_t N>
class SmallVec {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  SmallVec() = default;
  SmallVec(const T* p, uint32_t n) { assign(p, n); }
  SmallVec(const SmallVec& o) { assign(o.data(), o.size_); }
  SmallVec& operator=(const SmallVec& o) {
    if (this != &o) assign(o.data(), o.size_);
    return *this;
  }
  ~SmallVec() { delete[] heap_; }

  uint32_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return heap_ ? heap_ : inline_; }
  const T* data() const { return heap_ ? heap_ : inline_; }
  T& operator[](uint32_t i) { return data()[i]; }
  const T& operator[](uint32_t i) const { return data()[i]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  void clear() { size_ = 0; }
  void truncate(uint32_t n) { size_ = n; }
  void pop_back() { --size_; }
  void push_back(const T& v) {
    const T copy = v;  // v may live in the buffer that reserve() replaces
    reserve(size_ + 1);
    data()[size_++] = copy;
  }
  void assign(const T* p, uint32_t n) {
    size_ = 0;
    append(p, n);
  }
  void append(const T* p, uint32_t n) {
    reserve(size_ + n);
    if (n) std::memcpy(data() + size_, p, n * sizeof(T));
    size_ += n;
  }

 private:
  void reserve(uint32_t n) {
    if (n <= cap_) return;
    const uint32_t cap = std::max(n, cap_ * 2);
    T* p = new T[cap];
    std::memcpy(p, data(), size_ * sizeof(T));
    delete[] heap_;
    heap_ = p;
    cap_ = cap;
  }
  T* heap_ = nullptr;
  uint32_t size_ = 0, cap_ = N;
  T inline_[N];
};

enum class FrameKind : uint8_t { Root, Object, Key, Array, String, Number, Literal };

// Phases. Root: before the value, inside it (a frame above), after it.
enum : uint8_t { kRootBefore, kRootIn, kRootDone };
enum : uint8_t { kObjStart, kObjAfterOpen, kObjInKey, kObjColon, kObjBeforeValue, kObjInValue, kObjAfterValue,
                 kObjAfterComma };
enum : uint8_t { kArrStart, kArrAfterOpen, kArrInItem, kArrAfterItem, kArrAfterComma };
enum : uint8_t { kStrStart, kStrNormal, kStrEscape, kStrHex, kStrHexLow, kStrLowBackslash, kStrLowU, kStrUtf8 };
enum : uint8_t { kNumStart, kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumExp, kNumExpSign, kNumExpDigits };

// One open value. 20 bytes, no padding: alternatives are compared with memcmp.
struct Frame {
  uint32_t node;   // the SchemaNode matched (Key: the object's node)
  FrameKind kind;
  uint8_t phase;
  uint16_t left;   // String: UTF-8 continuation bytes / \u hex digits to come; Number: digits in the current part
  uint32_t a;      // Object: next property index; Array: items so far; String: code points so far;
                   // Literal / Key: candidate range begin
  uint32_t b;      // Object: the property whose key was matched; String: \u value so far (in a surrogate pair's
                   // low half: high << 16 | low so far), or the next UTF-8 byte's range (lo << 8 | hi);
                   // Literal / Key: candidate range end
  uint32_t pos;    // Literal / Key: bytes matched; String with a pattern: the DFA state (between code points, or
                   // inside a raw UTF-8 character; a pending escape has not moved it)
};
static_assert(sizeof(Frame) == 20 && std::has_unique_object_representations_v<Frame>);

constexpr uint32_t kInlineFrames = 32;
using Stack = SmallVec<Frame, 24>;  // one alternative's frames, copied aside (an anyOf forking)

// The alternatives: their stacks concatenated, ends[i] one past alternative i's top frame.
struct Alts {
  SmallVec<Frame, kInlineFrames> frames;
  SmallVec<uint32_t, 8> ends;
  uint8_t ws_break = 0;  // the run's line break so far (Stepper::ws)
  uint8_t ws_run = 0;  // inter-token whitespace bytes just consumed (the same in every alternative: JSON's
                       // tokenization of a prefix does not depend on the schema)
};

// Computes in's successors on byte c into out; false (out unspecified) if there are none.
bool step(const std::vector<SchemaNode>& nodes, const Alts& in, uint8_t c, Alts& out);
// Whether some alternative has completed the root value.
bool can_finish(const std::vector<SchemaNode>& nodes, const Alts& alts);
// The state before the first byte of a document matching `root`.
Alts initial_alts(uint32_t root);
// Whether `text` is a complete document for `node`.
bool matches(const std::vector<SchemaNode>& nodes, uint32_t node, std::string_view text);

}  // namespace detail
}  // namespace moeserve::grammar

// The JSON grammar's byte-level matcher (see json_grammar.h).
//
// The state is a set of alternatives, each a stack of trivially copyable Frames (the Root frame at the bottom, one
// frame per open value above it). A byte is fed to every alternative; an anyOf value start forks one alternative
// per branch, and a branch that cannot take the byte just disappears. The successors are built in a scratch set
// and committed only if one survives, so a rejected byte leaves the state unchanged. The compiler has pruned the
// schema of everything no finite value satisfies, so every accepted prefix can still be completed.
#include <algorithm>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "grammar/json_grammar_internal.h"

namespace moeserve::grammar {
namespace detail {

inline bool is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
inline bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
inline int hex_value(uint8_t c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

inline Frame make_frame(uint32_t node, FrameKind kind, uint8_t phase) {
  Frame f{};
  f.node = node;
  f.kind = kind;
  f.phase = phase;
  return f;
}

// Entries [lo, hi) share their first `pos` bytes and are sorted, so those with byte c at pos form a sub-range
// (an entry of exactly pos bytes sorts first). Returns it.
template <typename TextAt>
std::pair<uint32_t, uint32_t> narrow(uint32_t lo, uint32_t hi, uint32_t pos, uint8_t c, TextAt text_at) {
  auto byte_at = [&](uint32_t i) -> int {
    const std::string& t = text_at(i);
    return t.size() > pos ? static_cast<unsigned char>(t[pos]) : -1;
  };
  uint32_t l = lo, h = hi;
  while (l < h) {
    const uint32_t m = l + (h - l) / 2;
    if (byte_at(m) < c) l = m + 1; else h = m;
  }
  const uint32_t first = l;
  h = hi;
  while (l < h) {
    const uint32_t m = l + (h - l) / 2;
    if (byte_at(m) <= c) l = m + 1; else h = m;
  }
  return {first, l};
}

bool leaf_can_end(const std::vector<SchemaNode>& nodes, const Frame& f) {
  if (f.kind == FrameKind::Number)
    return f.phase == kNumZero || f.phase == kNumInt || f.phase == kNumFrac || f.phase == kNumExpDigits;
  if (f.kind == FrameKind::Literal) return nodes[f.node].texts[f.a].size() == f.pos;
  return false;
}

// Feeds one byte to alternatives, appending the successors to `out`. An alternative is worked on in place, as the
// tail of out.frames from `base`: closed by an entry in out.ends when it takes the byte, truncated away if not.
class Stepper {
 public:
  Stepper(const std::vector<SchemaNode>& nodes, uint8_t ws_run, uint8_t ws_break, Alts& out)
      : nodes_(nodes), ws_run_(ws_run), ws_break_(ws_break), out_(out), st_(out.frames) {}

  // Feeds c to the alternative whose stack is frames[0, n).
  void feed_alternative(const Frame* frames, uint32_t n, uint8_t c) {
    const uint32_t base = st_.size();
    st_.append(frames, n);
    feed(base, c);
  }

  bool ws_consumed() const { return ws_consumed_; }
  uint8_t ws_break_after() const { return ws_break_after_; }

 private:
  // What a frame did with the byte. Completed: consumed it and closed (pop, the parent moves past the value).
  // EndBefore: the value had ended before it (pop, then the parent gets the byte). Handled: the callee has already
  // emitted or dropped the alternative(s).
  enum class Result { Reject, Consumed, Completed, EndBefore, Handled };

  // Feeds c to the stack st_[base, size).
  void feed(uint32_t base, uint8_t c);

  Result root(uint32_t base, uint8_t c);
  Result object(uint32_t base, uint8_t c);
  Result key(uint8_t c);
  Result array(uint32_t base, uint8_t c);
  Result string(Frame& f, uint8_t c) const;
  bool hex_viable(const StringPattern& p, const Frame& f, uint32_t v, int digits) const;
  Result number(Frame& f, uint8_t c) const;
  Result literal(Frame& f, uint8_t c) const;
  // A whitespace run between JSON tokens: at most kMaxWhitespaceRun bytes and one line break ("\n", "\r" or
  // "\r\n"), so that pretty printing fits and a model cannot stall in blank lines. ws_break_: 0 none yet, 1 just
  // after a "\r" (a "\n" may join it), 2 had its break.
  Result ws(uint8_t c) {
    if (ws_run_ >= kMaxWhitespaceRun) return Result::Reject;
    uint8_t next = ws_break_;
    if (c == '\r') {
      if (ws_break_ != 0) return Result::Reject;
      next = 1;
    } else if (c == '\n') {
      if (ws_break_ == 2) return Result::Reject;
      next = 2;
    } else if (ws_break_ == 1) {
      next = 2;
    }
    ws_consumed_ = true;
    ws_break_after_ = next;
    return Result::Consumed;
  }
  // A value of `node` starts with byte c on top of the stack: push its frame(s) and feed them c.
  void start_value(uint32_t base, uint32_t node, uint8_t c);
  void push_initial(uint32_t base, uint32_t node, uint8_t c);
  // The value on top of the parent (now the top frame) is complete.
  void after_child();
  void emit() { out_.ends.push_back(st_.size()); }
  void drop(uint32_t base) { st_.truncate(base); }

  const std::vector<SchemaNode>& nodes_;
  const uint8_t ws_run_, ws_break_;
  uint8_t ws_break_after_ = 0;
  Alts& out_;
  SmallVec<Frame, kInlineFrames>& st_;  // out_.frames
  bool ws_consumed_ = false;
};

void Stepper::feed(uint32_t base, uint8_t c) {
  for (;;) {
    Frame& f = st_.back();
    Result r = Result::Reject;
    switch (f.kind) {
      case FrameKind::Root: r = root(base, c); break;
      case FrameKind::Object: r = object(base, c); break;
      case FrameKind::Key: r = key(c); break;
      case FrameKind::Array: r = array(base, c); break;
      case FrameKind::String: r = string(f, c); break;
      case FrameKind::Number: r = number(f, c); break;
      case FrameKind::Literal: r = literal(f, c); break;
    }
    switch (r) {
      case Result::Reject: drop(base); return;
      case Result::Handled: return;
      case Result::Consumed: emit(); return;
      case Result::Completed:
        st_.pop_back();
        after_child();
        emit();
        return;
      case Result::EndBefore:
        st_.pop_back();
        after_child();
        continue;  // the parent (a container or the root: they never end before a byte) takes c
    }
  }
}

void Stepper::start_value(uint32_t base, uint32_t node, uint8_t c) {
  const SchemaNode& n = nodes_[node];
  if (n.kind != Kind::AnyOf) return push_initial(base, node, c);
  // One alternative per branch, each from a copy of the stack so far.
  const Stack stack_so_far(st_.data() + base, st_.size() - base);
  drop(base);
  for (uint32_t alt : n.alts) {
    const uint32_t b = st_.size();
    st_.append(stack_so_far.data(), stack_so_far.size());
    push_initial(b, alt, c);
  }
}

void Stepper::push_initial(uint32_t base, uint32_t node, uint8_t c) {
  if (nodes_[node].kind == Kind::Any) {
    // An unconstrained value: its first byte says which shape.
    if (c == '{') node = kAnyObject;
    else if (c == '[') node = kAnyArray;
    else if (c == '"') node = kAnyString;
    else if (c == '-' || is_digit(c)) node = kAnyNumber;
    else if (c == 't' || c == 'f' || c == 'n') node = kWords;
    else return drop(base);
  }
  const SchemaNode& n = nodes_[node];
  Frame f{};
  switch (n.kind) {
    case Kind::Object: f = make_frame(node, FrameKind::Object, kObjStart); break;
    case Kind::Array: f = make_frame(node, FrameKind::Array, kArrStart); break;
    case Kind::String: f = make_frame(node, FrameKind::String, kStrStart); break;
    case Kind::Integer:
    case Kind::Number: f = make_frame(node, FrameKind::Number, kNumStart); break;
    case Kind::Literal:
      f = make_frame(node, FrameKind::Literal, 0);
      f.b = static_cast<uint32_t>(n.texts.size());
      break;
    default: MS_CHECK(false, "node {} of kind {} cannot start a value", node, int(n.kind));
  }
  st_.push_back(f);
  feed(base, c);
}

void Stepper::after_child() {
  Frame& p = st_.back();
  switch (p.kind) {
    case FrameKind::Root: p.phase = kRootDone; return;
    case FrameKind::Object:
      if (p.phase == kObjInKey) {
        p.phase = kObjColon;
      } else {
        p.phase = kObjAfterValue;
        if (!nodes_[p.node].free_form) p.a = p.b + 1;  // later keys only: properties come in schema order
      }
      return;
    case FrameKind::Array:
      p.phase = kArrAfterItem;
      ++p.a;
      return;
    default: MS_CHECK(false, "a frame of kind {} cannot hold a value", int(p.kind));
  }
}

Stepper::Result Stepper::root(uint32_t base, uint8_t c) {
  Frame& f = st_.back();
  if (f.phase != kRootBefore) return Result::Reject;  // nothing, not even whitespace, after the root value
  if (is_ws(c)) return ws(c);
  f.phase = kRootIn;
  start_value(base, f.node, c);
  return Result::Handled;
}

Stepper::Result Stepper::object(uint32_t base, uint8_t c) {
  Frame& f = st_.back();
  const SchemaNode& n = nodes_[f.node];
  const uint32_t nprops = static_cast<uint32_t>(n.props.size());
  const bool can_close = n.free_form || n.next_required[f.a] == nprops;
  // A key may come after '{' or ','; a ',' only if one can follow it.
  const bool key_possible = n.free_form || f.a < nprops;
  if (f.phase != kObjStart && f.phase != kObjInValue && is_ws(c)) return ws(c);
  switch (f.phase) {
    case kObjStart:
      if (c != '{') return Result::Reject;
      f.phase = kObjAfterOpen;
      return Result::Consumed;
    case kObjAfterOpen:
    case kObjAfterComma:
      if (c == '}' && f.phase == kObjAfterOpen && can_close) return Result::Completed;
      if (c != '"' || !key_possible) return Result::Reject;
      f.phase = kObjInKey;
      if (n.free_form) {
        st_.push_back(make_frame(kAnyString, FrameKind::String, kStrStart));
      } else {
        Frame k = make_frame(f.node, FrameKind::Key, 0);
        k.b = nprops;
        st_.push_back(k);
      }
      feed(base, c);
      return Result::Handled;
    case kObjColon:
      if (c != ':') return Result::Reject;
      f.phase = kObjBeforeValue;
      return Result::Consumed;
    case kObjBeforeValue:
      f.phase = kObjInValue;
      start_value(base, n.free_form ? n.additional : n.props[f.b].node, c);
      return Result::Handled;
    case kObjAfterValue:
      if (c == '}' && can_close) return Result::Completed;
      if (c != ',' || !key_possible) return Result::Reject;
      f.phase = kObjAfterComma;
      return Result::Consumed;
    default: MS_CHECK(false, "object frame in phase {} on top", int(f.phase));
  }
  return Result::Reject;
}

Stepper::Result Stepper::key(uint8_t c) {
  Frame& f = st_.back();
  Frame& parent = st_[st_.size() - 2];
  const SchemaNode& n = nodes_[f.node];
  // The keys that may come now: the next property up to and including the first required one not yet written.
  const uint32_t first = parent.a;
  const uint32_t last = std::min<uint32_t>(n.next_required[first], static_cast<uint32_t>(n.props.size()) - 1);
  auto [lo, hi] = narrow(f.a, f.b, f.pos, c, [&](uint32_t i) -> const std::string& {
    return n.props[n.keys_sorted[i]].key;
  });
  bool allowed = false;
  for (uint32_t i = lo; i < hi && !allowed; ++i) allowed = n.keys_sorted[i] >= first && n.keys_sorted[i] <= last;
  if (!allowed) return Result::Reject;
  f.a = lo;
  f.b = hi;
  ++f.pos;
  // A key's text ends with its first unescaped quote, so a complete key is the prefix of no other.
  if (n.props[n.keys_sorted[lo]].key.size() == f.pos) {
    parent.b = n.keys_sorted[lo];
    return Result::Completed;
  }
  return Result::Consumed;
}

Stepper::Result Stepper::array(uint32_t base, uint8_t c) {
  Frame& f = st_.back();
  const SchemaNode& n = nodes_[f.node];
  if (f.phase != kArrStart && f.phase != kArrInItem && is_ws(c)) return ws(c);
  switch (f.phase) {
    case kArrStart:
      if (c != '[') return Result::Reject;
      f.phase = kArrAfterOpen;
      return Result::Consumed;
    case kArrAfterOpen:
      if (c == ']') return n.min_items == 0 ? Result::Completed : Result::Reject;
      if (n.max_items == 0) return Result::Reject;
      [[fallthrough]];
    case kArrAfterComma:
      f.phase = kArrInItem;
      start_value(base, n.items, c);
      return Result::Handled;
    case kArrAfterItem:
      if (c == ']' && f.a >= n.min_items) return Result::Completed;
      if (c != ',' || f.a >= n.max_items) return Result::Reject;
      f.phase = kArrAfterComma;
      return Result::Consumed;
    default: MS_CHECK(false, "array frame in phase {} on top", int(f.phase));
  }
  return Result::Reject;
}

// The code points a \u escape can still yield once `digits` of its 4 hex digits (value v) are in, as BMP ranges
// and, where a high surrogate is still possible, the supplementary code points of the pairs it starts.
bool Stepper::hex_viable(const StringPattern& p, const Frame& f, uint32_t v, int digits) const {
  const uint32_t span = uint32_t(1) << (4 * (4 - digits));
  const uint32_t lo = v * span, hi = lo + span - 1;
  if (lo < 0xD800 && p.viable_cp(f.pos, f.a, lo, std::min<uint32_t>(hi, 0xD7FF))) return true;
  if (hi > 0xDFFF && p.viable_cp(f.pos, f.a, std::max<uint32_t>(lo, 0xE000), hi)) return true;
  const uint32_t hlo = std::max<uint32_t>(lo, 0xD800), hhi = std::min<uint32_t>(hi, 0xDBFF);
  return hlo <= hhi && p.viable_cp(f.pos, f.a, 0x10000 + ((hlo - 0xD800) << 10), 0x10000 + ((hhi - 0xD800) << 10) + 0x3FF);
}

Stepper::Result Stepper::string(Frame& f, uint8_t c) const {
  const SchemaNode& n = nodes_[f.node];
  // With a pattern, f.pos is the DFA state over the decoded value; every byte is accepted only if the state it
  // leads to (or, inside an escape, some completion of the escape) can still finish within the length bounds.
  const StringPattern* p = n.pattern.get();
  switch (f.phase) {
    case kStrStart:
      if (c != '"') return Result::Reject;
      f.phase = kStrNormal;
      return Result::Consumed;
    case kStrNormal: {
      if (c == '"') return f.a >= n.min_len && (!p || p->re->accepting(int32_t(f.pos))) ? Result::Completed
                                                                                        : Result::Reject;
      if (c < 0x20 || f.a >= n.max_len) return Result::Reject;  // any other byte starts a character
      if (c == '\\') {
        // Any code point can be written as an escape: some completion exists iff some code point can come.
        if (p && !p->viable_cp(int32_t(f.pos), f.a + 1, 0, 0x10FFFF)) return Result::Reject;
        f.phase = kStrEscape;
      } else {
        if (c >= 0x80) {
          // UTF-8 lead byte: continuation count, and the range of the first continuation byte (which excludes
          // overlong forms, UTF-16 surrogates and code points past U+10FFFF).
          uint32_t range = 0x80BF;
          if (c >= 0xC2 && c <= 0xDF) f.left = 1;
          else if (c >= 0xE0 && c <= 0xEF) f.left = 2, range = c == 0xE0 ? 0xA0BF : c == 0xED ? 0x809F : 0x80BF;
          else if (c >= 0xF0 && c <= 0xF4) f.left = 3, range = c == 0xF0 ? 0x90BF : c == 0xF4 ? 0x808F : 0x80BF;
          else return Result::Reject;
          f.phase = kStrUtf8;
          f.b = range;
        }
        if (p) {
          const int32_t next = p->re->next(int32_t(f.pos), c);
          if (!p->viable(next, f.a + 1)) return Result::Reject;
          f.pos = uint32_t(next);
        }
      }
      ++f.a;
      return Result::Consumed;
    }
    case kStrUtf8:
      if (c < (f.b >> 8) || c > (f.b & 0xFF)) return Result::Reject;
      if (p) {
        const int32_t next = p->re->next(int32_t(f.pos), c);
        if (!p->viable(next, f.a)) return Result::Reject;
        f.pos = uint32_t(next);
      }
      f.b = 0x80BF;
      if (--f.left == 0) f.phase = kStrNormal;
      return Result::Consumed;
    case kStrEscape: {
      if (c == 'u') {
        // Viable: the backslash was accepted only if some code point can come, and \u writes any of them.
        f.phase = kStrHex;
        f.left = 4;
        f.b = 0;
        return Result::Consumed;
      }
      static constexpr char kShort[] = "\"\\/bfnrt";
      static constexpr char kDecoded[] = "\"\\/\b\f\n\r\t";
      const char* at = c ? std::strchr(kShort, c) : nullptr;
      if (!at) return Result::Reject;
      if (p) {
        const int32_t next = p->run_cp(int32_t(f.pos), static_cast<uint8_t>(kDecoded[at - kShort]));
        if (!p->viable(next, f.a)) return Result::Reject;
        f.pos = uint32_t(next);
      }
      f.phase = kStrNormal;
      return Result::Consumed;
    }
    case kStrHex:
    case kStrHexLow: {
      // Surrogates must pair up (\uD800-\uDBFF then \uDC00-\uDFFF), as strict JSON parsers require; the pair
      // counts as the one code point it encodes. In the low half, b keeps the high half above the low digits.
      const int v = hex_value(c);
      if (v < 0) return Result::Reject;
      const int index = 4 - f.left;
      if (f.phase == kStrHexLow && ((index == 0 && v != 0xD) || (index == 1 && v < 0xC))) return Result::Reject;
      if (f.phase == kStrHex && index == 1 && f.b == 0xD && v >= 0xC) return Result::Reject;  // a lone low half
      const uint32_t high = f.b >> 16, low = (f.b & 0xFFFF) * 16 + uint32_t(v);
      f.b = high << 16 | low;
      --f.left;
      if (p) {
        if (f.phase == kStrHex) {
          if (!hex_viable(*p, f, low, index + 1)) return Result::Reject;
        } else {
          // The pair's code point: high's 10 bits, then low's (DC00 + 10 bits), of which index + 1 digits are in.
          const uint32_t span = uint32_t(1) << (4 * f.left);
          const uint32_t lo = std::max<uint32_t>(low * span, 0xDC00), hi = low * span + span - 1;
          const uint32_t base = 0x10000 + ((high - 0xD800) << 10) - 0xDC00;
          if (!p->viable_cp(int32_t(f.pos), f.a, base + lo, base + hi)) return Result::Reject;
        }
      }
      if (f.left > 0) return Result::Consumed;
      if (f.phase == kStrHex && low >= 0xD800 && low <= 0xDBFF) {
        f.phase = kStrLowBackslash;  // the DFA moves when the low half completes the code point
        return Result::Consumed;
      }
      if (p) {
        const uint32_t cp = f.phase == kStrHex ? low : 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
        f.pos = uint32_t(p->run_cp(int32_t(f.pos), cp));  // viable: checked above
      }
      f.phase = kStrNormal;
      return Result::Consumed;
    }
    case kStrLowBackslash:
      if (c != '\\') return Result::Reject;
      f.phase = kStrLowU;
      return Result::Consumed;
    case kStrLowU:
      if (c != 'u') return Result::Reject;
      f.phase = kStrHexLow;
      f.left = 4;
      f.b <<= 16;  // the high half, kept for the code point
      return Result::Consumed;
    default: MS_CHECK(false, "string frame in phase {}", int(f.phase));
  }
  return Result::Reject;
}

Stepper::Result Stepper::number(Frame& f, uint8_t c) const {
  const bool integer = nodes_[f.node].kind == Kind::Integer;
  auto to = [&](uint8_t phase, uint16_t digits) {
    f.phase = phase;
    f.left = digits;
    return Result::Consumed;
  };
  auto fraction_or_exponent = [&]() {
    if (!integer && c == '.') return to(kNumDot, 0);
    if (!integer && (c == 'e' || c == 'E')) return to(kNumExp, 0);
    return Result::EndBefore;
  };
  // A digit past kMaxNumberDigits ends the number (EndBefore): its parent then rejects the digit.
  const bool more = f.left < kMaxNumberDigits;
  switch (f.phase) {
    case kNumStart:
      if (c == '-') return to(kNumMinus, 0);
      [[fallthrough]];
    case kNumMinus:
      if (c == '0') return to(kNumZero, 1);
      if (is_digit(c)) return to(kNumInt, 1);
      return Result::Reject;
    case kNumZero: return fraction_or_exponent();
    case kNumInt:
      if (is_digit(c) && more) return to(kNumInt, f.left + 1);
      return fraction_or_exponent();
    case kNumDot: return is_digit(c) ? to(kNumFrac, 1) : Result::Reject;
    case kNumFrac:
      if (is_digit(c) && more) return to(kNumFrac, f.left + 1);
      if (c == 'e' || c == 'E') return to(kNumExp, 0);
      return Result::EndBefore;
    case kNumExp:
      if (c == '+' || c == '-') return to(kNumExpSign, 0);
      [[fallthrough]];
    case kNumExpSign: return is_digit(c) ? to(kNumExpDigits, 1) : Result::Reject;
    case kNumExpDigits: return is_digit(c) && more ? to(kNumExpDigits, f.left + 1) : Result::EndBefore;
    default: MS_CHECK(false, "number frame in phase {}", int(f.phase));
  }
  return Result::Reject;
}

Stepper::Result Stepper::literal(Frame& f, uint8_t c) const {
  const std::vector<std::string>& texts = nodes_[f.node].texts;
  if (f.a == f.b) return Result::Reject;  // a literal without texts (an impossible enum, before pruning)
  auto [lo, hi] = narrow(f.a, f.b, f.pos, c, [&](uint32_t i) -> const std::string& { return texts[i]; });
  // A complete literal that c does not continue has ended (enum [1, 12]: "1" then ','). Only numbers can be
  // continued, and no byte both continues a number and may follow one, so this choice loses nothing.
  if (lo == hi) return texts[f.a].size() == f.pos ? Result::EndBefore : Result::Reject;
  f.a = lo;
  f.b = hi;
  ++f.pos;
  return hi - lo == 1 && texts[lo].size() == f.pos ? Result::Completed : Result::Consumed;
}

bool step(const std::vector<SchemaNode>& nodes, const Alts& in, uint8_t c, Alts& out) {
  out.frames.clear();
  out.ends.clear();
  Stepper stepper(nodes, in.ws_run, in.ws_break, out);
  uint32_t begin = 0;
  for (uint32_t end : in.ends) {
    stepper.feed_alternative(in.frames.data() + begin, end - begin, c);
    begin = end;
  }
  if (out.ends.empty()) return false;
  out.ws_run = stepper.ws_consumed() ? in.ws_run + 1 : 0;
  out.ws_break = stepper.ws_consumed() ? stepper.ws_break_after() : 0;
  if (out.ends.size() > 1) {
    // Drop duplicate alternatives (e.g. anyOf branches that reached the same frames), compacting in place.
    uint32_t kept = 0, write = 0, read = 0;
    for (uint32_t i = 0; i < out.ends.size(); ++i) {
      const uint32_t size = out.ends[i] - read;
      bool dup = false;
      for (uint32_t k = 0, kb = 0; k < kept && !dup; kb = out.ends[k++]) {
        dup = out.ends[k] - kb == size &&
              std::memcmp(out.frames.data() + kb, out.frames.data() + read, size * sizeof(Frame)) == 0;
      }
      const uint32_t next_read = out.ends[i];
      if (!dup) {
        std::memmove(out.frames.data() + write, out.frames.data() + read, size * sizeof(Frame));
        write += size;
        out.ends[kept++] = write;
      }
      read = next_read;
    }
    out.ends.truncate(kept);
    out.frames.truncate(write);
    // A schema this ambiguous here would make every byte (and every step's mask) slow: the byte is refused, and a
    // request left without any token ends with an error (Constraint::stuck).
    if (out.ends.size() > size_t(kMaxAlternatives)) return false;
  }
  return true;
}

bool can_finish(const std::vector<SchemaNode>& nodes, const Alts& alts) {
  uint32_t begin = 0;
  for (uint32_t end : alts.ends) {
    const Frame* st = alts.frames.data() + begin;
    if (end - begin == 1 && st[0].phase == kRootDone) return true;
    if (end - begin == 2 && leaf_can_end(nodes, st[1])) return true;  // a root number or literal
    begin = end;
  }
  return false;
}

Alts initial_alts(uint32_t root) {
  Alts a;
  a.frames.push_back(make_frame(root, FrameKind::Root, kRootBefore));
  a.ends.push_back(1);
  return a;
}

// Whether `text` is a complete document for `node` (used to filter enum values at compile time).
bool matches(const std::vector<SchemaNode>& nodes, uint32_t node, std::string_view text) {
  Alts cur = initial_alts(node), next;
  for (char ch : text) {
    if (!step(nodes, cur, static_cast<uint8_t>(ch), next)) return false;
    std::swap(cur, next);
  }
  return can_finish(nodes, cur);
}

}  // namespace detail

using namespace detail;

// The current alternatives and a buffer for the next ones (feed steps from one into the other and flips `cur`, so
// accepting a byte copies nothing). A copy takes only the current alternatives.
struct JsonMatcher::State {
  std::shared_ptr<const JsonSchema> schema;  // keeps `nodes` alive
  const std::vector<SchemaNode>* nodes;
  Alts alts[2];
  uint8_t cur = 0;

  explicit State(std::shared_ptr<const JsonSchema> s) : schema(std::move(s)), nodes(&schema->impl().nodes) {}
  State(const State& o) : schema(o.schema), nodes(o.nodes) { alts[0] = o.now(); }
  State& operator=(const State& o) {
    if (schema != o.schema) schema = o.schema;  // skips the reference count's atomics in the common case
    nodes = o.nodes;
    alts[cur] = o.now();
    return *this;
  }
  const Alts& now() const { return alts[cur]; }
  Alts& now() { return alts[cur]; }
  Alts& spare() { return alts[cur ^ 1]; }
};

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonSchema> schema) {
  MS_CHECK(schema != nullptr, "JsonMatcher needs a schema");
  state_ = std::make_unique<State>(std::move(schema));
  state_->now() = initial_alts(state_->schema->impl().root);
}

JsonMatcher::JsonMatcher(const JsonMatcher& o) : state_(o.state_ ? std::make_unique<State>(*o.state_) : nullptr) {}

JsonMatcher& JsonMatcher::operator=(const JsonMatcher& o) {
  if (this == &o) return *this;
  if (state_ && o.state_) *state_ = *o.state_;  // reuses this state's memory: no allocation
  else state_ = o.state_ ? std::make_unique<State>(*o.state_) : nullptr;
  return *this;
}

JsonMatcher::JsonMatcher(JsonMatcher&&) noexcept = default;
JsonMatcher& JsonMatcher::operator=(JsonMatcher&&) noexcept = default;
JsonMatcher::~JsonMatcher() = default;

bool JsonMatcher::feed(unsigned char byte) {
  State& s = *state_;
  if (!step(*s.nodes, s.now(), byte, s.spare())) return false;
  s.cur ^= 1;
  return true;
}

bool JsonMatcher::feed(std::string_view bytes) {
  if (bytes.empty()) return true;
  State& s = *state_;
  // The current alternatives stay untouched until every byte is taken.
  Alts& result = s.spare();
  if (!step(*s.nodes, s.now(), static_cast<uint8_t>(bytes[0]), result)) return false;
  Alts scratch;
  Alts *cur = &result, *next = &scratch;
  for (size_t i = 1; i < bytes.size(); ++i) {
    if (!step(*s.nodes, *cur, static_cast<uint8_t>(bytes[i]), *next)) return false;
    std::swap(cur, next);
  }
  if (cur != &result) result = *cur;
  s.cur ^= 1;
  return true;
}

bool JsonMatcher::can_finish() const { return detail::can_finish(*state_->nodes, state_->now()); }

bool JsonMatcher::finished() const {
  if (!can_finish()) return false;
  Alts scratch;
  for (int c = 0; c < 256; ++c)
    if (step(*state_->nodes, state_->now(), static_cast<uint8_t>(c), scratch)) return false;
  return true;
}

bool JsonMatcher::in_plain_string(int bytes) const {
  const std::vector<SchemaNode>& nodes = *state_->nodes;
  const uint32_t need = static_cast<uint32_t>(std::max(bytes, 0));
  const Alts& alts = state_->now();
  for (uint32_t end : alts.ends) {
    const Frame& top = alts.frames[end - 1];
    if (top.kind != FrameKind::String || top.phase != kStrNormal) return false;
    if (nodes[top.node].pattern) return false;  // its content is constrained byte by byte
    // `bytes` more bytes are at most that many code points; each must fit under maxLength.
    const uint32_t max_len = nodes[top.node].max_len;
    if (max_len != kUnbounded && max_len - top.a < need) return false;
  }
  return true;
}

bool JsonMatcher::pattern_string(PatternString& out) const {
  const Alts& alts = state_->now();
  if (alts.ends.size() != 1) return false;
  const Frame& top = alts.frames[alts.ends[0] - 1];
  if (top.kind != FrameKind::String || top.phase != kStrNormal) return false;
  const StringPattern* p = (*state_->nodes)[top.node].pattern.get();
  if (!p) return false;
  out = PatternString{p, int32_t(top.pos), top.a};
  return true;
}

int32_t JsonMatcher::plain_string_room() const {
  const std::vector<SchemaNode>& nodes = *state_->nodes;
  const Alts& alts = state_->now();
  int64_t room = -1;
  for (uint32_t end : alts.ends) {
    const Frame& top = alts.frames[end - 1];
    if (top.kind != FrameKind::String || top.phase != kStrNormal || nodes[top.node].pattern) return -1;
    const uint32_t max_len = nodes[top.node].max_len;
    const int64_t r = max_len == kUnbounded ? INT32_MAX : int64_t(max_len) - int64_t(top.a);
    if (room >= 0 && r != room) return -1;  // alternatives with different rooms: no single budget
    room = r;
  }
  return int32_t(room);
}

}  // namespace moeserve::grammar

// The JSON grammar's string patterns (see json_grammar.h): a schema's `pattern` turned into a whole-match regex,
// `format`s as patterns, and the tables that keep the matcher exact where a pattern meets minLength / maxLength.
//
// The matcher runs the DFA over the string's decoded value. Without length bounds a live DFA state (one from which
// an accepting state is reachable) can always finish: every code point can be written in JSON (raw, or escaped).
// With bounds it also needs a path whose count of code points lands within them: lens holds, per DFA state, the
// counts k of lead bytes (code points started) on paths to an accepting state, for k up to a bound past which
// nothing new is learnt (see viable()).
#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/json_grammar_internal.h"
#include "grammar/regex_internal.h"

namespace moeserve::grammar::detail {

namespace {

constexpr uint64_t kMaxLenTableBits = uint64_t(1) << 26;  // DFA states x (bound + 1): 8 MiB
constexpr uint64_t kMaxLenTableWork = uint64_t(1) << 27;  // (bound + 1) x (states + edges)

constexpr std::string_view kAnyRun = "[\\s\\S]*";

// Whether the `$` at p[i] is escaped (an odd number of backslashes before it).
bool escaped(std::string_view p, size_t i) {
  size_t n = 0;
  while (i > n && p[i - n - 1] == '\\') ++n;
  return n % 2 == 1;
}

// The top-level alternatives of a pattern: split at each `|` outside groups, classes and escapes.
std::vector<std::string_view> top_level_alternatives(std::string_view p) {
  std::vector<std::string_view> out;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      ++i;  // the escaped byte (a UTF-8 continuation byte after it is no metacharacter)
    } else if (c == '[') {
      size_t j = i + 1;
      if (j < p.size() && p[j] == '^') ++j;
      if (j < p.size() && p[j] == ']') ++j;  // a leading ']' is a member
      for (; j < p.size() && p[j] != ']'; ++j)
        if (p[j] == '\\') ++j;
      i = j;  // the closing ']' (or the end: the regex compiler reports the unbalanced bracket)
    } else if (c == '(') {
      ++depth;
    } else if (c == ')') {
      if (depth > 0) --depth;
    } else if (c == '|' && depth == 0) {
      out.push_back(p.substr(start, i - start));
      start = i + 1;
    }
  }
  out.push_back(p.substr(start));
  return out;
}

// Code points lo..hi (their UTF-8 bytes from the current one on, `m` continuation bytes after it; the current
// byte is prefix | (value >> 6m)) taken from any of `states`: whether one reaches a state viable with `count`.
// Sub-ranges that cover every continuation are merged into one walk of the union of their states.
bool walk(const StringPattern& p, std::vector<int32_t> states, uint32_t lo, uint32_t hi, int m, uint32_t prefix,
          uint32_t count) {
  const Regex& re = *p.re;
  auto dedupe = [](std::vector<int32_t>& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  };
  auto step_all = [&](uint32_t t, std::vector<int32_t>& out) {
    for (int32_t s : states) {
      const int32_t u = re.next(s, static_cast<unsigned char>(prefix | t));
      if (u >= 0) out.push_back(u);
    }
  };
  const int shift = 6 * m;
  const uint32_t mask = (uint32_t(1) << shift) - 1;
  const uint32_t tlo = lo >> shift, thi = hi >> shift;
  std::vector<int32_t> full;
  if (m == 0) {
    for (uint32_t t = tlo; t <= thi; ++t) step_all(t, full);
    dedupe(full);
    return std::any_of(full.begin(), full.end(), [&](int32_t u) { return p.viable(u, count); });
  }
  for (uint32_t t = tlo; t <= thi; ++t) {
    const uint32_t sl = t == tlo ? lo & mask : 0, sh = t == thi ? hi & mask : mask;
    if (sl == 0 && sh == mask) {
      step_all(t, full);
      continue;
    }
    std::vector<int32_t> next;
    step_all(t, next);
    dedupe(next);
    if (!next.empty() && walk(p, std::move(next), sl, sh, m - 1, 0x80, count)) return true;
  }
  dedupe(full);
  return !full.empty() && walk(p, std::move(full), 0, mask, m - 1, 0x80, count);
}

}  // namespace

std::string pattern_as_whole_match(std::string_view pattern) {
  // ECMAScript's search: the pattern may match anywhere, unless ^ / $ anchor it. A top-level alternative that
  // starts with ^ / ends with an unescaped $ is anchored on that side; the other sides get [\s\S]* (any code
  // points). ^ or $ anywhere else is left in place for the regex compiler to refuse.
  std::string out;
  const std::vector<std::string_view> alts = top_level_alternatives(pattern);
  for (size_t i = 0; i < alts.size(); ++i) {
    std::string_view core = alts[i];
    const bool at_start = !core.empty() && core.front() == '^';
    if (at_start) core.remove_prefix(1);
    const bool at_end = !core.empty() && core.back() == '$' && !escaped(core, core.size() - 1);
    if (at_end) core.remove_suffix(1);
    if (i > 0) out += '|';
    if (core.empty()) {
      if (!at_start || !at_end) out += kAnyRun;  // else the empty alternative: only ""
      continue;
    }
    if (!at_start) out += kAnyRun;
    out += "(?:" + std::string(core) + ")";
    if (!at_end) out += kAnyRun;
  }
  return out.empty() ? "(?:)" : out;
}

std::string_view format_pattern(std::string_view format) {
#define MS_DATE "\\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\\d|3[01])"
#define MS_TIME "(?:[01]\\d|2[0-3]):[0-5]\\d:(?:[0-5]\\d|60)(?:\\.\\d+)?(?:[Zz]|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)"
#define MS_OCTET "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"
#define MS_LABEL "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
  if (format == "date") return MS_DATE;
  if (format == "time") return MS_TIME;
  if (format == "date-time") return MS_DATE "[Tt]" MS_TIME;
  if (format == "uuid") return "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
  if (format == "email") return "[^@\\s]+@[^@\\s]+\\.[^@\\s]+";
  if (format == "ipv4") return MS_OCTET "(?:\\." MS_OCTET "){3}";
  if (format == "hostname") return MS_LABEL "(?:\\." MS_LABEL ")*";
#undef MS_DATE
#undef MS_TIME
#undef MS_OCTET
#undef MS_LABEL
  return {};
}

std::shared_ptr<const StringPattern> compile_string_pattern(const std::string& regex, uint32_t min_len,
                                                            uint32_t max_len, const std::string& what) {
  auto p = std::make_shared<StringPattern>();
  try {
    p->re = Regex::compile(regex);
  } catch (const UserError& e) {
    throw_user("JSON schema: {}: {} (compiled as the whole-match regex {})", what, e.what(), regex);
  }
  p->min_len = min_len;
  p->max_len = max_len;
  if (min_len == 0 && max_len == kUnbounded) return p;  // any live state can finish

  const Regex& re = *p->re;
  const uint32_t states = static_cast<uint32_t>(re.state_count());
  uint64_t bound = uint64_t(min_len) + states;
  if (max_len != kUnbounded) bound = std::min<uint64_t>(bound, max_len);
  // Edges by kind, reversed: a continuation byte (10xxxxxx) keeps the code point count, any other byte starts one.
  std::vector<std::vector<uint32_t>> rev_cont(states), rev_lead(states);
  std::vector<uint32_t> seen_cont(states, UINT32_MAX), seen_lead(states, UINT32_MAX);
  uint64_t edges = 0;
  for (uint32_t s = 0; s < states; ++s) {
    for (int c = 0; c < 256; ++c) {
      const int32_t t = re.next(int32_t(s), static_cast<unsigned char>(c));
      if (t < 0) continue;
      const bool cont = (c & 0xC0) == 0x80;
      std::vector<uint32_t>& seen = cont ? seen_cont : seen_lead;
      if (seen[size_t(t)] == s) continue;
      seen[size_t(t)] = s;
      (cont ? rev_cont : rev_lead)[size_t(t)].push_back(s);
      ++edges;
    }
  }
  MS_USER_CHECK(uint64_t(states) * (bound + 1) <= kMaxLenTableBits &&
                    (bound + 1) * (uint64_t(states) + edges) <= kMaxLenTableWork,
                "JSON schema: {} with minLength {} / maxLength {}: the pattern's {} DFA states times the length "
                "bound {} is too large to enforce both exactly; lower minLength / maxLength or simplify the pattern",
                what, min_len, max_len == kUnbounded ? std::string("none") : std::to_string(max_len), states, bound);
  p->bound = static_cast<uint32_t>(bound);
  p->words = static_cast<uint32_t>(bound / 64 + 1);
  p->lens.assign(size_t(states) * p->words, 0);
  // R_k: the states with a path to an accepting state that starts exactly k code points. R_0: those that reach
  // one through continuation bytes only; R_k: those that reach, through continuation bytes, a lead byte into R_k-1.
  std::vector<uint32_t> in(states, UINT32_MAX), todo;
  std::vector<uint32_t> prev, cur;
  for (uint64_t k = 0; k <= bound; ++k) {
    todo.clear();
    const uint32_t stamp = static_cast<uint32_t>(k);
    auto add = [&](uint32_t s) {
      if (in[s] == stamp) return;
      in[s] = stamp;
      todo.push_back(s);
    };
    if (k == 0) {
      for (uint32_t s = 0; s < states; ++s)
        if (re.accepting(int32_t(s))) add(s);
    } else {
      for (uint32_t t : prev)
        for (uint32_t s : rev_lead[t]) add(s);
    }
    cur.clear();
    while (!todo.empty()) {
      const uint32_t s = todo.back();
      todo.pop_back();
      cur.push_back(s);
      for (uint32_t r : rev_cont[s]) add(r);
    }
    if (cur.empty()) break;  // and so are all later ones
    for (uint32_t s : cur) p->lens[size_t(s) * p->words + k / 64] |= uint64_t(1) << (k % 64);
    std::swap(prev, cur);
  }
  return p;
}

bool StringPattern::viable(int32_t state, uint32_t count) const {
  if (state < 0 || count > max_len) return false;
  if (lens.empty()) return true;
  // Wanted: a path of k more code points with count + k within [min_len, max_len]. If one has k > need + states,
  // it repeats a state: cutting a simple cycle (1 to `states` code points) keeps it above need, so some path has k
  // in [need, need + states]. Hence the window below, and bound = min(maxLength, minLength + states).
  const uint64_t need = min_len > count ? min_len - count : 0;
  uint64_t hi = need + uint64_t(re->state_count());
  if (max_len != kUnbounded) hi = std::min<uint64_t>(hi, max_len - count);
  hi = std::min<uint64_t>(hi, bound);
  if (need > hi) return false;
  const uint64_t* row = lens.data() + size_t(state) * words;
  for (uint64_t w = need / 64; w <= hi / 64; ++w) {
    uint64_t bits = row[w];
    if (w == need / 64) bits &= ~uint64_t(0) << (need % 64);
    if (w == hi / 64 && hi % 64 != 63) bits &= (uint64_t(1) << (hi % 64 + 1)) - 1;
    if (bits) return true;
  }
  return false;
}

bool StringPattern::viable_cp(int32_t state, uint32_t count, uint32_t lo, uint32_t hi) const {
  if (state < 0) return false;
  struct Segment {
    uint32_t lo, hi;
    int m;
    uint32_t prefix;
  };
  static constexpr Segment kSegments[] = {{0, 0x7F, 0, 0},          {0x80, 0x7FF, 1, 0xC0},
                                          {0x800, 0xD7FF, 2, 0xE0}, {0xE000, 0xFFFF, 2, 0xE0},
                                          {0x10000, 0x10FFFF, 3, 0xF0}};
  for (const Segment& seg : kSegments) {
    const uint32_t l = std::max(lo, seg.lo), h = std::min(hi, seg.hi);
    if (l <= h && walk(*this, {state}, l, h, seg.m, seg.prefix, count)) return true;
  }
  return false;
}

int32_t StringPattern::run_cp(int32_t state, uint32_t cp) const {
  uint8_t b[4];
  const int n = regex_detail::encode_utf8(cp, b);
  for (int i = 0; i < n && state >= 0; ++i) state = re->next(state, b[i]);
  return state;
}

}  // namespace moeserve::grammar::detail

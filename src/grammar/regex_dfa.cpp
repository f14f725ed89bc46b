// The regular-expression grammar's DFA construction (see regex_grammar.h, regex_internal.h): the subset construction
// over byte equivalence classes (the intervals between the NFA's byte-range boundaries), eagerly and capped at
// kMaxRegexStates; Hopcroft's minimization, which also merges every state that cannot reach an accepting one into
// the dead state (what makes the matcher exact: every byte it accepts leaves a completion possible); and the minimal
// DFA's classes merged where no state tells them apart.
#include <algorithm>
#include <array>
#include <map>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "grammar/regex_internal.h"

namespace moeserve::grammar::regex_detail {
namespace {

// The subset construction's budget: NFA states visited by epsilon closures, and NFA state ids held by the DFA
// states' keys (memory). Ordinary patterns stay orders of magnitude below both.
constexpr int64_t kClosureWorkBudget = int64_t(1) << 27;
constexpr int64_t kSubsetKeyBudget = int64_t(1) << 23;

struct KeyHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t x : v) h = (h ^ uint32_t(x)) * 1099511628211ull;
    return size_t(h ^ (h >> 29));
  }
};

constexpr std::string_view kSimplify =
    "shorten counted repetitions {n,m}, make a repeated group's parts unambiguous (e.g. (\\w+\\s+){0,9} rather "
    "than (\\w+\\s*){0,9}), or avoid a bounded repetition after an unbounded one such as (a|b)*a(a|b){14}";

[[noreturn]] void too_complex(std::string_view why) {
  throw_user("the regular expression is too complex to compile: {}; simplify it: {}", why, kSimplify);
}

}  // namespace

Regex::Dfa build_dfa(const Nfa& nfa) {
  const std::vector<NState>& st = nfa.st;
  // Byte classes: the intervals between the NFA's byte-range boundaries.
  std::array<bool, 257> cut{};
  for (const NState& s : st)
    if (s.kind == NState::kByte) cut[s.lo] = cut[size_t(s.hi) + 1] = true;
  std::array<uint8_t, 256> class_of{};
  int32_t classes = 1;
  for (size_t b = 0; b < 256; ++b) {
    if (b > 0 && cut[b]) ++classes;
    class_of[b] = uint8_t(classes - 1);
  }

  // Epsilon closures as sorted keys of the states that matter: byte states and the match state.
  std::vector<uint32_t> seen(st.size(), 0);
  uint32_t stamp = 0;
  int64_t work = 0, key_ints = 0;
  std::vector<int32_t> stack;
  auto closure = [&](const std::vector<int32_t>& seeds, std::vector<int32_t>& out) {
    ++stamp;
    out.clear();
    stack.assign(seeds.begin(), seeds.end());
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      if (seen[size_t(s)] == stamp) continue;
      seen[size_t(s)] = stamp;
      ++work;
      const NState& n = st[size_t(s)];
      if (n.kind != NState::kEps) {
        out.push_back(s);
        continue;
      }
      if (n.out2 >= 0) stack.push_back(n.out2);
      if (n.out >= 0) stack.push_back(n.out);
    }
    if (work > kClosureWorkBudget) too_complex("its automaton construction ran past its work budget");
    std::sort(out.begin(), out.end());
  };

  std::unordered_map<std::vector<int32_t>, int32_t, KeyHash> ids;
  std::vector<const std::vector<int32_t>*> sets;
  std::vector<int32_t> trans;  // state * classes + class -> state, -1 dead
  auto intern = [&](const std::vector<int32_t>& key) -> int32_t {
    if (key.empty()) return -1;
    auto [it, fresh] = ids.try_emplace(key, int32_t(sets.size()));
    if (fresh) {
      if (sets.size() >= size_t(kMaxRegexStates))
        throw_user("the regular expression needs more than {} automaton (DFA) states; simplify it: {}",
                   kMaxRegexStates, kSimplify);
      if ((key_ints += int64_t(key.size())) > kSubsetKeyBudget) too_complex("its automaton needs too much memory");
      sets.push_back(&it->first);
      trans.resize(trans.size() + size_t(classes), -1);
    }
    return it->second;
  };

  std::vector<int32_t> key;
  closure({nfa.start}, key);
  intern(key);
  std::vector<std::vector<int32_t>> bucket(static_cast<size_t>(classes));
  for (size_t d = 0; d < sets.size(); ++d) {
    for (auto& b : bucket) b.clear();
    for (int32_t s : *sets[d]) {
      const NState& n = st[size_t(s)];
      if (n.kind != NState::kByte) continue;
      for (int32_t c = class_of[n.lo]; c <= class_of[n.hi]; ++c) bucket[size_t(c)].push_back(n.out);
    }
    for (int32_t c = 0; c < classes; ++c) {
      if (bucket[size_t(c)].empty()) continue;
      closure(bucket[size_t(c)], key);
      const int32_t t = intern(key);
      trans[d * size_t(classes) + size_t(c)] = t;
    }
  }
  std::vector<bool> accepting(sets.size() + 1, false);
  bool any_accepting = false;
  for (size_t d = 0; d < sets.size(); ++d)
    if (std::binary_search(sets[d]->begin(), sets[d]->end(), nfa.match)) accepting[d] = any_accepting = true;
  if (!any_accepting) throw_user("the regular expression matches no string at all (e.g. an empty class [^\\s\\S])");

  // Hopcroft over the complete DFA: the states plus a dead sink. Blocks are ranges of `elems`; a block's marked
  // members (those with a transition into the splitter) are moved to its front.
  const int32_t n = int32_t(sets.size()) + 1, sink = n - 1;
  auto delta = [&](int32_t s, int32_t c) {
    const int32_t t = s == sink ? sink : trans[size_t(s) * size_t(classes) + size_t(c)];
    return t < 0 ? sink : t;
  };
  std::vector<int32_t> inv_begin(size_t(classes) * size_t(n) + 1, 0), inv(size_t(classes) * size_t(n));
  for (int32_t s = 0; s < n; ++s)
    for (int32_t c = 0; c < classes; ++c) ++inv_begin[size_t(c) * size_t(n) + size_t(delta(s, c)) + 1];
  for (size_t k = 1; k < inv_begin.size(); ++k) inv_begin[k] += inv_begin[k - 1];
  {
    std::vector<int32_t> fill(inv_begin.begin(), inv_begin.end() - 1);
    for (int32_t s = 0; s < n; ++s)
      for (int32_t c = 0; c < classes; ++c) inv[size_t(fill[size_t(c) * size_t(n) + size_t(delta(s, c))]++)] = s;
  }
  std::vector<int32_t> elems(static_cast<size_t>(n)), loc(elems.size()), blk(elems.size()), first, end, marked;
  {
    int32_t k = 0;
    for (int pass = 0; pass < 2; ++pass) {
      first.push_back(k);
      for (int32_t s = 0; s < n; ++s)
        if (accepting[size_t(s)] == (pass == 0)) elems[size_t(k)] = s, loc[size_t(s)] = k++, blk[size_t(s)] = pass;
      end.push_back(k);
      marked.push_back(0);
    }
  }
  std::vector<uint8_t> in_work(size_t(n) * size_t(classes), 0);
  std::vector<std::pair<int32_t, int32_t>> work_list;
  auto push = [&](int32_t b, int32_t c) {
    in_work[size_t(b) * size_t(classes) + size_t(c)] = 1;
    work_list.push_back({b, c});
  };
  const int32_t smaller = end[0] - first[0] <= end[1] - first[1] ? 0 : 1;
  for (int32_t c = 0; c < classes; ++c) push(smaller, c);
  std::vector<int32_t> splitter, touched;
  while (!work_list.empty()) {
    const auto [b, c] = work_list.back();
    work_list.pop_back();
    in_work[size_t(b) * size_t(classes) + size_t(c)] = 0;
    splitter.assign(elems.begin() + first[size_t(b)], elems.begin() + end[size_t(b)]);
    touched.clear();
    for (int32_t t : splitter) {
      const size_t base = size_t(c) * size_t(n) + size_t(t);
      for (int32_t k = inv_begin[base]; k < inv_begin[base + 1]; ++k) {
        const int32_t s = inv[size_t(k)], x = blk[size_t(s)];
        const int32_t boundary = first[size_t(x)] + marked[size_t(x)];
        if (loc[size_t(s)] < boundary) continue;  // already marked
        const int32_t other = elems[size_t(boundary)];
        std::swap(elems[size_t(boundary)], elems[size_t(loc[size_t(s)])]);
        loc[size_t(other)] = loc[size_t(s)];
        loc[size_t(s)] = boundary;
        if (marked[size_t(x)]++ == 0) touched.push_back(x);
      }
    }
    for (int32_t x : touched) {
      const int32_t m = marked[size_t(x)];
      marked[size_t(x)] = 0;
      if (m == end[size_t(x)] - first[size_t(x)]) continue;
      const int32_t y = int32_t(first.size());  // the marked part becomes block y
      first.push_back(first[size_t(x)]);
      end.push_back(first[size_t(x)] + m);
      marked.push_back(0);
      first[size_t(x)] += m;
      for (int32_t k = first[size_t(y)]; k < end[size_t(y)]; ++k) blk[size_t(elems[size_t(k)])] = y;
      const bool y_smaller = m <= end[size_t(x)] - first[size_t(x)];
      for (int32_t cc = 0; cc < classes; ++cc) {
        if (in_work[size_t(x) * size_t(classes) + size_t(cc)]) push(y, cc);
        else push(y_smaller ? y : x, cc);
      }
    }
  }

  // Renumber the live blocks breadth-first from the start; the sink's block (every state that cannot reach an
  // accepting one) is the dead state -1.
  const int32_t blocks = int32_t(first.size()), dead = blk[size_t(sink)];
  std::vector<int32_t> id(size_t(blocks), -1), order{blk[0]};
  id[size_t(blk[0])] = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const int32_t rep = elems[size_t(first[size_t(order[k])])];
    for (int32_t c = 0; c < classes; ++c) {
      const int32_t t = blk[size_t(delta(rep, c))];
      if (t != dead && id[size_t(t)] < 0) id[size_t(t)] = int32_t(order.size()), order.push_back(t);
    }
  }
  const size_t live = order.size();
  // Columns (classes) no state tells apart are merged.
  std::map<std::vector<int16_t>, uint8_t> columns;
  std::vector<uint8_t> class_map(static_cast<size_t>(classes));
  std::vector<std::vector<int16_t>> kept;
  for (int32_t c = 0; c < classes; ++c) {
    std::vector<int16_t> col(live);
    for (size_t k = 0; k < live; ++k) {
      const int32_t t = blk[size_t(delta(elems[size_t(first[size_t(order[k])])], c))];
      col[k] = int16_t(t == dead ? -1 : id[size_t(t)]);
    }
    auto [it, fresh] = columns.try_emplace(col, uint8_t(kept.size()));
    if (fresh) kept.push_back(std::move(col));
    class_map[size_t(c)] = it->second;
  }
  Regex::Dfa dfa;
  dfa.classes = int32_t(kept.size());
  for (size_t b = 0; b < 256; ++b) dfa.class_of[b] = class_map[class_of[b]];
  dfa.next.assign(live * kept.size(), -1);
  dfa.flags.assign(live, 0);
  for (size_t k = 0; k < live; ++k) {
    bool any = false;
    for (size_t c = 0; c < kept.size(); ++c) {
      dfa.next[k * kept.size() + c] = kept[c][k];
      any |= kept[c][k] >= 0;
    }
    if (accepting[size_t(elems[size_t(first[size_t(order[k])])])]) dfa.flags[k] = any ? 1 : 3;
  }
  return dfa;
}

}  // namespace moeserve::grammar::regex_detail

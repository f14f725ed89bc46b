#include "grammar/token_mask.h"

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/json_grammar_internal.h"

namespace moeserve::grammar {
namespace {

bool is_json_space(unsigned char b) { return b == ' ' || b == '\n' || b == '\t' || b == '\r'; }

}  // namespace

void TokenVocabulary::Trie::build(std::vector<std::pair<std::string, int32_t>> entries) {
  // Sorted byte strings list a trie's nodes in preorder: each entry opens the nodes past its common prefix with the
  // entry before it (closing that one's deeper nodes first), and its token belongs to its last node, the newest.
  std::sort(entries.begin(), entries.end());
  nodes.assign(1, Node{});
  tokens.clear();
  tokens.reserve(entries.size());
  max_depth = 0;
  std::vector<int32_t> path{0};  // the open nodes, by depth
  const std::string* prev = nullptr;
  for (const auto& [bytes, id] : entries) {
    MS_CHECK(!bytes.empty() && bytes.size() < 65535, "a trie entry of {} bytes", bytes.size());
    size_t common = 0;
    if (prev)
      while (common < prev->size() && common < bytes.size() && (*prev)[common] == bytes[common]) ++common;
    while (path.size() > common + 1) {
      nodes[size_t(path.back())].end = int32_t(nodes.size());
      path.pop_back();
    }
    for (size_t k = common; k < bytes.size(); ++k) {
      path.push_back(int32_t(nodes.size()));
      Node n;
      n.depth = uint16_t(k + 1);
      n.byte = static_cast<uint8_t>(bytes[k]);
      n.token_begin = int32_t(tokens.size());
      nodes.push_back(n);
    }
    tokens.push_back(id);
    max_depth = std::max(max_depth, int(bytes.size()));
    prev = &bytes;
  }
  for (int32_t open : path) nodes[size_t(open)].end = int32_t(nodes.size());
  Node sentinel;
  sentinel.token_begin = int32_t(tokens.size());
  nodes.push_back(sentinel);
}

template <class State, class Step>
void TokenVocabulary::Trie::scan(const State& root, Step step, std::vector<uint8_t>& allowed) const {
  // A state a depth (assigned in place, so a matcher's storage is reused); preorder goes one level deeper at most.
  std::vector<State> state{root};
  const int32_t last = int32_t(nodes.size()) - 1;  // the sentinel
  for (int32_t i = 1; i < last;) {
    const Node& n = nodes[size_t(i)];
    if (state.size() <= n.depth) state.push_back(state[n.depth - 1u]);
    if (!step(state[n.depth - 1u], n.byte, state[n.depth])) {
      i = n.end;
      continue;
    }
    for (int32_t k = n.token_begin; k < nodes[size_t(i) + 1].token_begin; ++k) allowed[size_t(tokens[size_t(k)])] = 1;
    ++i;
  }
}

namespace {

// The scan's steps: a JSON matcher fed the byte; a regex DFA's state (a table lookup: a permissive pattern's mask
// visits most of the trie); a JSON pattern string's DFA state with its code points so far, counted at a character's
// first byte and viable within the string's length bounds (as the matcher steps such a string's content).
bool json_step(const JsonMatcher& from, uint8_t byte, JsonMatcher& to) {
  to = from;
  return to.feed(byte);
}

struct PatternAt {
  int32_t state;
  uint32_t count;
};

}  // namespace

TokenVocabulary::TokenVocabulary(const std::vector<std::optional<std::string>>& bytes)
    : size_(int32_t(bytes.size())) {
  std::vector<std::pair<std::string, int32_t>> all, non_plain;
  bytes_.resize(bytes.size());
  // Plain: what the matcher itself takes inside a fresh free string without a quote or backslash (the content that
  // JsonMatcher::in_plain_string promises to accept whatever came before in the string).
  JsonMatcher free_string(JsonSchema::compile(nlohmann::ordered_json{{"type", "string"}}));
  free_string.feed('"');
  JsonMatcher scratch = free_string;
  auto plain = [&](const std::string& b) {
    if (b.find_first_of("\"\\") != std::string::npos) return false;
    scratch = free_string;
    return scratch.feed(b);
  };
  for (size_t id = 0; id < bytes.size(); ++id) {
    if (!bytes[id] || bytes[id]->empty()) continue;
    const std::string& b = *bytes[id];
    bytes_[id] = b;
    max_bytes_ = std::max(max_bytes_, int(b.size()));
    all.emplace_back(b, int32_t(id));
    if (plain(b)) plain_.push_back(int32_t(id));
    else non_plain.emplace_back(b, int32_t(id));
  }
  auto code_points = [&](int32_t id) {
    return int32_t(std::count_if(bytes_[size_t(id)].begin(), bytes_[size_t(id)].end(),
                                 [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
  };
  std::stable_sort(plain_.begin(), plain_.end(), [&](int32_t a, int32_t b) { return code_points(a) < code_points(b); });
  for (int32_t id : plain_) plain_cp_.push_back(code_points(id));
  std::vector<std::pair<std::string, int32_t>> plain_entries;
  plain_entries.reserve(plain_.size());
  for (int32_t id : plain_) plain_entries.emplace_back(bytes_[size_t(id)], id);
  all_.build(std::move(all));
  non_plain_.build(std::move(non_plain));
  plain_trie_.build(std::move(plain_entries));
}

void TokenVocabulary::mark_allowed(const JsonMatcher& m, std::vector<uint8_t>& allowed) const {
  MS_CHECK(allowed.size() == size_t(size_), "mask of {} entries for a vocabulary of {}", allowed.size(), size_);
  if (const int32_t room = m.plain_string_room(); room >= 0) {
    const size_t n = size_t(std::upper_bound(plain_cp_.begin(), plain_cp_.end(), room) - plain_cp_.begin());
    for (size_t i = 0; i < n; ++i) allowed[size_t(plain_[i])] = 1;
    non_plain_.scan(m, json_step, allowed);
  } else if (JsonMatcher::PatternString ps; m.pattern_string(ps)) {
    const auto& p = *static_cast<const detail::StringPattern*>(ps.pattern);
    plain_trie_.scan(PatternAt{ps.state, ps.count}, [&p](const PatternAt& from, uint8_t byte, PatternAt& to) {
      to = PatternAt{p.re->next(from.state, byte), from.count + ((byte & 0xC0) != 0x80 ? 1u : 0u)};
      return to.state >= 0 && p.viable(to.state, to.count);
    }, allowed);
    non_plain_.scan(m, json_step, allowed);
  } else {
    all_.scan(m, json_step, allowed);
  }
}

void TokenVocabulary::mark_allowed(const RegexMatcher& m, std::vector<uint8_t>& allowed) const {
  MS_CHECK(allowed.size() == size_t(size_), "mask of {} entries for a vocabulary of {}", allowed.size(), size_);
  const Regex& re = m.regex();
  all_.scan(m.state(), [&re](int32_t from, uint8_t byte, int32_t& to) { return (to = re.next(from, byte)) >= 0; },
            allowed);
}

namespace {

std::variant<JsonMatcher, RegexMatcher> start_matcher(const ConstraintSpec& spec) {
  MS_CHECK(bool(spec.schema) != bool(spec.regex), "a constraint needs exactly one grammar (a schema or a regex)");
  if (spec.regex) return RegexMatcher(spec.regex);
  return JsonMatcher(spec.schema);
}

}  // namespace

Constraint::Constraint(std::shared_ptr<const ConstraintSpec> spec, std::vector<int32_t> end_tokens)
    : spec_(std::move(spec)), end_tokens_(std::move(end_tokens)), matcher_(start_matcher(*spec_)) {
  switch (spec_->start) {
    case ConstraintSpec::Start::kDocument: phase_ = Phase::kDocument; break;
    case ConstraintSpec::Start::kMaybeReasoning: phase_ = Phase::kMaybeReasoning; break;
    case ConstraintSpec::Start::kReasoning: phase_ = Phase::kReasoning; break;
  }
}

void Constraint::allowed_tokens(std::vector<uint32_t>& words) const {
  words.clear();
  if (!constraining()) return;
  // A regex's mask is a function of its DFA state: a state met again (a loop such as [a-z ]+) takes its mask from
  // the cache (a bounded one: each entry is the vocabulary's bits).
  const RegexMatcher* re = std::get_if<RegexMatcher>(&matcher_);
  const bool cacheable = re && phase_ == Phase::kDocument;
  if (cacheable)
    if (auto it = mask_cache_.find(re->state()); it != mask_cache_.end()) {
      words = it->second.words;
      stuck_ = it->second.stuck;
      return;
    }
  const TokenVocabulary& v = *spec_->vocab;
  allowed_.assign(size_t(v.size()), 0);
  std::visit([&](const auto& m) { v.mark_allowed(m, allowed_); }, matcher_);
  if (phase_ == Phase::kMaybeReasoning && spec_->think_open >= 0 && spec_->think_open < v.size())
    allowed_[size_t(spec_->think_open)] = 1;
  // The bytes (0 / 1) packed 8 at a time: the multiply moves byte i's bit to bit 56 + i (no two products overlap,
  // so nothing carries), then 32 at a time into the words.
  const size_t n = size_t(v.size());
  words.assign((n + 31) / 32, 0u);
  size_t id = 0;
  for (; id + 8 <= n; id += 8) {
    uint64_t x;
    std::memcpy(&x, allowed_.data() + id, 8);
    words[id >> 5] |= uint32_t((x * 0x0102040810204080ull) >> 56) << (id & 31);
  }
  for (; id < n; ++id)
    if (allowed_[id]) words[id >> 5] |= 1u << (id & 31);
  const bool complete = can_finish();
  stuck_ = !complete && std::all_of(words.begin(), words.end(), [](uint32_t w) { return w == 0; });
  if (complete || stuck_)
    for (int32_t e : end_tokens_)
      if (e >= 0 && e < v.size()) words[size_t(e) >> 5] |= 1u << (e & 31);
  if (cacheable && mask_cache_.size() < kMaskCacheEntries) mask_cache_[re->state()] = CachedMask{words, stuck_};
}

bool Constraint::can_finish() const {
  return std::visit([](const auto& m) { return m.can_finish(); }, matcher_);
}

bool Constraint::accept(int32_t token) {
  if (phase_ == Phase::kReasoning) {
    if (token == spec_->think_close) phase_ = Phase::kDocument;
    return true;
  }
  if (phase_ == Phase::kMaybeReasoning && token == spec_->think_open) {
    phase_ = Phase::kReasoning;
    return true;
  }
  if (std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end()) return can_finish();
  const std::string* bytes = spec_->vocab->bytes_of(token);
  if (!bytes || !std::visit([&](auto& m) { return m.feed(*bytes); }, matcher_)) return false;
  // The reasoning may still open after leading whitespace (the reasoning parser allows it there too).
  if (phase_ == Phase::kMaybeReasoning &&
      !std::all_of(bytes->begin(), bytes->end(), [](char b) { return is_json_space(static_cast<unsigned char>(b)); }))
    phase_ = Phase::kDocument;
  return true;
}

}  // namespace moeserve::grammar

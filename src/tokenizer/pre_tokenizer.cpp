#include "tokenizer/pre_tokenizer.h"

#include <algorithm>

#include "tokenizer/json_util.h"
#include "tokenizer/unicode.h"

namespace moeserve::tok {
namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const std::string& s, const std::string& where) {
  if (s == "Removed") return Behavior::kRemoved;
  if (s == "Isolated") return Behavior::kIsolated;
  if (s == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::kMergedWithNext;
  if (s == "Contiguous") return Behavior::kContiguous;
  throw_user("{}: unknown split behavior '{}' (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)",
             where, s);
}

struct Part {
  uint32_t b, e;
  bool is_match;
};

// NormalizedString::split of tokenizers: the matches and the gaps between them, combined by `behavior`,
// then empty pieces dropped. Appends pieces of the parent piece `parent` (offsets into the same buffer).
void split_piece(const Piece& parent, const std::vector<Span>& matches, bool invert, Behavior behavior,
                 std::vector<Piece>& out) {
  const uint32_t n = parent.end - parent.begin;
  if (n == 0) return;
  if (behavior == Behavior::kIsolated) {
    // The hot path (every GPT-style split regex): matches and gaps all become pieces, no bookkeeping needed.
    uint32_t prev = 0;
    auto emit = [&](uint32_t b, uint32_t e) {
      if (b != e) out.push_back({parent.begin + b, parent.begin + e, parent.at_origin && b == 0});
    };
    for (const Span& m : matches) {
      emit(prev, m.first);
      emit(m.first, m.second);
      prev = m.second;
    }
    emit(prev, n);
    return;
  }
  std::vector<Part> parts;
  parts.reserve(matches.size() * 2 + 1);
  uint32_t prev = 0;
  for (const Span& m : matches) {
    if (prev != m.first) parts.push_back({prev, m.first, invert});
    parts.push_back({m.first, m.second, !invert});
    prev = m.second;
  }
  if (prev != n) parts.push_back({prev, n, invert});

  std::vector<Part> kept;
  kept.reserve(parts.size());
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated: break;  // handled above
    case Behavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.is_match) kept.push_back(p);
      }
      break;
    case Behavior::kContiguous:
      for (const Part& p : parts) {
        if (p.is_match == previous_match && !kept.empty()) kept.back().e = p.e;
        else kept.push_back(p);
        previous_match = p.is_match;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !kept.empty()) kept.back().e = p.e;
        else kept.push_back(p);
        previous_match = p.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty()) kept.back().b = it->b;
        else kept.push_back(*it);
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
  }
  for (const Part& p : kept) {
    if (p.b == p.e) continue;
    out.push_back({parent.begin + p.b, parent.begin + p.e, parent.at_origin && p.b == 0});
  }
}

// Splits every piece with `find`, which appends the matches inside one piece's text.
template <typename FindFn>
void split_all(Pieces& pieces, bool invert, Behavior behavior, FindFn&& find) {
  pieces.tmp_list.clear();
  for (const Piece& p : pieces.list) {
    pieces.matches.clear();
    find(pieces.view(p), pieces.matches);
    split_piece(p, pieces.matches, invert, behavior, pieces.tmp_list);
  }
  std::swap(pieces.list, pieces.tmp_list);
}

// Each character for which pred holds is one match (tokenizers' Pattern impl for char predicates).
template <typename Pred>
void char_matches(std::string_view s, std::vector<Span>& out, Pred&& pred) {
  int len;
  for (size_t i = 0; i < s.size(); i += len) {
    char32_t cp = unicode::decode_valid(s.data(), i, len);
    if (pred(cp)) out.emplace_back(uint32_t(i), uint32_t(i + len));
  }
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Pattern> pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void apply(Pieces& pieces) const override {
    split_all(pieces, invert_, behavior_,
              [&](std::string_view s, std::vector<Span>& out) { pattern_->find_all(s, out); });
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) {
      regex_ = make_regex_pattern(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
                                  where);
    }
  }
  void apply(Pieces& pieces) const override {
    if (add_prefix_space_) {
      bool any = std::any_of(pieces.list.begin(), pieces.list.end(),
                             [&](const Piece& p) { return pieces.buf[p.begin] != ' '; });
      if (any) {
        pieces.tmp_buf.clear();
        pieces.tmp_list.clear();
        for (const Piece& p : pieces.list) {
          uint32_t b = uint32_t(pieces.tmp_buf.size());
          if (pieces.buf[p.begin] != ' ') pieces.tmp_buf.push_back(' ');
          pieces.tmp_buf.append(pieces.view(p));
          pieces.tmp_list.push_back({b, uint32_t(pieces.tmp_buf.size()), p.at_origin});
        }
        std::swap(pieces.buf, pieces.tmp_buf);
        std::swap(pieces.list, pieces.tmp_list);
      }
    }
    if (regex_) {
      split_all(pieces, false, Behavior::kIsolated,
                [&](std::string_view s, std::vector<Span>& out) { regex_->find_all(s, out); });
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Pattern> regex_;
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(char32_t replacement, Prepend prepend, bool split)
      : prepend_(prepend), split_(split), replacement_cp_(replacement) {
    unicode::append_utf8(replacement_, replacement);
  }
  void apply(Pieces& pieces) const override {
    pieces.tmp_buf.clear();
    pieces.tmp_list.clear();
    for (const Piece& p : pieces.list) {
      // tokenizers replaces the spaces first, then decides on the prefix.
      const std::string_view s = pieces.view(p);
      const uint32_t b = uint32_t(pieces.tmp_buf.size());
      const bool starts_with_rep = s.substr(0, 1) == " " || s.substr(0, replacement_.size()) == replacement_;
      bool prefix = !starts_with_rep && (prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && p.at_origin));
      if (prefix) pieces.tmp_buf.append(replacement_);
      for (char c : s) {
        if (c == ' ') pieces.tmp_buf.append(replacement_);
        else pieces.tmp_buf.push_back(c);
      }
      pieces.tmp_list.push_back({b, uint32_t(pieces.tmp_buf.size()), p.at_origin});
    }
    std::swap(pieces.buf, pieces.tmp_buf);
    std::swap(pieces.list, pieces.tmp_list);
    if (split_) {
      split_all(pieces, false, Behavior::kMergedWithNext, [&](std::string_view s, std::vector<Span>& out) {
        char_matches(s, out, [&](char32_t cp) { return cp == replacement_cp_; });
      });
    }
  }

 private:
  Prepend prepend_;
  bool split_;
  char32_t replacement_cp_;
  std::string replacement_;
};

// Digits (char::is_numeric), WhitespaceSplit (char::is_whitespace, removed), CharDelimiterSplit.
class CharClassPreTokenizer final : public PreTokenizer {
 public:
  enum class Kind { kDigits, kWhitespace, kDelimiter };
  CharClassPreTokenizer(Kind kind, Behavior behavior, char32_t delimiter = 0)
      : kind_(kind), behavior_(behavior), delimiter_(delimiter) {}
  void apply(Pieces& pieces) const override {
    split_all(pieces, false, behavior_, [&](std::string_view s, std::vector<Span>& out) {
      char_matches(s, out, [&](char32_t cp) {
        switch (kind_) {
          case Kind::kDigits: return (unicode::classes(cp) & unicode::kNumber) != 0;
          case Kind::kWhitespace: return unicode::is_white_space(cp);
          case Kind::kDelimiter: return cp == delimiter_;
        }
        return false;
      });
    });
  }

 private:
  Kind kind_;
  Behavior behavior_;
  char32_t delimiter_;
};

char32_t single_char(const std::string& s, const std::string& what, const std::string& where) {
  int len = 0;
  if (s.empty() || !unicode::is_valid_utf8(s)) throw_user("{}: '{}' must be one character", where, what);
  char32_t cp = unicode::decode_valid(s.data(), 0, len);
  if (size_t(len) != s.size()) throw_user("{}: '{}' must be one character, got '{}'", where, what, s);
  return cp;
}

void build(const nlohmann::json& j, const std::string& where, std::vector<std::unique_ptr<PreTokenizer>>& out,
           bool& byte_level) {
  if (j.is_null()) return;
  const std::string type = json_util::type_of(j, where + ": pre_tokenizer");
  const std::string w = where + ": pre_tokenizer " + type;
  if (byte_level) {
    throw_user("{}: a pre-tokenizer after ByteLevel is not supported (ByteLevel must come last)", w);
  }
  if (type == "Sequence") {
    const nlohmann::json& list = json_util::field(j, "pretokenizers", w);
    if (!list.is_array()) throw_user("{}: 'pretokenizers' must be a list", w);
    for (const auto& item : list) build(item, where, out, byte_level);
  } else if (type == "Split") {
    out.push_back(std::make_unique<SplitPreTokenizer>(
        json_util::pattern(j, w), parse_behavior(json_util::get<std::string>(j, "behavior", w), w),
        json_util::get_or<bool>(j, "invert", false, w)));
  } else if (type == "ByteLevel") {
    out.push_back(std::make_unique<ByteLevelPreTokenizer>(json_util::get_or<bool>(j, "add_prefix_space", true, w),
                                                          json_util::get_or<bool>(j, "use_regex", true, w), w));
    byte_level = true;
  } else if (type == "Metaspace") {
    using P = MetaspacePreTokenizer::Prepend;
    P prepend = json_util::get_or<bool>(j, "add_prefix_space", true, w) ? P::kAlways : P::kNever;
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
      std::string scheme = json_util::get<std::string>(j, "prepend_scheme", w);
      if (scheme == "always") prepend = P::kAlways;
      else if (scheme == "first") prepend = P::kFirst;
      else if (scheme == "never") prepend = P::kNever;
      else throw_user("{}: unknown prepend_scheme '{}' (always, first, never)", w, scheme);
    }
    out.push_back(std::make_unique<MetaspacePreTokenizer>(
        single_char(json_util::get_or<std::string>(j, "replacement", "\xE2\x96\x81", w), "replacement", w), prepend,
        json_util::get_or<bool>(j, "split", true, w)));
  } else if (type == "Digits") {
    bool individual = json_util::get_or<bool>(j, "individual_digits", false, w);
    out.push_back(std::make_unique<CharClassPreTokenizer>(
        CharClassPreTokenizer::Kind::kDigits, individual ? Behavior::kIsolated : Behavior::kContiguous));
  } else if (type == "WhitespaceSplit") {
    out.push_back(std::make_unique<CharClassPreTokenizer>(CharClassPreTokenizer::Kind::kWhitespace,
                                                          Behavior::kRemoved));
  } else if (type == "CharDelimiterSplit") {
    out.push_back(std::make_unique<CharClassPreTokenizer>(
        CharClassPreTokenizer::Kind::kDelimiter, Behavior::kRemoved,
        single_char(json_util::get<std::string>(j, "delimiter", w), "delimiter", w)));
  } else {
    throw_user("{}: unsupported pre_tokenizer type '{}' (moeserve supports Split, ByteLevel, Metaspace, Digits, "
               "WhitespaceSplit, CharDelimiterSplit and Sequence)",
               where, type);
  }
}

}  // namespace

std::vector<std::unique_ptr<PreTokenizer>> make_pre_tokenizers(const nlohmann::json& j, const std::string& where,
                                                               bool& byte_level) {
  std::vector<std::unique_ptr<PreTokenizer>> out;
  byte_level = false;
  build(j, where, out, byte_level);
  return out;
}

}  // namespace moeserve::tok

#include "tokenizer/normalizer.h"

#include <vector>

#include "tokenizer/json_util.h"
#include "tokenizer/unicode.h"

namespace moeserve::tok {
namespace {

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(unicode::NormalForm form) : form_(form) {}
  void normalize(std::string& s) const override { s = unicode::normalize(s, form_); }

 private:
  unicode::NormalForm form_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Pattern> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& s) const override {
    std::vector<Span> matches;
    pattern_->find_all(s, matches);
    if (matches.empty()) return;
    std::string out;
    out.reserve(s.size() + matches.size() * content_.size());
    size_t prev = 0;
    for (const Span& m : matches) {
      out.append(s, prev, m.first - prev);
      out.append(content_);
      prev = m.second;
    }
    out.append(s, prev, std::string::npos);
    s = std::move(out);
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  std::string content_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override {
    size_t b = 0, e = s.size();
    int len;
    if (left_) {
      while (b < e && unicode::is_white_space(unicode::decode_valid(s.data(), b, len))) b += len;
    }
    if (right_) {
      while (e > b) {
        size_t p = e - 1;
        while (p > b && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
        if (!unicode::is_white_space(unicode::decode_valid(s.data(), p, len))) break;
        e = p;
      }
    }
    s = s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& s) const override {
    for (const auto& step : steps_) step->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_util::type_of(j, where + ": normalizer");
  const std::string w = where + ": normalizer " + type;
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::kNFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::kNFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::kNFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::kNFKD);
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(json_util::get<std::string>(j, "prepend", w));
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(json_util::pattern(j, w), json_util::get<std::string>(j, "content", w));
  }
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(json_util::get_or<bool>(j, "strip_left", true, w),
                                             json_util::get_or<bool>(j, "strip_right", true, w));
  }
  if (type == "Sequence") {
    const nlohmann::json& list = json_util::field(j, "normalizers", w);
    if (!list.is_array()) throw_user("{}: 'normalizers' must be a list", w);
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& item : list) {
      if (auto n = make_normalizer(item, where)) steps.push_back(std::move(n));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  throw_user("{}: unsupported normalizer type '{}' (moeserve supports NFC, NFD, NFKC, NFKD, Prepend, Replace, "
             "Strip and Sequence)",
             where, type);
}

}  // namespace moeserve::tok

#include "tokenizer/json_loader.h"

#include "core/error.h"

namespace moeserve::tok {
namespace {

using json = nlohmann::json;

// SAX handler: builds a DOM, except under model.vocab and model.merges where entries go to TokenizerJson's
// vectors. The first malformed entry is remembered and reported after parsing.
class Handler final : public nlohmann::json_sax<json> {
 public:
  explicit Handler(TokenizerJson& out) : out_(out) {}
  const std::string& error() const { return error_; }

  bool null() override { return value(json()); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(number_integer_t v) override { return value(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return value(json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return value(json(v)); }
  bool string(string_t& v) override { return value(json(std::move(v))); }
  bool binary(binary_t&) override { return fail("binary data is not JSON"); }

  bool start_object(std::size_t) override {
    if (skip_ > 0) return ++skip_, true;  // inside a skipped entry: only counted
    if (mode_ != Mode::kDom) return nested("an object");
    if (model_field("vocab")) {
      out_.has_vocab = true;
      mode_ = Mode::kVocab;
      return insert(json());
    }
    return open(json::object());
  }
  bool key(string_t& k) override {
    if (mode_ == Mode::kVocab && skip_ == 0) vocab_key_ = std::move(k);
    else if (mode_ == Mode::kDom) key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    if (skip_ > 0) return --skip_, true;
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    return close();
  }
  bool start_array(std::size_t) override {
    if (skip_ > 0) return ++skip_, true;  // inside a skipped entry (a list there is no merge pair: fuzz_tokenizer_json)
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_.clear();
      return true;
    }
    if (mode_ != Mode::kDom) return nested("a list");
    if (model_field("merges")) {
      out_.has_merges = true;
      mode_ = Mode::kMerges;
      return insert(json());
    }
    return open(json::array());
  }
  bool end_array() override {
    if (skip_ > 0) return --skip_, true;
    if (mode_ == Mode::kMergePair) {
      mode_ = Mode::kMerges;
      if (pair_.size() != 2) return fail("model.merges: a merge given as a list must have two strings");
      out_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kDom;
      return true;
    }
    return close();
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    parse_error_ = e.what();
    return false;
  }
  const std::string& parse_error_message() const { return parse_error_; }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  // A scalar: into the DOM, or an entry of the vocabulary / merges.
  bool value(json&& v) {
    if (skip_ > 0) return true;
    switch (mode_) {
      case Mode::kDom: return insert(std::move(v));
      case Mode::kVocab:
        if (!v.is_number_integer()) return fail("model.vocab: entry '" + vocab_key_ + "' has a non-integer id");
        out_.vocab.emplace_back(std::move(vocab_key_), v.get<int64_t>());
        return true;
      case Mode::kMerges: {
        if (!v.is_string()) return fail("model.merges: entries must be \"a b\" strings or [a, b] lists");
        const std::string& s = v.get_ref<const std::string&>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos) return fail("model.merges: '" + s + "' is not of the form \"a b\"");
        out_.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        return true;
      }
      case Mode::kMergePair:
        if (!v.is_string()) return fail("model.merges: a merge given as a list must have two strings");
        pair_.push_back(v.get<std::string>());
        return true;
    }
    return true;
  }

  // An object or list where the vocabulary / merges allow none: remember the error, skip its contents.
  bool nested(const char* what) {
    ++skip_;
    if (mode_ == Mode::kVocab) return fail(std::string("model.vocab: an entry is ") + what + ", not an id");
    return fail(std::string("model.merges: an entry is ") + what);
  }

  bool fail(const std::string& msg) {
    if (error_.empty()) error_ = msg;
    return true;  // keep parsing: the JSON itself may be fine, and its syntax errors take precedence
  }

  bool model_field(const char* name) const {
    return stack_.size() == 2 && keys_[1] == "model" && stack_[1]->is_object() && key_ == name;
  }

  json* place(json&& v) {
    if (stack_.empty()) {
      out_.root = std::move(v);
      return &out_.root;
    }
    json& parent = *stack_.back();
    if (parent.is_object()) return &(parent[key_] = std::move(v));
    parent.push_back(std::move(v));
    return &parent.back();
  }
  bool insert(json&& v) {
    place(std::move(v));
    return true;
  }
  bool open(json&& container) {
    std::string k = stack_.empty() || !stack_.back()->is_object() ? std::string() : key_;
    stack_.push_back(place(std::move(container)));
    keys_.push_back(std::move(k));
    return true;
  }
  bool close() {
    MS_CHECK(!stack_.empty(), "tokenizer.json loader: a container closed that was never opened");
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }

  TokenizerJson& out_;
  std::vector<json*> stack_;
  std::vector<std::string> keys_;  // the key each open container sits under ("" in a list)
  std::string key_;
  std::string vocab_key_;
  std::vector<std::string> pair_;
  Mode mode_ = Mode::kDom;
  int skip_ = 0;
  std::string error_;
  std::string parse_error_;
};

}  // namespace

TokenizerJson parse_tokenizer_json(std::string_view text, const std::string& where) {
  TokenizerJson out;
  Handler handler(out);
  const bool ok = json::sax_parse(text.begin(), text.end(), &handler, nlohmann::detail::input_format_t::json,
                                  /*strict=*/true, /*ignore_comments=*/false);
  if (!ok) throw_user("{}: not valid JSON ({})", where, handler.parse_error_message());
  if (!handler.error().empty()) throw_user("{}: {}", where, handler.error());
  return out;
}

}  // namespace moeserve::tok

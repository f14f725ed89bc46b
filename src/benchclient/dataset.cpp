#include "benchclient/dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/json_depth.h"

namespace moeserve::bench {

using nlohmann::json;

namespace {

// Frequent English words that byte-level BPE vocabularies (GPT-2, Llama 3, Qwen) hold as one token with their
// leading space, so that random text of N words is close to N tokens.
constexpr const char* kWords[] = {
    "the",   "of",    "and",   "to",    "in",    "is",    "you",   "that",  "it",    "he",    "was",   "for",
    "on",    "are",   "as",    "with",  "his",   "they",  "at",    "be",    "this",  "have",  "from",  "or",
    "one",   "had",   "by",    "word",  "but",   "not",   "what",  "all",   "were",  "we",    "when",  "your",
    "can",   "said",  "there", "use",   "an",    "each",  "which", "she",   "do",    "how",   "their", "if",
    "will",  "up",    "other", "about", "out",   "many",  "then",  "them",  "these", "so",    "some",  "her",
    "would", "make",  "like",  "him",   "into",  "time",  "has",   "look",  "two",   "more",  "write", "go",
    "see",   "number", "no",   "way",   "could", "people", "my",   "than",  "first", "water", "been",  "call",
    "who",   "now",   "find",  "long",  "down",  "day",   "did",   "get",   "come",  "made",  "may",   "part",
};

int64_t lower_bound_len(int64_t len, double ratio) {
  return std::max<int64_t>(int64_t(double(len) * ratio), 1);  // int() truncation, as numpy code does
}

}  // namespace

int64_t estimate_tokens(const std::string& text) { return int64_t((text.size() + 3) / 4); }

std::vector<BenchRequest> make_random_dataset(const RandomDatasetOptions& o) {
  MS_USER_CHECK(o.num_prompts >= 1, "--num-prompts must be at least 1, got {}", o.num_prompts);
  MS_USER_CHECK(o.input_len >= 1, "--random-input-len must be at least 1, got {}", o.input_len);
  MS_USER_CHECK(o.output_len >= 1, "--random-output-len must be at least 1, got {}", o.output_len);
  MS_USER_CHECK(o.range_ratio >= 0 && o.range_ratio <= 1, "--random-range-ratio must be in [0, 1], got {}",
                o.range_ratio);
  // The prompts are made up front: a workload that cannot fit in memory is an error, not std::bad_alloc.
  constexpr long double kMaxPromptTokens = 1e9;  // 4 GB of token ids, ~5 GB of text
  MS_USER_CHECK((long double)o.num_prompts * (long double)o.input_len <= kMaxPromptTokens,
                "--num-prompts {} x --random-input-len {} = {:.3g} prompt tokens to hold in memory; at most {:.0e}",
                o.num_prompts, o.input_len, double((long double)o.num_prompts * (long double)o.input_len),
                double(kMaxPromptTokens));
  MS_USER_CHECK(o.as_text || o.vocab_size >= 1,
                "random token-id prompts need the vocabulary size: pass --vocab-size N (the server's "
                "/get_model_info did not give one)");
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int64_t> in_len(lower_bound_len(o.input_len, o.range_ratio), o.input_len);
  std::uniform_int_distribution<int64_t> out_len(lower_bound_len(o.output_len, o.range_ratio), o.output_len);
  std::uniform_int_distribution<int64_t> token(0, std::max<int64_t>(o.vocab_size, 1) - 1);
  std::uniform_int_distribution<size_t> word(0, std::size(kWords) - 1);
  std::vector<BenchRequest> out(size_t(o.num_prompts));
  // All lengths first (as numpy draws them as two arrays), then the prompts.
  for (auto& r : out) r.prompt_len = in_len(rng);
  for (auto& r : out) r.output_len = out_len(rng);
  for (auto& r : out) {
    r.is_ids = !o.as_text;
    if (r.is_ids) {
      r.prompt_ids.resize(size_t(r.prompt_len));
      for (auto& id : r.prompt_ids) id = int32_t(token(rng));
    } else {
      for (int64_t i = 0; i < r.prompt_len; ++i) {
        if (i) r.prompt_text += ' ';
        r.prompt_text += kWords[word(rng)];
      }
    }
  }
  return out;
}

std::vector<BenchRequest> sharegpt_from_json(const json& data, const ShareGptOptions& o, const std::string& source) {
  MS_USER_CHECK(o.num_prompts >= 1, "--num-prompts must be at least 1, got {}", o.num_prompts);
  MS_USER_CHECK(data.is_array(), "{}: expected a JSON list of {{\"conversations\": [...]}} entries", source);
  // (prompt, completion) pairs: the first human turn and the gpt turn after it.
  std::vector<std::pair<const std::string*, const std::string*>> pairs;
  for (auto& entry : data) {
    if (!entry.is_object()) continue;
    auto conv = entry.find("conversations");
    if (conv == entry.end() || !conv->is_array()) conv = entry.find("conversation");
    if (conv == entry.end() || !conv->is_array()) continue;
    const std::string *prompt = nullptr, *completion = nullptr;
    for (auto& turn : *conv) {
      if (!turn.is_object()) continue;
      auto from = turn.find("from");
      auto value = turn.find("value");
      if (from == turn.end() || !from->is_string() || value == turn.end() || !value->is_string()) continue;
      const std::string& who = from->get_ref<const std::string&>();
      if (!prompt && (who == "human" || who == "user")) {
        prompt = &value->get_ref<const std::string&>();
      } else if (prompt && (who == "gpt" || who == "assistant" || who == "chatgpt")) {
        completion = &value->get_ref<const std::string&>();
        break;
      }
    }
    if (prompt && completion) pairs.emplace_back(prompt, completion);
  }
  MS_USER_CHECK(!pairs.empty(), "{}: no conversation with a human turn followed by a gpt turn", source);
  std::mt19937_64 rng(o.seed);
  std::shuffle(pairs.begin(), pairs.end(), rng);
  std::vector<BenchRequest> out;
  for (auto& [prompt, completion] : pairs) {
    if (int64_t(out.size()) >= o.num_prompts) break;
    BenchRequest r;
    r.prompt_text = *prompt;
    r.prompt_len = estimate_tokens(r.prompt_text);
    r.output_len = o.fixed_output_len > 0 ? o.fixed_output_len : estimate_tokens(*completion);
    // SGLang's (and vLLM's) filter: too short to measure, or too long for the usual context.
    if (r.prompt_len < 4 || (o.fixed_output_len <= 0 && r.output_len < 4)) continue;
    if (o.context_len > 0) {
      if (r.prompt_len + r.output_len > o.context_len) continue;
    } else if (r.prompt_len > 1024 || (o.fixed_output_len <= 0 && r.prompt_len + r.output_len > 2048)) {
      continue;
    }
    out.push_back(std::move(r));
  }
  MS_USER_CHECK(!out.empty(),
                "{}: every conversation was filtered out (prompt or output under 4 tokens, or too long); "
                "try --sharegpt-output-len or --sharegpt-context-len",
                source);
  return out;
}

std::vector<BenchRequest> load_sharegpt_dataset(const std::string& path, const ShareGptOptions& o) {
  MS_USER_CHECK(!path.empty(), "--dataset-name sharegpt needs --dataset-path FILE (a ShareGPT JSON file, e.g. "
                               "ShareGPT_V3_unfiltered_cleaned_split.json)");
  std::ifstream in(path, std::ios::binary);
  MS_USER_CHECK(in.good(), "--dataset-path {}: cannot open the file", path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();  // (one copy of a file that may be hundreds of MB)
  MS_USER_CHECK(!json_nesting_exceeds(text), "--dataset-path {}: nests arrays and objects more than {} levels deep",
                path, kMaxJsonDepth);
  json data = json::parse(text, nullptr, /*allow_exceptions=*/false);
  MS_USER_CHECK(!data.is_discarded(), "--dataset-path {}: not valid JSON", path);
  return sharegpt_from_json(data, o, path);
}

std::vector<double> make_arrival_times(int64_t n, double rate, double burstiness, uint64_t seed) {
  MS_USER_CHECK(rate > 0, "--request-rate must be positive (or inf), got {}", rate);
  MS_USER_CHECK(burstiness > 0, "--burstiness must be positive, got {}", burstiness);
  std::vector<double> t(size_t(std::max<int64_t>(n, 0)), 0.0);
  if (std::isinf(rate)) return t;
  std::mt19937_64 rng(seed);
  // Gamma(shape k, scale 1/(rate k)) has mean 1/rate; k = 1 is the exponential distribution.
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  for (size_t i = 1; i < t.size(); ++i) t[i] = t[i - 1] + gap(rng);
  return t;
}

}  // namespace moeserve::bench

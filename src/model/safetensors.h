// safetensors files: validated header, memory-mapped data, zero-copy tensor views; a checkpoint folder
// (one file or shards with model.safetensors.index.json); and a parallel writer used by gen-model.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace moeserve {

class ThreadPool;

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets in the data section
};

// One .safetensors file. Every structural problem (short file, bad header length, bad JSON, unknown dtype,
// offsets past the end, overlapping tensors, size not matching dtype x shape) is a UserError naming the file
// and the tensor, raised in open() before any tensor is touched.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const nlohmann::json& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // A view into the mapping; it keeps the file mapped while alive.
  Tensor get(const std::string& name) const;
  size_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  std::map<std::string, TensorInfo> tensors_;
  nlohmann::json metadata_;
  std::shared_ptr<void> mapping_;  // munmap on release
  const char* data_ = nullptr;     // start of the data section
  size_t size_ = 0;
  std::weak_ptr<SafetensorsFile> self_;
};

// All the weights of a checkpoint folder, by name.
class Checkpoint {
 public:
  // Opens model.safetensors.index.json (and every shard it names) or model.safetensors. UserError when the
  // folder, a shard or a tensor the index names is missing.
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  std::optional<TensorInfo> info(const std::string& name) const;
  Tensor get(const std::string& name) const;  // UserError if missing
  std::vector<std::string> names() const;
  std::string file_of(const std::string& name) const;
  size_t total_bytes() const;

 private:
  std::string dir_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> where_;
};

// What gen-model writes: one tensor whose bytes are produced by fill(dst, first_element, count), a pure
// function of its arguments so that any split across threads gives the same file.
struct TensorSpec {
  std::string name;
  DType dtype;
  Shape shape;
  std::function<void(void* dst, int64_t first, int64_t count)> fill;
  size_t nbytes() const;
};

// Writes one safetensors file (header with sorted names, 8-byte aligned data), filling in parallel.
void write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                       const std::map<std::string, std::string>& metadata, ThreadPool& pool);

// Splits tensors into shards of at most max_shard_bytes (one file if they fit), writes them as
// model-0000i-of-0000n.safetensors plus model.safetensors.index.json (or model.safetensors alone).
// Returns the file names written.
std::vector<std::string> write_checkpoint_shards(const std::string& dir, const std::vector<TensorSpec>& tensors,
                                                 size_t max_shard_bytes, ThreadPool& pool);

}  // namespace moeserve

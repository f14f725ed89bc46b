#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/fs_lookup.h"
#include "core/json_depth.h"
#include "core/threadpool.h"
#include "model/config.h"

namespace moeserve {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the safetensors format's own limit

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void read_exact(int fd, void* buf, size_t n, uint64_t off, const std::string& path) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, static_cast<char*>(buf) + got, n - got, off + got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw_user("{}: read failed: {}", path, r < 0 ? std::strerror(errno) : "unexpected end of file");
    got += size_t(r);
  }
}
}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw_user("cannot open {}: {}", path, std::strerror(errno));
  struct stat st{};
  if (::fstat(f.fd, &st) != 0) throw_user("cannot stat {}: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw_user("{}: not a regular file", path);
  size_t size = size_t(st.st_size);
  if (size < 8) throw_user("{}: truncated safetensors file ({} bytes, the header length alone needs 8)", path, size);
  uint64_t header_len = 0;
  read_exact(f.fd, &header_len, 8, 0, path);  // little-endian on every platform we build for
  if (header_len > kMaxHeaderBytes || header_len > size - 8)
    throw_user("{}: corrupt safetensors header length {} (file is {} bytes)", path, header_len, size);
  std::string header(header_len, '\0');
  read_exact(f.fd, header.data(), header_len, 8, path);
  if (json_nesting_exceeds(header))
    throw_user("{}: the safetensors header nests more than {} levels deep", path, kMaxJsonDepth);
  json j;
  try {
    j = json::parse(header);
  } catch (const json::exception& e) {
    throw_user("{}: safetensors header is not valid JSON: {}", path, e.what());
  }
  if (!j.is_object()) throw_user("{}: safetensors header must be a JSON object", path);

  auto file = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = path;
  file->size_ = size;
  uint64_t data_size = size - 8 - header_len;
  std::vector<const TensorInfo*> by_offset;
  for (auto& item : j.items()) {
    const std::string& name = item.key();  // not a structured binding: the lambda below captures it (clang 14)
    auto& v = item.value();
    if (name == "__metadata__") {
      file->metadata_ = v;
      continue;
    }
    auto bad = [&](const std::string& why) { throw_user("{}: tensor '{}': {}", path, name, why); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      bad("header entry needs dtype, shape and data_offsets");
    if (!v["dtype"].is_string()) bad("dtype must be a string");
    auto dt = dtype_from_safetensors(v["dtype"].get<std::string>());
    if (!dt) bad(fmt::format("unsupported dtype '{}'", v["dtype"].get<std::string>()));
    TensorInfo t;
    t.name = name;
    t.dtype = *dt;
    if (!v["shape"].is_array()) bad("shape must be a list");
    uint64_t numel = 1;
    for (auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) bad(fmt::format("bad dimension {} in shape", d.dump()));
      uint64_t dim = d.get<uint64_t>();
      if (dim > (1ull << 40) || (dim && numel > (1ull << 50) / dim)) bad("shape is absurdly large");
      numel *= dim;
      t.shape.push_back(int64_t(dim));
    }
    auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad("data_offsets must be two non-negative integers");
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    if (t.begin > t.end) bad(fmt::format("data_offsets [{}, {}] are reversed", t.begin, t.end));
    if (t.end > data_size)
      bad(fmt::format("data_offsets [{}, {}] run past the end of the data ({} bytes): the file is truncated or corrupt",
                      t.begin, t.end, data_size));
    if (t.end - t.begin != numel * dtype_size(t.dtype))
      bad(fmt::format("{} bytes stored but dtype {} x shape {} needs {}", t.end - t.begin, dtype_name(t.dtype),
                      shape_str(t.shape), numel * dtype_size(t.dtype)));
    file->tensors_.emplace(name, std::move(t));
  }
  // Empty tensors take no bytes; each non-empty one must start at or after the furthest end of those before it
  // (a neighbour-only check misses a long tensor overlapping one past an empty or a short one).
  for (auto& [n, t] : file->tensors_)
    if (t.begin != t.end) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  const TensorInfo* reach = nullptr;  // the non-empty tensor with the furthest end so far
  for (const TensorInfo* t : by_offset) {
    if (reach && t->begin < reach->end)
      throw_user("{}: tensors '{}' and '{}' overlap in the data section", path, reach->name, t->name);
    if (!reach || t->end > reach->end) reach = t;
  }

  void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, f.fd, 0);
  if (m == MAP_FAILED) throw_user("{}: mmap failed: {}", path, std::strerror(errno));
  file->mapping_ = std::shared_ptr<void>(m, [size](void* p) { ::munmap(p, size); });
  file->data_ = static_cast<const char*>(m) + 8 + header_len;
  file->self_ = file;
  return file;
}

SafetensorsFile::~SafetensorsFile() = default;

Tensor SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw_user("{}: no tensor '{}'", path_, name);
  Tensor t;
  t.dtype = it->second.dtype;
  t.shape = it->second.shape;
  t.data = const_cast<char*>(data_ + it->second.begin);
  t.owner = mapping_;
  return t;
}

Checkpoint Checkpoint::open(const std::string& dir) {
  Checkpoint c;
  c.dir_ = dir;
  if (!path_is_directory(dir, "model path")) throw_user("model path '{}' is not a directory", dir);
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (path_exists(index, "model folder")) {
    std::ifstream in(index);
    const json j = read_json_file(in, index.string());
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw_user("{}: missing 'weight_map' object", index.string());
    std::map<std::string, std::shared_ptr<SafetensorsFile>> files;
    for (auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) throw_user("{}: weight_map['{}'] must be a file name", index.string(), name);
      std::string fname = file.get<std::string>();
      if (fname.find('/') != std::string::npos || fname.empty() || fname == "." || fname == "..")
        throw_user("{}: weight_map['{}'] names '{}', which is not a file in the model folder", index.string(),
                   name, fname);
      auto& f = files[fname];
      if (!f) {
        fs::path p = fs::path(dir) / fname;
        if (!path_exists(p, fmt::format("{}: the shard of '{}'", index.string(), name)))
          throw_user("{}: shard '{}' (holding '{}') is missing from {}", index.string(), fname, name, dir);
        f = SafetensorsFile::open(p.string());
      }
      if (!f->contains(name))
        throw_user("{}: the index puts tensor '{}' in {}, but that file does not contain it", index.string(), name,
                   fname);
      c.where_[name] = f;
    }
    return c;
  }
  fs::path single = fs::path(dir) / "model.safetensors";
  if (!path_exists(single, "model folder"))
    throw_user("no weights in {}: expected model.safetensors or model.safetensors.index.json", dir);
  auto f = SafetensorsFile::open(single.string());
  for (auto& [name, t] : f->tensors()) c.where_[name] = f;
  return c;
}

std::optional<TensorInfo> Checkpoint::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return std::nullopt;
  return it->second->tensors().at(name);
}

Tensor Checkpoint::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw_user("{}: missing tensor '{}'", dir_, name);
  return it->second->get(name);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> r;
  for (auto& [n, f] : where_) r.push_back(n);
  return r;
}

std::string Checkpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? std::string() : it->second->path();
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (auto& [name, f] : where_) {
    const auto& t = f->tensors().at(name);
    n += t.end - t.begin;
  }
  return n;
}

size_t TensorSpec::nbytes() const {
  size_t n = dtype_size(dtype);
  for (auto d : shape) n *= size_t(d);
  return n;
}

void write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                       const std::map<std::string, std::string>& metadata, ThreadPool& pool) {
  std::vector<const TensorSpec*> order;
  for (auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->name < b->name; });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<uint64_t> offsets;
  uint64_t off = 0;
  for (auto* t : order) {
    uint64_t n = t->nbytes();
    header[t->name] = {{"dtype", dtype_name(t->dtype)}, {"shape", t->shape}, {"data_offsets", {off, off + n}}};
    offsets.push_back(off);
    off += n;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8) h.push_back(' ');  // data section 8-byte aligned, as the reference writer does
  uint64_t total = 8 + h.size() + off;

  std::string tmp = path + ".partial";
  Fd f;
  f.fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd < 0) throw_user("cannot create {}: {}", tmp, std::strerror(errno));
  // pwrite from per-thread buffers: much faster than faulting in pages of a writable mapping.
  auto write_at = [&](const char* buf, size_t n, uint64_t off) {
    while (n > 0) {
      ssize_t w = ::pwrite(f.fd, buf, n, off_t(off));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw_user("cannot write {}: {}", tmp, std::strerror(errno));
      buf += w;
      n -= size_t(w);
      off += uint64_t(w);
    }
  };
  std::string head(8, '\0');
  uint64_t hl = h.size();
  std::memcpy(head.data(), &hl, 8);
  head += h;
  write_at(head.data(), head.size(), 0);
  const uint64_t data_start = 8 + h.size();
  // Work items of ~4 MiB so that big and small tensors spread evenly over the threads.
  struct Item {
    const TensorSpec* t;
    uint64_t off;
    int64_t first, count;
  };
  std::vector<Item> items;
  constexpr int64_t kItemBytes = 4 << 20;
  for (size_t i = 0; i < order.size(); ++i) {
    const TensorSpec* t = order[i];
    int64_t esz = int64_t(dtype_size(t->dtype)), numel = int64_t(t->nbytes()) / std::max<int64_t>(esz, 1);
    int64_t per = std::max<int64_t>(1, kItemBytes / esz);
    for (int64_t b = 0; b < numel; b += per)
      items.push_back({t, data_start + offsets[i] + uint64_t(b * esz), b, std::min(per, numel - b)});
  }
  pool.parallel_for(int64_t(items.size()), 1, [&](int64_t b, int64_t e) {
    std::vector<char> buf;
    for (int64_t i = b; i < e; ++i) {
      size_t n = size_t(items[i].count) * dtype_size(items[i].t->dtype);
      buf.resize(n);
      items[i].t->fill(buf.data(), items[i].first, items[i].count);
      write_at(buf.data(), n, items[i].off);
    }
  });
  if (::ftruncate(f.fd, off_t(total)) != 0) throw_user("cannot size {}: {}", tmp, std::strerror(errno));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw_user("cannot rename {} to {}: {}", tmp, path, std::strerror(errno));
}

std::vector<std::string> write_checkpoint_shards(const std::string& dir, const std::vector<TensorSpec>& tensors,
                                                 size_t max_shard_bytes, ThreadPool& pool) {
  std::vector<std::vector<TensorSpec>> shards(1);
  size_t cur = 0, total = 0;
  for (auto& t : tensors) {
    size_t n = t.nbytes();
    if (cur > 0 && cur + n > max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(t);
    cur += n;
    total += n;
  }
  std::vector<std::string> names;
  std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (shards.size() == 1) {
    write_safetensors(dir + "/model.safetensors", shards[0], meta, pool);
    names.push_back("model.safetensors");
    std::filesystem::remove(dir + "/model.safetensors.index.json");
    return names;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", json::object()}};
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    write_safetensors(dir + "/" + name, shards[i], meta, pool);
    for (auto& t : shards[i]) index["weight_map"][t.name] = name;
    names.push_back(name);
  }
  std::filesystem::remove(dir + "/model.safetensors");
  std::ofstream out(dir + "/model.safetensors.index.json");
  out << index.dump(2) << "\n";
  if (!out) throw_user("cannot write {}/model.safetensors.index.json", dir);
  names.push_back("model.safetensors.index.json");
  return names;
}

}  // namespace moeserve

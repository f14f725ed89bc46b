// The safetensors fuzz target's check: a checkpoint folder's weights as the loader opens them (model/safetensors.h,
// Checkpoint::open). Kept apart from fuzz_checks.h because it needs the model library.
//
// Input layout: byte 0 = flags; bit 0 clear: the rest is model.safetensors; bit 0 set: the rest is
// model.safetensors.index.json, a 0x00 byte, then the one shard's bytes (written as kShardName).
//
// What must hold: only a moeserve::UserError escapes (the server refuses to start with its message); a checkpoint
// that opens names only tensors that lie inside their file's data section, whose byte count is dtype x shape, that
// do not overlap another non-empty tensor of the same file, and whose first and last bytes can be read through the
// mapping; the index's tensors are all in its shard.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_checks.h"
#include "model/safetensors.h"

namespace moeserve::fuzz {

inline constexpr const char* kShardName = "model-00001-of-00001.safetensors";

// A private folder for the checkpoint files, made once per process and removed at exit.
inline const std::filesystem::path& safetensors_scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "moeserve-fuzz-st-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) {
      std::fprintf(stderr, "cannot make a scratch folder from %s\n", tmpl.c_str());
      std::exit(2);
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(safetensors_scratch_dir(), ec);
    });
    return std::filesystem::path(tmpl);
  }();
  return dir;
}

inline void write_scratch_file(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  FUZZ_CHECK(out.good(), "cannot write {}", p.string());
}

inline void check_safetensors(std::string_view data) {
  if (data.empty()) return;
  namespace fs = std::filesystem;
  const fs::path& dir = safetensors_scratch_dir();
  for (const char* f : {"model.safetensors", "model.safetensors.index.json", kShardName}) fs::remove(dir / f);
  const bool indexed = (static_cast<unsigned char>(data[0]) & 1) != 0;
  std::string_view rest = data.substr(1);
  if (indexed) {
    const size_t nul = rest.find('\0');
    const std::string_view index = rest.substr(0, nul);
    const std::string_view shard = nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1);
    write_scratch_file(dir / "model.safetensors.index.json", index);
    write_scratch_file(dir / kShardName, shard);
  } else {
    write_scratch_file(dir / "model.safetensors", rest);
  }
  Checkpoint c;
  try {
    c = Checkpoint::open(dir.string());
  } catch (const UserError&) {
    return;
  }
  // Per file: its tensors' extents, and the data section's start as each tensor's view implies it.
  struct Extent {
    uint64_t begin, end;
    std::string name;
  };
  std::map<std::string, std::vector<Extent>> by_file;
  std::map<std::string, const char*> base_of;
  size_t total = 0;
  for (const std::string& name : c.names()) {
    const auto info = c.info(name);
    FUZZ_CHECK(info.has_value(), "'{}' is listed but has no info", name);
    const std::string file = c.file_of(name);
    FUZZ_CHECK(!file.empty(), "'{}' has no file", name);
    FUZZ_CHECK(!indexed || fs::path(file).filename() == kShardName, "'{}' in {}", name, file);
    uint64_t numel = 1;
    for (const int64_t d : info->shape) {
      FUZZ_CHECK(d >= 0, "'{}' has dimension {}", name, d);
      numel *= uint64_t(d);
    }
    FUZZ_CHECK(info->begin <= info->end, "'{}' [{}, {}]", name, info->begin, info->end);
    FUZZ_CHECK(info->end - info->begin == numel * dtype_size(info->dtype), "'{}': {} bytes for {} x {}", name,
               info->end - info->begin, numel, dtype_name(info->dtype));
    const uint64_t file_bytes = fs::file_size(file);
    FUZZ_CHECK(info->end <= file_bytes, "'{}' ends at {} in a {}-byte file", name, info->end, file_bytes);
    const Tensor t = c.get(name);
    FUZZ_CHECK(t.shape == info->shape && t.dtype == info->dtype, "'{}': the view disagrees with its info", name);
    const char* base = static_cast<const char*>(t.data) - info->begin;
    const auto [it, fresh] = base_of.emplace(file, base);
    FUZZ_CHECK(fresh || it->second == base, "'{}': its view implies another data section start", name);
    if (info->end > info->begin) {
      // Read through the mapping: a view past the mapped file faults here.
      const volatile char* p = static_cast<const volatile char*>(t.data);
      (void)p[0];
      (void)p[info->end - info->begin - 1];
    }
    by_file[file].push_back({info->begin, info->end, name});
    total += info->end - info->begin;
  }
  FUZZ_CHECK(c.total_bytes() == total, "total_bytes {} against {}", c.total_bytes(), total);
  for (auto& [file, extents] : by_file) {
    std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) { return a.begin < b.begin; });
    uint64_t reach = 0;  // the furthest end of a non-empty tensor so far
    std::string reacher;
    for (const Extent& e : extents) {
      if (e.begin == e.end) continue;
      FUZZ_CHECK(e.begin >= reach, "'{}' [{}, {}) overlaps '{}' (to {})", e.name, e.begin, e.end, reacher, reach);
      reach = e.end;
      reacher = e.name;
    }
  }
}

}  // namespace moeserve::fuzz

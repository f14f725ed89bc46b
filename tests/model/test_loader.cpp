// The safetensors reader and the checkpoint loader: good files read back exactly and without copies; every
// kind of broken file or folder is a UserError that names the file and the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/threadpool.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "temp_dir.h"

using namespace moeserve;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {


void write_raw(const fs::path& p, const std::string& header, const std::string& data, int64_t header_len = -1) {
  std::ofstream out(p, std::ios::binary);
  uint64_t n = header_len < 0 ? header.size() : uint64_t(header_len);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
}

// The UserError message of f(), or "" when it did not throw one.
template <typename F>
std::string user_error(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_USER_ERROR(expr, ...)                                          \
  do {                                                                        \
    std::string msg_ = user_error([&] { (void)(expr); });                     \
    EXPECT_FALSE(msg_.empty()) << #expr " did not raise a UserError";         \
    for (const char* part : {__VA_ARGS__}) EXPECT_NE(msg_.find(part), std::string::npos) << msg_ << " lacks " << part; \
  } while (0)

}  // namespace

TEST(Safetensors, RoundTripIsExactAndZeroCopy) {
  const test_util::TempDir d("test_roundtrip");
  ThreadPool pool(2);
  std::vector<TensorSpec> specs;
  specs.push_back({"a.f32", DType::F32, {3, 5}, [](void* dst, int64_t first, int64_t n) {
                     for (int64_t i = 0; i < n; ++i) static_cast<float*>(dst)[i] = float(first + i) * 0.5f;
                   }});
  specs.push_back({"b.bf16", DType::BF16, {7}, [](void* dst, int64_t first, int64_t n) {
                     for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(float(first + i) - 3);
                   }});
  specs.push_back({"c.u8", DType::U8, {4, 2}, [](void* dst, int64_t first, int64_t n) {
                     for (int64_t i = 0; i < n; ++i) static_cast<uint8_t*>(dst)[i] = uint8_t(200 + first + i);
                   }});
  write_safetensors((d / "model.safetensors").string(), specs, {{"format", "pt"}}, pool);
  auto f = SafetensorsFile::open((d / "model.safetensors").string());
  ASSERT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->metadata()["format"], "pt");
  Tensor a = f->get("a.f32");
  EXPECT_EQ(a.shape, (Shape{3, 5}));
  for (int i = 0; i < 15; ++i) EXPECT_EQ(a.ptr<float>()[i], float(i) * 0.5f);
  Tensor b = f->get("b.bf16");
  for (int i = 0; i < 7; ++i) EXPECT_EQ(bf16_to_f32(b.ptr<uint16_t>()[i]), float(i - 3));
  EXPECT_EQ(f->get("c.u8").ptr<uint8_t>()[7], 207);
  // Views point into the one mapping: no copies.
  EXPECT_EQ(f->get("a.f32").data, a.data);
  // The data section is 8-byte aligned, as other readers expect.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % 8, 0u);
}

TEST(Safetensors, ShardedCheckpointWithIndex) {
  const test_util::TempDir d("test_sharded");
  ThreadPool pool(2);
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 5; ++i)
    specs.push_back({"t" + std::to_string(i), DType::F32, {100}, [i](void* dst, int64_t first, int64_t n) {
                       for (int64_t k = 0; k < n; ++k) static_cast<float*>(dst)[k] = float(i * 1000 + first + k);
                     }});
  auto files = write_checkpoint_shards(d.string(), specs, 800, pool);
  EXPECT_EQ(files.size(), 4u);  // 3 shards (2 + 2 + 1 tensors of 400 bytes) + index
  Checkpoint c = Checkpoint::open(d.string());
  EXPECT_EQ(c.names().size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(c.get("t" + std::to_string(i)).ptr<float>()[7], float(i * 1000 + 7));
  EXPECT_NE(c.file_of("t0"), c.file_of("t4"));

  // A shard the index names is missing.
  fs::remove(d / files[1]);
  EXPECT_USER_ERROR(Checkpoint::open(d.string()), "missing", files[1].c_str());

  // Shard names the file system cannot look up, or that name no file, are the user's errors (a 300-character name
  // made fs::exists throw filesystem_error: fuzz_safetensors).
  const fs::path index = d / "model.safetensors.index.json";
  json j = json::parse(std::ifstream(index));
  for (const std::string& bad : {std::string(300, 'x') + ".safetensors", std::string(), std::string(".")}) {
    json k = j;
    k["weight_map"]["t0"] = bad;
    std::ofstream(index) << k.dump();
    if (bad.size() > 255)
      EXPECT_USER_ERROR(Checkpoint::open(d.string()), "cannot look up", "t0");  // (the path, then the reason)
    else
      EXPECT_USER_ERROR(Checkpoint::open(d.string()), "not a file in the model folder");
  }
  EXPECT_USER_ERROR(Checkpoint::open(std::string(5000, 'd')), "cannot be looked up");
}

TEST(Safetensors, CorruptFilesAreClearErrors) {
  const test_util::TempDir d("test_corrupt");
  fs::path p = d / "x.safetensors";
  std::string ok_header = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";

  EXPECT_USER_ERROR(SafetensorsFile::open((d / "nope.safetensors").string()), "nope.safetensors");

  { std::ofstream(p, std::ios::binary) << "abc"; }
  EXPECT_USER_ERROR(SafetensorsFile::open(p.string()), "truncated", "x.safetensors");

  write_raw(p, ok_header, std::string(16, '\0'), 1 << 20);
  EXPECT_USER_ERROR(SafetensorsFile::open(p.string()), "header length");

  write_raw(p, "{not json", "");
  EXPECT_USER_ERROR(SafetensorsFile::open(p.string()), "not valid JSON");

  // Nesting that would exhaust the stack of the JSON library's recursive copies: refused before parsing.
  write_raw(p, "{\"w\": " + std::string(100000, '[') + std::string(100000, ']') + "}", "");
  EXPECT_USER_ERROR(SafetensorsFile::open(p.string()), "levels deep");
  const fs::path cfg = d / "config.json";
  { std::ofstream(cfg) << "{\"a\": " << std::string(100000, '[') << std::string(100000, ']') << "}"; }
  EXPECT_USER_ERROR(ModelConfig::from_file(cfg.string()), "config.json", "levels deep");

  write_raw(p, ok_header, std::string(8, '\0'));  // data cut short
  EXPECT_USER_ERROR(SafetensorsFile::open(p.string()), "'w'", "past the end");

  write_raw(p, R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})", std::string(16, '\0'));
  EXPECT_USER_ERROR(SafetensorsFile::open(p.string()), "'w'", "needs 24");

  write_raw(p, R"({"w":{"dtype":"Q7","shape":[2],"data_offsets":[0,2]}})", std::string(2, '\0'));
  EXPECT_USER_ERROR(SafetensorsFile::open(p.string()), "'w'", "unsupported dtype 'Q7'");

  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
            std::string(16, '\0'));
  EXPECT_USER_ERROR(SafetensorsFile::open(p.string()), "overlap", "'a'", "'b'");
  // A long tensor overlapping one that starts past an empty tensor (the check must keep the furthest end, not
  // compare neighbours only): 'a' [0, 32) holds 'c' [12, 16); 'e' [8, 8) sorts between them.
  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]},"e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
            R"("c":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
            std::string(32, '\0'));
  EXPECT_USER_ERROR(SafetensorsFile::open(p.string()), "overlap", "'a'", "'c'");
  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
            R"("c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            std::string(12, '\0'));
  EXPECT_NO_THROW(SafetensorsFile::open(p.string()));  // an empty tensor inside another's bytes takes none of them

  write_raw(p, R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0'));
  EXPECT_USER_ERROR(SafetensorsFile::open(p.string()), "'w'", "dimension");

  write_raw(p, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, '\0'));
  EXPECT_USER_ERROR(SafetensorsFile::open(p.string()), "'w'", "reversed");

  write_raw(p, R"({"w":{"dtype":"F32","shape":[2]}})", std::string(8, '\0'));
  EXPECT_USER_ERROR(SafetensorsFile::open(p.string()), "'w'", "data_offsets");

  EXPECT_USER_ERROR(Checkpoint::open((d / "missing_dir").string()), "not a directory");
  fs::create_directories(d / "empty");
  EXPECT_USER_ERROR(Checkpoint::open((d / "empty").string()), "model.safetensors");
}

// Copies a parity checkpoint into d so a test can damage it.
static void copy_fixture(const std::string& name, const test_util::TempDir& d) {
  fs::copy(fs::path(MOESERVE_TEST_DATA) / "parity" / name, d.path(), fs::copy_options::recursive);
}

static json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

static void write_json(const fs::path& p, const json& j) { std::ofstream(p) << j.dump(2); }

TEST(Loader, MissingTensorNamesTheTensor) {
  const test_util::TempDir d("test_missing_tensor");
  copy_fixture("qwen3_basic", d);
  auto f = SafetensorsFile::open((d / "model.safetensors").string());
  ThreadPool pool(1);
  std::vector<TensorSpec> keep;
  for (auto& [name, info] : f->tensors()) {
    if (name == "model.layers.1.self_attn.k_norm.weight") continue;
    Tensor t = f->get(name);
    keep.push_back({name, info.dtype, info.shape, [t](void* dst, int64_t first, int64_t n) {
                      std::memcpy(dst, t.ptr<char>() + first * dtype_size(t.dtype), n * dtype_size(t.dtype));
                    }});
  }
  write_safetensors((d / "model.safetensors.new").string(), keep, {}, pool);
  f.reset();
  fs::rename(d / "model.safetensors.new", d / "model.safetensors");
  EXPECT_USER_ERROR(load_model(d.string()), "missing tensor 'model.layers.1.self_attn.k_norm.weight'");
}

TEST(Loader, ShapeMismatchNamesTensorAndShapes) {
  const test_util::TempDir d("test_shape_mismatch");
  copy_fixture("moe_basic", d);
  json c = read_json(d / "config.json");
  c["moe_intermediate_size"] = 48;  // the file holds 40
  write_json(d / "config.json", c);
  EXPECT_USER_ERROR(load_model(d.string()), "experts.0.gate_proj.weight", "[40, 64]", "[48, 64]");
}

TEST(Loader, UnsupportedArchitectureIsRefused) {
  const test_util::TempDir d("test_bad_arch");
  copy_fixture("qwen3_basic", d);
  json c = read_json(d / "config.json");
  c["architectures"] = {"LlamaForCausalLM"};
  c["model_type"] = "llama";
  write_json(d / "config.json", c);
  EXPECT_USER_ERROR(load_model(d.string()), "unsupported architecture 'LlamaForCausalLM'", "Qwen3MoeForCausalLM");
}

TEST(Loader, TruncatedShardIsCaughtAtOpen) {
  const test_util::TempDir d("test_truncated");
  copy_fixture("moe_basic", d);
  fs::path shard = d / "model-00003-of-00010.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 10);
  EXPECT_USER_ERROR(load_model(d.string()), "model-00003-of-00010.safetensors", "past the end");
}

TEST(Loader, UnknownTensorsAreReportedNotFatal) {
  const test_util::TempDir d("test_unknown");
  ThreadPool pool(1);
  std::vector<TensorSpec> specs = {
      {"known", DType::F32, {2}, [](void* dst, int64_t, int64_t n) { std::memset(dst, 0, n * 4); }},
      {"surprise", DType::F32, {2}, [](void* dst, int64_t, int64_t n) { std::memset(dst, 0, n * 4); }}};
  write_safetensors((d / "model.safetensors").string(), specs, {}, pool);
  Checkpoint c = Checkpoint::open(d.string());
  WeightLoader wl(c);
  wl.take("known", {2});
  EXPECT_EQ(wl.unused(), std::vector<std::string>{"surprise"});
  EXPECT_USER_ERROR(wl.take("known", {3}), "'known'", "[2]", "[3]");
  EXPECT_USER_ERROR(wl.take("absent", {2}), "missing tensor 'absent'");
}

TEST(Loader, Fp8TensorIsNotMistakenForBf16) {
  const test_util::TempDir d("test_fp8");
  ThreadPool pool(1);
  std::vector<TensorSpec> specs = {
      {"w", DType::F8E4M3, {4, 4}, [](void* dst, int64_t, int64_t n) { std::memset(dst, 0x38, n); }}};
  write_safetensors((d / "model.safetensors").string(), specs, {}, pool);
  Checkpoint c = Checkpoint::open(d.string());
  EXPECT_EQ(c.info("w")->dtype, DType::F8E4M3);
  EXPECT_EQ(fp8e4m3_to_f32(c.get("w").ptr<uint8_t>()[0]), 1.0f);
  WeightLoader wl(c);
  EXPECT_USER_ERROR(wl.take("w", {4, 4}), "F8_E4M3");
}

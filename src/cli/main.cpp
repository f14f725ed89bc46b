// moeserve: one binary, subcommands.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"

namespace {

const char* kUsage =
    "usage: moeserve <command> [flags]\n\n"
    "commands:\n"
    "  serve       the inference server (OpenAI- and SGLang-compatible HTTP API)\n"
    "  bench       serving benchmark client (SGLang bench_serving compatible)\n"
    "  generate    offline generation from token ids (or a prompt) for scripting and debugging\n"
    "  backends    list every kernel backend with its architectures, formats, code for this GPU and self-test\n"
    "  gen-model   write a synthetic Hugging Face checkpoint (presets: demo, q30b8l, q30b, tiny-qwen3, tiny-moe)\n\n"
    "Run `moeserve <command> --help` for the flags of a command.\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace moeserve;
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (cmd == "serve") return cli::cmd_serve(args);
    if (cmd == "generate") return cli::cmd_generate(args);
    if (cmd == "bench") return cli::cmd_bench(args);
    if (cmd == "gen-model") return cli::cmd_gen_model(args);
    if (cmd == "backends") return cli::cmd_backends(args);
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "moeserve: unknown command '%s' (valid: serve, bench, generate, gen-model, backends)\n\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fatal: %s\n", e.what());
    return 3;
  }
}

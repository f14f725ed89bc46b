// `moeserve backends`: every kernel backend of every op family on this machine, checked and self-tested.
#include <cstdio>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/log.h"
#include "launch/launch.h"

namespace moeserve::cli {

int cmd_backends(const std::vector<std::string>& args) {
  std::string model_path, log_level = "warning";
  FlagSet f("backends", "Lists every kernel backend of every op family: the architectures and weight formats it "
                        "declares, whether this binary holds code for this GPU (or NVRTC compiled it here), the "
                        "result and time of its self-test against the CPU reference, and its timed trial.");
  f.add_string("model-path", &model_path, "use this checkpoint's shapes (default: Qwen3-30B-A3B shapes)");
  f.add_string("log-level", &log_level, "log level", {"debug", "info", "warning", "error"});
  if (!f.parse(args)) return 0;
  set_log_level(parse_log_level(log_level));
  std::fputs(backends_report(model_path).c_str(), stdout);
  return 0;
}

}  // namespace moeserve::cli

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/log.h"
#include "server/api_server.h"

namespace moeserve::cli {

int cmd_serve(const std::vector<std::string>& args) {
  server::ServeOptions o;
  FlagSet f("serve", "The inference server: OpenAI-compatible and SGLang-compatible HTTP API over a continuous-"
                     "batching engine. Without --model-path it serves the built-in demo model.");
  server::register_serve_flags(f, o);
  if (!f.parse(args)) return 0;
  set_log_level(parse_log_level(o.log_level));
  server::validate_serve_options(o, f.was_set("cuda-graph-max-bs"));
  if (o.model_path.empty()) {
    o.model_path = ensure_demo_model();
    if (o.served_model_name.empty()) o.served_model_name = "moeserve-demo";
  }
  return server::run_server(o);
}

}  // namespace moeserve::cli

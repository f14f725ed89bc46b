// `moeserve serve`: starts the HTTP server at once (/health says 503 while starting), loads the model and the
// text layer, warms up through the scheduler, serves until SIGTERM/SIGINT, then drains and exits.
#pragma once

#include "server/options.h"

namespace moeserve::server {

// Returns the process exit code; UserError when startup fails for a reason the operator can fix.
int run_server(ServeOptions opts);

}  // namespace moeserve::server

// Error bodies and status lines shared by the transport and the routes.
#pragma once

#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace moeserve::http {

// The OpenAI error shape, as SGLang and vLLM answer it:
//   {"error": {"message": ..., "type": ..., "param": ... | null, "code": <status number>}}
// An empty `type` means "invalid_request_error" for 4xx and "server_error" for 5xx;
// an empty `param` is written as null.
nlohmann::json error_json(int status, std::string_view message, std::string_view type = {},
                          std::string_view param = {});

// Reason phrase for a status line ("Not Found"); "Unknown" for codes we never send.
std::string_view status_reason(int status);

}  // namespace moeserve::http

// Minimal leveled logging to stderr. The level is process-wide state, set once from --log-level at startup.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace moeserve {

enum class LogLevel { Debug = 0, Info = 1, Warning = 2, Error = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
// Parses debug|info|warning|error; UserError naming the valid choices otherwise.
LogLevel parse_log_level(std::string_view name);
void log_line(LogLevel level, const std::string& msg);

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::Info) log_line(LogLevel::Info, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::Debug) log_line(LogLevel::Debug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::Warning) log_line(LogLevel::Warning, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  log_line(LogLevel::Error, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace moeserve

#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "core/error.h"

namespace moeserve {

namespace {
std::atomic<int> g_level{int(LogLevel::Info)};
std::mutex g_mu;
}  // namespace

void set_log_level(LogLevel level) { g_level = int(level); }
LogLevel log_level() { return LogLevel(g_level.load(std::memory_order_relaxed)); }

LogLevel parse_log_level(std::string_view n) {
  if (n == "debug") return LogLevel::Debug;
  if (n == "info") return LogLevel::Info;
  if (n == "warning" || n == "warn") return LogLevel::Warning;
  if (n == "error") return LogLevel::Error;
  throw_user("--log-level: unknown level '{}' (valid: debug, info, warning, error)", n);
}

void log_line(LogLevel level, const std::string& msg) {
  static const char* names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  int ms = int(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%H:%M:%S", &tm);
  std::lock_guard<std::mutex> lk(g_mu);
  std::fprintf(stderr, "[%s.%03d %s] %s\n", ts, ms, names[int(level)], msg.c_str());
}

}  // namespace moeserve

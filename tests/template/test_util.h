// Shared helpers for the template tests.
#pragma once

#include <ctime>
#include <fstream>
#include <sstream>
#include <string>

#include "template/jinja.h"

namespace moeserve::tpl::testing {

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::string data_dir() { return std::string(MOESERVE_TEST_DATA) + "/templates"; }

// The clock tools/reference/render_templates.py pins (FIXED_NOW): 2025-03-14 09:26:53.
inline RenderOptions fixed_clock() {
  std::tm tm{};
  tm.tm_year = 2025 - 1900;
  tm.tm_mon = 2;
  tm.tm_mday = 14;
  tm.tm_hour = 9;
  tm.tm_min = 26;
  tm.tm_sec = 53;
  const std::time_t t = timegm(&tm);  // fills tm_wday / tm_yday
  gmtime_r(&t, &tm);
  RenderOptions o;
  o.now = tm;
  return o;
}

inline std::string render_src(const std::string& src, const nlohmann::ordered_json& ctx = nlohmann::ordered_json::object()) {
  return Template::parse(src).render(ctx, fixed_clock());
}

}  // namespace moeserve::tpl::testing

// File-system look-ups that report a path the system cannot even look up (a name over 255 bytes, a path over
// PATH_MAX, a loop of links, a folder without search permission) as the user's error with the system's reason,
// where std::filesystem's throwing overloads would let a filesystem_error escape (found by fuzz_safetensors).
#pragma once

#include <filesystem>
#include <string_view>
#include <system_error>

#include "core/error.h"

namespace moeserve {

// Whether `p` exists; `what` names it in the error.
inline bool path_exists(const std::filesystem::path& p, std::string_view what) {
  std::error_code ec;
  const bool found = std::filesystem::exists(p, ec);
  if (ec) throw_user("{}: cannot look up '{}': {}", what, p.string(), ec.message());
  return found;
}

// Whether `p` is a directory (false when it does not exist or a part of it is a file); `what` names it in the
// error.
inline bool path_is_directory(const std::filesystem::path& p, std::string_view what) {
  std::error_code ec;
  const bool dir = std::filesystem::is_directory(p, ec);
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory)
    throw_user("{} '{}' cannot be looked up: {}", what, p.string(), ec.message());
  return dir;
}

}  // namespace moeserve

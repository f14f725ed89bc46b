// A folder for one test's files: under the system temp directory, named for a tag, this process (ctest runs the
// tests of a binary as parallel processes) and a count (one test may hold several), created empty and removed with its contents when the object goes out of
// scope - for a function-local static, at exit - so that a test run leaves nothing behind in /tmp (the model and
// checkpoint folders of the loader, gen-model and scheduler tests used to stay: ~21 folders a run).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace moeserve::test_util {

class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(std::filesystem::temp_directory_path() /
              ("moeserve_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(count_++))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string string() const { return path_.string(); }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  void write(const std::string& name, const std::string& content) const {
    std::ofstream(path_ / name, std::ios::binary) << content;
  }

 private:
  std::filesystem::path path_;
  static inline int count_ = 0;
};

}  // namespace moeserve::test_util

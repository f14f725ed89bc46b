// Command-line flags: declared once with their help text; an unknown flag or a bad value is a UserError
// naming the flag and the valid choices. Accepts --name value, --name=value, and bare --name for booleans.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace moeserve::cli {

class FlagSet {
 public:
  FlagSet(std::string command, std::string summary) : command_(std::move(command)), summary_(std::move(summary)) {}

  void add_string(const std::string& name, std::string* dst, const std::string& help,
                  std::vector<std::string> choices = {});
  void add_int(const std::string& name, int64_t* dst, const std::string& help, int64_t min = INT64_MIN,
               int64_t max = INT64_MAX);
  void add_double(const std::string& name, double* dst, const std::string& help, double min = -1e300,
                  double max = 1e300);
  void add_bool(const std::string& name, bool* dst, const std::string& help);
  // A list of integers: "1,2,3" or "1 2 3" as one value, or the flag followed by several values.
  void add_int_list(const std::string& name, std::vector<int64_t>* dst, const std::string& help,
                    int64_t min = INT64_MIN, int64_t max = INT64_MAX);
  // Same flag under another name (e.g. --tp for --tp-size).
  void alias(const std::string& alias, const std::string& name);

  // Returns false when --help was given (help() has been printed to stdout).
  bool parse(const std::vector<std::string>& args);
  bool was_set(const std::string& name) const;
  std::string help() const;

 private:
  struct Flag {
    std::string name, help, kind, default_text;
    std::vector<std::string> choices;
    std::function<void(const std::string&)> set;
    bool is_bool = false, is_list = false, set_by_user = false;
  };
  Flag* find(const std::string& name);
  std::string command_, summary_;
  std::vector<Flag> flags_;
  std::vector<std::pair<std::string, std::string>> aliases_;
};

}  // namespace moeserve::cli

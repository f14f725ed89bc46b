// One error model for moeserve: exceptions.
//  - UserError: the input is wrong (a flag, a request, a checkpoint file, a template). The message must say
//    what is wrong and what to do; the server turns it into a 4xx, the CLI prints it and exits 1.
//  - InternalError: a moeserve bug or an environment failure (CUDA, OS). Raised by MS_CHECK with file:line.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace moeserve {

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& msg) : std::runtime_error(msg) {}
};

class InternalError : public std::runtime_error {
 public:
  explicit InternalError(const std::string& msg) : std::runtime_error(msg) {}
};

template <typename... Args>
[[noreturn]] inline void throw_user(fmt::format_string<Args...> f, Args&&... args) {
  throw UserError(fmt::format(f, std::forward<Args>(args)...));
}

[[noreturn]] inline void throw_internal(const char* file, int line, const std::string& msg) {
  throw InternalError(fmt::format("internal error at {}:{}: {}", file, line, msg));
}

}  // namespace moeserve

// MS_CHECK(cond, "fmt", args...): for invariants that only a bug can break. Never for input validation.
#define MS_CHECK(cond, ...)                                                                  \
  do {                                                                                       \
    if (!(cond)) ::moeserve::throw_internal(__FILE__, __LINE__, "check failed: " #cond      \
                                            " " + ::fmt::format(__VA_ARGS__));               \
  } while (0)

// MS_USER_CHECK(cond, "fmt", args...): validation of user input; throws UserError with the message.
#define MS_USER_CHECK(cond, ...)                                  \
  do {                                                            \
    if (!(cond)) throw ::moeserve::UserError(::fmt::format(__VA_ARGS__)); \
  } while (0)

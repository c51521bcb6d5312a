// The library's one error policy.
//
// Every failure is a dcp::Error carrying a category. Validation happens before any
// state changes: a rejected call leaves every object exactly as it was. Messages name the
// argument (or flag) and its legal values, e.g.
//   "dcp_size = 32 must divide attention TP size 16 (tp_size 64 / dp_size 4)".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dcp {

enum class ErrorCategory {
  invalid_argument,  // caller passed something outside the legal range
  unsupported,       // legal in principle, not implemented or not available on this platform
  capacity,          // out of KV slots, memory or another bounded resource
  comm,              // a collective failed, timed out, or a peer rank failed
  io,                // file missing, truncated or malformed
  internal,          // a broken invariant: a bug in dcp
};

const char* to_string(ErrorCategory category) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCategory category, const std::string& message)
      : std::runtime_error(message), category_(category) {}
  ErrorCategory category() const noexcept { return category_; }

 private:
  ErrorCategory category_;
};

// Concatenates anything streamable: dcp::str("n = ", n, " must be >= 1").
template <typename... Args>
std::string str(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

[[noreturn]] void throw_error(ErrorCategory category, const std::string& message, const char* file,
                              int line);

}  // namespace dcp

// DCP_CHECK(cond, category, message parts...): throws dcp::Error when cond is false.
#define DCP_CHECK(cond, category, ...)                                                      \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      ::dcp::throw_error(::dcp::ErrorCategory::category, ::dcp::str(__VA_ARGS__), __FILE__, \
                         __LINE__);                                                         \
    }                                                                                       \
  } while (0)

#define DCP_ARG_CHECK(cond, ...) DCP_CHECK(cond, invalid_argument, __VA_ARGS__)

// DCP_CHECK_EQ(a, b, context...): prints both values on failure (internal invariants).
#define DCP_CHECK_EQ(a, b, ...)                                                                   \
  do {                                                                                            \
    const auto& dcp_check_a_ = (a);                                                               \
    const auto& dcp_check_b_ = (b);                                                               \
    if (!(dcp_check_a_ == dcp_check_b_)) {                                                        \
      ::dcp::throw_error(::dcp::ErrorCategory::internal,                                          \
                         ::dcp::str(#a " == " #b " failed (", dcp_check_a_, " vs ", dcp_check_b_, \
                                    ") " __VA_OPT__(, ) __VA_ARGS__),                             \
                         __FILE__, __LINE__);                                                     \
    }                                                                                             \
  } while (0)

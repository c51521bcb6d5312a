#include "dcp/error.h"

namespace dcp {

const char* to_string(ErrorCategory category) noexcept {
  switch (category) {
    case ErrorCategory::invalid_argument: return "invalid argument";
    case ErrorCategory::unsupported: return "unsupported";
    case ErrorCategory::capacity: return "capacity";
    case ErrorCategory::comm: return "communication";
    case ErrorCategory::io: return "io";
    case ErrorCategory::internal: return "internal";
  }
  return "unknown";
}

void throw_error(ErrorCategory category, const std::string& message, const char* file, int line) {
  // Internal errors are bugs: point at the source. User-facing errors read cleanly.
  if (category == ErrorCategory::internal) {
    throw Error(category, str("internal error at ", file, ":", line, ": ", message));
  }
  throw Error(category, message);
}

}  // namespace dcp

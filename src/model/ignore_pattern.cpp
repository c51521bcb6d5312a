#define PCRE2_CODE_UNIT_WIDTH 8
#include "ignore_pattern.h"

#include <pcre2.h>

#include <map>
#include <memory>
#include <mutex>

#include "dcp/error.h"

namespace dcp {
namespace ignore_pattern {  // named: a unity build shares one file's anonymous namespace

struct CodeFree {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
using Code = std::unique_ptr<pcre2_code, CodeFree>;

// Backtracking steps one match may take: a checkpoint's patterns match a module name in far
// fewer; a pattern that needs more would stall the load.
constexpr std::uint32_t kMatchLimit = 1000000;

// Refuses the entry 're:PATTERN', saying `what` failed and PCRE2's message for `code`.
[[noreturn]] void refuse(const std::string& pattern, const std::string& what, int code) {
  PCRE2_UCHAR message[256];
  pcre2_get_error_message(code, message, sizeof message);
  throw Error(ErrorCategory::unsupported,
              str("model config: quantization_config.ignore entry 're:", pattern, "' ", what,
                  ": ", reinterpret_cast<const char*>(message)));
}

const pcre2_code& compiled(const std::string& pattern) {
  static std::mutex mutex;
  static std::map<std::string, Code> codes;  // a real checkpoint asks about 70,000 modules
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = codes.find(pattern);
  if (it == codes.end()) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    Code code(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                            PCRE2_ANCHORED, &err, &offset, nullptr));
    if (!code) refuse(pattern, str("is not a regular expression dcp reads (at offset ", offset, ")"), err);
    it = codes.emplace(pattern, std::move(code)).first;
  }
  return *it->second;
}

}  // namespace ignore_pattern

bool ignore_pattern_matches(const std::string& pattern, const std::string& module) {
  const pcre2_code& code = ignore_pattern::compiled(pattern);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_set_match_limit(context, ignore_pattern::kMatchLimit);
  pcre2_set_depth_limit(context, ignore_pattern::kMatchLimit);
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(&code, nullptr);
  const int rc = pcre2_match(&code, reinterpret_cast<PCRE2_SPTR>(module.data()), module.size(), 0,
                             0, data, context);
  pcre2_match_data_free(data);
  pcre2_match_context_free(context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) ignore_pattern::refuse(pattern, str("could not be matched against '", module, "'"), rc);
  return true;
}

}  // namespace dcp

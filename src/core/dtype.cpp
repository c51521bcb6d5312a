#include "dcp/dtype.h"

#include <string>

#include "dcp/error.h"

namespace dcp {

KvDtype parse_kv_dtype(std::string_view name) {
  if (name == "fp32") return KvDtype::fp32;
  if (name == "bf16") return KvDtype::bf16;
  throw Error(ErrorCategory::invalid_argument,
              str("kv dtype '", std::string(name), "' is not supported (legal: fp32, bf16)"));
}

}  // namespace dcp

// config.json: every input parses to a valid config or fails with a dcp::Error naming the field.
#include <cstddef>
#include <cstdint>
#include <string>

#include "dcp/error.h"
#include "dcp/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const dcp::ModelConfig c =
        dcp::parse_model_config(std::string(reinterpret_cast<const char*>(data), size));
    c.validate();  // what parses must hold
    (void)dcp::model_config_to_json(c);
  } catch (const dcp::Error&) {
  }
  return 0;
}

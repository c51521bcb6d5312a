// model.safetensors.index.json beside a valid shard: every input opens or fails with a
// dcp::Error naming the index, and never reaches outside the checkpoint directory.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "dcp/error.h"
#include "dcp/model_config.h"
#include "dcp/weights.h"

namespace {

// A checkpoint directory of one small shard, made once per process.
std::string checkpoint_dir() {
  static const std::string dir = [] {
    const auto d = std::filesystem::temp_directory_path() /
                   ("dcp_fuzz_index_" + std::to_string(::getpid()));
    std::filesystem::remove_all(d);
    dcp::ModelConfig c = dcp::preset_config("tiny", 1);
    c.vocab_size = 16;
    c.hidden_size = 16;
    c.intermediate_size = 16;
    c.q_lora_rank = 8;
    c.kv_lora_rank = 8;
    c.qk_nope_head_dim = 4;
    c.qk_rope_head_dim = 4;
    c.v_head_dim = 4;
    dcp::write_checkpoint(d.string(), c, *dcp::make_synthetic_weights(1), "BF16", 2);
    return d.string();
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string dir = checkpoint_dir();
  {
    std::ofstream index(dir + "/model.safetensors.index.json", std::ios::trunc | std::ios::binary);
    index.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    dcp::open_checkpoint(dir);
  } catch (const dcp::Error&) {
  }
  return 0;
}

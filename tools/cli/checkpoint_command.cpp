// `dcp gen-checkpoint`: writes a small deterministic random checkpoint in the Hugging Face
// DeepSeek-V2/V3 format (config.json + safetensors), the same format `dcp run --model-path` loads.
#include <cstdio>
#include <memory>

#include "cli_checks.h"
#include "commands.h"
#include "dcp/error.h"
#include "dcp/weights.h"

namespace dcp::cli {

void add_gen_checkpoint_command(CLI::App& app) {
  struct Options {
    std::string preset = "tiny", out, dtype = "BF16";
    int num_layers = 0, num_files = 1;
    std::uint64_t seed = 1234;
    bool no_q_lora = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "gen-checkpoint", "Write a deterministic random checkpoint (config.json + safetensors)");
  cmd->add_option("--preset", o->preset, "geometry: tiny, deepseek-v3, kimi-k3")
      ->capture_default_str();
  cmd->add_option("--out", o->out, "output directory")->required();
  cmd->add_option("--dtype", o->dtype, "tensor dtype: BF16, F16, F32")
      ->check(one_of({"BF16", "F16", "F32"}))
      ->capture_default_str();
  cmd->add_option("--num-layers", o->num_layers, "layers (default: the preset's)")
      ->check(at_least(1));
  cmd->add_option("--num-files", o->num_files, "safetensors files (> 1 writes an index)")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "weight seed")->check(at_least(0))->capture_default_str();
  cmd->add_flag("--no-q-lora", o->no_q_lora,
                "plain q_proj (q_lora_rank null, as DeepSeek-V2-Lite)");
  cmd->callback([o] {
    ModelConfig c = preset_config(o->preset, o->num_layers);
    if (o->no_q_lora) c.q_lora_rank.reset();
    with_flag("--out", [&] {
      write_checkpoint(o->out, c, *make_synthetic_weights(o->seed), o->dtype, o->num_files);
    });
    std::printf("wrote %s: %s, %d layers, %s\n", o->out.c_str(), o->preset.c_str(),
                c.num_hidden_layers, o->dtype.c_str());
  });
}

}  // namespace dcp::cli

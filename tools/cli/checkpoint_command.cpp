// `dcp gen-checkpoint`: writes a small deterministic random checkpoint in the Hugging Face
// DeepSeek-V2/V3 format (config.json + safetensors), the same format `dcp run --model-path` loads.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli_checks.h"
#include "commands.h"
#include "dcp/error.h"
#include "dcp/tokenizer.h"
#include "dcp/weights.h"

namespace dcp::cli {
namespace {

// Before anything is written: the tensors are drawn and held as fp32 until their files are written,
// and the files must fit on the filesystem of `out`.
void check_checkpoint_fits(const ModelConfig& c, const std::string& dtype, const std::string& out) {
  const double as_fp32 = weight_bytes_per_rank(c, 1, [](const std::string&) { return 4.0; });
  check_fits_in_memory(as_fp32,
                       str("writing a checkpoint of ", c.num_hidden_layers,
                           " layers (its tensors are held as fp32 until written)"),
                       "lower --num-layers");
  const double on_disk =
      weight_bytes_per_rank(c, 1, checkpoint_element_bytes(c, dtype == "F32" ? 4.0 : 2.0));
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path existing = fs::absolute(out, ec);
  while (!existing.empty() && !fs::exists(existing, ec)) existing = existing.parent_path();
  const fs::space_info space = fs::space(existing.empty() ? fs::path(".") : existing, ec);
  DCP_CHECK(ec || static_cast<double>(space.available) >= on_disk, capacity,
            "--out: the checkpoint needs about ", on_disk / (1ull << 30), " GiB, more than the ",
            static_cast<double>(space.available) / (1ull << 30), " GiB free on the filesystem of ",
            existing.string(), "; lower --num-layers");
}

}  // namespace

void add_gen_checkpoint_command(CLI::App& app) {
  struct Options {
    std::string preset = "tiny", family, out, dtype = "BF16";
    int num_layers = 0, num_files = 0;
    std::uint64_t seed = 1234;
    bool no_q_lora = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "gen-checkpoint", "Write a deterministic random checkpoint (config.json + safetensors)");
  cmd->add_option("--preset", o->preset, std::string("geometry: ") + preset_names())
      ->capture_default_str();
  cmd->add_option(
         "--family", o->family,
         str("an MLA family as published, scaled down (its config fields, tensor names and "
             "dtypes: FP8 with scales, or compressed-tensors INT4 experts, where it ships them): ",
             family_names()))
      ->check(one_of({"deepseek-v2-lite", "deepseek-v2", "deepseek-v3", "kimi-k2",
                      "kimi-k2-thinking", "moonlight", "minicpm3"}))
      ->excludes(cmd->get_option("--preset"));
  cmd->add_option("--out", o->out, "output directory")->required();
  cmd->add_option("--dtype", o->dtype, "tensor dtype: BF16, F16, F32")
      ->check(one_of({"BF16", "F16", "F32"}))
      ->capture_default_str();
  cmd->add_option("--num-layers", o->num_layers, "layers (default: the preset's)")
      ->check(at_least(1));
  cmd->add_option("--num-files", o->num_files,
                  "safetensors files (> 1 writes an index; default 1, or 3 with --family)")
      ->check(at_least(1));
  cmd->add_option("--seed", o->seed, "weight seed")->check(at_least(0))->capture_default_str();
  cmd->add_flag("--no-q-lora", o->no_q_lora,
                "plain q_proj (q_lora_rank null, as DeepSeek-V2-Lite)");
  cmd->callback([o] {
    const bool family = !o->family.empty();
    ModelConfig c = family ? family_config(o->family) : preset_config(o->preset, o->num_layers);
    if (family && o->num_layers > 0) c.num_hidden_layers = o->num_layers;
    if (o->no_q_lora) c.q_lora_rank.reset();
    const int files = o->num_files > 0 ? o->num_files : (family ? 3 : 1);
    check_checkpoint_fits(c, o->dtype, o->out);
    // MiniCPM3's vocabulary is SentencePiece-style; the others' byte-level.
    const bool sentencepiece = c.model_type == "minicpm3";
    const bool with_tokenizer = c.vocab_size >= (sentencepiece ? 288 : 260);
    with_flag("--out", [&] {
      write_checkpoint(o->out, c, *make_synthetic_weights(o->seed), o->dtype, files);
      if (with_tokenizer) write_small_tokenizer(o->out, c.vocab_size, sentencepiece);
    });
    std::printf(
        "wrote %s: %s (%s), %d layers, %s%s, %d file(s)%s\n", o->out.c_str(),
        family ? o->family.c_str() : o->preset.c_str(), c.model_type.c_str(), c.num_hidden_layers,
        c.quantized                              ? "FP8 E4M3 projections with scales, rest "
        : c.quant_method == "compressed-tensors" ? "INT4 experts (compressed-tensors), rest "
                                                 : "",
        o->dtype.c_str(), files,
        !with_tokenizer ? " (no tokenizer: a vocabulary too small for one)"
        : sentencepiece ? ", and a small SentencePiece-style tokenizer with a chat template"
                        : ", and a small byte-level tokenizer with a chat template");
  });
}

}  // namespace dcp::cli

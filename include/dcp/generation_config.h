// What a checkpoint says about ending a generation, beside its weights and tokenizer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dcp {

// The token ids that end a generation as the checkpoint in `model_dir` states them, as
// transformers and vLLM read them: generation_config.json's eos_token_id (one id or a list), or
// config.json's when there is no generation_config.json; empty when neither states one. They need
// not be the tokenizer's eos_token: Kimi's turns end with <|im_end|> (K2) or <|end_of_msg|> (K3),
// its eos_token is [EOS]. Throws dcp::Error (io) naming the file and the field when one is not
// JSON, or an id is not an integer in [0, vocab_size).
std::vector<std::int32_t> checkpoint_eos_token_ids(const std::string& model_dir, int vocab_size);

// The sampling a checkpoint's generation_config.json recommends (DeepSeek-V3's: temperature 0.6,
// top_p 0.95), which vLLM applies to a request that does not set the field: each of temperature,
// top_p, top_k, min_p and repetition_penalty the file states (a top_k of 50, transformers' own
// default, is left out, as vLLM leaves it). None when there is no such file. Throws dcp::Error
// (io) naming the file and the field when a value is out of its range.
struct SamplingDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
};
SamplingDefaults checkpoint_sampling_defaults(const std::string& model_dir);

}  // namespace dcp

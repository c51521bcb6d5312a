// What a checkpoint says about ending a generation, beside its weights and tokenizer.
#pragma once

#include <cstdint>
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

}  // namespace dcp

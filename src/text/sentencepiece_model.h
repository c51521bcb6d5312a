// SentencePiece's own model file (tokenizer.model, a ModelProto), as Transformers converts it to
// a fast tokenizer (LlamaConverter): what a checkpoint without tokenizer.json ships. Internal.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "sentencepiece_normalizer.h"

namespace dcp {

// A BPE SentencePiece model with byte fallback as a tokenizer.json text: every piece in the
// vocabulary at its id, merges from the pieces' scores (highest first), the U+2581 normalizer
// and decoder, unknown/control/user-defined pieces as added tokens, BOS added by the
// post-processor; with tokenizer_config.json's added_tokens_decoder (`config_json`, may be empty)
// added as Transformers' slow tokenizer adds it. Its normalizer, when the model has one beyond
// the U+2581 marks (a compiled character map such as NFKC's, collapsed spaces), runs as
// SentencePiece runs it. Throws dcp::Error (io) naming the field of a model it cannot run the
// same way (a unigram model, no byte fallback, spaces not marked with U+2581, ...).
struct SentencePieceConversion {
  std::string tokenizer_json;
  // Null when the tokenizer.json's own normalizer is the model's (identity, spaces kept).
  std::shared_ptr<const text_internal::SentencePieceNormalizer> normalizer;
};
SentencePieceConversion convert_sentencepiece_model(std::string_view model,
                                                    const std::string& config_json = "");

// A SentencePiece-style tokenizer.json (the one Transformers' Llama conversion writes): the
// U+2581 normalizer and decoder, BPE with byte fallback over `vocab` and `merges`, `added` as
// its added tokens, `bos` (when not empty, id `bos_id`) added by the post-processor.
nlohmann::ordered_json sentencepiece_tokenizer_json(nlohmann::ordered_json added,
                                                    nlohmann::ordered_json vocab,
                                                    nlohmann::ordered_json merges,
                                                    const std::string& unk, const std::string& bos,
                                                    std::int64_t bos_id);

}  // namespace dcp

// vLLM's /tokenize and /detokenize: the server's own tokenizer and chat template, so a client can
// count a prompt's tokens against the context, or read ids back, as the server will see them.
#include "dcp/error.h"
#include "serve/openai_api.h"
#include "serve/request_fields.h"

namespace dcp::serve {

HttpReply OpenAiApi::tokenize(const std::string& body) const {
  try {
    const json b = parse_object(body);
    check_model(b, options_.model_name);
    const json* prompt = field(b, "prompt");
    const json* messages = field(b, "messages");
    if (!prompt == !messages) bad("prompt", "give exactly one of 'prompt' and 'messages'");
    if (!tokenizer_)
      bad(prompt ? "prompt" : "messages",
          "this server has no tokenizer (serve a checkpoint with one, or pass --tokenizer-path)");
    // A text gets the BOS it would get as a prompt; a chat's template writes its own.
    const bool special = boolean(b, "add_special_tokens").value_or(prompt != nullptr);
    std::vector<std::int32_t> ids;
    if (prompt) {
      if (!prompt->is_string()) bad("prompt", "'prompt' must be a string");
      ids = tokenizer_->encode(prompt->get<std::string>(), special);
    } else {
      ids = tokenizer_->encode(chat_prompt_text(*tokenizer_, b), special);
    }
    json reply = {
        {"count", ids.size()}, {"max_model_len", deployment_.context_tokens()}, {"tokens", ids}};
    if (boolean(b, "return_token_strs").value_or(false)) {
      json strs = json::array();
      // vLLM's: each token as the vocabulary spells it (convert_ids_to_tokens), not its text.
      for (std::int32_t id : ids) strs.push_back(tokenizer_->token_piece(id));
      reply["token_strs"] = strs;
    }
    return {200, "application/json", text_of(reply)};
  } catch (const BadRequest& e) {
    return error(e.status, e.what(), e.param);
  }
}

HttpReply OpenAiApi::detokenize(const std::string& body) const {
  try {
    const json b = parse_object(body);
    check_model(b, options_.model_name);
    const json* tokens = field(b, "tokens");
    if (!tokens) bad("tokens", "'tokens' is required");
    const std::vector<std::int32_t> ids =
        token_ids(*tokens, "tokens", deployment_.config().vocab_size);
    if (!tokenizer_)
      bad("tokens",
          "this server has no tokenizer (serve a checkpoint with one, or pass --tokenizer-path)");
    for (std::int32_t id : ids) {
      if (!tokenizer_->contains(id))
        bad("tokens", str("'tokens': ", id, " has no text in this server's tokenizer"));
    }
    return {200, "application/json", text_of(json{{"prompt", tokenizer_->decode(ids, false)}})};
  } catch (const BadRequest& e) {
    return error(e.status, e.what(), e.param);
  }
}

}  // namespace dcp::serve

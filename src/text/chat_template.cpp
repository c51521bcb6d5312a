// Chat templates (dcp/chat_template.h): a Jinja interpreter in jinja/ (values, syntax,
// rendering) and apply_chat_template's context around it.
#include "dcp/chat_template.h"

#include <nlohmann/json.hpp>

#include "dcp/error.h"
#include "jinja/content_format.h"
#include "jinja/render.h"
#include "jinja/syntax.h"
#include "jinja/value.h"

namespace dcp {

using ordered_json = nlohmann::ordered_json;

struct ChatTemplate::Impl {
  jinja::Body body;
};

ChatTemplate::ChatTemplate(const std::string& source) : impl_(std::make_unique<Impl>()) {
  impl_->body = jinja::parse(source);
}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const std::string& context_json) const {
  ordered_json j;
  try {
    j = ordered_json::parse(context_json);
  } catch (const ordered_json::exception& e) {
    throw Error(ErrorCategory::invalid_argument,
                str("chat template context is not valid JSON: ", e.what()));
  }
  DCP_ARG_CHECK(j.is_object(), "chat template context must be a JSON object");
  return jinja::render(impl_->body, jinja::from_json(j));
}

bool ChatTemplate::reads_content_parts() const {
  return jinja::loops_over_message_content(impl_->body);
}

bool ChatTemplate::reads_tool_arguments_as_mapping() const {
  return jinja::reads_tool_arguments_as_mapping(impl_->body);
}

std::string apply_chat_template(const Tokenizer& tokenizer, const std::string& context_json,
                                bool add_generation_prompt) {
  DCP_ARG_CHECK(tokenizer.chat_template().has_value(),
                "the tokenizer has no chat_template (tokenizer_config.json)");
  return apply_chat_template(tokenizer, context_json, add_generation_prompt,
                             *tokenizer.chat_template());
}

std::string apply_chat_template(const Tokenizer& tokenizer, const std::string& context_json,
                                bool add_generation_prompt, const std::string& chat_template) {
  nlohmann::ordered_json context;  // keys keep their order: templates iterate dicts
  try {
    context = nlohmann::ordered_json::parse(context_json);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCategory::invalid_argument, str("chat messages are not JSON: ", e.what()));
  }
  if (context.is_array()) context = nlohmann::ordered_json{{"messages", context}};
  DCP_ARG_CHECK(
      context.is_object() && context.contains("messages") && context["messages"].is_array(),
      "chat input must be a list of messages or an object with 'messages'");
  // As apply_chat_template passes them: the special tokens' text and the generation flag.
  context["bos_token"] = tokenizer.bos_token();
  context["eos_token"] = tokenizer.eos_token();
  if (!context.contains("add_generation_prompt"))
    context["add_generation_prompt"] = add_generation_prompt;
  return ChatTemplate(chat_template).render(context.dump());
}

std::string continue_final_message(const std::string& rendered, const std::string& final_content) {
  DCP_ARG_CHECK(!final_content.empty(),
                "continue_final_message: the final message has no content to continue");
  const std::size_t at = rendered.rfind(final_content);
  DCP_ARG_CHECK(at != std::string::npos,
                "continue_final_message: the chat template did not write the final message's "
                "content verbatim, so there is no place to continue it from");
  return rendered.substr(0, at + final_content.size());
}

}  // namespace dcp

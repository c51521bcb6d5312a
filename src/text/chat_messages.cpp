// OpenAI's chat messages as an OpenAI-compatible front hands them to a chat template
// (dcp/chat_template.h): content parts made the form the template reads.
#include <nlohmann/json.hpp>
#include <string>

#include "dcp/chat_template.h"
#include "dcp/error.h"

namespace dcp {

std::string openai_chat_messages(const std::string& messages_json,
                                 const std::string& chat_template) {
  nlohmann::ordered_json messages;  // a message's keys keep their order
  try {
    messages = nlohmann::ordered_json::parse(messages_json);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw Error(ErrorCategory::invalid_argument, str("messages are not JSON: ", e.what()));
  }
  DCP_ARG_CHECK(messages.is_array(), "messages must be a list of messages");
  bool parts_read = false, format_known = false;  // the template is parsed if a list needs it
  for (std::size_t i = 0; i < messages.size(); ++i) {
    nlohmann::ordered_json& m = messages[i];
    const std::string at = str("messages[", i, "]");
    DCP_ARG_CHECK(m.is_object() && m.contains("role") && m["role"].is_string(), at,
                  " must be an object with a string 'role'");
    if (!m.contains("content") || m["content"].is_null() || m["content"].is_string()) continue;
    DCP_ARG_CHECK(m["content"].is_array(), at,
                  ".content must be a string, null or a list of text parts");
    nlohmann::ordered_json parts = nlohmann::ordered_json::array();
    std::string joined;
    for (std::size_t j = 0; j < m["content"].size(); ++j) {
      const nlohmann::ordered_json& p = m["content"][j];
      const bool text = p.is_object() && p.contains("type") && p["type"] == "text" &&
                        p.contains("text") && p["text"].is_string();
      if (!text && p.is_object() && p.contains("type") && p["type"].is_string() &&
          p["type"] != "text")
        throw Error(ErrorCategory::invalid_argument,
                    str(at, ".content[", j, "] is a part of type '", p["type"].get<std::string>(),
                        "': this engine reads text only (parts {\"type\": \"text\", \"text\": "
                        "...})"));
      DCP_ARG_CHECK(text, at, ".content[", j, "] must be {\"type\": \"text\", \"text\": \"...\"}");
      parts.push_back({{"type", "text"}, {"text", p["text"]}});
      joined += (j ? "\n" : "") + p["text"].get<std::string>();
    }
    if (!format_known) {
      parts_read = ChatTemplate(chat_template).reads_content_parts();
      format_known = true;
    }
    // vLLM gives tool results as one string whatever the template reads.
    if (parts_read && m["role"] != "tool")
      m["content"] = parts;
    else
      m["content"] = joined;
  }
  return messages.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace dcp

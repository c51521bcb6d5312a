// OpenAI's chat messages as an OpenAI-compatible front hands them to a chat template
// (dcp/chat_template.h): content parts and tool-call arguments made the form the template reads.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "dcp/chat_template.h"
#include "dcp/error.h"
#include "jinja/value.h"

namespace dcp {
namespace {

// A tool call's arguments (OpenAI's JSON string) parsed into the object a template that reads
// them as a mapping needs; an empty or missing one is {}, as vLLM makes it.
void parse_call_arguments(nlohmann::ordered_json& function, const std::string& at) {
  if (!function.contains("arguments") || function["arguments"].is_null() ||
      (function["arguments"].is_string() && function["arguments"].get<std::string>().empty())) {
    function["arguments"] = nlohmann::ordered_json::object();
    return;
  }
  nlohmann::ordered_json& arguments = function["arguments"];
  if (arguments.is_object()) return;
  const std::string why = " (this chat template reads a call's arguments as a mapping)";
  DCP_ARG_CHECK(arguments.is_string(), at, " must be a JSON object in a string", why);
  nlohmann::ordered_json parsed;
  try {
    parsed = nlohmann::ordered_json::parse(arguments.get<std::string>());
  } catch (const nlohmann::ordered_json::exception& e) {
    throw Error(ErrorCategory::invalid_argument, str(at, " is not JSON", why, ": ", e.what()));
  }
  DCP_ARG_CHECK(parsed.is_object(), at, " must be a JSON object, not ", parsed.type_name(), why);
  arguments = std::move(parsed);
}

// Arguments given as an object (as transformers' documentation writes them) for a template that
// reads them as a string: the JSON text Python's json.dumps writes of them (what such a
// template's `tojson` would write too), so a template that concatenates them renders.
void write_call_arguments(nlohmann::ordered_json& function) {
  if (!function.contains("arguments") || !function["arguments"].is_object()) return;
  std::string text;
  jinja::dump_json(jinja::from_json(function["arguments"]), text, jinja::JsonStyle{});
  function["arguments"] = text;
}

}  // namespace

std::string openai_chat_messages(const std::string& messages_json,
                                 const std::string& chat_template) {
  nlohmann::ordered_json messages;  // a message's keys keep their order
  try {
    messages = nlohmann::ordered_json::parse(messages_json);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw Error(ErrorCategory::invalid_argument, str("messages are not JSON: ", e.what()));
  }
  DCP_ARG_CHECK(messages.is_array(), "messages must be a list of messages");
  std::optional<ChatTemplate> parsed;  // the template, parsed once a message needs it
  const auto parsed_template = [&]() -> const ChatTemplate& {
    if (!parsed) parsed.emplace(chat_template);
    return *parsed;
  };
  std::optional<bool> parts_read, arguments_as_mapping;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    nlohmann::ordered_json& m = messages[i];
    const std::string at = str("messages[", i, "]");
    DCP_ARG_CHECK(m.is_object() && m.contains("role") && m["role"].is_string(), at,
                  " must be an object with a string 'role'");
    // An empty list of calls is no call (vLLM drops it), so the template writes a plain turn.
    if (m["role"] == "assistant" && m.contains("tool_calls") && m["tool_calls"].is_array() &&
        m["tool_calls"].empty())
      m.erase("tool_calls");
    if (m["role"] == "assistant" && m.contains("tool_calls") && m["tool_calls"].is_array()) {
      if (!arguments_as_mapping)
        arguments_as_mapping = parsed_template().reads_tool_arguments_as_mapping();
      for (std::size_t j = 0; j < m["tool_calls"].size(); ++j) {
        nlohmann::ordered_json& call = m["tool_calls"][j];
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
          continue;
        if (*arguments_as_mapping)
          parse_call_arguments(call["function"],
                               str(at, ".tool_calls[", j, "].function.arguments"));
        else
          write_call_arguments(call["function"]);
      }
    }
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
    if (!parts_read) parts_read = parsed_template().reads_content_parts();
    // vLLM gives tool results as one string whatever the template reads.
    if (*parts_read && m["role"] != "tool")
      m["content"] = parts;
    else
      m["content"] = joined;
  }
  return messages.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace dcp

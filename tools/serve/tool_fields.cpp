// Tool calling on chat completions (see tool_fields.h).
#include "serve/tool_fields.h"

#include <cctype>
#include <set>

#include "dcp/json_schema.h"
#include "serve/openai_api.h"

namespace dcp::serve {
namespace {

constexpr std::size_t kMaxTools = 128;

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (const char c : n) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  }
  return true;
}

}  // namespace

const json* checked_tools(const json& b) {
  const json* tools = field(b, "tools");
  if (!tools) return nullptr;
  if (!tools->is_array() || tools->size() > kMaxTools)
    bad("tools", str("'tools' must be a list of at most ", kMaxTools, " tools"));
  std::set<std::string> names;
  for (std::size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    const std::string at = str("tools[", i, "]");
    if (!t.is_object() || t.value("type", json()) != "function" || !t.contains("function") ||
        !t["function"].is_object())
      bad("tools", str("'", at, "' must be {\"type\": \"function\", \"function\": {...}}"));
    const json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() ||
        !valid_name(f["name"].get_ref<const std::string&>()))
      bad("tools",
          str("'", at, ".function.name' must be 1 to 64 letters, digits, underscores or dashes"));
    if (!names.insert(f["name"].get<std::string>()).second)
      bad("tools",
          str("'", at, ".function.name': '", f["name"].get<std::string>(), "' names two tools"));
    if (f.contains("parameters") && !f["parameters"].is_object())
      bad("tools", str("'", at, ".function.parameters' must be a JSON Schema object"));
    if (f.contains("description") && !f["description"].is_string())
      bad("tools", str("'", at, ".function.description' must be a string"));
  }
  return tools;
}

ToolUse OpenAiApi::parse_tools(const json& b, const std::string& body, SamplingParams& p) const {
  ToolUse use;
  const json* tools = checked_tools(b);
  const json* choice = field(b, "tool_choice");
  use.parallel = boolean(b, "parallel_tool_calls").value_or(true);
  const bool any = tools && !tools->empty();
  const auto none_without_tools = [&] {
    if (choice && !(choice->is_string() && *choice == "none"))
      bad("tool_choice", "'tool_choice' needs 'tools' (the functions it may call)");
  };
  if (!any) {
    none_without_tools();
    return use;
  }
  // OpenAI's default with tools: the model decides.
  const std::string mode = !choice ? "auto" : choice->is_string() ? choice->get<std::string>() : "";
  if (mode == "none") return use;
  if (mode == "auto") {
    if (!options_.tool_call_format)
      bad("tool_choice",
          "'tool_choice' \"auto\" (the default with 'tools') needs a server that reads tool "
          "calls: this tokenizer has none of DeepSeek's, Kimi K2's or MiniCPM3's tool-call "
          "tokens (start the server with --tool-call-parser deepseek_v3|kimi_k2|minicpm3), or "
          "send \"required\", "
          "\"none\" or a named function");
    use.mode = ToolUse::Mode::read_auto;
    use.format = *options_.tool_call_format;
    return use;
  }
  if (mode == "required") {
    use.mode = ToolUse::Mode::required;
  } else if (choice->is_object() && choice->value("type", json()) == "function" &&
             choice->contains("function") && (*choice)["function"].is_object() &&
             (*choice)["function"].contains("name") && (*choice)["function"]["name"].is_string()) {
    use.mode = ToolUse::Mode::named;
    use.function = (*choice)["function"]["name"].get<std::string>();
  } else {
    bad("tool_choice",
        "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
        "\"function\": {\"name\": ...}}");
  }
  // "required" and a named function guide the reply: not combined with other guides.
  if (p.guided() || !p.allowed_token_ids.empty() || !p.bad_words.empty())
    bad("tool_choice",
        "'tool_choice' \"required\" or a named function guides the reply itself: it does not "
        "combine with response_format, guided_*, allowed_token_ids or bad_words");
  need_tokenizer_for("tool_choice");
  // Each tool's arguments as a regex of its JSON (the body read again: properties in order).
  const auto schema_of = [&](std::size_t i) {
    const json& f = (*tools)[i]["function"];
    const std::string at = str("tools[", i, "].function.parameters");
    try {
      return json_schema_regex(
          f.contains("parameters")
              ? ordered_text(body, {"tools", std::to_string(i), "function", "parameters"})
              : std::string(R"({"type": "object", "properties": {}})"),
          at);
    } catch (const Error& e) {
      bad("tools", e.what());
    }
  };
  if (use.mode == ToolUse::Mode::named) {
    std::size_t i = 0;
    while (i < tools->size() && (*tools)[i]["function"]["name"] != use.function) ++i;
    if (i == tools->size())
      bad("tool_choice",
          str("'tool_choice' names '", use.function, "', which 'tools' does not hold"));
    p.regex = schema_of(i);
  } else {
    // A list of calls, each {"name": ..., "parameters": ...} of one of the tools (vLLM's form).
    std::string alternatives;
    for (std::size_t i = 0; i < tools->size(); ++i) {
      if (i) alternatives += "|";
      alternatives.append("\\{ ?\"name\" ?: ?\"")
          .append((*tools)[i]["function"]["name"].get<std::string>())
          .append("\" ?, ?\"parameters\" ?: ?(?:")
          .append(schema_of(i))
          .append(") ?\\}");
    }
    const std::string call = "(?:" + alternatives + ")";
    p.regex = "\\[ ?" + call + (use.parallel ? "(?: ?, ?" + call + ")*" : "") + " ?\\]";
  }
  check_guide(p, "tool_choice", "tool_choice");
  return use;
}

}  // namespace dcp::serve

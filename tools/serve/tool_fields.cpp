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

// JSON text as Python's json.dumps writes it (", " and ": ", non-ASCII kept), as vLLM returns the
// arguments of a call it read from JSON.
std::string dumps(const nlohmann::ordered_json& v) {
  if (v.is_object()) {
    std::string out = "{";
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it != v.begin()) out += ", ";
      out.append(nlohmann::ordered_json(it.key()).dump()).append(": ").append(dumps(it.value()));
    }
    return out + "}";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      out += dumps(v[i]);
    }
    return out + "]";
  }
  return v.dump();
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
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
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
          "calls: this tokenizer has neither DeepSeek's nor Kimi K2's tool-call tokens (start "
          "the server with --tool-call-parser deepseek_v3|kimi_k2), or send \"required\", "
          "\"none\" or a named function");
    use.mode = ToolUse::Mode::read_auto;
    use.format = *options_.tool_call_format;
    return use;
  }
  if (mode == "required") {
    use.mode = ToolUse::Mode::required;
  } else if (choice->is_object() && choice->value("type", "") == "function" &&
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
  if (!p.regex.empty() || !p.choices.empty() || p.json_object || !p.allowed_token_ids.empty() ||
      !p.bad_words.empty())
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

ToolReply::ToolReply(ToolUse use, std::string call_id)
    : use_(std::move(use)), call_id_(std::move(call_id)) {}

json ToolReply::call_json(std::size_t index, const std::string& id, const std::string& name,
                          const std::string& arguments) const {
  return {{"index", index},
          {"id", id.empty() ? str(call_id_, "-", index) : id},
          {"type", "function"},
          {"function", {{"name", name}, {"arguments", arguments}}}};
}

ToolReply::Read ToolReply::read(const std::string& text, bool complete) const {
  Read r;
  switch (use_.mode) {
    case ToolUse::Mode::none: r.content = text; break;
    case ToolUse::Mode::named: r.calls.push_back(call_json(0, "", use_.function, text)); break;
    case ToolUse::Mode::required: {
      // The guide kept the text to the list's grammar; cut short, it is content.
      nlohmann::ordered_json list;
      if (complete) list = nlohmann::ordered_json::parse(text, nullptr, false);
      if (!list.is_array()) {
        r.content = text;
        break;
      }
      for (std::size_t k = 0; k < list.size(); ++k)
        r.calls.push_back(
            call_json(k, "", list[k]["name"].get<std::string>(), dumps(list[k]["parameters"])));
      break;
    }
    case ToolUse::Mode::read_auto: {
      ParsedToolCalls parsed = parse_tool_calls(text, use_.format);
      r.content = std::move(parsed.content);
      // parallel_tool_calls false: the first call only.
      const std::size_t keep =
          use_.parallel ? parsed.calls.size() : std::min<std::size_t>(parsed.calls.size(), 1);
      for (std::size_t k = 0; k < keep; ++k) {
        const ToolCall& c = parsed.calls[k];
        r.calls.push_back(call_json(k, c.id, c.name, c.arguments));
      }
      break;
    }
  }
  return r;
}

json ToolReply::delta(const std::string& text) {
  text_ += text;
  switch (use_.mode) {
    case ToolUse::Mode::none:
      sent_ = text_.size();
      return text.empty() ? json(nullptr) : json{{"content", text}};
    case ToolUse::Mode::named: {
      // The arguments stream as they come, after a first delta with the call's id and name.
      json call = {{"index", 0}, {"function", {{"arguments", text}}}};
      if (!opened_) {
        call = call_json(0, "", use_.function, text);
        opened_ = called_ = true;
      } else if (text.empty()) {
        return nullptr;
      }
      return {{"tool_calls", json::array({call})}};
    }
    case ToolUse::Mode::required: return nullptr;  // a list is read whole, at the end
    case ToolUse::Mode::read_auto: {
      // Content up to the calls' marker, or up to a tail that could begin it.
      const std::string_view marker = tool_calls_begin(use_.format);
      std::size_t safe = text_.find(marker);
      if (safe == std::string::npos) {
        safe = text_.size();
        for (std::size_t n = std::min(marker.size() - 1, text_.size()); n > 0; --n) {
          if (text_.compare(text_.size() - n, n, marker.substr(0, n)) == 0) {
            safe = text_.size() - n;
            break;
          }
        }
      }
      if (safe <= sent_) return nullptr;
      json d = {{"content", text_.substr(sent_, safe - sent_)}};
      sent_ = safe;
      return d;
    }
  }
  return nullptr;
}

json ToolReply::last_delta(bool complete) {
  if (use_.mode == ToolUse::Mode::none || use_.mode == ToolUse::Mode::named) return nullptr;
  Read r = read(text_, complete);
  json d = json::object();
  if (r.content.size() > sent_) d["content"] = r.content.substr(sent_);
  if (!r.calls.empty()) {
    d["tool_calls"] = std::move(r.calls);
    called_ = true;
  }
  return d.empty() ? json(nullptr) : d;
}

json ToolReply::message(const std::string& text, bool complete) {
  Read r = read(text, complete);
  called_ = !r.calls.empty();
  json m = {{"role", "assistant"}};
  m["content"] = called_ && r.content.empty() ? json(nullptr) : json(r.content);
  if (called_) {
    for (json& call : r.calls) call.erase("index");  // deltas number their calls; a message lists
    m["tool_calls"] = std::move(r.calls);
  }
  return m;
}

}  // namespace dcp::serve

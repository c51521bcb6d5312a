#include "serve/request_fields.h"

#include <cmath>
#include <string>

#include "dcp/chat_template.h"
#include "dcp/error.h"
#include "dcp/json_schema.h"
#include "serve/tool_fields.h"

namespace dcp::serve {

std::string text_of(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void bad(const std::string& param, const std::string& message, int status) {
  throw BadRequest(status, param, message);
}

const json* field(const json& obj, const char* key) {
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> number(const json& obj, const char* key, double lo, double hi) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(key, str("'", key, "' must be a number"));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) bad(key, str("'", key, "' = ", x, " must be in [", lo, ", ", hi, "]"));
  return x;
}

std::optional<std::int64_t> integer(const json& obj, const char* key, std::int64_t lo,
                                    std::int64_t hi) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) bad(key, str("'", key, "' must be an integer"));
  if (v->is_number_unsigned() && v->get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
    bad(key, str("'", key, "' = ", v->dump(), " must be in [", lo, ", ", hi, "]"));
  const std::int64_t x = v->get<std::int64_t>();
  if (x < lo || x > hi) bad(key, str("'", key, "' = ", x, " must be in [", lo, ", ", hi, "]"));
  return x;
}

std::optional<bool> boolean(const json& obj, const char* key) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(key, str("'", key, "' must be true or false"));
  return v->get<bool>();
}

std::vector<std::int32_t> token_ids(const json& v, const std::string& param, int vocab) {
  if (!v.is_array()) bad(param, str("'", param, "' must be a list of token ids"));
  std::vector<std::int32_t> out;
  for (const json& t : v) {
    if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() >= vocab)
      bad(param, str("'", param, "': ", text_of(t), " is not a token id in [0, ", vocab, ")"));
    out.push_back(t.get<std::int32_t>());
  }
  return out;
}

std::map<std::int32_t, double> logit_bias(const json& obj, int vocab) {
  const json* v = field(obj, "logit_bias");
  if (!v) return {};
  if (!v->is_object()) bad("logit_bias", "'logit_bias' must be an object of token id: bias");
  std::map<std::int32_t, double> out;
  for (const auto& [key, bias] : v->items()) {
    std::size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (key.empty() || key[0] < '0' || key[0] > '9' || used != key.size() || id < 0 || id >= vocab)
      bad("logit_bias", str("'logit_bias': key '", key, "' is not a token id in [0, ", vocab, ")"));
    if (!bias.is_number() || !(std::abs(bias.get<double>()) <= 100))
      bad("logit_bias",
          str("'logit_bias': the bias of token ", id, " must be a number in [-100, 100]"));
    out[static_cast<std::int32_t>(id)] = bias.get<double>();
  }
  return out;
}

std::vector<std::string> stop_strings(const json& obj) {
  const json* v = field(obj, "stop");
  if (!v) return {};
  if (!v->is_string() && (!v->is_array() || v->size() > 16))
    bad("stop", "'stop' must be a string or a list of at most 16 strings");
  std::vector<std::string> out;
  for (const json& s : v->is_string() ? json::array({*v}) : *v) {
    if (!s.is_string()) bad("stop", "'stop' must be a string or a list of strings");
    // An empty string would match before any text: refused, as vLLM refuses it.
    if (s.get_ref<const std::string&>().empty())
      bad("stop", "'stop' cannot contain an empty string");
    out.push_back(s.get<std::string>());
  }
  return out;
}

json parse_object(const std::string& body) {
  // No request needs deep nesting; refused before parsing it (json_nesting says why).
  if (json_nesting(body) > kMaxBodyNesting)
    bad("", str("the body nests arrays and objects more than ", kMaxBodyNesting, " levels"));
  json b;
  try {
    b = json::parse(body);
  } catch (const json::exception& e) {
    bad("", str("the body is not JSON: ", e.what()));
  }
  if (!b.is_object()) bad("", "the body must be a JSON object");
  return b;
}

void check_model(const json& b, const std::string& served) {
  if (const json* m = field(b, "model")) {
    if (!m->is_string()) bad("model", "'model' must be a string");
    if (m->get<std::string>() != served)
      bad("model",
          str("the model '", m->get<std::string>(), "' does not exist; this server serves '",
              served, "'"),
          404);
  }
}

std::string chat_prompt_text(const Tokenizer& tokenizer, const json& b) {
  const json* msgs = field(b, "messages");
  if (!msgs || !msgs->is_array() || msgs->empty())
    bad("messages", "'messages' must be a non-empty list");
  std::optional<std::string> own;  // a template for this request only
  if (const json* t = field(b, "chat_template")) {
    if (!t->is_string()) bad("chat_template", "'chat_template' must be a string of Jinja");
    try {
      ChatTemplate parsed(t->get<std::string>());
    } catch (const Error& e) {
      bad("chat_template", str("'chat_template' does not parse: ", e.what()));
    }
    own = t->get<std::string>();
  }
  // Content parts in the form the template reads, as vLLM hands them.
  json plain;
  try {
    plain = json::parse(openai_chat_messages(
        msgs->dump(), own ? *own : tokenizer.chat_template().value_or(std::string())));
  } catch (const Error& e) {
    bad("messages", e.what());
  }
  // vLLM's order: the request's template variables, overridden by chat_template_kwargs.
  json context = {{"messages", plain},
                  {"add_generation_prompt", boolean(b, "add_generation_prompt").value_or(true)}};
  if (const json* tools = checked_tools(b)) context["tools"] = *tools;
  if (const json* docs = field(b, "documents")) {  // for templates that cite them (RAG)
    if (!docs->is_array()) bad("documents", "'documents' must be a list");
    context["documents"] = *docs;
  }
  if (const json* kwargs = field(b, "chat_template_kwargs")) {
    if (!kwargs->is_object())
      bad("chat_template_kwargs", "'chat_template_kwargs' must be an object of template variables");
    for (const auto& [key, value] : kwargs->items()) {
      if (key == "messages" || key == "bos_token" || key == "eos_token")
        bad("chat_template_kwargs", str("'chat_template_kwargs' may not set '", key, "'"));
      context[key] = value;
    }
  }
  const bool open_end = boolean(b, "continue_final_message").value_or(false);
  if (open_end && context["add_generation_prompt"] != false)
    bad("continue_final_message",
        "'continue_final_message' needs 'add_generation_prompt': false (the reply continues the "
        "final message instead of starting a turn)");
  std::string text;
  try {
    text = own ? apply_chat_template(tokenizer, text_of(context), true, *own)
               : apply_chat_template(tokenizer, text_of(context), true);
  } catch (const Error& e) {
    bad("messages", str("the chat template failed: ", e.what()));
  }
  if (open_end) {
    // The final message's text (of its last part, as transformers takes a list's).
    const json content = plain.back().value("content", json());
    const json& final_text =
        content.is_array() && !content.empty() ? content.back()["text"] : content;
    try {
      text =
          continue_final_message(text, final_text.is_string() ? final_text.get<std::string>() : "");
    } catch (const Error& e) {
      bad("continue_final_message", e.what());
    }
  }
  return text;
}

std::string ordered_text(const std::string& body, const std::vector<std::string>& path) {
  nlohmann::ordered_json at = nlohmann::ordered_json::parse(body);  // parse_object checked it
  for (const std::string& key : path)                               // a list's element by its index
    at = nlohmann::ordered_json(at.is_array() ? at.at(std::stoul(key)) : at.at(key));
  return at.is_string() ? at.get<std::string>() : at.dump();
}

}  // namespace dcp::serve

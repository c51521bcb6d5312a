// The fields that constrain what a reply may say: vLLM's guided_choice and guided_regex,
// SGLang's regex, a JSON Schema (OpenAI's response_format json_schema, vLLM's guided_json,
// SGLang's json_schema), OpenAI's JSON mode, a GBNF grammar (vLLM's guided_grammar, SGLang's
// ebnf), or vLLM's structured_outputs object holding any of them. Each becomes a guide the engine
// walks token by token; every refusal names its field.
#include <optional>

#include "dcp/engine.h"
#include "dcp/json_schema.h"
#include "serve/openai_api.h"
#include "serve/request_fields.h"

namespace dcp::serve {
namespace {

constexpr std::size_t kMaxChoices = 256;

}  // namespace

// The pattern's syntax, and whether this server's vocabulary can begin a match; a refusal names
// `param`, its message `shown` (structured_outputs.regex for the structured_outputs field).
void OpenAiApi::check_guide(const SamplingParams& p, const std::string& param,
                            const std::string& shown) const {
  RequestSpec probe;
  probe.sampling = p;
  try {
    request_guide(probe, deployment_.guide_vocabulary(), shown);
  } catch (const Error& e) {
    bad(param, e.what());
  }
}

// vLLM's newer form, {"structured_outputs": {"choice" | "regex" | "json" | "json_object" |
// "grammar"}}, as
// the guided_* fields it replaces; null when the body has none. Anything else it may hold that
// would change the reply is refused.
std::optional<json> structured_outputs(const json& src, const char* within) {
  const json* so = field(src, "structured_outputs");
  if (!so) return std::nullopt;
  if (*within) bad("structured_outputs", "'structured_outputs' is a field of the body (vLLM's)");
  if (!so->is_object())
    bad("structured_outputs",
        "'structured_outputs' must be an object (choice, regex, json, json_object or "
        "grammar)");
  for (const char* key : {"guided_choice", "guided_regex", "regex", "guided_json", "json_schema",
                          "guided_grammar", "ebnf", "response_format"}) {
    if (field(src, key) &&
        (std::string_view(key) != "response_format" || (*field(src, key))["type"] != "text"))
      bad("structured_outputs", str("send 'structured_outputs' or '", key, "', not both"));
  }
  json legacy = json::object();
  for (const auto& [key, value] : so->items()) {
    if (value.is_null()) continue;
    if (key == "choice") {
      legacy["guided_choice"] = value;
    } else if (key == "regex") {
      legacy["guided_regex"] = value;
    } else if (key == "json") {
      legacy["guided_json"] = value;
    } else if (key == "grammar") {
      legacy["guided_grammar"] = value;
    } else if (key == "json_object") {
      if (!value.is_boolean())
        bad("structured_outputs", "'structured_outputs.json_object' must be a boolean");
      if (value.get<bool>()) legacy["response_format"] = {{"type", "json_object"}};
    } else if (key == "disable_additional_properties") {
      // Schemas never get properties they do not list: what true asks, and false permits.
      if (!value.is_boolean())
        bad("structured_outputs",
            "'structured_outputs.disable_additional_properties' must be a boolean");
    } else {
      bad("structured_outputs",
          str("'structured_outputs.", key,
              "' is not supported (supported: choice, regex, json, json_object, grammar, "
              "disable_additional_properties)"));
    }
  }
  return legacy;
}

void OpenAiApi::parse_guides(const json& body_src, const char* within, const std::string& body,
                             SamplingParams& p) const {
  // With structured_outputs its fields stand in for the guided_* ones, and refusals name it.
  const std::optional<json> so = structured_outputs(body_src, within);
  const json& src = so ? *so : body_src;
  struct Key {
    std::string param, shown;  // the field a refusal names, and how its message writes it
  };
  const auto key_of = [&](const char* legacy, const char* so_name) {
    return so ? Key{"structured_outputs", str("structured_outputs.", so_name)}
              : Key{legacy, legacy};
  };
  if (const json* choices = field(src, "guided_choice")) {  // vLLM's: the reply is one of them
    const Key k = key_of("guided_choice", "choice");
    if (!choices->is_array() || choices->empty() || choices->size() > kMaxChoices)
      bad(k.param,
          str("'", k.shown, "' must be a list of 1 to ", kMaxChoices, " non-empty strings"));
    if (!p.allowed_token_ids.empty() || !p.bad_words.empty())
      bad(k.param, str("'", k.shown, "' does not combine with allowed_token_ids or bad_words"));
    need_tokenizer_for(k.param.c_str());
    std::vector<std::string> texts;
    for (const json& c : *choices) {
      if (!c.is_string() || c.get_ref<const std::string&>().empty())
        bad(k.param,
            str("'", k.shown, "' must be a list of 1 to ", kMaxChoices, " non-empty strings"));
      texts.push_back(c.get<std::string>());
      p.choices.push_back(tokenizer_->encode(texts.back(), false));
    }
    if (const auto pair = prefix_pair(p.choices))
      bad(k.param, str("'", k.shown, "': the tokens of '", texts[pair->first], "' begin those of '",
                       texts[pair->second], "', so a reply could not tell them apart"));
  }
  // vLLM's guided_regex, SGLang's regex: the reply's text matches the pattern whole.
  if (field(src, "guided_regex") && field(src, "regex"))
    bad("regex", "send one of 'guided_regex' and 'regex', not both");
  const char* regex_key = field(src, "regex") ? "regex" : "guided_regex";
  if (const json* pattern = field(src, regex_key)) {
    const Key k = key_of(regex_key, "regex");
    if (!pattern->is_string() || pattern->get_ref<const std::string&>().empty())
      bad(k.param, str("'", k.shown, "' must be a non-empty string (a regular expression)"));
    if (!p.allowed_token_ids.empty() || !p.bad_words.empty() || !p.choices.empty())
      bad(k.param, str("'", k.shown,
                       "' does not combine with allowed_token_ids, bad_words or guided_choice"));
    need_tokenizer_for(k.param.c_str());
    p.regex = pattern->get<std::string>();
    check_guide(p, k.param, k.shown);
  }
  // A JSON Schema (OpenAI's response_format json_schema, vLLM's guided_json, SGLang's
  // json_schema), compiled to a regex; the body is read again so that its properties keep the
  // client's order.
  std::vector<std::pair<Key, std::vector<std::string>>> schemas;  // each: its key, its path
  if (const json* format = field(src, "response_format");
      format && (*format)["type"] == "json_schema") {
    const json* spec = field(*format, "json_schema");
    if (!spec || !spec->is_object() || !field(*spec, "schema") || !(*spec)["schema"].is_object())
      bad("response_format",
          "'response_format' json_schema needs \"json_schema\": {\"schema\": "
          "{...}}");
    schemas.push_back(
        {{"response_format", "response_format"}, {"response_format", "json_schema", "schema"}});
  }
  for (const char* key : {"guided_json", "json_schema"}) {
    if (const json* v = field(src, key)) {
      const Key k = key_of(key, "json");
      if (!v->is_object() && !v->is_string())
        bad(k.param, str("'", k.shown, "' must be a JSON Schema (an object, or its JSON text)"));
      std::vector<std::string> path;
      if (so) {
        path = {"structured_outputs", "json"};
      } else {
        if (*within) path.push_back(within);
        path.push_back(key);
      }
      schemas.push_back({k, path});
    }
  }
  if (schemas.size() > 1) bad(schemas[1].first.param, "send one JSON Schema, not several");
  if (!schemas.empty()) {
    const Key& k = schemas[0].first;
    if (!p.regex.empty() || !p.choices.empty() || !p.allowed_token_ids.empty() ||
        !p.bad_words.empty())
      bad(k.param, str("'", k.shown,
                       "' (a JSON Schema) does not combine with guided_regex, "
                       "guided_choice, allowed_token_ids or bad_words"));
    need_tokenizer_for(k.param.c_str());
    try {
      p.regex = json_schema_regex(ordered_text(body, schemas[0].second), k.shown);
      check_guide(p, k.param, k.shown);
    } catch (const Error& e) {
      bad(k.param, e.what());
    }
  }
  // OpenAI's JSON mode: the reply is one JSON object.
  if (const json* format = field(src, "response_format");
      format && (*format)["type"] == "json_object") {
    const Key k = key_of("response_format", "json_object");
    if (!p.regex.empty() || !p.choices.empty() || !p.allowed_token_ids.empty() ||
        !p.bad_words.empty())
      bad(k.param, str("'", k.shown,
                       "' (JSON mode) does not combine with guided_regex, "
                       "guided_choice, allowed_token_ids or bad_words"));
    need_tokenizer_for(k.param.c_str());
    p.json_object = true;
    check_guide(p, k.param, k.shown);
  }
  // vLLM's guided_grammar, SGLang's ebnf: the reply's text is a whole text of the GBNF grammar.
  if (field(src, "guided_grammar") && field(src, "ebnf"))
    bad("ebnf", "send one of 'guided_grammar' and 'ebnf', not both");
  const char* grammar_key = field(src, "ebnf") ? "ebnf" : "guided_grammar";
  if (const json* grammar = field(src, grammar_key)) {
    const Key k = key_of(grammar_key, "grammar");
    if (!grammar->is_string() || grammar->get_ref<const std::string&>().empty())
      bad(k.param, str("'", k.shown, "' must be a non-empty string (a GBNF grammar)"));
    if (p.guided() || !p.allowed_token_ids.empty() || !p.bad_words.empty())
      bad(k.param, str("'", k.shown,
                       "' (a grammar) does not combine with response_format, guided_regex, "
                       "guided_choice, guided_json, allowed_token_ids or bad_words"));
    need_tokenizer_for(k.param.c_str());
    p.grammar = grammar->get<std::string>();
    check_guide(p, k.param, k.shown);
  }
}

}  // namespace dcp::serve

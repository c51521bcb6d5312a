// The fields that constrain what a reply may say: vLLM's guided_choice and guided_regex,
// SGLang's regex, a JSON Schema (OpenAI's response_format json_schema, vLLM's guided_json,
// SGLang's json_schema) and OpenAI's JSON mode. Each becomes a guide the engine walks token by
// token; every refusal names its field.
#include "dcp/engine.h"
#include "dcp/json_schema.h"
#include "serve/openai_api.h"
#include "serve/request_fields.h"

namespace dcp::serve {
namespace {

constexpr std::size_t kMaxChoices = 256;

}  // namespace

// The pattern's syntax, and whether this server's vocabulary can begin a match.
void OpenAiApi::check_guide(const SamplingParams& p, const char* field_name) const {
  RequestSpec probe;
  probe.sampling = p;
  try {
    request_guide(probe, deployment_.guide_vocabulary(), field_name);
  } catch (const Error& e) {
    bad(field_name, e.what());
  }
}

void OpenAiApi::parse_guides(const json& src, const char* within, const std::string& body,
                             SamplingParams& p) const {
  if (const json* choices = field(src, "guided_choice")) {  // vLLM's: the reply is one of them
    if (!choices->is_array() || choices->empty() || choices->size() > kMaxChoices)
      bad("guided_choice",
          str("'guided_choice' must be a list of 1 to ", kMaxChoices, " non-empty strings"));
    if (!p.allowed_token_ids.empty() || !p.bad_words.empty())
      bad("guided_choice", "'guided_choice' does not combine with allowed_token_ids or bad_words");
    need_tokenizer_for("guided_choice");
    std::vector<std::string> texts;
    for (const json& c : *choices) {
      if (!c.is_string() || c.get_ref<const std::string&>().empty())
        bad("guided_choice",
            str("'guided_choice' must be a list of 1 to ", kMaxChoices, " non-empty strings"));
      texts.push_back(c.get<std::string>());
      p.choices.push_back(tokenizer_->encode(texts.back(), false));
    }
    if (const auto pair = prefix_pair(p.choices))
      bad("guided_choice",
          str("'guided_choice': the tokens of '", texts[pair->first], "' begin those of '",
              texts[pair->second], "', so a reply could not tell them apart"));
  }
  // vLLM's guided_regex, SGLang's regex: the reply's text matches the pattern whole.
  if (field(src, "guided_regex") && field(src, "regex"))
    bad("regex", "send one of 'guided_regex' and 'regex', not both");
  const char* regex_key = field(src, "regex") ? "regex" : "guided_regex";
  if (const json* pattern = field(src, regex_key)) {
    if (!pattern->is_string() || pattern->get_ref<const std::string&>().empty())
      bad(regex_key, str("'", regex_key, "' must be a non-empty string (a regular expression)"));
    if (!p.allowed_token_ids.empty() || !p.bad_words.empty() || !p.choices.empty())
      bad(regex_key, str("'", regex_key,
                         "' does not combine with allowed_token_ids, bad_words or guided_choice"));
    need_tokenizer_for(regex_key);
    p.regex = pattern->get<std::string>();
    check_guide(p, regex_key);
  }
  // A JSON Schema (OpenAI's response_format json_schema, vLLM's guided_json, SGLang's
  // json_schema), compiled to a regex; the body is read again so that its properties keep the
  // client's order.
  const std::vector<std::string> at_src =
      *within ? std::vector<std::string>{within} : std::vector<std::string>{};
  std::vector<std::pair<const char*, std::vector<std::string>>> schemas;
  if (const json* format = field(src, "response_format");
      format && (*format)["type"] == "json_schema") {
    const json* spec = field(*format, "json_schema");
    if (!spec || !spec->is_object() || !field(*spec, "schema") || !(*spec)["schema"].is_object())
      bad("response_format",
          "'response_format' json_schema needs \"json_schema\": {\"schema\": "
          "{...}}");
    schemas.push_back({"response_format", {"response_format", "json_schema", "schema"}});
  }
  for (const char* key : {"guided_json", "json_schema"}) {
    if (const json* v = field(src, key)) {
      if (!v->is_object() && !v->is_string())
        bad(key, str("'", key, "' must be a JSON Schema (an object, or its JSON text)"));
      schemas.push_back({key, {key}});
    }
  }
  if (schemas.size() > 1) bad(schemas[1].first, "send one JSON Schema, not several");
  if (!schemas.empty()) {
    const char* key = schemas[0].first;
    if (!p.regex.empty() || !p.choices.empty() || !p.allowed_token_ids.empty() ||
        !p.bad_words.empty())
      bad(key, str("'", key,
                   "' (a JSON Schema) does not combine with guided_regex, "
                   "guided_choice, allowed_token_ids or bad_words"));
    need_tokenizer_for(key);
    std::vector<std::string> path = at_src;
    path.insert(path.end(), schemas[0].second.begin(), schemas[0].second.end());
    try {
      p.regex = json_schema_regex(ordered_text(body, path), key);
      check_guide(p, key);
    } catch (const Error& e) {
      bad(key, e.what());
    }
  }
  // OpenAI's JSON mode: the reply is one JSON object.
  if (const json* format = field(src, "response_format");
      format && (*format)["type"] == "json_object") {
    if (!p.regex.empty() || !p.choices.empty() || !p.allowed_token_ids.empty() ||
        !p.bad_words.empty())
      bad("response_format",
          "'response_format' json_object does not combine with guided_regex, "
          "guided_choice, allowed_token_ids or bad_words");
    need_tokenizer_for("response_format");
    p.json_object = true;
    check_guide(p, "response_format");
  }
}

}  // namespace dcp::serve

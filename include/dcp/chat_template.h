// Chat templates: the Jinja templates of tokenizer_config.json, rendered as Hugging Face's
// apply_chat_template renders them (trim_blocks and lstrip_blocks on, the template's trailing
// newline dropped).
//
// The engine covers the Jinja that chat templates use: {{ }}, {% if/elif/else %}, {% for %} (with
// loop.*, else, tuple targets, an `if` filter), {% break %} and {% continue %}, {% set %} (names,
// namespace attributes, and {% set x %}...{% endset %} blocks), {% macro %} (defaults, keywords,
// varargs and kwargs), {% call %} blocks, whitespace control, comments; expressions with Python's
// operators, literals, lists and dicts, attribute and item access, slices, the conditional
// expression, tests (is defined, none, string, ...), filters (length, trim, tojson with
// transformers' arguments, join, default, dictsort, sort, unique, min, max, sum, round, indent,
// int, float, ...), string methods with Python's Unicode case and whitespace rules, dict methods,
// and the globals namespace(), range(), raise_exception() and strftime_now(). Anything else
// (blocks, includes, an unknown filter) is refused with the construct and its line, never
// rendered approximately.
#pragma once

#include <memory>
#include <string>

#include "dcp/tokenizer.h"

namespace dcp {

class ChatTemplate {
 public:
  // Parses `source`; throws dcp::Error (invalid_argument) naming the line of a syntax error or of
  // a construct the engine does not run.
  explicit ChatTemplate(const std::string& source);
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  // Renders with the variables of `context_json`, a JSON object (messages, add_generation_prompt,
  // bos_token, tools, ...). Throws dcp::Error on a runtime error (raise_exception included).
  std::string render(const std::string& context_json) const;
  // Whether the template loops over a message's content as a list of parts (Kimi K2's does) rather
  // than writing it as one string (DeepSeek's do), as vLLM detects it.
  bool reads_content_parts() const;
  // Whether the template reads a tool call's arguments only as a mapping (`arguments|items`,
  // `arguments|tojson` with no `is string` test first), so that OpenAI's JSON string must be
  // parsed for it, as vLLM parses it.
  bool reads_tool_arguments_as_mapping() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What apply_chat_template does: renders the tokenizer's chat template over `context_json` (a
// JSON list of messages, or an object of template variables with "messages"), adding bos_token,
// eos_token and add_generation_prompt (unless the object sets it). Throws dcp::Error
// (invalid_argument) when the tokenizer has no template or the context is not such JSON.
std::string apply_chat_template(const Tokenizer& tokenizer, const std::string& context_json,
                                bool add_generation_prompt);
// The same with `chat_template` (Jinja source) in place of the tokenizer's: a template for one
// call. Throws dcp::Error (invalid_argument) when it does not parse, naming the line.
std::string apply_chat_template(const Tokenizer& tokenizer, const std::string& context_json,
                                bool add_generation_prompt, const std::string& chat_template);

// OpenAI's chat messages made what `chat_template` (Jinja source) reads, as vLLM's chat front
// makes them: `messages_json` is a JSON list of messages, each an object with a string 'role' and
// a 'content' that is a string, null (or absent), or a list of text parts ({"type": "text",
// "text": ...}). A list stays a list of those parts for a template that reads parts; otherwise,
// and always for a tool message, it becomes its texts joined by "\n". An assistant message's
// tool calls keep their arguments as the JSON string OpenAI sends, unless the template reads them
// only as a mapping (ChatTemplate::reads_tool_arguments_as_mapping): then each string is parsed
// into its object (an empty or missing one into {}); for any other template, arguments given as an
// object become the JSON text json.dumps writes of them. An empty list of calls is dropped.
// Returns the messages as JSON. Throws dcp::Error (invalid_argument) naming messages[i] (or
// messages[i].content[j], or messages[i].tool_calls[j].function.arguments when it is not a JSON
// object such a template can read) on anything else; this engine reads text, so an image or audio
// part is refused.
std::string openai_chat_messages(const std::string& messages_json,
                                 const std::string& chat_template);

// vLLM's continue_final_message: `rendered` (a chat rendered without the generation prompt) cut
// right after the last message's content, so that generation continues that message instead of
// starting a turn after it. Throws dcp::Error (invalid_argument) when that content is empty or
// the template did not write it verbatim.
std::string continue_final_message(const std::string& rendered, const std::string& final_content);

}  // namespace dcp

// Reading a client's JSON request: typed fields with their legal ranges, and the refusal that
// names the field at fault. Shared by the generation endpoints and the tokenizer endpoints.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dcp/tokenizer.h"

namespace dcp::serve {

using json = nlohmann::json;

// JSON text of a reply. Client bytes that are not UTF-8 can reach a reply inside a message (a
// parse error quotes them): they become U+FFFD instead of failing the reply.
std::string text_of(const json& j);

// A request the API refuses: the status, the field at fault and why.
struct BadRequest : std::runtime_error {
  BadRequest(int status_, std::string param_, const std::string& message)
      : std::runtime_error(message), status(status_), param(std::move(param_)) {}
  int status;
  std::string param;
};

[[noreturn]] void bad(const std::string& param, const std::string& message, int status = 400);

// How deep a request body may nest its arrays and objects (a JSON Schema in it: 64 schema levels).
constexpr std::size_t kMaxBodyNesting = 300;

// The body as a JSON object, or BadRequest.
json parse_object(const std::string& body);

// A request's `model`, when it names one, must be the served one (404 otherwise).
void check_model(const json& body, const std::string& served);

// obj[key], or null when it is absent or JSON null.
const json* field(const json& obj, const char* key);

// The JSON text at `path` of the body with its objects' keys in the client's order (json keeps
// them sorted), e.g. a JSON Schema whose properties are written in that order (a list's element
// named by its index); a string there is returned as it is (a schema sent as JSON text).
std::string ordered_text(const std::string& body, const std::vector<std::string>& path);
// Each: nullopt when absent; BadRequest naming the key when of another type or out of [lo, hi].
std::optional<double> number(const json& obj, const char* key, double lo, double hi);
std::optional<std::int64_t> integer(const json& obj, const char* key, std::int64_t lo,
                                    std::int64_t hi);
std::optional<bool> boolean(const json& obj, const char* key);

// A list of token ids in [0, vocab); BadRequest naming `param` otherwise.
std::vector<std::int32_t> token_ids(const json& v, const std::string& param, int vocab);
// OpenAI's logit_bias: {"token id": bias}, each bias in [-100, 100].
std::map<std::int32_t, double> logit_bias(const json& obj, int vocab);
// `stop`: a string or at most 16, none empty.
std::vector<std::string> stop_strings(const json& obj);

// The prompt text of a chat request: its `messages` (content parts joined: templates expect
// strings), `add_generation_prompt` (default true) and `chat_template_kwargs` through the
// tokenizer's chat template or the request's `chat_template`; with `continue_final_message`, cut
// after the last message's content.
std::string chat_prompt_text(const Tokenizer& tokenizer, const json& body);

}  // namespace dcp::serve

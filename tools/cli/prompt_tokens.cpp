// --prompt-tokens: token ids as text or in a file.
#include "cli/prompt_tokens.h"

#include <climits>
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "dcp/error.h"

namespace dcp::cli {
namespace {

// `text` without the spaces and tabs (and a carriage return) around it.
std::string trimmed(const std::string& text) {
  const std::size_t first = text.find_first_not_of(" \t\r");
  if (first == std::string::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\r") - first + 1);
}

// One prompt: token ids separated by commas (spaces around them allowed). An empty prompt or an
// empty item ("1,,2", "1,") is an error, never skipped: skipping would renumber the requests.
std::vector<std::int32_t> parse_ids(const std::string& text, const std::string& where) {
  const std::string prompt = trimmed(text);
  DCP_ARG_CHECK(!prompt.empty(), "--prompt-tokens: ", where, " is an empty prompt");
  std::vector<std::int32_t> ids;
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = prompt.find(',', at);
    const std::string tok = trimmed(prompt.substr(at, comma == std::string::npos ? std::string::npos
                                                                                 : comma - at));
    DCP_ARG_CHECK(!tok.empty(), "--prompt-tokens: ", where, " has an empty item ('", prompt, "')");
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DCP_ARG_CHECK(used == tok.size() && v >= 0 && v <= INT32_MAX, "--prompt-tokens: '", tok,
                  "' in ", where, " is not a token id (an integer in [0, 2^31))");
    ids.push_back(static_cast<std::int32_t>(v));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return ids;
}

}  // namespace

std::vector<std::vector<std::int32_t>> parse_prompt_list(const std::string& text) {
  std::vector<std::vector<std::int32_t>> prompts;
  std::size_t at = 0;
  for (int n = 1;; ++n) {
    const std::size_t semi = text.find(';', at);
    prompts.push_back(
        parse_ids(text.substr(at, semi == std::string::npos ? std::string::npos : semi - at),
                  str("prompt ", n)));
    if (semi == std::string::npos) break;
    at = semi + 1;
  }
  return prompts;
}

std::vector<std::vector<std::int32_t>> read_prompts(const std::string& arg) {
  std::error_code ec;  // a long inline list is no file name: no error, just not a file
  if (!std::filesystem::is_regular_file(arg, ec)) return parse_prompt_list(arg);
  std::vector<std::vector<std::int32_t>> prompts;
  std::ifstream in(arg);
  DCP_CHECK(in, io, "--prompt-tokens: cannot read '", arg, "'");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    prompts.push_back(parse_ids(line, str(arg, " line ", n)));
  }
  DCP_ARG_CHECK(!prompts.empty(), "--prompt-tokens: '", arg, "' holds no prompt");
  return prompts;
}


}  // namespace dcp::cli

// --prompt-tokens: prompts given as token ids, on the command line or in a file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dcp::cli {

// "1,2,3;4,5": prompts separated by ';', token ids by ',' (spaces around them allowed). An empty
// prompt, an empty item ("1,,2", "1,") or an id outside [0, 2^31) is a dcp::Error naming the
// prompt, never skipped (skipping would renumber the requests).
std::vector<std::vector<std::int32_t>> parse_prompt_list(const std::string& text);
// `arg` names a file (one prompt per line, numbered from 1 in errors) or is a list as above.
std::vector<std::vector<std::int32_t>> read_prompts(const std::string& arg);

}  // namespace dcp::cli

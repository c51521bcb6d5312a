// The command line's boundary with the library: library errors name parameters
// ("dcp_size = 3 must divide tp_size = 4"); a user of `dcp` sees the flags that set them
// ("--dcp-size 3 must divide --tp-size 4").
#pragma once

#include <string>

namespace dcp::cli {

// The message with every library parameter that a flag sets replaced by that flag
// ("name = value" becomes "--flag value"); other words are left alone.
std::string with_flag_names(const std::string& message);

}  // namespace dcp::cli

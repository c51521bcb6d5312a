// The library's version: the CMake project's, as `dcp --version` and the servers' /version and
// /get_server_info report it.
#pragma once

namespace dcp {

inline constexpr const char* kVersion = DCP_VERSION;

}  // namespace dcp

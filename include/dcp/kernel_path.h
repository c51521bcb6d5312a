// Which CPU implementation a kernel runs: chosen at run time from what this CPU has, or forced
// (tests check every forced path against its reference).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace dcp {

// Implementations of the CPU kernels (local attention, bf16 conversion). `automatic` picks the
// fastest exact path this CPU runs; the others force one (tests check each against its
// reference).
//
// `amx_bf16` is opt-in and never automatic: for bf16 KV only, it runs both products on AMX
// tiles and, like GPU MLA kernels, rounds the scaled query and the softmax probabilities to
// bf16 (outputs within about 2^-8 of the value scale; the LSE stays fp32-accurate).
enum class KernelPath : std::uint8_t { automatic, portable, avx2, avx512, amx_bf16 };
std::string_view to_string(KernelPath k) noexcept;
// The inverse of to_string; dcp::Error (invalid_argument) listing the legal names otherwise.
KernelPath parse_kernel_path(std::string_view name);
// The exact paths this CPU can run, slowest first; `portable` is always there.
std::vector<KernelPath> available_kernel_paths();
// `automatic` -> the fastest of those; any other exact path is returned if this CPU runs it,
// else dcp::Error (unsupported). amx_bf16 is not resolved here: its callers check it.
KernelPath resolve_exact_path(KernelPath k);
// Whether this CPU has AMX-BF16 and the OS lets this process use the tile state.
bool amx_bf16_available();

}  // namespace dcp

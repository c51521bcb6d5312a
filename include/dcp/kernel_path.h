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
// The bf16-pair paths are opt-in and never automatic: for bf16 KV only, they run both products
// on bf16 pairs with fp32 sums, `amx_bf16` on AMX tiles (TDPBF16PS) and `avx512_bf16` on
// AVX512-BF16 vectors (VDPBF16PS, for CPUs without AMX), and like GPU MLA kernels round the
// scaled query and the softmax probabilities to bf16 (outputs within about 2^-8 of the value
// scale; the LSE stays fp32-accurate).
enum class KernelPath : std::uint8_t { automatic, portable, avx2, avx512, amx_bf16, avx512_bf16 };
std::string_view to_string(KernelPath k) noexcept;
// The inverse of to_string; dcp::Error (invalid_argument) listing the legal names otherwise.
KernelPath parse_kernel_path(std::string_view name);
// The exact paths this CPU can run, slowest first; `portable` is always there.
std::vector<KernelPath> available_kernel_paths();
// `automatic` -> the fastest of those; any other exact path is returned if this CPU runs it,
// else dcp::Error (unsupported). The bf16-pair paths are not resolved here: their callers check
// them.
KernelPath resolve_exact_path(KernelPath k);
// amx_bf16 or avx512_bf16.
bool is_bf16_pair_path(KernelPath k) noexcept;
// Whether this CPU has AMX-BF16 and the OS lets this process use the tile state.
bool amx_bf16_available();
// Whether this CPU has AVX-512 (F, BW, VL) with AVX512-BF16.
bool avx512_bf16_available();
// Returns when this CPU (and OS) runs the bf16-pair path k; else dcp::Error (unsupported) naming
// k and what it needs. invalid_argument when k is not a bf16-pair path.
void require_bf16_pair_path(KernelPath k);

}  // namespace dcp

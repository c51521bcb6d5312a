// The BLAS dcp links (OpenBLAS, for prefill-sized products) and the kernels it runs here.
//
// A DYNAMIC_ARCH OpenBLAS picks its kernels from CPUID when it loads. A CPU it does not know
// (Debian 12's 0.3.21 names a current Xeon with AVX-512-FP16 "Prescott") gets generic SSE3
// kernels, 4-5x slower than the hardware, without a word. dcp names the kernels in every
// benchmark ceiling and the `dcp` command runs again with OPENBLAS_CORETYPE set when the choice
// is below what the CPU has (restart_with_better_blas_kernels).
#pragma once

#include <string>
#include <string_view>

namespace dcp {

struct BlasInfo {
  std::string core;    // OpenBLAS's kernel set: "Haswell", "SkylakeX", "Zen", ... "Prescott"
  std::string config;  // openblas_get_config(): version and build options
  std::string forced;  // OPENBLAS_CORETYPE as this process was started with ("" when unset)
};
BlasInfo blas_info();

// "OpenBLAS 0.3.21, Zen kernels" (and ", forced by OPENBLAS_CORETYPE" when it was).
std::string blas_kernels_label();

// What this CPU runs, as far as the choice of BLAS kernels goes.
struct CpuIsa {
  bool avx2_fma = false;
  bool avx512 = false;  // F, BW, VL, DQ and CD: what OpenBLAS's SkylakeX kernels use
  bool amd = false;
};
CpuIsa this_cpu_isa();

// The OpenBLAS kernel set to ask for when `core` is below what `isa` runs: on a CPU with AVX2
// and FMA, a core without AVX2 kernels is replaced by SkylakeX (AVX-512), else Zen (AMD) or
// Haswell. "" when `core` already uses AVX2 (Haswell, Zen, Excavator, SkylakeX, Cooperlake,
// SapphireRapids) or the CPU has no AVX2.
std::string better_blas_core(std::string_view core, const CpuIsa& isa);

// Called first thing by a program (before threads or MPI start): when OPENBLAS_CORETYPE is unset
// and better_blas_core names a better kernel set, sets it, says so on stderr and executes the
// program again (argv unchanged), so that OpenBLAS loads with it. Returns when there is nothing to
// do, or when the new start fails (after saying so).
void restart_with_better_blas_kernels(char** argv);

}  // namespace dcp

#include "dcp/blas.h"

#include <cpuid.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
char* openblas_get_corename(void);
char* openblas_get_config(void);
}

namespace dcp {

BlasInfo blas_info() {
  BlasInfo b;
  b.core = openblas_get_corename();
  b.config = openblas_get_config();
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE")) b.forced = forced;
  return b;
}

std::string blas_kernels_label() {
  const BlasInfo b = blas_info();
  // The config starts with "OpenBLAS <version>".
  std::string name = b.config.substr(0, b.config.find(' ', b.config.find(' ') + 1));
  name += ", " + b.core + " kernels";
  if (!b.forced.empty()) name += ", forced by OPENBLAS_CORETYPE";
  return name;
}

CpuIsa this_cpu_isa() {
  __builtin_cpu_init();
  CpuIsa isa;
  isa.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  isa.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512cd");
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx)) {
    char vendor[13] = {};
    std::memcpy(vendor, &ebx, 4);
    std::memcpy(vendor + 4, &edx, 4);
    std::memcpy(vendor + 8, &ecx, 4);
    isa.amd = std::strcmp(vendor, "AuthenticAMD") == 0;
  }
  return isa;
}

std::string better_blas_core(std::string_view core, const CpuIsa& isa) {
  if (!isa.avx2_fma) return "";
  static constexpr std::array<std::string_view, 6> kAvx2Cores = {
      "Haswell", "Zen", "Excavator", "SkylakeX", "Cooperlake", "SapphireRapids"};
  if (std::find(kAvx2Cores.begin(), kAvx2Cores.end(), core) != kAvx2Cores.end()) return "";
  if (isa.avx512) return "SkylakeX";
  return isa.amd ? "Zen" : "Haswell";
}

void restart_with_better_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE")) return;  // chosen by the user, or by our first start
  const std::string core = openblas_get_corename();
  const std::string better = better_blas_core(core, this_cpu_isa());
  if (better.empty()) return;
  std::fprintf(stderr,
               "dcp: OpenBLAS chose its %s kernels, below what this CPU runs; starting again with "
               "OPENBLAS_CORETYPE=%s\n",
               core.c_str(), better.c_str());
  if (setenv("OPENBLAS_CORETYPE", better.c_str(), 1) == 0) {
    execv("/proc/self/exe", argv);
  }
  std::fprintf(stderr, "dcp: warning: could not start again (%s); running on the %s kernels\n",
               std::strerror(errno), core.c_str());
  unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace dcp

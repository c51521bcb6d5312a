// Names of the CPU kernel paths and which of them this CPU can run.
#include "dcp/kernel_path.h"

#include <cpuid.h>
#include <algorithm>

#include "attention_tasks.h"
#include "dcp/error.h"

namespace dcp {

std::string_view to_string(KernelPath k) noexcept {
  switch (k) {
    case KernelPath::automatic: return "automatic";
    case KernelPath::portable: return "portable";
    case KernelPath::avx2: return "avx2";
    case KernelPath::avx512: return "avx512";
    case KernelPath::amx_bf16: return "amx_bf16";
  }
  return "?";
}

KernelPath parse_kernel_path(std::string_view name) {
  std::string legal;
  for (KernelPath k : {KernelPath::automatic, KernelPath::portable, KernelPath::avx2,
                       KernelPath::avx512, KernelPath::amx_bf16}) {
    if (name == to_string(k)) return k;
    legal += (legal.empty() ? "" : ", ") + std::string(to_string(k));
  }
  throw_error(ErrorCategory::invalid_argument,
              str("kernel path '", name, "' is not one of: ", legal), __FILE__, __LINE__);
}

std::vector<KernelPath> available_kernel_paths() {
  std::vector<KernelPath> paths = {KernelPath::portable};
  __builtin_cpu_init();
  // F16C (every AVX2 CPU has it) widens FP8 weights through fp16 in the avx2 weight product.
  // Read from CPUID: clang 14's __builtin_cpu_supports does not know "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c)
    paths.push_back(KernelPath::avx2);
  if (__builtin_cpu_supports("avx512f")) paths.push_back(KernelPath::avx512);
  return paths;
}

KernelPath resolve_exact_path(KernelPath k) {
  const auto avail = available_kernel_paths();
  if (k == KernelPath::automatic) return avail.back();
  DCP_CHECK(std::find(avail.begin(), avail.end(), k) != avail.end(), unsupported, "kernel path ",
            to_string(k), " is not available on this CPU");
  return k;
}

bool amx_bf16_available() {
  return kernels::amx_bf16_supported();
}

}  // namespace dcp

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
    case KernelPath::avx512_bf16: return "avx512_bf16";
  }
  return "?";
}

KernelPath parse_kernel_path(std::string_view name) {
  std::string legal;
  for (KernelPath k : {KernelPath::automatic, KernelPath::portable, KernelPath::avx2,
                       KernelPath::avx512, KernelPath::amx_bf16, KernelPath::avx512_bf16}) {
    if (name == to_string(k)) return k;
    legal += (legal.empty() ? "" : ", ") + std::string(to_string(k));
  }
  throw_error(ErrorCategory::invalid_argument,
              str("kernel path '", name, "' is not one of: ", legal), __FILE__, __LINE__);
}

std::vector<KernelPath> available_kernel_paths() {
  // Once per process: CPUID traps to the hypervisor in a virtual machine (microseconds), and a
  // forced path is resolved on every weight product.
  static const std::vector<KernelPath> available = [] {
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
  }();
  return available;
}

KernelPath resolve_exact_path(KernelPath k) {
  const auto avail = available_kernel_paths();
  if (k == KernelPath::automatic) return avail.back();
  DCP_CHECK(std::find(avail.begin(), avail.end(), k) != avail.end(), unsupported, "kernel path ",
            to_string(k), " is not available on this CPU");
  return k;
}

bool is_bf16_pair_path(KernelPath k) noexcept {
  return k == KernelPath::amx_bf16 || k == KernelPath::avx512_bf16;
}

bool amx_bf16_available() {
  return kernels::amx_bf16_supported();
}

bool avx512_bf16_available() {
  static const bool available = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl"))
      return false;
    // CPUID.(7,1):EAX bit 5 (clang 14's __builtin_cpu_supports does not know "avx512bf16").
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 5)) != 0;
  }();
  return available;
}

void require_bf16_pair_path(KernelPath k) {
  if (k == KernelPath::amx_bf16) {
    DCP_CHECK(amx_bf16_available(), unsupported,
              "kernel path amx_bf16 is not available: it needs a CPU with AMX-BF16 and an OS "
              "that grants the tile state");
  } else {
    DCP_CHECK(k == KernelPath::avx512_bf16, invalid_argument, "kernel path ", to_string(k),
              " is not a bf16-pair path");
    DCP_CHECK(avx512_bf16_available(), unsupported,
              "kernel path avx512_bf16 is not available: it needs a CPU with AVX-512 and "
              "AVX512-BF16");
  }
}

}  // namespace dcp

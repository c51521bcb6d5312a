// The choice of OpenBLAS kernels: which loaded kernel sets count as below the CPU, and what is
// asked for instead; and the label the benchmarks print beside their sgemm ceilings.
#include <gtest/gtest.h>

#include "dcp/blas.h"

namespace dcp {
namespace {

TEST(Blas, GenericKernelsOnAnAvx2CpuAreReplaced) {
  const CpuIsa avx512_intel{true, true, false}, avx2_intel{true, false, false},
      avx2_amd{true, false, true}, avx512_amd{true, true, true}, sse_only{false, false, false};
  // The case that started this: a Xeon with AVX-512 that OpenBLAS 0.3.21 calls Prescott.
  EXPECT_EQ(better_blas_core("Prescott", avx512_intel), "SkylakeX");
  EXPECT_EQ(better_blas_core("Prescott", avx2_intel), "Haswell");
  EXPECT_EQ(better_blas_core("Sandybridge", avx2_intel), "Haswell");  // AVX without AVX2
  EXPECT_EQ(better_blas_core("Nehalem", avx2_amd), "Zen");
  EXPECT_EQ(better_blas_core("Barcelona", avx512_amd), "SkylakeX");
  EXPECT_EQ(better_blas_core("Core2", sse_only), "");  // nothing better to ask for
  // Kernel sets that use AVX2 already stay, AVX-512 CPU or not (Zen 4 runs Zen's), spelled as
  // openblas_get_corename returns them: 0.3.21 names Zen 5 "Cooperlake", and a list that spelled
  // it "CooperLake" restarted dcp there for nothing.
  for (const char* core :
       {"Haswell", "Zen", "Excavator", "SkylakeX", "Cooperlake", "SapphireRapids"}) {
    EXPECT_EQ(better_blas_core(core, avx512_intel), "") << core;
    EXPECT_EQ(better_blas_core(core, avx512_amd), "") << core;
    EXPECT_EQ(better_blas_core(core, avx2_amd), "") << core;
  }
}

TEST(Blas, TheLabelNamesTheVersionAndTheKernels) {
  const BlasInfo info = blas_info();
  EXPECT_FALSE(info.core.empty());
  EXPECT_EQ(info.config.rfind("OpenBLAS ", 0), 0u) << info.config;
  const std::string label = blas_kernels_label();
  EXPECT_EQ(label.rfind("OpenBLAS ", 0), 0u) << label;
  EXPECT_NE(label.find(", " + info.core + " kernels"), std::string::npos) << label;
  EXPECT_EQ(label.find("forced") != std::string::npos, !info.forced.empty()) << label;
}

}  // namespace
}  // namespace dcp

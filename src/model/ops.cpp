#include "ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "dcp/error.h"
#include "dcp/model_config.h"
#include "dcp/worker_pool.h"
#include "kernels/cpu/simd_dispatch.h"
#include "kernels/cpu/weight_bf16_pairs.h"
#include "kernels/cpu/weight_gemm.h"
#include "kernels/cpu/weight_gemv.h"

namespace dcp {
namespace {

kernels::GemvFn select_gemv(KernelPath path) {
  return kernels::select_simd_copy<kernels::GemvFn>(
      path, "the weight product", kernels::gemv_portable, kernels::gemv_avx2,
      kernels::avx512_vbmi_available() ? kernels::gemv_avx512_vbmi : kernels::gemv_avx512);
}

kernels::WidenRowsFn select_widen(KernelPath path) {
  return kernels::select_simd_copy<kernels::WidenRowsFn>(
      path, "the weight widening", kernels::widen_rows_portable, kernels::widen_rows_avx2,
      kernels::widen_rows_avx2);
}

// The blocked prefill product's copy for a path: the two halves (pack x, multiply) of one
// instruction set, and how many of x's columns a packed word holds (bf16 pairs: two). The
// portable path has none and runs BLAS.
struct BlockedProduct {
  void (*pack)(const float* x, std::int64_t m, std::int64_t k, std::int64_t ldx, float* packed);
  void (*product)(const float* packed, std::int64_t m, const kernels::GemvWeight& w, float* y,
                  std::int64_t ldy);
  int columns_per_word = 1;
};
constexpr BlockedProduct kBlockedAvx2{kernels::gemm_pack_x_avx2, kernels::gemm_packed_avx2};
constexpr BlockedProduct kBlockedAvx512{kernels::gemm_pack_x_avx512, kernels::gemm_packed_avx512};
constexpr BlockedProduct kBlockedBf16Pairs{kernels::gemm_pack_x_bf16_pairs,
                                           kernels::gemm_packed_bf16_pairs, 2};

// The exact copy a weight path runs: avx512_bf16 runs the avx512 copies for the products it does
// not pair (linear()); amx_bf16 has no weight product.
KernelPath exact_weight_path(KernelPath path) {
  if (path == KernelPath::avx512_bf16) {
    require_bf16_pair_path(path);
    return KernelPath::avx512;
  }
  DCP_ARG_CHECK(path != KernelPath::amx_bf16,
                "kernel path amx_bf16 is an attention path; the weight product runs on automatic, "
                "portable, avx2, avx512 or avx512_bf16");
  return path;
}

const BlockedProduct* select_blocked(KernelPath path) {
  return kernels::select_simd_copy<const BlockedProduct*>(path, "the weight product", nullptr,
                                                          &kBlockedAvx2, &kBlockedAvx512);
}

// fn(r0, r1) over [0, n) in at most `threads` ranges of whole `align`-row groups, each of at least
// min_rows rows; range 0 on the calling thread, the others on its worker pool.
template <typename Fn>
void split_rows(int threads, std::int64_t n, std::int64_t align, std::int64_t min_rows, Fn fn) {
  const std::int64_t parts = std::clamp<std::int64_t>(n / std::max(min_rows, align), 1, threads);
  if (parts == 1) {
    fn(std::int64_t{0}, n);
    return;
  }
  const auto boundary = [&](std::int64_t i) {
    return i == parts ? n : n * i / parts / align * align;
  };
  this_thread_worker_pool(static_cast<int>(parts) - 1).run(static_cast<int>(parts), [&](int i) {
    fn(boundary(i), boundary(i + 1));
  });
}

}  // namespace
}  // namespace dcp

namespace dcp::ops {

kernels::GemvWeight gemv_weight(const WeightMatrix& w, std::int64_t r0, std::int64_t r1) {
  const std::size_t element = w.dtype == WeightDtype::f32    ? 4
                              : w.dtype == WeightDtype::bf16 ? 2
                                                             : 1;
  kernels::GemvWeight g;
  g.data = w.data.data() +
           static_cast<std::size_t>(r0 * w.cols) * element / (w.dtype == WeightDtype::int4 ? 2 : 1);
  g.rows = r1 - r0;
  g.k = w.cols;
  switch (w.dtype) {
    case WeightDtype::f32: g.dtype = kernels::GemvDtype::f32; break;
    case WeightDtype::bf16: g.dtype = kernels::GemvDtype::bf16; break;
    case WeightDtype::f8_e4m3:
    case WeightDtype::int4:
      g.dtype = w.dtype == WeightDtype::int4 ? kernels::GemvDtype::int4 : kernels::GemvDtype::fp8;
      g.row0 = w.row0 + r0;
      g.scales =
          w.scale_inv.data() + (g.row0 / w.block_rows - w.row0 / w.block_rows) * w.scale_cols;
      g.scale_stride = w.scale_cols;
      g.block_rows = w.block_rows;
      g.block_cols = w.block_cols;
      g.first_block_cols = (w.col0 / w.block_cols + 1) * w.block_cols - w.col0;
      break;
  }
  return g;
}

void linear(const float* x, std::int64_t m, std::int64_t k, const float* w, std::int64_t n,
            float* y, std::int64_t ldx, std::int64_t ldy) {
  if (m == 0 || n == 0) return;
  if (ldx < 0) ldx = k;
  if (ldy < 0) ldy = n;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, x, static_cast<int>(ldx), w, static_cast<int>(k), 0.0f, y,
              static_cast<int>(ldy));
}

void rms_norm(float* x, std::int64_t m, std::int64_t d, const float* weight, double eps,
              std::int64_t ld) {
  if (ld < 0) ld = d;
  for (std::int64_t i = 0; i < m; ++i) {
    float* row = x + i * ld;
    double ss = 0;
    for (std::int64_t j = 0; j < d; ++j) ss += static_cast<double>(row[j]) * row[j];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    for (std::int64_t j = 0; j < d; ++j) row[j] = row[j] * inv * weight[j];
  }
}

void silu_mul(const float* gate, const float* up, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void widen_rows(const WeightMatrix& w, std::int64_t r0, std::int64_t r1, float* out,
                KernelPath path) {
  static const kernels::WidenRowsFn best = select_widen(KernelPath::automatic);
  const kernels::WidenRowsFn widen = path == KernelPath::automatic ? best : select_widen(path);
  widen(gemv_weight(w, r0, r1), 0, r1 - r0, out);
}

void set_blas_threads(int threads) {
  openblas_set_num_threads(std::max(1, threads));
}

namespace {

// DeepSeek's YaRN: the dimension at which a frequency makes `rotations` turns over max_pos.
double correction_dim(double rotations, int dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (rotations * 2 * std::numbers::pi))) / (2 * std::log(base));
}

}  // namespace

Rope::Rope(const ModelConfig& c) : interleaved_(c.rope_interleaved) {
  const int dim = c.qk_rope_head_dim;
  const double theta = c.rope_theta;
  DCP_ARG_CHECK(dim >= 0 && dim % 2 == 0 && dim <= 512, "rope dim ", dim,
                " must be even and at most 512");
  const int half = dim / 2;
  inv_freq_.resize(half);
  for (int i = 0; i < half; ++i) inv_freq_[i] = 1.0 / std::pow(theta, 2.0 * i / dim);
  if (c.longrope) {
    const LongRope& r = *c.longrope;
    long_inv_freq_ = inv_freq_;
    for (int i = 0; i < half; ++i) {
      inv_freq_[i] /= r.short_factor[i];
      long_inv_freq_[i] /= r.long_factor[i];
    }
    long_from_ = static_cast<std::int64_t>(r.original_max_position_embeddings);
    mscale_ = r.attention_factor;
    return;
  }
  const RopeScaling* yarn = c.rope_scaling ? &*c.rope_scaling : nullptr;
  if (!yarn || yarn->factor <= 1.0) return;
  // Interpolate low frequencies by `factor`, keep high ones, ramp in between.
  const double low =
      std::max(0.0, std::floor(correction_dim(yarn->beta_fast, dim, theta,
                                              yarn->original_max_position_embeddings)));
  double high =
      std::min<double>(dim - 1, std::ceil(correction_dim(yarn->beta_slow, dim, theta,
                                                         yarn->original_max_position_embeddings)));
  if (low == high) high += 0.001;
  for (int i = 0; i < half; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extrapolate = 1.0 - ramp;  // weight of the original frequency
    const double interp = inv_freq_[i] / yarn->factor;
    inv_freq_[i] = interp * (1.0 - extrapolate) + inv_freq_[i] * extrapolate;
  }
  mscale_ = yarn_get_mscale(yarn->factor, yarn->mscale) /
            yarn_get_mscale(yarn->factor, yarn->mscale_all_dim);
}

void Rope::apply(float* x, std::int64_t pos) const {
  const int half = static_cast<int>(inv_freq_.size());
  const std::vector<double>& inv =
      !long_inv_freq_.empty() && pos >= long_from_ ? long_inv_freq_ : inv_freq_;
  float tmp[512];
  for (int i = 0; i < half; ++i) {
    const double angle = static_cast<double>(pos) * inv[i];
    const double c = std::cos(angle) * mscale_, s = std::sin(angle) * mscale_;
    const double a = interleaved_ ? x[2 * i] : x[i];
    const double b = interleaved_ ? x[2 * i + 1] : x[i + half];
    tmp[i] = static_cast<float>(a * c - b * s);
    tmp[i + half] = static_cast<float>(b * c + a * s);
  }
  std::copy(tmp, tmp + 2 * half, x);
}

}  // namespace dcp::ops

namespace dcp {

namespace {
thread_local int t_weight_threads = 1;
thread_local KernelPath t_weight_path = KernelPath::automatic;
}  // namespace

int weight_threads() {
  return t_weight_threads;
}

KernelPath weight_path() {
  return t_weight_path;
}

ScopedWeightThreads::ScopedWeightThreads(int threads, KernelPath path)
    : previous_(t_weight_threads), previous_path_(t_weight_path) {
  t_weight_threads = std::max(1, threads);
  t_weight_path = path;
}

ScopedWeightThreads::~ScopedWeightThreads() {
  t_weight_threads = previous_;
  t_weight_path = previous_path_;
}

bool prefill_runs_blocked_product(KernelPath path) {
  return select_blocked(exact_weight_path(path)) != nullptr;
}

std::string weight_prefill_kernel_label(KernelPath path) {
  const BlockedProduct* blocked = select_blocked(exact_weight_path(path));
  std::string label = "BLAS sgemm, bf16/FP8 rows widened a tile at a time";
  if (blocked == &kBlockedAvx512) label = "avx512, x packed once, bf16/FP8 widened in L1 chunks";
  if (blocked == &kBlockedAvx2) label = "avx2, x packed once, bf16/FP8 widened in L1 chunks";
  if (path != KernelPath::avx512_bf16) return label;
  return str("avx512_bf16: bf16 and FP8 weights in vdpbf16ps pairs, x rounded to bf16; fp32 on ",
             label);
}

std::string weight_kernel_label(KernelPath path) {
  const kernels::GemvFn gemv = select_gemv(exact_weight_path(path));
  std::string label = "portable";
  if (gemv == kernels::gemv_avx512_vbmi) label = "avx512, FP8 widened by AVX512-VBMI byte lookups";
  if (gemv == kernels::gemv_avx512) label = "avx512, FP8 widened by F16C";
  if (gemv == kernels::gemv_avx2) label = "avx2, FP8 widened by F16C";
  // Every copy but the portable one asks for weight lines ahead, the pairs included.
  const std::string lines =
      str(", lines asked ahead into ", kernels::gemv_prefetch_into_l1() ? "L1" : "L2", " (L1d ",
          kernels::l1_data_cache_bytes() >> 10, " KB)");
  if (gemv != kernels::gemv_portable) label += lines;
  if (path != KernelPath::avx512_bf16) return label;
  if (kernels::fp8_pairs_decode_available()) {  // the exact copy runs fp32 weights only
    return str(
        "avx512_bf16: bf16 and FP8 weights in vdpbf16ps pairs (FP8 widened by AVX512-VBMI "
        "byte lookups), x rounded to bf16; fp32 on ",
        to_string(exact_weight_path(path)), lines);
  }
  return str("avx512_bf16: bf16 weights in vdpbf16ps pairs, x rounded to bf16; fp32/FP8 on ",
             label);
}

void linear(const float* x, std::int64_t m, const WeightMatrix& w, float* y, std::int64_t ldx,
            std::int64_t ldy, KernelPath path, int threads) {
  const std::int64_t n = w.rows, k = w.cols;
  if (ldx < 0) ldx = k;
  if (ldy < 0) ldy = n;
  if (m == 0 || n == 0) return;
  DCP_ARG_CHECK(threads >= 1, "linear: threads = ", threads, " must be >= 1");
  // avx512_bf16: bf16 weights in pairs; FP8 ones in decode shapes where the CPU has AVX512-VBMI
  // for their widening, and in prefill shapes where their scale blocks do not split a pair.
  const bool paired = path == KernelPath::avx512_bf16;
  const bool pairs = paired && w.dtype == WeightDtype::bf16;
  const bool fp8_paired = paired && w.dtype == WeightDtype::f8_e4m3;
  path = exact_weight_path(path);
  if (m <= weight_gemv_max_rows(w.dtype)) {
    static const kernels::GemvFn best = select_gemv(KernelPath::automatic);
    const kernels::GemvFn gemv = pairs ? kernels::gemv_bf16_pairs
                                 : fp8_paired && kernels::fp8_pairs_decode_available()
                                     ? kernels::gemv_fp8_pairs
                                 : path == KernelPath::automatic ? best
                                                                 : select_gemv(path);
    // Each part reads its own rows once: parts of at least 64K weights keep the wake-up of a
    // worker (microseconds) small beside the reads.
    split_rows(threads, n, 4, std::max<std::int64_t>(4, (64 << 10) / std::max<std::int64_t>(1, k)),
               [&](std::int64_t r0, std::int64_t r1) {
                 gemv(x, m, ldx, ops::gemv_weight(w, r0, r1), y + r0, ldy);
               });
    return;
  }
  static const BlockedProduct* const blocked_automatic = select_blocked(KernelPath::automatic);
  const bool pairs_fp8 = fp8_paired && kernels::fp8_blocks_pair(ops::gemv_weight(w, 0, n));
  if (const BlockedProduct* blocked = pairs || pairs_fp8              ? &kBlockedBf16Pairs
                                      : path == KernelPath::automatic ? blocked_automatic
                                                                      : select_blocked(path)) {
    // x packed here, up to 528 tokens (11 tiles of 48, 22 of 24) at a time, so that the packed
    // copy stays small beside a long prompt's x; every part multiplies its rows by it. Each
    // token's sums are its own, so the slabs change no bit.
    constexpr std::int64_t kSlabTokens = 528;
    thread_local std::vector<float> packing;
    for (std::int64_t t0 = 0; t0 < m; t0 += kSlabTokens) {
      const std::int64_t tokens = std::min(kSlabTokens, m - t0);
      const std::int64_t words = (k + blocked->columns_per_word - 1) / blocked->columns_per_word;
      packing.resize(static_cast<std::size_t>(kernels::gemm_packed_x_floats(tokens, words)));
      blocked->pack(x + t0 * ldx, tokens, k, ldx, packing.data());
      const float* packed = packing.data();  // the workers' own thread_local is another vector
      split_rows(threads, n, 16, 64, [&](std::int64_t begin, std::int64_t end) {
        blocked->product(packed, tokens, ops::gemv_weight(w, begin, end), y + t0 * ldy + begin,
                         ldy);
      });
    }
    return;
  }
  if (w.dtype == WeightDtype::f32) {
    split_rows(threads, n, 16, 64, [&](std::int64_t r0, std::int64_t r1) {
      ops::linear(x, m, k, reinterpret_cast<const float*>(w.data.data()) + r0 * k, r1 - r0, y + r0,
                  ldx, ldy);
    });
    return;
  }
  // Tiles of rows widened to fp32, each thread its own, that BLAS multiplies while they are in
  // cache. BLAS packs x again for every tile, so a tile has at least 128 rows (that packing is
  // then a few percent of the product); up to 512 while the tile stays within 2 MB.
  const std::int64_t tile_rows =
      std::clamp<std::int64_t>((2 << 20) / (4 * std::max<std::int64_t>(1, k)) / 16 * 16, 128, 512);
  split_rows(threads, n, 16, 64, [&](std::int64_t begin, std::int64_t end) {
    thread_local std::vector<float> tile;
    tile.resize(static_cast<std::size_t>(std::min(tile_rows, end - begin) * k));
    for (std::int64_t r0 = begin; r0 < end; r0 += tile_rows) {
      const std::int64_t rows = std::min(tile_rows, end - r0);
      ops::widen_rows(w, r0, r0 + rows, tile.data(), path);
      ops::linear(x, m, k, tile.data(), rows, y + r0, ldx, ldy);
    }
  });
}

}  // namespace dcp

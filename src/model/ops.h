// Dense building blocks of the model, on fp32 row-major tensors. Weight products go through
// dcp::linear (weights.h); BLAS serves the fp32 products it falls back to.
#pragma once

#include <cstdint>
#include <vector>

#include "dcp/model_config.h"
#include "dcp/weights.h"
#include "kernels/cpu/weight_gemv.h"

namespace dcp::ops {

// y[M, N] = x[M, K] @ w[N, K]^T  (w as a torch Linear weight: [out, in]); ldx/ldy row strides.
void linear(const float* x, std::int64_t m, std::int64_t k, const float* w, std::int64_t n,
            float* y, std::int64_t ldx = -1, std::int64_t ldy = -1);
// y[M, N] = x[M, K] @ w^T for a weight held in its checkpoint dtype (N = w.rows, K = w.cols):
// dcp::linear (weights.h) on weight_path(), over weight_threads() threads.
inline void linear(const float* x, std::int64_t m, const WeightMatrix& w, float* y,
                   std::int64_t ldx = -1, std::int64_t ldy = -1) {
  dcp::linear(x, m, w, y, ldx, ldy, weight_path(), weight_threads());
}
// Rows [r0, r1) of w as the weight kernels see them (FP8: the scale blocks that cover them).
kernels::GemvWeight gemv_weight(const WeightMatrix& w, std::int64_t r0, std::int64_t r1);
// Rows [r0, r1) of w as fp32, row-major with stride w.cols: the values the dtype holds (FP8
// times its block scale), bit for bit on every path; the widest SIMD copy this CPU runs.
void widen_rows(const WeightMatrix& w, std::int64_t r0, std::int64_t r1, float* out,
                KernelPath path = KernelPath::automatic);

// In place: x[M, D] = x / rms(x) * weight, rows of stride ld (default D).
void rms_norm(float* x, std::int64_t m, std::int64_t d, const float* weight, double eps,
              std::int64_t ld = -1);

// out = silu(gate) * up, elementwise over n.
void silu_mul(const float* gate, const float* up, float* out, std::int64_t n);

// BLAS threads per call (1 when ranks run as threads, so ranks do not oversubscribe cores).
void set_blas_threads(int threads);

// Rotary embedding as the Hugging Face code of the model's family applies it. DeepSeek-V2/V3 take
// the rope dims as interleaved pairs and write them back in rotate-half order:
//   out[i] = a cos - b sin,  out[i + d/2] = b cos + a sin,  a = x[2i], b = x[2i+1];
// MiniCPM3 (rope_interleaved false) rotates the halves in place: a = x[i], b = x[i + d/2].
// cos/sin of position * inv_freq[i], times YaRN's mscale or LongRoPE's attention factor.
class Rope {
 public:
  Rope() = default;
  // Frequencies and magnitude from the config's rope_theta, rope_scaling (YaRN) or longrope.
  explicit Rope(const ModelConfig& c);
  // In place on `x` [d] at global position `pos`.
  void apply(float* x, std::int64_t pos) const;
  int dim() const noexcept { return static_cast<int>(inv_freq_.size() * 2); }

 private:
  std::vector<double> inv_freq_;
  std::vector<double> long_inv_freq_;  // LongRoPE: from position long_from_ on
  std::int64_t long_from_ = 0;
  double mscale_ = 1.0;
  bool interleaved_ = true;
};

}  // namespace dcp::ops

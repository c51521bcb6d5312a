// Exact merge of partial attention results.
//
// A shard's result for one (token, head) is the pair (O, LSE): O normalised over the shard,
// LSE = log sum exp(scores) over it. With Z = exp(LSE) the pairs (Z, Z*O) add, so
//
//   m = max_k L_k,  L = m + log sum_k exp(L_k - m),  O = sum_k exp(L_k - L) O_k
//
// is exact up to float rounding and independent of the reduction order (the arithmetic and its
// rule for empty parts: dcp/attention_state.h). Conventions:
// - LSEs inside dcp are natural-log. Every API taking an LSE states its base; outputs are
//   always natural log.
// - An empty shard is (O = 0, LSE = -inf). NaN and +inf LSEs are treated as empty.
// - If every part is empty the merge gives O = 0, LSE = -inf, never NaN.
#pragma once

#include <cstdint>
#include <limits>

#include "dcp/attention_state.h"
#include "dcp/kernel_path.h"

namespace dcp {

enum class LseBase : std::uint8_t { e, two };

using attention_state::kNegInf;

// Converts an LSE in `base` to natural log; NaN and +inf become -inf (empty).
float lse_to_natural(float lse, LseBase base) noexcept;

// acc ⊕= (o, lse): the in-place merge of one state into an accumulator.
//   acc_o [dim], o [dim]; acc_lse and lse natural log. An empty `o` may hold garbage.
void merge_state_into(float* acc_o, float& acc_lse, const float* o, float lse, int dim) noexcept;

// Merges K partial states per row.
//   o_parts   [K, rows, dim]  fp32, part-major
//   lse_parts [K, rows]       in `base`
//   out_o     [rows, dim]     may not alias o_parts
//   out_lse   [rows]          natural log; may be null
void merge_attention_states(const float* o_parts, const float* lse_parts, int num_parts,
                            std::int64_t rows, int dim, LseBase base, float* out_o, float* out_lse);

// The same with explicit part strides (in floats), for parts packed in one buffer, e.g. the
// a2a combine's receive buffer [K][O rows*dim | LSE rows]:
//   part k's O rows start at o_parts + k * o_part_stride, its LSEs at lse_parts + k *
//   lse_part_stride.
void merge_attention_states(const float* o_parts, std::int64_t o_part_stride,
                            const float* lse_parts, std::int64_t lse_part_stride, int num_parts,
                            std::int64_t rows, int dim, LseBase base, float* out_o, float* out_lse);

// The merge's inner loop, out[d] = sum_k weights[k] * parts[k][d] for d < dim, one pass over
// out, on the widest SIMD path this CPU has (or `path`; the bf16-pair paths are refused).
// Exposed so that each path is tested. `out` may be one of the parts (ag_rs rescales in place):
// each element is read before it is written.
void weighted_sum(const float* const* parts, const float* weights, int num_parts, int dim,
                  float* out, KernelPath path = KernelPath::automatic);

// The global LSE of K parts per row, and nothing else (what ag_rs needs before rescaling).
//   lse_parts [K, rows] in `base`; out_lse [rows] natural log.
void global_lse(const float* lse_parts, int num_parts, std::int64_t rows, LseBase base,
                float* out_lse);

// Adds an attention sink: one extra logit per row that contributes weight but no value,
// i.e. state ⊕ (O = 0, LSE = sink). Apply exactly once per (token, head) in a merged result.
//   o [rows, dim], lse [rows] natural log, sink_logit [rows] natural log.
void merge_sink(float* o, float* lse, const float* sink_logit, std::int64_t rows, int dim);

}  // namespace dcp

// Where model weights come from: a Hugging Face safetensors checkpoint, or deterministic
// synthetic values. Both hand out slices of 2-D (or 1-D) tensors by name, as fp32 or in their
// dtype, so each rank loads only its TP shard.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/kernel_path.h"
#include "dcp/memory.h"
#include "dcp/model_config.h"

namespace dcp {

// A half-open index range [begin, end); an empty Range means "all of it".
struct Range {
  std::int64_t begin = 0;
  std::int64_t end = -1;
  bool whole() const noexcept { return end < 0; }
};

// How a weight is held in memory: the checkpoint's own dtype.
// int4: compressed-tensors' symmetric INT4, two values a byte (the even column in the low
// nibble), each a code 0..15 standing for code - 8, times its group's scale.
enum class WeightDtype : std::uint8_t { f32, bf16, f8_e4m3, int4 };
std::string_view to_string(WeightDtype d) noexcept;

// One rank's slice of a 2-D weight (a torch Linear weight [out, in]) in its checkpoint dtype:
// rows x cols values, row-major. An FP8 slice carries the weight_scale_inv blocks that cover it
// (block_rows x block_cols values of the whole tensor share one F32 scale), indexed by the slice's
// place in the whole tensor, so a slice that starts inside a block scales exactly as the whole.
// An INT4 slice carries its weight_scale groups the same way, as blocks of 1 x group columns
// (its columns start on a group's first).
struct WeightMatrix {
  WeightDtype dtype = WeightDtype::f32;
  std::int64_t rows = 0, cols = 0;
  // rows x cols elements of dtype (INT4: rows x cols / 2 bytes); huge pages where the kernel
  // allows, as a decode step streams every weight once
  HugePageVector<std::uint8_t> data;
  // FP8 and INT4 only.
  int block_rows = 0, block_cols = 0;
  std::int64_t row0 = 0, col0 = 0;              // the slice's first row and column in the tensor
  std::int64_t scale_rows = 0, scale_cols = 0;  // the blocks held: from (row0 / block_rows,
  std::vector<float> scale_inv;                 // col0 / block_cols), [scale_rows, scale_cols]

  // Bytes held (values and scales).
  std::size_t bytes() const noexcept;
  // Row r of the slice as fp32, exactly (an FP8 value or an INT4 code - 8 times its block's
  // scale, rounded once).
  void row_to_float(std::int64_t r, float* out) const;
  // The whole slice as fp32.
  std::vector<float> to_float() const;
  // The transpose (cols x rows) in the same dtype, each value kept bit for bit; an FP8 slice's
  // scale blocks, block shape and place in the tensor are transposed with it. INT4 is refused
  // (its packing and groups run along the columns).
  WeightMatrix transposed() const;
  // An fp32 matrix holding `values` (rows x cols).
  static WeightMatrix from_float(std::vector<float> values, std::int64_t rows, std::int64_t cols);
  // `values` (rows x cols) in FP8 E4M3 as DeepSeek-V3 ships its weights: one scale per
  // block_rows x block_cols block, the block's largest magnitude over 448 (1 for an all-zero
  // block), and each value divided by its block's scale, rounded to the nearest code.
  static WeightMatrix quantize_fp8(const std::vector<float>& values, std::int64_t rows,
                                   std::int64_t cols, int block_rows, int block_cols);
  // `values` (rows x cols, cols a multiple of `group`, group even) in INT4 as compressed-tensors
  // packs it: one scale per `group` columns of a row, the group's largest magnitude over 7.5
  // rounded to bf16 (a checkpoint's scale dtype; 1 for an all-zero group), each value divided by
  // it, rounded to the nearest integer and clamped to [-8, 7].
  static WeightMatrix quantize_int4(const std::vector<float>& values, std::int64_t rows,
                                    std::int64_t cols, int group);
};

// The most rows of x for which linear() runs its decode-shaped product, reading each weight from
// memory once and widening bf16, FP8 and INT4 in registers; beyond it (prefill shapes) the product
// is the blocked one below. The crossovers were measured with `dcp bench decode`'s shapes on an
// AVX2 CPU.
constexpr std::int64_t weight_gemv_max_rows(WeightDtype d) noexcept {
  return d == WeightDtype::f32 ? 8 : 16;
}

// y[m, w.rows] = x[m, w.cols] @ w^T with w held in its dtype; ldx and ldy are row strides
// (-1: dense). Up to weight_gemv_max_rows(w.dtype) rows of x run on the widest SIMD path this CPU
// has (or `path`). More rows run dcp's blocked product on the avx512 and avx2 paths (x packed
// once, each sum one fused multiply-add per column in column order, so both paths give the same
// bits; bf16 and FP8 widened in L1 a chunk of rows and columns at a time), and BLAS's sgemm on
// the portable path (bf16 and FP8 widened a tile of rows at a time). Every such path multiplies
// by the values row_to_float gives; sums differ only in their rounding order. The opt-in
// avx512_bf16 path multiplies bf16 and FP8 weights (their codes widened to bf16 exactly, each
// scale block summed on its own and times its scale) by x rounded to bf16, two columns per
// vdpbf16ps (1.5-2x the exact products' rate where they are compute-bound); fp32 and INT4
// weights as avx512 does, and FP8 in decode shapes too on a CPU without AVX512-VBMI; amx_bf16 is
// refused.
// threads > 1 splits the output rows over the calling thread's worker pool
// (this_thread_worker_pool) in parts of at least 64K weights; every sum is bitwise the one-thread
// sum, except BLAS's.
void linear(const float* x, std::int64_t m, const WeightMatrix& w, float* y, std::int64_t ldx = -1,
            std::int64_t ldy = -1, KernelPath path = KernelPath::automatic, int threads = 1);
// Which copy of linear()'s own product `path` runs on this CPU, for benchmark headers: its path
// and how it widens FP8, e.g. "avx512, FP8 widened by AVX512-VBMI byte lookups". The same
// errors as linear() for a path this CPU lacks.
std::string weight_kernel_label(KernelPath path = KernelPath::automatic);
// Whether linear() runs dcp's blocked product beyond weight_gemv_max_rows rows of x on `path`
// (the avx512 and avx2 paths), rather than BLAS; the same errors as linear() for a path this
// CPU lacks.
bool prefill_runs_blocked_product(KernelPath path = KernelPath::automatic);
// Which product linear() runs beyond weight_gemv_max_rows rows of x on `path`, for benchmark
// headers.
std::string weight_prefill_kernel_label(KernelPath path = KernelPath::automatic);

// The threads and the path the weight products of dcp's layers (MlaModel, DenseMlp, MoeLayer)
// use when run on the calling thread: 1 and automatic, unless a ScopedWeightThreads lives on it.
// MlaModel::forward runs under its ModelOptions::threads and weight_kernel; a caller of a layer
// alone sets its own.
int weight_threads();
KernelPath weight_path();
class ScopedWeightThreads {
 public:
  // threads at least 1; path as linear() takes it.
  explicit ScopedWeightThreads(int threads, KernelPath path = KernelPath::automatic);
  ~ScopedWeightThreads();
  ScopedWeightThreads(const ScopedWeightThreads&) = delete;
  ScopedWeightThreads& operator=(const ScopedWeightThreads&) = delete;

 private:
  int previous_;
  KernelPath previous_path_;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The same slice as load(), kept in the checkpoint's dtype (FP8 with its scale blocks). The
  // default converts load()'s fp32 values (a source without dtypes).
  virtual WeightMatrix load_matrix(const std::string& name, const std::vector<std::int64_t>& shape,
                                   Range rows = {}, Range cols = {}) const;
  // The tensor `name`, checked against `shape` ([rows, cols] or [n]), as fp32 rows-major values
  // of rows `rows` x cols `cols`. Throws dcp::Error(io) naming the tensor on a missing tensor,
  // a shape mismatch, an unsupported dtype or a truncated file.
  virtual std::vector<float> load(const std::string& name, const std::vector<std::int64_t>& shape,
                                  Range rows = {}, Range cols = {}) const = 0;
  virtual bool contains(const std::string& name) const = 0;
  virtual std::string describe() const = 0;
};

// Deterministic pseudo-random weights: element i of tensor `name` is a pure function of
// (seed, name, i), so any slice is generated without the rest of the tensor. Matrices
// [out, in] are uniform with unit variance scaled by 1/sqrt(in); 1-D tensors (norm weights) are
// 1 + small noise; the embedding has unit variance.
std::unique_ptr<WeightSource> make_synthetic_weights(std::uint64_t seed);
// The same values held as a checkpoint of `config` would hold them: the projections of an FP8
// config in FP8 E4M3 with block scales (drawn per block, so that no value saturates), the other
// matrices in `dtype` (fp32 or bf16), norm weights and biases in fp32. load() returns the values
// the dtype holds, so both loads agree.
std::unique_ptr<WeightSource> make_synthetic_weights(std::uint64_t seed, const ModelConfig& config,
                                                     WeightDtype dtype);
// The dtype a preset's synthetic weights are generated in: bf16 for the published families (their
// checkpoints' dtype; FP8 projections come with the config), fp32 for tiny, deepseek-v3-attn and
// kimi-k3. Throws naming the legal presets.
WeightDtype preset_weight_dtype(const std::string& preset);

// A checkpoint directory: config.json and *.safetensors (with model.safetensors.index.json or
// without). Files are memory-mapped; headers are validated when opened.
std::unique_ptr<WeightSource> open_checkpoint(const std::string& dir);
// Reads DIR/config.json.
ModelConfig read_checkpoint_config(const std::string& dir);

// Writes a checkpoint of `config` with weights from `source` (synthetic, for tests and demos):
// config.json plus `num_files` safetensors files (an index file when num_files > 1), tensors in
// dtype "BF16", "F16" or "F32". With an FP8 config (quant_method fp8) the projection weights are
// written as F8_E4M3 with F32 weight_scale_inv blocks, as DeepSeek-V3 ships them, and the
// rest (embeddings, norms, router) in `dtype`; with a compressed-tensors config its INT4 weights
// as quantize_int4 makes them, in the three tensors is_int4_weight names.
void write_checkpoint(const std::string& dir, const ModelConfig& config, const WeightSource& source,
                      const std::string& dtype = "BF16", int num_files = 1);

// Whether a checkpoint of `config` holds tensor `name` in FP8 (with `name`_scale_inv): the
// projection and expert weights of an FP8 config; never embeddings, norms, the router or its
// bias.
bool is_fp8_weight(const ModelConfig& config, const std::string& name);
// Whether a checkpoint of `config` holds weight `name` ("X.weight") in INT4, as compressed-tensors
// stores it: X.weight_packed (I32 [out, in / 8]), X.weight_scale (BF16 [out, in / group]) and
// X.weight_shape (I32 [2]). The Linear weights (projections, experts, lm_head) of a
// compressed-tensors config that its `ignore` does not name.
bool is_int4_weight(const ModelConfig& config, const std::string& name);

// Whether every rank of a TP group holds tensor `name` (of `shape`) whole rather than a slice:
// norms and biases, the low-rank down projections, the router.
bool is_replicated_weight(const std::string& name, const std::vector<std::int64_t>& shape);

// About the bytes of weights the largest rank of a TP group of `tp_size` holds for `config`
// (replicated tensors whole, the others a 1/tp_size slice), each tensor at `element_bytes(name)`
// bytes per value, FP8 scale blocks included: what to check against memory before loading.
double weight_bytes_per_rank(const ModelConfig& config, int tp_size,
                             const std::function<double(const std::string&)>& element_bytes);
// The element size of each tensor as a checkpoint of `config` stores it (FP8 projections, INT4
// weights with their group scales as a rank holds them, the rest in `dtype_bytes`); synthetic
// weights of a preset take the same sizes.
std::function<double(const std::string&)> checkpoint_element_bytes(const ModelConfig& config,
                                                                   double dtype_bytes);

// The names and shapes of every tensor a checkpoint of `config` holds (the main model's layers;
// MoE layers with their router, routed and shared experts).
std::vector<std::pair<std::string, std::vector<std::int64_t>>> checkpoint_tensors(
    const ModelConfig& config);

}  // namespace dcp

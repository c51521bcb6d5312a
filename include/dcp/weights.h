// Where model weights come from: a Hugging Face safetensors checkpoint, or deterministic
// synthetic values. Both hand out fp32 slices of 2-D (or 1-D) tensors by name, so each rank
// loads only its TP shard.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dcp/model_config.h"

namespace dcp {

// A half-open index range [begin, end); an empty Range means "all of it".
struct Range {
  std::int64_t begin = 0;
  std::int64_t end = -1;
  bool whole() const noexcept { return end < 0; }
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
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

// A checkpoint directory: config.json and *.safetensors (with model.safetensors.index.json or
// without). Files are memory-mapped; headers are validated when opened.
std::unique_ptr<WeightSource> open_checkpoint(const std::string& dir);
// Reads DIR/config.json.
ModelConfig read_checkpoint_config(const std::string& dir);

// Writes a checkpoint of `config` with weights from `source` (synthetic, for tests and demos):
// config.json plus `num_files` safetensors files (an index file when num_files > 1), tensors in
// dtype "BF16", "F16" or "F32".
void write_checkpoint(const std::string& dir, const ModelConfig& config, const WeightSource& source,
                      const std::string& dtype = "BF16", int num_files = 1);

// The names and shapes of every tensor a dense DeepSeek-V2/V3 checkpoint of `config` holds.
std::vector<std::pair<std::string, std::vector<std::int64_t>>> checkpoint_tensors(
    const ModelConfig& config);

}  // namespace dcp

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

#include "dcp/dtype.h"
#include "dcp/error.h"
#include "dcp/weights.h"

namespace dcp {
namespace {

// splitmix64: a good 64-bit mix; counter-based so any element can be drawn directly.
std::uint64_t mix(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::uint64_t name_hash(const std::string& s) noexcept {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a: stable across platforms
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// A tensor's slice drawn element by element: uniform in [-amp, amp) around `center`.
struct Draw {
  std::uint64_t key = 0;
  float amp = 0, center = 0;
  std::int64_t n_rows = 0, n_cols = 0;
  std::int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;

  float at(std::int64_t r, std::int64_t c) const noexcept {
    const std::uint64_t bits = mix(key + static_cast<std::uint64_t>(r * n_cols + c));
    const float u = static_cast<float>(bits >> 40) * (2.0f / 16777216.0f) - 1.0f;  // [-1, 1)
    return center + amp * u;
  }
};

class SyntheticWeights final : public WeightSource {
 public:
  SyntheticWeights(std::uint64_t seed, std::optional<ModelConfig> config, WeightDtype dtype)
      : seed_(seed), config_(std::move(config)), dtype_(dtype) {}

  std::vector<float> load(const std::string& name, const std::vector<std::int64_t>& shape,
                          Range rows, Range cols) const override {
    if (dtype_of(name, shape) != WeightDtype::f32) {
      return load_matrix(name, shape, rows, cols).to_float();  // the values the dtype holds
    }
    const Draw d = draw(name, shape, rows, cols);
    std::vector<float> out(static_cast<std::size_t>((d.r1 - d.r0) * (d.c1 - d.c0)));
    std::size_t k = 0;
    for (std::int64_t r = d.r0; r < d.r1; ++r)
      for (std::int64_t c = d.c0; c < d.c1; ++c) out[k++] = d.at(r, c);
    return out;
  }

  WeightMatrix load_matrix(const std::string& name, const std::vector<std::int64_t>& shape,
                           Range rows, Range cols) const override {
    const WeightDtype dtype = dtype_of(name, shape);
    if (dtype == WeightDtype::f32) return WeightSource::load_matrix(name, shape, rows, cols);
    const Draw d = draw(name, shape, rows, cols);
    WeightMatrix m;
    m.dtype = dtype;
    m.rows = d.r1 - d.r0;
    m.cols = d.c1 - d.c0;
    if (dtype == WeightDtype::bf16) {
      m.data.resize(static_cast<std::size_t>(m.rows * m.cols) * sizeof(bf16_t));
      auto* out = reinterpret_cast<bf16_t*>(m.data.data());
      for (std::int64_t r = d.r0; r < d.r1; ++r)
        for (std::int64_t c = d.c0; c < d.c1; ++c) *out++ = float_to_bf16(d.at(r, c));
      return m;
    }
    if (dtype == WeightDtype::int4) return int4_matrix(name, d, std::move(m));
    // FP8 E4M3 with a scale per block, drawn in [1, 1.5) x amp / 448 so that every value of the
    // block fits without saturating; each block's scale depends on the block alone, so any slice
    // is drawn without the rest of the tensor.
    const int br = config_->weight_block_rows, bc = config_->weight_block_cols;
    m.block_rows = br;
    m.block_cols = bc;
    m.row0 = d.r0;
    m.col0 = d.c0;
    const std::int64_t sr0 = d.r0 / br, sc0 = d.c0 / bc;
    m.scale_rows = m.rows == 0 ? 0 : (d.r1 - 1) / br - sr0 + 1;
    m.scale_cols = m.cols == 0 ? 0 : (d.c1 - 1) / bc - sc0 + 1;
    m.scale_inv.resize(static_cast<std::size_t>(m.scale_rows * m.scale_cols));
    const std::uint64_t scale_key = mix(d.key ^ 0x5ca1ab1e5ca1ab1eull);
    const std::int64_t blocks_per_row = (d.n_cols + bc - 1) / bc;
    for (std::int64_t i = 0; i < m.scale_rows; ++i) {
      for (std::int64_t j = 0; j < m.scale_cols; ++j) {
        const std::uint64_t block =
            static_cast<std::uint64_t>((sr0 + i) * blocks_per_row + sc0 + j);
        const float u = static_cast<float>(mix(scale_key + block) >> 40) / 16777216.0f;  // [0, 1)
        m.scale_inv[i * m.scale_cols + j] = d.amp / 448.0f * (1.0f + 0.5f * u);
      }
    }
    m.data.resize(static_cast<std::size_t>(m.rows * m.cols));
    std::uint8_t* out = m.data.data();
    for (std::int64_t r = d.r0; r < d.r1; ++r) {
      const float* scales = m.scale_inv.data() + (r / br - sr0) * m.scale_cols;
      for (std::int64_t c = d.c0; c < d.c1; ++c)
        *out++ = float_to_fp8_e4m3(d.at(r, c) / scales[c / bc - sc0]);
    }
    return m;
  }

  bool contains(const std::string&) const override { return true; }
  std::string describe() const override {
    return str(
        "synthetic weights (seed ", seed_, ", ", to_string(dtype_),
        config_ && config_->quantized ? ", projections fp8" : "",
        config_ && config_->quant_method == "compressed-tensors" ? ", int4 per its config" : "",
        ")");
  }

 private:
  // INT4 with a scale per group of columns of a row, drawn in [1, 1.5) x amp / 7.5 and rounded to
  // bf16 (a checkpoint's scale dtype), so that the largest draws reach the codes' ends; a group's
  // scale depends on the group alone, so any slice on group boundaries is drawn alone.
  WeightMatrix int4_matrix(const std::string& name, const Draw& d, WeightMatrix m) const {
    const int group = config_->int4_group_size;
    DCP_ARG_CHECK(d.c0 % group == 0 && (d.c1 % group == 0 || d.c1 == d.n_cols), "tensor ", name,
                  ": INT4 columns [", d.c0, ", ", d.c1, ") do not start and end on groups of ",
                  group);
    m.block_rows = 1;
    m.block_cols = group;
    m.row0 = d.r0;
    m.col0 = d.c0;
    m.scale_rows = m.rows;
    m.scale_cols = m.cols / group;
    m.scale_inv.resize(static_cast<std::size_t>(m.scale_rows * m.scale_cols));
    const std::uint64_t scale_key = mix(d.key ^ 0x1a7e4a11c0de5eedull);
    const std::int64_t groups_per_row = d.n_cols / group;
    for (std::int64_t i = 0; i < m.scale_rows; ++i) {
      for (std::int64_t j = 0; j < m.scale_cols; ++j) {
        const auto at = static_cast<std::uint64_t>((d.r0 + i) * groups_per_row + d.c0 / group + j);
        const float u = static_cast<float>(mix(scale_key + at) >> 40) / 16777216.0f;  // [0, 1)
        m.scale_inv[i * m.scale_cols + j] =
            bf16_to_float(float_to_bf16(d.amp / 7.5f * (1.0f + 0.5f * u)));
      }
    }
    m.data.assign(static_cast<std::size_t>(m.rows * m.cols / 2), 0);
    for (std::int64_t r = d.r0; r < d.r1; ++r) {
      const float* scales = m.scale_inv.data() + (r - d.r0) * m.scale_cols;
      for (std::int64_t c = d.c0; c < d.c1; ++c) {
        const float q =
            std::clamp(std::nearbyint(d.at(r, c) / scales[(c - d.c0) / group]), -8.0f, 7.0f);
        const std::int64_t k = (r - d.r0) * m.cols + (c - d.c0);
        m.data[static_cast<std::size_t>(k / 2)] |=
            static_cast<std::uint8_t>(static_cast<int>(q + 8.0f) << (4 * (k % 2)));
      }
    }
    return m;
  }

  Draw draw(const std::string& name, const std::vector<std::int64_t>& shape, Range rows,
            Range cols) const {
    DCP_ARG_CHECK(shape.size() == 1 || shape.size() == 2, "tensor ", name, ": rank ", shape.size(),
                  " is not 1 or 2");
    Draw d;
    d.n_rows = shape[0];
    d.n_cols = shape.size() == 2 ? shape[1] : 1;
    d.r0 = rows.whole() ? 0 : rows.begin;
    d.r1 = rows.whole() ? d.n_rows : rows.end;
    d.c0 = cols.whole() ? 0 : cols.begin;
    d.c1 = cols.whole() ? d.n_cols : cols.end;
    DCP_ARG_CHECK(0 <= d.r0 && d.r0 <= d.r1 && d.r1 <= d.n_rows && 0 <= d.c0 && d.c0 <= d.c1 &&
                      d.c1 <= d.n_cols,
                  "tensor ", name, ": slice outside its shape");
    d.key = mix(seed_ ^ name_hash(name));
    const bool is_embedding = name.find("embed_tokens") != std::string::npos;
    const bool is_vector = shape.size() == 1;
    // Uniform(-1, 1) has variance 1/3: scale to unit variance, then by 1/sqrt(fan_in).
    d.amp = is_vector      ? 0.1f
            : is_embedding ? std::sqrt(3.0f)
                           : std::sqrt(3.0f / static_cast<float>(d.n_cols));
    d.center = is_vector ? 1.0f : 0.0f;
    return d;
  }

  // Norm weights and the router's bias stay fp32 (as the model holds them); FP8 projections of
  // a quantized config; the rest in dtype_.
  WeightDtype dtype_of(const std::string& name, const std::vector<std::int64_t>& shape) const {
    if (shape.size() != 2) return WeightDtype::f32;
    if (config_ && is_fp8_weight(*config_, name)) return WeightDtype::f8_e4m3;
    if (config_ && is_int4_weight(*config_, name)) return WeightDtype::int4;
    return dtype_;
  }

  std::uint64_t seed_;
  std::optional<ModelConfig> config_;
  WeightDtype dtype_;
};

}  // namespace

std::unique_ptr<WeightSource> make_synthetic_weights(std::uint64_t seed) {
  return std::make_unique<SyntheticWeights>(seed, std::nullopt, WeightDtype::f32);
}

std::unique_ptr<WeightSource> make_synthetic_weights(std::uint64_t seed, const ModelConfig& config,
                                                     WeightDtype dtype) {
  return std::make_unique<SyntheticWeights>(seed, config, dtype);
}

WeightDtype preset_weight_dtype(const std::string& preset) {
  preset_config(preset);  // throws naming the legal presets
  return preset == "tiny" || preset == "kimi-k3" || preset == "deepseek-v3-attn"
             ? WeightDtype::f32
             : WeightDtype::bf16;
}

}  // namespace dcp

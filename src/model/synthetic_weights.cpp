#include <cmath>
#include <functional>

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

class SyntheticWeights final : public WeightSource {
 public:
  explicit SyntheticWeights(std::uint64_t seed) : seed_(seed) {}

  std::vector<float> load(const std::string& name, const std::vector<std::int64_t>& shape,
                          Range rows, Range cols) const override {
    DCP_ARG_CHECK(shape.size() == 1 || shape.size() == 2, "tensor ", name, ": rank ", shape.size(),
                  " is not 1 or 2");
    const std::int64_t n_rows = shape[0];
    const std::int64_t n_cols = shape.size() == 2 ? shape[1] : 1;
    const std::int64_t r0 = rows.whole() ? 0 : rows.begin, r1 = rows.whole() ? n_rows : rows.end;
    const std::int64_t c0 = cols.whole() ? 0 : cols.begin, c1 = cols.whole() ? n_cols : cols.end;
    DCP_ARG_CHECK(0 <= r0 && r0 <= r1 && r1 <= n_rows && 0 <= c0 && c0 <= c1 && c1 <= n_cols,
                  "tensor ", name, ": slice outside its shape");
    const std::uint64_t key = mix(seed_ ^ name_hash(name));
    const bool is_embedding = name.find("embed_tokens") != std::string::npos;
    const bool is_vector = shape.size() == 1;
    // Uniform(-1, 1) has variance 1/3: scale to unit variance, then by 1/sqrt(fan_in).
    const float amp = is_vector      ? 0.1f
                      : is_embedding ? std::sqrt(3.0f)
                                     : std::sqrt(3.0f / static_cast<float>(n_cols));
    std::vector<float> out(static_cast<std::size_t>((r1 - r0) * (c1 - c0)));
    std::size_t k = 0;
    for (std::int64_t r = r0; r < r1; ++r) {
      for (std::int64_t c = c0; c < c1; ++c) {
        const std::uint64_t bits = mix(key + static_cast<std::uint64_t>(r * n_cols + c));
        const float u = static_cast<float>(bits >> 40) * (2.0f / 16777216.0f) - 1.0f;  // [-1, 1)
        out[k++] = is_vector ? 1.0f + amp * u : amp * u;
      }
    }
    return out;
  }
  bool contains(const std::string&) const override { return true; }
  std::string describe() const override { return str("synthetic weights (seed ", seed_, ")"); }

 private:
  std::uint64_t seed_;
};

}  // namespace

std::unique_ptr<WeightSource> make_synthetic_weights(std::uint64_t seed) {
  return std::make_unique<SyntheticWeights>(seed);
}

}  // namespace dcp

// Shared helpers for the test suite: seeded randomness, numerical comparison, a builder that
// stripes a full context over N ranks' paged KV pools, and byte-level tokenizer characters.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "dcp/attention.h"
#include "dcp/error.h"
#include "dcp/reference.h"

namespace dcp::test {

// A fresh seed each run (or DCP_TEST_SEED), printed so a failure can be replayed.
std::uint64_t test_seed();

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : gen_(seed) {}
  float normal(float stddev = 1.0f) { return std::normal_distribution<float>(0.0f, stddev)(gen_); }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  std::int64_t range(std::int64_t lo, std::int64_t hi_inclusive) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi_inclusive)(gen_);
  }
  bool coin(double p = 0.5) { return std::bernoulli_distribution(p)(gen_); }
  std::mt19937_64& engine() { return gen_; }

 private:
  std::mt19937_64 gen_;
};

// A per-test Rng whose seed is derived from the run seed and the test's name.
Rng make_rng();

struct Tolerance {
  double nmse;     // sum (a-b)^2 / sum b^2
  double max_abs;  // relative to max |b| (or absolute when b is all zero)
};
constexpr Tolerance kFp32Tol{1e-10, 1e-4};
constexpr Tolerance kBf16Tol{1e-10, 1e-4};  // inputs are bf16-exact, so accumulation dominates

// NaN fails; infinities must match exactly; finite values within tolerance.
::testing::AssertionResult close(const std::vector<float>& actual,
                                 const std::vector<double>& expected, Tolerance tol,
                                 const char* what);
// LSE against a float64 reference: |error| <= 1e-5 x max(1, max |LSE|), -inf matching -inf.
// Absolute, since the LSE is a log (see test_util.cpp).
::testing::AssertionResult lse_close(const std::vector<float>& got,
                                     const std::vector<double>& expect, const std::string& what);

// The message of the dcp::Error that f throws, or "" if it throws none.
std::string error_of(const std::function<void()>& f);
// Success when f throws a dcp::Error of `category` whose message contains `needle`.
::testing::AssertionResult throws_error(const std::function<void()>& f, ErrorCategory category,
                                        const std::string& needle);

// The same between two runs' float values (step logits against a reference run's).
::testing::AssertionResult close_runs(const std::vector<float>& actual,
                                      const std::vector<float>& expected, Tolerance tol,
                                      const char* what);

// One rank's paged shard of a set of requests, ready to hand to the kernel.
struct Shard {
  std::vector<float> kv_fp32;            // [pages * P, width] when fp32
  std::vector<std::uint16_t> kv_bf16;    // [pages * P, width] when bf16
  std::vector<std::int32_t> page_table;  // [B, stride]
  std::vector<std::int64_t> local_len;   // [B]
  std::int64_t num_pages = 0;
  int stride = 0;
};

// Stripes each request's full context over `dcp_size` ranks: rank r stores position p iff
// layout::owner(p) == r, at local row layout::row(p), on pages drawn in a shuffled order
// from a pool with a few spare pages (so page ids are not the identity).
std::vector<Shard> stripe(const ref::FullAttentionInput& in, int dcp_size, int interleave,
                          int page_size, KvDtype dtype, Rng& rng);

// Kernel params for one rank's shard, masks and queries taken from `in`.
MlaAttentionParams shard_params(const ref::FullAttentionInput& in, const Shard& shard,
                                KvDtype dtype, int page_size, int dcp_size, int dcp_rank,
                                int interleave);

// Random queries and contexts. kv values are rounded to bf16 when `dtype` is bf16 so that
// the reference sees exactly what the kernel sees.
struct ContextSpec {
  int heads = 4;
  int kv_lora_rank = 64;
  int rope_dim = 16;
  std::vector<std::int64_t> lengths;  // global context length per request
  std::vector<int> q_lens;            // query tokens per request (the last q_len positions)
};
ref::FullAttentionInput random_context(const ContextSpec& spec, KvDtype dtype, Rng& rng);

// GPT-2's byte-to-unicode table, written out here for tokenizer.json files the tests write: bytes
// ! .. ~, 0xA1 .. 0xAC and 0xAE .. 0xFF stand for themselves; the rest, in byte order, for U+0100,
// U+0101, ...
std::string byte_char(int b);

// Python decides each case: runs `script` with the cases' JSON file and the answers' file
// (byte strings travel as hex); nullopt when Debian's python3 is missing.
std::optional<nlohmann::json> python_oracle(const nlohmann::json& cases, const std::string& script);

}  // namespace dcp::test

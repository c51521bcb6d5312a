// The MLA model and the engine: absorbed MLA with DCP equals a naive float64 model; DCP N equals
// DCP 1; a full KV cache queues; checkpoints load, and malformed ones are refused clearly.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dcp/comm_threads.h"
#include "dcp/engine.h"
#include "dcp/error.h"
#include "dcp/model.h"
#include "dcp/weights.h"
#include "engine_util.h"
#include "naive_model.h"
#include "test_util.h"

namespace dcp {
namespace {

namespace fs = std::filesystem;

// DCP N vs DCP 1 with bf16 KV: both runs are exact up to fp32 rounding order, but a layer's
// latent rows are rounded to bf16 when stored, and a 1e-7 difference that crosses a bf16
// rounding boundary becomes a 4e-3 difference in that element (measured: nmse up to ~5e-8,
// max relative ~3e-4 over many seeds). Hence limits far looser than fp32's, and teacher forcing
// so that a near tie cannot branch the two sequences.
constexpr test::Tolerance kBf16KvTol{1e-6, 3e-3};

using test::EngineRun;
using test::EngineSetup;
using test::random_tokens;
using test::request;
using test::run_engine;

ModelConfig small_config(int layers) {
  ModelConfig c = preset_config("tiny", layers);
  c.vocab_size = 96;  // keeps the float64 reference quick
  return c;
}

// Step logits of the engine vs the naive model at the same positions (teacher forcing).
void expect_engine_matches_naive(const ModelConfig& c, const WeightSource& w, const EngineSetup& s,
                                 test::Rng& rng) {
  const std::vector<std::int32_t> prompt = random_tokens(rng, 23, c.vocab_size);
  RequestSpec r = request(0, prompt, 4, random_tokens(rng, 4, c.vocab_size));
  const EngineRun run = run_engine(c, w, s, {r});
  std::vector<std::int32_t> seq = prompt;
  seq.insert(seq.end(), r.forced_outputs.begin(), r.forced_outputs.end() - 1);
  const std::vector<double> naive = test::naive_logits(c, w, seq);
  // Engine step k predicts position prompt + k from the sequence up to prompt - 1 + k.
  std::vector<double> expect(naive.end() - static_cast<std::ptrdiff_t>(4 * c.vocab_size),
                             naive.end());
  const std::string what = "tp " + std::to_string(s.tp) + " dcp " + std::to_string(s.dcp) + " " +
                           std::string(to_string(s.backend)) +
                           (s.replicate_q ? " replicated-q" : "");
  EXPECT_TRUE(test::close(run.results[0].step_logits, expect, {1e-9, 1e-4}, what.c_str()));
}

class GeneratedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dcp_test_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

std::vector<char> read_bytes(const fs::path& file) {
  std::vector<char> bytes(static_cast<std::size_t>(fs::file_size(file)));
  std::ifstream(file, std::ios::binary)
      .read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return bytes;
}

TEST_F(GeneratedCheckpoint, AbsorbedDcpModelEqualsNaiveFloat64Model) {
  auto rng = test::make_rng();
  for (int layers : {1, 2}) {
    const ModelConfig c = small_config(layers);
    write_checkpoint(dir_.string(), c, *make_synthetic_weights(7), "F32", 2);
    const auto w = open_checkpoint(dir_.string());
    const ModelConfig loaded = read_checkpoint_config(dir_.string());
    ASSERT_EQ(loaded.num_hidden_layers, layers);
    EngineSetup s;
    s.chunk = 10;  // prefill in chunks: exercises the gather path over a cached prefix
    expect_engine_matches_naive(loaded, *w, s, rng);
    s.tp = 2;
    s.dcp = 2;
    expect_engine_matches_naive(loaded, *w, s, rng);
    s.tp = 4;
    s.dcp = 4;
    s.backend = CombineBackend::a2a;
    s.replicate_q = true;
    expect_engine_matches_naive(loaded, *w, s, rng);
    fs::remove_all(dir_);
  }
}

TEST(Model, VariantsEqualNaiveModel) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(11);
  ModelConfig plain_q = small_config(1);  // DeepSeek-V2-Lite style: no q_lora
  plain_q.q_lora_rank.reset();
  plain_q.rope_scaling.reset();
  ModelConfig k3 = small_config(1);  // Kimi-K3 style: output gate, no rope
  k3.skip_rope = true;
  k3.attn_output_gate = true;
  k3.rope_scaling.reset();
  for (const ModelConfig& c : {plain_q, k3}) {
    EngineSetup s;
    s.tp = 2;
    s.dcp = 2;
    s.chunk = 9;
    expect_engine_matches_naive(c, *w, s, rng);
  }
}

TEST(Model, DcpEqualsDcpOne) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(3);
  // Mixed lengths in one batch, including prompts shorter than N.
  std::vector<RequestSpec> reqs;
  const int lengths[] = {1, 2, 3, 57, 130, 201};
  for (int i = 0; i < 6; ++i)
    reqs.push_back(request(i, random_tokens(rng, lengths[i], c.vocab_size), 5));
  struct Case {
    int dcp;
    CombineBackend backend;
    bool replicate;
    int chunk;
  };
  const Case cases[] = {{2, CombineBackend::ag_rs, false, 61},
                        {2, CombineBackend::a2a, true, 7},
                        {4, CombineBackend::ag_rs, false, 13},
                        {4, CombineBackend::a2a, false, 61},
                        {4, CombineBackend::a2a, true, 29}};
  for (KvDtype dtype : {KvDtype::fp32, KvDtype::bf16}) {
    EngineSetup base;
    base.tp = 4;
    base.kv_dtype = dtype;
    base.chunk = 61;
    const EngineRun ref = run_engine(c, *w, base, reqs);
    // fp32 KV: free-running, tokens equal and logits to fp32 rounding. bf16 KV: fed the
    // reference's tokens (teacher forcing), logits within the bf16 limits.
    std::vector<RequestSpec> run = reqs;
    if (dtype == KvDtype::bf16) {
      for (std::size_t i = 0; i < run.size(); ++i)
        run[i].forced_outputs = ref.results[i].output_tokens;
    }
    const test::Tolerance tol = dtype == KvDtype::fp32 ? test::Tolerance{1e-10, 1e-4} : kBf16KvTol;
    for (const Case& k : cases) {
      EngineSetup s = base;
      s.dcp = k.dcp;
      s.backend = k.backend;
      s.replicate_q = k.replicate;
      s.chunk = k.chunk;  // not a multiple of N: chunk shares differ per rank
      const EngineRun got = run_engine(c, *w, s, run);
      for (std::size_t i = 0; i < reqs.size(); ++i) {
        const std::string what = std::string(to_string(dtype)) + " dcp " + std::to_string(k.dcp) +
                                 " " + std::string(to_string(k.backend)) +
                                 (k.replicate ? " replicated" : "") + " request " +
                                 std::to_string(i);
        if (dtype == KvDtype::fp32) {
          EXPECT_TRUE(test::same_greedy_run(got.results[i], ref.results[i], c.vocab_size, tol))
              << what;
        } else {  // fed the same tokens, each run's own choices may part at a near-tie
          EXPECT_TRUE(test::close_runs(got.results[i].step_logits, ref.results[i].step_logits, tol,
                                       what.c_str()));
        }
      }
    }
  }
}

TEST(Model, DeepSeekV3AttentionDcpEqualsDcpOne) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("deepseek-v3-attn", 1);
  const auto w = make_synthetic_weights(5);
  const std::vector<RequestSpec> reqs = {request(0, random_tokens(rng, 9, c.vocab_size), 2),
                                         request(1, random_tokens(rng, 3, c.vocab_size), 2)};
  EngineSetup s;
  s.tp = 4;
  s.kv_dtype = KvDtype::bf16;
  s.capacity = 1024;
  const EngineRun ref = run_engine(c, *w, s, reqs);
  s.dcp = 4;
  s.backend = CombineBackend::a2a;
  const EngineRun got = run_engine(c, *w, s, reqs);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(test::same_greedy_run(got.results[i], ref.results[i], c.vocab_size, kBf16KvTol))
        << "deepseek-v3 request " << i;
  }
}

// ---- loading: every malformed input is a clear error ----

using test::error_of;

TEST_F(GeneratedCheckpoint, RoundTripsInEveryDtype) {
  const ModelConfig c = small_config(1);
  const auto src = make_synthetic_weights(4);
  const std::string name = "model.layers.0.self_attn.kv_b_proj.weight";
  const std::vector<std::int64_t> shape = {
      c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank};
  const std::vector<float> truth = src->load(name, shape);
  for (const std::string dtype : {"F32", "BF16", "F16"}) {
    write_checkpoint(dir_.string(), c, *src, dtype, 1);
    const auto w = open_checkpoint(dir_.string());
    const std::vector<float> got = w->load(name, shape, {3, 9}, {5, 17});  // a slice
    for (std::int64_t r = 3; r < 9; ++r) {
      for (std::int64_t k = 5; k < 17; ++k) {
        const float t = truth[r * shape[1] + k], g = got[(r - 3) * 12 + (k - 5)];
        const float tol = dtype == "F32"    ? 0.0f
                          : dtype == "BF16" ? std::abs(t) / 128
                                            : std::abs(t) / 1024 + 1e-7f;
        ASSERT_LE(std::abs(g - t), tol) << dtype << " [" << r << "," << k << "]";
      }
    }
    fs::remove_all(dir_);
  }
}

TEST_F(GeneratedCheckpoint, MalformedCheckpointsAreRefusedClearly) {
  const ModelConfig c = small_config(1);
  write_checkpoint(dir_.string(), c, *make_synthetic_weights(2), "BF16", 1);
  const fs::path file = dir_ / "model.safetensors";
  const std::vector<char> bytes = read_bytes(file);
  const auto write_bytes = [&](const std::vector<char>& b) {
    std::ofstream(file, std::ios::binary | std::ios::trunc)
        .write(b.data(), static_cast<std::streamsize>(b.size()));
  };
  // Truncated data.
  write_bytes(std::vector<char>(bytes.begin(), bytes.end() - 100));
  EXPECT_NE(error_of([&] { open_checkpoint(dir_.string()); }).find("truncated file"),
            std::string::npos);
  // Truncated header.
  write_bytes(std::vector<char>(bytes.begin(), bytes.begin() + 5));
  EXPECT_NE(error_of([&] { open_checkpoint(dir_.string()); }).find("truncated"), std::string::npos);
  // Header length beyond the file.
  std::vector<char> lie = bytes;
  lie[6] = 0x7f;
  write_bytes(lie);
  EXPECT_NE(error_of([&] { open_checkpoint(dir_.string()); }).find("exceeds the file"),
            std::string::npos);
  // Header lies about a tensor's size: edit its shape in the JSON (same text length).
  std::string header(bytes.begin() + 8, bytes.end());
  const std::string shape_text = "\"shape\":[" + std::to_string(c.hidden_size) + "]";
  const std::size_t at = header.find(shape_text);
  ASSERT_NE(at, std::string::npos);
  std::vector<char> lied = bytes;
  lied[8 + at + shape_text.size() - 2] =
      static_cast<char>(lied[8 + at + shape_text.size() - 2] + 1);  // 128 -> 129
  write_bytes(lied);
  EXPECT_NE(error_of([&] { open_checkpoint(dir_.string()); }).find("need"), std::string::npos);
  // Unknown dtype.
  std::vector<char> dtype = bytes;
  const std::size_t bf = std::string(dtype.begin(), dtype.end()).find("\"BF16\"");
  dtype[bf + 1] = 'Q';
  write_bytes(dtype);
  EXPECT_NE(error_of([&] { open_checkpoint(dir_.string()); }).find("unknown dtype 'QF16'"),
            std::string::npos);
  write_bytes(bytes);  // intact again
  const auto w = open_checkpoint(dir_.string());
  // Missing tensor and wrong shape, named.
  EXPECT_NE(error_of([&] {
              w->load("model.layers.7.mlp.up_proj.weight", {4, 4});
            }).find("missing tensor 'model.layers.7.mlp.up_proj.weight'"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { w->load("model.norm.weight", {c.hidden_size + 1}); }).find("has shape [128]"),
      std::string::npos);
  // A config with MoE layers over a dense checkpoint: refused naming the first missing tensor.
  ModelConfig moe = c;
  moe.n_routed_experts = 8;
  moe.num_experts_per_tok = 2;
  moe.moe_intermediate_size = 16;
  moe.scoring_func = "sigmoid";
  moe.topk_method = "noaux_tc";
  moe.first_k_dense_replace = 0;
  run_threads(1, [&](Communicator& world) {
    auto dcp = world.split(0, 0);
    ModelOptions mo;
    mo.kv_capacity_tokens = 64;
    const std::string why = error_of([&] { MlaModel m(moe, *w, world, *dcp, mo); });
    EXPECT_NE(why.find("missing tensor 'model.layers.0.mlp.gate.weight'"), std::string::npos)
        << why;
  });
  // Malformed config.json.
  std::ofstream(dir_ / "config.json") << "{\"vocab_size\": 10,";
  EXPECT_NE(error_of([&] { read_checkpoint_config(dir_.string()); }).find("not valid JSON"),
            std::string::npos);
  std::ofstream(dir_ / "config.json") << "{\"vocab_size\": 10}";
  EXPECT_NE(
      error_of([&] { read_checkpoint_config(dir_.string()); }).find("missing field 'hidden_size'"),
      std::string::npos);
}

// A source whose tensor `name` holds `value` at element `index` (for writing bad checkpoints).
class PoisonedWeights final : public WeightSource {
 public:
  PoisonedWeights(const WeightSource& base, std::string name, std::size_t index, float value)
      : base_(base), name_(std::move(name)), index_(index), value_(value) {}
  std::vector<float> load(const std::string& name, const std::vector<std::int64_t>& shape,
                          Range rows, Range cols) const override {
    std::vector<float> v = base_.load(name, shape, rows, cols);
    if (name == name_) v.at(index_) = value_;
    return v;
  }
  bool contains(const std::string& name) const override { return base_.contains(name); }
  std::string describe() const override { return "poisoned"; }

 private:
  const WeightSource& base_;
  std::string name_;
  std::size_t index_;
  float value_;
};

TEST_F(GeneratedCheckpoint, NonFiniteWeightsAreRefusedNamingTensorAndElement) {
  const ModelConfig c = small_config(1);
  const auto base = make_synthetic_weights(3);
  const std::string up = "model.layers.0.mlp.up_proj.weight";
  const std::vector<std::int64_t> up_shape{c.intermediate_size, c.hidden_size};
  const std::size_t at = 3 * static_cast<std::size_t>(c.hidden_size) + 5;  // element [3, 5]
  // BF16: NaN, as the typed load and the fp32 load read it, whole or sliced over TP.
  write_checkpoint(dir_.string(), c, PoisonedWeights(*base, up, at, NAN), "BF16", 1);
  auto w = open_checkpoint(dir_.string());
  EXPECT_TRUE(test::throws_error([&] { w->load_matrix(up, up_shape); }, ErrorCategory::io,
                                 "tensor '" + up + "' holds a non-finite BF16 value at [3, 5]"));
  EXPECT_TRUE(test::throws_error([&] { w->load_matrix(up, up_shape, {2, 9}); }, ErrorCategory::io,
                                 "holds a non-finite BF16 value at [3, 5]"));
  EXPECT_TRUE(test::throws_error([&] { w->load(up, up_shape, {2, 9}); }, ErrorCategory::io,
                                 "tensor '" + up + "' holds NaN at [3, 5]"));
  EXPECT_NO_THROW(w->load_matrix(up, up_shape, {4, 9}));  // a slice without it loads
  // F32: an infinity in a norm weight (a vector).
  fs::remove_all(dir_);
  write_checkpoint(dir_.string(), c, PoisonedWeights(*base, "model.norm.weight", 7, INFINITY),
                   "F32", 1);
  w = open_checkpoint(dir_.string());
  EXPECT_TRUE(test::throws_error([&] { w->load("model.norm.weight", {c.hidden_size}); },
                                 ErrorCategory::io,
                                 "tensor 'model.norm.weight' holds an infinity at [7]"));
  // FP8: a NaN weight becomes the E4M3 NaN code; the model refuses to load.
  const ModelConfig f = family_config("deepseek-v3");
  const std::string o_proj = "model.layers.0.self_attn.o_proj.weight";
  fs::remove_all(dir_);
  write_checkpoint(dir_.string(), f, PoisonedWeights(*base, o_proj, 1, NAN), "BF16", 1);
  w = open_checkpoint(dir_.string());
  const std::string why = error_of([&] {
    run_threads(1, [&](Communicator& world) {
      auto dcp = world.split(0, 0);
      ModelOptions mo;
      mo.kv_capacity_tokens = 64;
      MlaModel m(f, *w, world, *dcp, mo);
    });
  });
  EXPECT_NE(why.find("tensor '" + o_proj + "' holds an FP8 NaN at [0, 1]"), std::string::npos)
      << why;
}

TEST_F(GeneratedCheckpoint, TensorsMustTileTheDataSection) {
  const ModelConfig c = small_config(1);
  write_checkpoint(dir_.string(), c, *make_synthetic_weights(2), "BF16", 1);
  const fs::path file = dir_ / "model.safetensors";
  const std::vector<char> bytes = read_bytes(file);
  std::uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(bytes[i]);
  const nlohmann::json header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + len);
  const std::vector<char> data(bytes.begin() + 8 + static_cast<std::ptrdiff_t>(len), bytes.end());
  // Writes the file with `h` as its header and `tail` extra bytes of data.
  const auto write_with = [&](const nlohmann::json& h, std::size_t tail) {
    const std::string text = h.dump();
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((text.size() >> (8 * i)) & 0xff));
    out << text;
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    for (std::size_t i = 0; i < tail; ++i) out.put('\0');
  };
  // The first tensor in the file grown by one row into the next one's bytes: its size agrees
  // with its shape, and two tensors share those bytes.
  std::string first;
  for (const auto& [name, t] : header.items()) {
    if (name != "__metadata__" && t["data_offsets"][0].get<std::uint64_t>() == 0) first = name;
  }
  ASSERT_FALSE(first.empty());
  nlohmann::json alias = header;
  nlohmann::json& t = alias[first];
  ASSERT_EQ(t["dtype"], "BF16");
  const std::uint64_t row_bytes =
      t["shape"].size() == 2 ? 2 * t["shape"][1].get<std::uint64_t>() : 2;
  t["shape"][0] = t["shape"][0].get<std::int64_t>() + 1;
  t["data_offsets"][1] = t["data_offsets"][1].get<std::uint64_t>() + row_bytes;
  write_with(alias, 0);
  EXPECT_TRUE(test::throws_error([&] { open_checkpoint(dir_.string()); }, ErrorCategory::io,
                                 "overlaps tensor '" + first + "'"));
  // A shape entry past 64 bits (JSON keeps it as a float): refused, never converted (found by
  // fuzz_safetensors as undefined behavior).
  nlohmann::json huge = header;
  huge[first]["shape"][0] = 6.7e39;
  write_with(huge, 0);
  EXPECT_TRUE(test::throws_error([&] { open_checkpoint(dir_.string()); }, ErrorCategory::io,
                                 "is not a 64-bit integer"));
  // Bytes no tensor holds at the end.
  write_with(header, 16);
  EXPECT_TRUE(test::throws_error([&] { open_checkpoint(dir_.string()); }, ErrorCategory::io,
                                 "the data section has 16 bytes no tensor holds at its end"));
  write_with(header, 0);  // as written: loads
  EXPECT_NO_THROW(open_checkpoint(dir_.string()));
}

// ModelOptions::weight_kernel runs every weight product on the path it names: the widest path
// gives automatic's logits bit for bit, every other one different bits within fp32 rounding (its
// sums run in another order), and an attention-only path is refused when the model is built.
TEST(Model, RunsTheWeightProductsOnTheWeightKernel) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(5);
  std::vector<RequestSpec> reqs;
  reqs.push_back(request(0, random_tokens(rng, 3, c.vocab_size), 4));
  reqs.push_back(request(1, random_tokens(rng, 40, c.vocab_size), 4));  // prefill-sized products
  EngineSetup base;
  base.tp = 2;
  base.dcp = 2;
  const EngineRun ref = run_engine(c, *w, base, reqs);
  std::vector<RequestSpec> forced = reqs;  // the reference's tokens, so that the logits compare
  for (std::size_t i = 0; i < reqs.size(); ++i)
    forced[i].forced_outputs = ref.results[i].output_tokens;
  const std::vector<KernelPath> paths = available_kernel_paths();
  for (const KernelPath p : paths) {
    EngineSetup s = base;
    s.weight_kernel = p;
    const EngineRun got = run_engine(c, *w, s, forced);
    bool all_equal = true;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      const std::string what = std::string(to_string(p)) + " request " + std::to_string(i);
      EXPECT_TRUE(test::close_runs(got.results[i].step_logits, ref.results[i].step_logits,
                                   {1e-10, 1e-4}, what.c_str()));
      all_equal = all_equal && got.results[i].step_logits == ref.results[i].step_logits;
    }
    EXPECT_EQ(all_equal, p == paths.back()) << to_string(p);
  }
  run_threads(1, [&](Communicator& world) {
    auto dcp = world.split(0, world.rank());
    ModelOptions mo;
    mo.kv_capacity_tokens = 64;
    mo.weight_kernel = KernelPath::amx_bf16;
    std::string why = error_of([&] { MlaModel m(c, *w, world, *dcp, mo); });
    EXPECT_NE(why.find("weight_kernel = amx_bf16: kernel path amx_bf16 is an attention path"),
              std::string::npos)
        << why;
    if (!avx512_bf16_available()) return;
    mo.weight_kernel = KernelPath::avx512_bf16;  // fp32 weights: nothing to pair
    why = error_of([&] { MlaModel m(c, *w, world, *dcp, mo); });
    EXPECT_NE(why.find("weight_kernel = avx512_bf16 multiplies bf16 and FP8 weights in pairs; "
                       "this model holds neither (its weights are fp32, its lm_head fp32)"),
              std::string::npos)
        << why;
  });
}

// The opt-in avx512_bf16 weight path on bf16 weights, and on FP8 projections (paired in the
// prefill's products): x rounded to bf16 moves the logits by more than the exact paths' rounding
// and by less than bf16's.
TEST(Model, PairsBf16WeightsOnTheAvx512Bf16WeightKernel) {
  if (!avx512_bf16_available()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  for (const bool fp8 : {false, true}) {
    auto rng = test::make_rng();
    ModelConfig c = preset_config("tiny", 2);
    c.quantized = fp8;
    c.weight_block_rows = c.weight_block_cols = 32;
    const auto w = make_synthetic_weights(5, c, WeightDtype::bf16);
    std::vector<RequestSpec> reqs;
    reqs.push_back(request(0, random_tokens(rng, 3, c.vocab_size), 4));
    reqs.push_back(request(1, random_tokens(rng, 40, c.vocab_size), 4));
    EngineSetup base;
    base.tp = 2;
    base.dcp = 2;
    const EngineRun exact = run_engine(c, *w, base, reqs);
    std::vector<RequestSpec> forced = reqs;
    for (std::size_t i = 0; i < reqs.size(); ++i)
      forced[i].forced_outputs = exact.results[i].output_tokens;
    EngineSetup s = base;
    s.weight_kernel = KernelPath::avx512_bf16;
    const EngineRun paired = run_engine(c, *w, s, forced);
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      const std::vector<float>& a = paired.results[i].step_logits;
      const std::vector<float>& b = exact.results[i].step_logits;
      ASSERT_EQ(a.size(), b.size());
      double largest = 0, diff = 0;
      for (std::size_t j = 0; j < a.size(); ++j) {
        largest = std::max(largest, std::fabs(static_cast<double>(b[j])));
        diff = std::max(diff, std::fabs(static_cast<double>(a[j]) - b[j]));
      }
      EXPECT_GT(diff, 1e-4 * largest) << "fp8 " << fp8 << " request " << i << ": x was not rounded";
      EXPECT_LT(diff, 2e-2 * largest) << "fp8 " << fp8 << " request " << i;
    }
  }
}

TEST(Model, RefusesHeadsNotDivisibleByTp) {
  ModelConfig c = small_config(1);
  c.num_attention_heads = 6;
  const auto w = make_synthetic_weights(1);
  run_threads(4, [&](Communicator& world) {
    auto dcp = world.split(0, world.rank());
    ModelOptions mo;
    mo.kv_capacity_tokens = 64;
    const std::string why = error_of([&] { MlaModel m(c, *w, world, *dcp, mo); });
    EXPECT_NE(why.find("tp_size = 4 must divide the model's num_attention_heads 6"),
              std::string::npos)
        << why;
  });
}

}  // namespace
}  // namespace dcp

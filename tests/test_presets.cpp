// The synthetic presets of the published MLA geometries, their weights held in the dtypes the
// checkpoints ship, and the MoE layer on its own.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dcp/dtype.h"
#include "dcp/error.h"
#include "dcp/feed_forward.h"
#include "dcp/model_config.h"
#include "dcp/weights.h"
#include "test_util.h"

namespace dcp {
namespace {

// The fields of each model's config.json as its publisher ships it on Hugging Face (fields dcp
// does not read left out).
const char* const kDeepSeekV2Lite = R"({
  "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
  "vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944,
  "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
  "n_shared_experts": 2, "n_routed_experts": 64, "routed_scaling_factor": 1.0,
  "kv_lora_rank": 512, "q_lora_rank": null, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "qk_nope_head_dim": 128, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
  "num_experts_per_tok": 6, "moe_layer_freq": 1, "first_k_dense_replace": 1,
  "norm_topk_prob": false, "scoring_func": "softmax", "rms_norm_eps": 1e-06,
  "rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
  "mscale": 0.707, "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
  "type": "yarn"}, "max_position_embeddings": 163840})";

const char* const kDeepSeekV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
  "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_nextn_predict_layers": 1,
  "num_attention_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
  "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
  "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
  "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
  "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": true,
  "scoring_func": "sigmoid", "rms_norm_eps": 1e-06, "rope_theta": 10000,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
  "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
  "max_position_embeddings": 163840,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
  "quant_method": "fp8", "weight_block_size": [128, 128]}})";

const char* const kKimiK2 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
  "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432,
  "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_nextn_predict_layers": 0,
  "num_attention_heads": 64, "n_shared_experts": 1, "n_routed_experts": 384,
  "routed_scaling_factor": 2.827, "kv_lora_rank": 512, "q_lora_rank": 1536,
  "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
  "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8,
  "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": true,
  "scoring_func": "sigmoid", "rms_norm_eps": 1e-06, "rope_theta": 50000.0,
  "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
  "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
  "max_position_embeddings": 131072,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
  "quant_method": "fp8", "weight_block_size": [128, 128]}})";

// Kimi-K2-Thinking: Kimi-K2's geometry, a 256K context, and its routed experts in
// compressed-tensors INT4.
const char* const kKimiK2Thinking = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
  "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432,
  "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_nextn_predict_layers": 0,
  "num_attention_heads": 64, "n_shared_experts": 1, "n_routed_experts": 384,
  "routed_scaling_factor": 2.827, "kv_lora_rank": 512, "q_lora_rank": 1536,
  "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
  "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8,
  "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": true,
  "scoring_func": "sigmoid", "rms_norm_eps": 1e-06, "rope_theta": 50000.0,
  "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0,
  "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
  "max_position_embeddings": 262144,
  "quantization_config": {"config_groups": {"group_0": {"input_activations": null,
  "output_activations": null, "targets": ["Linear"], "weights": {"actorder": null,
  "block_structure": null, "dynamic": false, "group_size": 32, "num_bits": 4,
  "observer": "minmax", "observer_kwargs": {}, "strategy": "group", "symmetric": true,
  "type": "int"}}}, "format": "pack-quantized", "ignore": ["lm_head", "re:.*self_attn.*",
  "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
  "kv_cache_scheme": null, "quant_method": "compressed-tensors",
  "quantization_status": "compressed"}})";

const char* const kMoonlight = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 163840, "hidden_size": 2048, "intermediate_size": 11264,
  "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
  "n_shared_experts": 2, "n_routed_experts": 64, "routed_scaling_factor": 2.446,
  "kv_lora_rank": 512, "q_lora_rank": null, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1,
  "num_experts_per_tok": 6, "moe_layer_freq": 1, "first_k_dense_replace": 1,
  "norm_topk_prob": true, "scoring_func": "sigmoid", "rms_norm_eps": 1e-05,
  "rope_theta": 50000.0, "rope_scaling": null, "max_position_embeddings": 8192})";

void expect_same_geometry(const ModelConfig& got, const ModelConfig& want, const char* name) {
  EXPECT_EQ(got.model_type, want.model_type) << name;
  EXPECT_EQ(got.architecture, want.architecture) << name;
  EXPECT_EQ(got.vocab_size, want.vocab_size) << name;
  EXPECT_EQ(got.hidden_size, want.hidden_size) << name;
  EXPECT_EQ(got.intermediate_size, want.intermediate_size) << name;
  EXPECT_EQ(got.num_hidden_layers, want.num_hidden_layers) << name;
  EXPECT_EQ(got.num_attention_heads, want.num_attention_heads) << name;
  EXPECT_EQ(got.q_lora_rank, want.q_lora_rank) << name;
  EXPECT_EQ(got.kv_lora_rank, want.kv_lora_rank) << name;
  EXPECT_EQ(got.qk_nope_head_dim, want.qk_nope_head_dim) << name;
  EXPECT_EQ(got.qk_rope_head_dim, want.qk_rope_head_dim) << name;
  EXPECT_EQ(got.v_head_dim, want.v_head_dim) << name;
  EXPECT_DOUBLE_EQ(got.rms_norm_eps, want.rms_norm_eps) << name;
  EXPECT_DOUBLE_EQ(got.rope_theta, want.rope_theta) << name;
  EXPECT_EQ(got.max_position_embeddings, want.max_position_embeddings) << name;
  ASSERT_EQ(got.rope_scaling.has_value(), want.rope_scaling.has_value()) << name;
  if (want.rope_scaling) {
    EXPECT_DOUBLE_EQ(got.rope_scaling->factor, want.rope_scaling->factor) << name;
    EXPECT_DOUBLE_EQ(got.rope_scaling->original_max_position_embeddings,
                     want.rope_scaling->original_max_position_embeddings)
        << name;
    EXPECT_DOUBLE_EQ(got.rope_scaling->beta_fast, want.rope_scaling->beta_fast) << name;
    EXPECT_DOUBLE_EQ(got.rope_scaling->beta_slow, want.rope_scaling->beta_slow) << name;
    EXPECT_DOUBLE_EQ(got.rope_scaling->mscale, want.rope_scaling->mscale) << name;
    EXPECT_DOUBLE_EQ(got.rope_scaling->mscale_all_dim, want.rope_scaling->mscale_all_dim) << name;
  }
  EXPECT_EQ(got.n_routed_experts, want.n_routed_experts) << name;
  EXPECT_EQ(got.n_shared_experts, want.n_shared_experts) << name;
  EXPECT_EQ(got.num_experts_per_tok, want.num_experts_per_tok) << name;
  EXPECT_EQ(got.moe_intermediate_size, want.moe_intermediate_size) << name;
  EXPECT_EQ(got.first_k_dense_replace, want.first_k_dense_replace) << name;
  EXPECT_EQ(got.moe_layer_freq, want.moe_layer_freq) << name;
  EXPECT_EQ(got.scoring_func, want.scoring_func) << name;
  EXPECT_EQ(got.topk_method, want.topk_method) << name;
  EXPECT_EQ(got.n_group, want.n_group) << name;
  EXPECT_EQ(got.topk_group, want.topk_group) << name;
  EXPECT_EQ(got.norm_topk_prob, want.norm_topk_prob) << name;
  EXPECT_DOUBLE_EQ(got.routed_scaling_factor, want.routed_scaling_factor) << name;
  EXPECT_EQ(got.quant_method, want.quant_method) << name;
  EXPECT_EQ(got.quantized, want.quantized) << name;
  if (want.quantized) {
    EXPECT_EQ(got.weight_block_rows, want.weight_block_rows) << name;
    EXPECT_EQ(got.weight_block_cols, want.weight_block_cols) << name;
  }
  EXPECT_EQ(got.int4_group_size, want.int4_group_size) << name;
  EXPECT_EQ(got.int4_ignore, want.int4_ignore) << name;
  EXPECT_EQ(got.num_nextn_predict_layers, want.num_nextn_predict_layers) << name;
}

TEST(Presets, AreThePublishedConfigsAtFullWidth) {
  const std::pair<const char*, const char*> published[] = {{"deepseek-v2-lite", kDeepSeekV2Lite},
                                                           {"deepseek-v3", kDeepSeekV3},
                                                           {"kimi-k2", kKimiK2},
                                                           {"kimi-k2-thinking", kKimiK2Thinking},
                                                           {"moonlight", kMoonlight}};
  for (const auto& [name, json] : published) {
    expect_same_geometry(preset_config(name), parse_model_config(json), name);
    EXPECT_EQ(preset_config(name, 4).num_hidden_layers, 4) << name;  // cut in depth only
    EXPECT_EQ(preset_weight_dtype(name), WeightDtype::bf16) << name;
  }
  // The attention-only geometries keep V3's attention and a small feed-forward half.
  for (const char* name : {"deepseek-v3-attn", "kimi-k3"}) {
    const ModelConfig c = preset_config(name);
    EXPECT_EQ(c.kv_lora_rank, 512) << name;
    EXPECT_EQ(c.q_lora_rank, 1536) << name;
    EXPECT_EQ(c.n_routed_experts, 0) << name;
    EXPECT_FALSE(c.quantized) << name;
    EXPECT_EQ(preset_weight_dtype(name), WeightDtype::f32) << name;
  }
  EXPECT_EQ(preset_config("kimi-k3").num_attention_heads, 96);
  EXPECT_TRUE(test::throws_error([] { preset_config("llama"); }, ErrorCategory::invalid_argument,
                                 "preset = 'llama' is not one of: tiny, deepseek-v2-lite"));
  EXPECT_TRUE(test::throws_error([] { preset_weight_dtype("llama"); },
                                 ErrorCategory::invalid_argument, "preset = 'llama'"));
}

// Every out-of-range or mistyped field of a real config.json is refused naming the field.
TEST(Presets, ConfigFieldsOutOfRangeAreRefusedNamingTheField) {
  const nlohmann::json good = nlohmann::json::parse(kDeepSeekV3);
  ASSERT_NO_THROW(parse_model_config(good.dump()));
  const auto refused = [&](const std::function<void(nlohmann::json&)>& edit,
                           const std::string& needle) {
    nlohmann::json j = good;
    edit(j);
    return test::throws_error([&] { parse_model_config(j.dump()); }, ErrorCategory::io, needle);
  };
  EXPECT_TRUE(
      refused([](auto& j) { j["rope_scaling"] = "yarn"; },
              "field 'rope_scaling' = \"yarn\" must be an object (type yarn or longrope) or null"));
  EXPECT_TRUE(refused([](auto& j) { j["rope_scaling"] = 40; }, "field 'rope_scaling' = 40"));
  EXPECT_TRUE(refused([](auto& j) { j["rope_scaling"]["factor"] = -40; },
                      "rope_scaling.factor = -40 must be a finite number > 0"));
  EXPECT_TRUE(refused([](auto& j) { j["rope_scaling"]["beta_fast"] = 0; },
                      "rope_scaling.beta_fast = 0 must be a finite number > 0"));
  {  // a number past double's range is refused by the JSON parser, never read as infinity
    std::string text = good.dump();
    const std::string theta = "\"rope_theta\":10000";
    ASSERT_NE(text.find(theta), std::string::npos);
    text.replace(text.find(theta), theta.size(), "\"rope_theta\":1e400");
    EXPECT_TRUE(test::throws_error([&] { parse_model_config(text); }, ErrorCategory::io,
                                   "number overflow parsing '1e400'"));
  }
  EXPECT_TRUE(refused([](auto& j) { j["moe_layer_freq"] = 0; }, "moe_layer_freq = 0 must be >= 1"));
  EXPECT_TRUE(refused([](auto& j) { j["hidden_size"] = 4294967424ull; },
                      "field 'hidden_size' = 4294967424 is out of range"));
  EXPECT_TRUE(refused([](auto& j) { j["hidden_size"] = 2147483648ull; },
                      "field 'hidden_size' = 2147483648 is out of range"));
  EXPECT_TRUE(refused([](auto& j) { j["hidden_size"] = 128.7; },
                      "field 'hidden_size' = 128.7 must be an integer"));
  EXPECT_TRUE(refused([](auto& j) { j["routed_scaling_factor"] = -2.5; },
                      "routed_scaling_factor = -2.5 must be > 0"));
  EXPECT_TRUE(refused([](auto& j) { j["norm_topk_prob"] = 1; },
                      "field 'norm_topk_prob' = 1 must be true or false"));
  EXPECT_TRUE(refused([](auto& j) { j["max_position_embeddings"] = 0; },
                      "max_position_embeddings = 0 must be >= 1"));
  // Absent: the Transformers config class's default (DeepseekV2Config 2048, DeepseekV3Config 4096).
  nlohmann::json v3 = good, v2 = nlohmann::json::parse(kDeepSeekV2Lite);
  v3.erase("max_position_embeddings");
  v2.erase("max_position_embeddings");
  EXPECT_EQ(parse_model_config(v3.dump()).max_position_embeddings, 4096);
  EXPECT_EQ(parse_model_config(v2.dump()).max_position_embeddings, 2048);
}

// A family config small enough to draw whole tensors, FP8 in blocks of 32 (edge blocks partial).
ModelConfig small_fp8() {
  return family_config("deepseek-v3");
}

TEST(SyntheticWeights, Fp8SlicesAreTheWholeTensorsSlicesAndNeverSaturate) {
  const ModelConfig c = small_fp8();
  ASSERT_TRUE(c.quantized);
  const auto typed = make_synthetic_weights(7, c, WeightDtype::bf16);
  const auto plain = make_synthetic_weights(7);
  const std::string name = "model.layers.1.mlp.experts.3.down_proj.weight";
  ASSERT_TRUE(is_fp8_weight(c, name));
  const std::vector<std::int64_t> shape{c.hidden_size, c.moe_intermediate_size};  // 96 x 40
  const WeightMatrix whole = typed->load_matrix(name, shape);
  ASSERT_EQ(whole.dtype, WeightDtype::f8_e4m3);
  EXPECT_EQ(whole.scale_rows, 3);  // ceil(96 / 32)
  EXPECT_EQ(whole.scale_cols, 2);  // ceil(40 / 32): a partial edge block
  const std::vector<float> all = whole.to_float();
  const std::vector<float> fp32 = plain->load(name, shape);
  for (std::size_t i = 0; i < all.size(); ++i) {
    const std::uint8_t code = whole.data[i];
    ASSERT_NE(code & 0x7f, 0x7f) << "a NaN code at " << i;
    // E4M3 keeps 3 mantissa bits: within 1/16 relative, or half the subnormal step of its block.
    const float scale = whole.scale_inv[(i / 40 / 32) * 2 + (i % 40) / 32];
    EXPECT_LE(std::fabs(all[i] - fp32[i]), std::fabs(fp32[i]) / 16 + scale * 0x1p-10f) << i;
  }
  // A slice that starts and ends inside blocks holds exactly the whole tensor's values there.
  const WeightMatrix part = typed->load_matrix(name, shape, {5, 70}, {13, 39});
  EXPECT_EQ(part.row0, 5);
  EXPECT_EQ(part.col0, 13);
  const std::vector<float> got = part.to_float();
  for (std::int64_t r = 5; r < 70; ++r)
    for (std::int64_t col = 13; col < 39; ++col)
      ASSERT_EQ(got[(r - 5) * 26 + (col - 13)], all[r * 40 + col]) << r << "," << col;
  // load() returns what load_matrix holds.
  EXPECT_EQ(typed->load(name, shape, {5, 70}, {13, 39}), got);
}

// Kimi-K2-Thinking's experts drawn in INT4: a slice on group boundaries is the whole tensor's
// slice, each value the nearest code of the plain draw times its group's scale, the other
// projections in bf16.
TEST(SyntheticWeights, Int4SlicesAreTheWholeTensorsSlices) {
  const ModelConfig c = family_config("kimi-k2-thinking");
  const auto typed = make_synthetic_weights(9, c, WeightDtype::bf16);
  const auto plain = make_synthetic_weights(9);
  const std::string name = "model.layers.1.mlp.experts.3.down_proj.weight";
  ASSERT_TRUE(is_int4_weight(c, name));
  const std::int64_t cols = c.moe_intermediate_size;
  const std::vector<std::int64_t> shape{c.hidden_size, cols};
  const WeightMatrix whole = typed->load_matrix(name, shape);
  ASSERT_EQ(whole.dtype, WeightDtype::int4);
  ASSERT_EQ(whole.scale_cols, cols / 32);
  const std::vector<float> all = whole.to_float();
  const std::vector<float> fp32 = plain->load(name, shape);
  for (std::size_t i = 0; i < all.size(); ++i) {
    const float scale = whole.scale_inv[i / static_cast<std::size_t>(32)];
    EXPECT_LE(std::fabs(all[i] - fp32[i]), scale * (0.5f + 7.5f / 256)) << i;
  }
  const WeightMatrix part = typed->load_matrix(name, shape, {5, 70}, {32, 96});
  const std::vector<float> got = part.to_float();
  for (std::int64_t r = 5; r < 70; ++r)
    for (std::int64_t col = 32; col < 96; ++col)
      ASSERT_EQ(got[(r - 5) * 64 + (col - 32)], all[r * cols + col]) << r << "," << col;
  EXPECT_EQ(typed->load(name, shape, {5, 70}, {32, 96}), got);
  EXPECT_TRUE(test::throws_error(
      [&] {
        typed->load_matrix(name, shape, {}, {8, 64});
      },
      ErrorCategory::invalid_argument, "groups of 32"));
  EXPECT_EQ(typed
                ->load_matrix("model.layers.1.self_attn.o_proj.weight",
                              {c.hidden_size, c.num_attention_heads * c.v_head_dim})
                .dtype,
            WeightDtype::bf16);
}

TEST(SyntheticWeights, Bf16AndFp32TensorsRoundTheSameValues) {
  const ModelConfig c = small_fp8();
  const auto typed = make_synthetic_weights(7, c, WeightDtype::bf16);
  const auto plain = make_synthetic_weights(7);
  const std::vector<std::int64_t> vocab{c.vocab_size, c.hidden_size};
  const WeightMatrix embed = typed->load_matrix("model.embed_tokens.weight", vocab, {10, 20});
  ASSERT_EQ(embed.dtype, WeightDtype::bf16);  // not a projection: the dense dtype
  const std::vector<float> want = plain->load("model.embed_tokens.weight", vocab, {10, 20});
  const std::vector<float> got = embed.to_float();
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(got[i], bf16_to_float(float_to_bf16(want[i]))) << i;
  // Norm weights stay fp32, exactly the untyped values.
  const std::vector<std::int64_t> hidden{c.hidden_size};
  EXPECT_EQ(typed->load("model.norm.weight", hidden), plain->load("model.norm.weight", hidden));
  EXPECT_EQ(typed->load_matrix("model.norm.weight", hidden).dtype, WeightDtype::f32);
}

TEST(MoeLayer, TpSlicesSumToTheWholeLayerAndCountTheExpertsRun) {
  for (const char* family : {"deepseek-v2", "kimi-k2"}) {  // softmax groups; sigmoid FP8
    const ModelConfig c = family_config(family);
    const auto w = make_synthetic_weights(3, c, WeightDtype::bf16);
    const int layer = c.first_k_dense_replace;
    ASSERT_TRUE(c.is_moe_layer(layer));
    auto rng = test::make_rng();
    const std::int64_t tokens = 5, hidden = c.hidden_size;
    std::vector<float> x(static_cast<std::size_t>(tokens * hidden));
    for (float& v : x) v = static_cast<float>(rng.uniform(-1, 1));
    const MoeLayer whole(c, *w, layer, 0, 1);
    std::vector<float> want(x.size()), sum(x.size(), 0.0f), part(x.size());
    MoeStats stats;
    whole.forward(x.data(), tokens, want.data(), &stats);
    EXPECT_GE(stats.experts_run, c.num_experts_per_tok) << family;
    EXPECT_LE(stats.experts_run, std::min<int>(c.n_routed_experts, tokens * c.num_experts_per_tok))
        << family;
    for (int r = 0; r < 4; ++r) {
      const MoeLayer slice(c, *w, layer, r, 4);
      slice.forward(x.data(), tokens, part.data());
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    }
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < sum.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(sum[i] - want[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
    }
    EXPECT_GT(scale, 0) << family;
    EXPECT_LE(worst, 1e-5 * scale) << family;
    // One token runs exactly its k experts; the bytes read are the router (bf16), the bias
    // (fp32), the shared experts and those k experts.
    whole.forward(x.data(), 1, want.data(), &stats);
    EXPECT_EQ(stats.experts_run, c.num_experts_per_tok) << family;
    const double fp8 = 1.0 + 4.0 / (c.weight_block_rows * c.weight_block_cols);
    const double per_value = c.quantized ? fp8 : 2.0;
    const double expert = 3.0 * c.moe_intermediate_size * hidden;
    const double want_bytes = 2.0 * c.n_routed_experts * hidden +
                              (c.topk_method == "noaux_tc" ? 4.0 * c.n_routed_experts : 0.0) +
                              expert * (c.n_shared_experts + c.num_experts_per_tok) * per_value;
    // FP8 scale blocks round up at the edges: within 5% of the even estimate.
    EXPECT_NEAR(static_cast<double>(stats.weight_bytes_read), want_bytes,
                c.quantized ? 0.05 * want_bytes : 0.0)
        << family;
  }
  EXPECT_TRUE(test::throws_error(
      [] {
        const ModelConfig c = family_config("deepseek-v2");
        MoeLayer(c, *make_synthetic_weights(1), 0, 0, 1);  // layer 0 is dense
      },
      ErrorCategory::invalid_argument, "layer 0 of this config is not a MoE layer"));
}

}  // namespace
}  // namespace dcp

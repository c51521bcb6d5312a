#include "dcp/model_config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "dcp/error.h"

namespace dcp {

double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

double ModelConfig::softmax_scale() const {
  double s = 1.0 / std::sqrt(static_cast<double>(q_head_dim()));
  if (rope_scaling && rope_scaling->mscale_all_dim != 0) {
    const double m = yarn_get_mscale(rope_scaling->factor, rope_scaling->mscale_all_dim);
    s *= m * m;
  }
  return s;
}

void ModelConfig::validate() const {
  const auto positive = [](int v, const char* field) {
    DCP_CHECK(v >= 1, io, "model config: ", field, " = ", v, " must be >= 1");
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(kv_lora_rank, "kv_lora_rank");
  positive(qk_nope_head_dim, "qk_nope_head_dim");
  positive(v_head_dim, "v_head_dim");
  DCP_CHECK(qk_rope_head_dim >= 0 && qk_rope_head_dim % 2 == 0, io,
            "model config: qk_rope_head_dim = ", qk_rope_head_dim, " must be even and >= 0");
  if (q_lora_rank) positive(*q_lora_rank, "q_lora_rank");
  DCP_CHECK(rms_norm_eps > 0, io, "model config: rms_norm_eps must be > 0");
  DCP_CHECK(rope_theta > 0, io, "model config: rope_theta must be > 0");
}

namespace {

template <typename T>
T get(const nlohmann::json& j, const char* key) {
  DCP_CHECK(j.contains(key) && !j[key].is_null(), io, "config.json: missing field '", key, "'");
  try {
    return j[key].get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCategory::io,
                str("config.json: field '", key, "' has the wrong type: ", e.what()));
  }
}

template <typename T>
T get_or(const nlohmann::json& j, const char* key, T fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return get<T>(j, key);
}

}  // namespace

ModelConfig parse_model_config(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCategory::io, str("config.json is not valid JSON: ", e.what()));
  }
  DCP_CHECK(j.is_object(), io, "config.json must hold a JSON object");
  ModelConfig c;
  c.name = get_or<std::string>(j, "model_type", "deepseek_v3");
  c.vocab_size = get<int>(j, "vocab_size");
  c.hidden_size = get<int>(j, "hidden_size");
  c.intermediate_size = get<int>(j, "intermediate_size");
  c.num_hidden_layers = get<int>(j, "num_hidden_layers");
  c.num_attention_heads = get<int>(j, "num_attention_heads");
  if (j.contains("q_lora_rank") && !j["q_lora_rank"].is_null())
    c.q_lora_rank = get<int>(j, "q_lora_rank");
  c.kv_lora_rank = get<int>(j, "kv_lora_rank");
  c.qk_nope_head_dim = get<int>(j, "qk_nope_head_dim");
  c.qk_rope_head_dim = get<int>(j, "qk_rope_head_dim");
  c.v_head_dim = get<int>(j, "v_head_dim");
  c.rms_norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6);
  c.rope_theta = get_or<double>(j, "rope_theta", 10000.0);
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    const auto& rs = j["rope_scaling"];
    const std::string type =
        get_or<std::string>(rs, "type", get_or<std::string>(rs, "rope_type", ""));
    DCP_CHECK(type == "yarn", unsupported, "config.json: rope_scaling type '", type,
              "' is not supported (legal: yarn)");
    RopeScaling s;
    s.factor = get<double>(rs, "factor");
    s.original_max_position_embeddings =
        get_or<double>(rs, "original_max_position_embeddings", 4096);
    s.beta_fast = get_or<double>(rs, "beta_fast", 32);
    s.beta_slow = get_or<double>(rs, "beta_slow", 1);
    s.mscale = get_or<double>(rs, "mscale", 1);
    s.mscale_all_dim = get_or<double>(rs, "mscale_all_dim", 0);
    c.rope_scaling = s;
  }
  c.skip_rope = get_or<bool>(j, "skip_rope", false);
  c.attn_output_gate = get_or<bool>(j, "attn_output_gate", false);
  c.quantized = j.contains("quantization_config") && !j["quantization_config"].is_null();
  c.n_routed_experts = get_or<int>(j, "n_routed_experts", 0);
  c.first_k_dense_replace = get_or<int>(j, "first_k_dense_replace", 0);
  c.moe_layer_freq = get_or<int>(j, "moe_layer_freq", 1);
  c.validate();
  return c;
}

std::string model_config_to_json(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {"DeepseekV3ForCausalLM"};
  j["model_type"] = c.name;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["q_lora_rank"] =
      c.q_lora_rank ? nlohmann::ordered_json(*c.q_lora_rank) : nlohmann::ordered_json(nullptr);
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling) {
    const RopeScaling& s = *c.rope_scaling;
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", s.factor},
                         {"original_max_position_embeddings", s.original_max_position_embeddings},
                         {"beta_fast", s.beta_fast},
                         {"beta_slow", s.beta_slow},
                         {"mscale", s.mscale},
                         {"mscale_all_dim", s.mscale_all_dim}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (c.skip_rope) j["skip_rope"] = true;
  if (c.attn_output_gate) j["attn_output_gate"] = true;
  j["n_routed_experts"] = c.n_routed_experts > 0 ? nlohmann::ordered_json(c.n_routed_experts)
                                                 : nlohmann::ordered_json(nullptr);
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["moe_layer_freq"] = c.moe_layer_freq;
  return j.dump(2);
}

ModelConfig preset_config(const std::string& name, int num_layers) {
  DCP_ARG_CHECK(num_layers >= 0, "num_layers = ", num_layers, " must be >= 0 (0: the preset's)");
  ModelConfig c;
  c.name = name;
  if (name == "tiny") {
    // Small and fast, but with every feature on the path: q_lora, YaRN, 8 heads.
    c.vocab_size = 512;
    c.hidden_size = 128;
    c.intermediate_size = 256;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 8;
    c.q_lora_rank = 64;
    c.kv_lora_rank = 64;
    c.qk_nope_head_dim = 32;
    c.qk_rope_head_dim = 16;
    c.v_head_dim = 32;
    c.rope_theta = 10000;
    c.rope_scaling = RopeScaling{4.0, 1024, 32, 1, 1.0, 1.0};
  } else if (name == "deepseek-v3") {
    // DeepSeek-V3's attention geometry; a small dense MLP and vocabulary.
    c.vocab_size = 4096;
    c.hidden_size = 7168;
    c.intermediate_size = 1024;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 128;
    c.q_lora_rank = 1536;
    c.kv_lora_rank = 512;
    c.qk_nope_head_dim = 128;
    c.qk_rope_head_dim = 64;
    c.v_head_dim = 128;
    c.rope_theta = 10000;
    c.rope_scaling = RopeScaling{40, 4096, 32, 1, 1.0, 1.0};
  } else if (name == "kimi-k3") {
    // Kimi-K3's attention: DeepSeek-V3's latent geometry with 96 heads, an output gate and no
    // rotary embedding.
    c = preset_config("deepseek-v3");
    c.name = name;
    c.num_attention_heads = 96;
    c.rope_theta = 50000;
    c.rope_scaling.reset();
    c.skip_rope = true;
    c.attn_output_gate = true;
  } else {
    throw Error(ErrorCategory::invalid_argument,
                str("preset = '", name, "' is not one of: tiny, deepseek-v3, kimi-k3"));
  }
  if (num_layers > 0) c.num_hidden_layers = num_layers;
  return c;
}

}  // namespace dcp

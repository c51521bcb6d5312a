// Model geometry: the fields of a Hugging Face DeepSeek-V2/V3 config.json that dcp uses, plus
// the Kimi-K3 extensions (output gate, skip_rope), and the synthetic presets.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dcp {

struct RopeScaling {  // rope_scaling with type "yarn"
  double factor = 1.0;
  double original_max_position_embeddings = 4096;
  double beta_fast = 32;
  double beta_slow = 1;
  double mscale = 1;
  double mscale_all_dim = 0;
};

struct ModelConfig {
  std::string name = "custom";
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;  // dense MLP
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  std::optional<int> q_lora_rank;  // null: plain q_proj (DeepSeek-V2-Lite)
  int kv_lora_rank = 512;
  int qk_nope_head_dim = 128;
  int qk_rope_head_dim = 64;
  int v_head_dim = 128;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  std::optional<RopeScaling> rope_scaling;
  bool skip_rope = false;         // Kimi-K3: no rotary embedding
  bool attn_output_gate = false;  // Kimi-K3: x * sigmoid(g_proj(hidden)) before o_proj
  bool quantized = false;         // config has quantization_config
  // Mixture of experts: layer i is MoE iff n_routed_experts > 0, i >= first_k_dense_replace and
  // i % moe_layer_freq == 0. dcp runs dense layers only.
  int n_routed_experts = 0;
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;

  int q_head_dim() const noexcept { return qk_nope_head_dim + qk_rope_head_dim; }
  int latent_width() const noexcept { return kv_lora_rank + qk_rope_head_dim; }
  bool is_moe_layer(int layer) const noexcept {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && moe_layer_freq > 0 &&
           layer % moe_layer_freq == 0;
  }
  // 1/sqrt(q_head_dim), times mscale^2 under YaRN with mscale_all_dim (as DeepSeek does).
  double softmax_scale() const;
  // Throws dcp::Error naming the field when a value is out of range.
  void validate() const;
};

// Parses a config.json text; throws dcp::Error(io) on malformed JSON or missing fields.
ModelConfig parse_model_config(const std::string& json_text);
std::string model_config_to_json(const ModelConfig& c);

// Presets with synthetic weights: "tiny", "deepseek-v3", "kimi-k3". num_layers overrides the
// layer count when > 0. Throws naming the legal presets otherwise.
ModelConfig preset_config(const std::string& name, int num_layers = 0);

// YaRN helper (DeepSeek): 0.1 * mscale * ln(scale) + 1 for scale > 1, else 1.
double yarn_get_mscale(double scale, double mscale);

}  // namespace dcp

// Model geometry: the fields of a Hugging Face DeepSeek-V2/V3 (and Kimi-K2, Moonlight) or
// MiniCPM3 config.json that dcp uses, plus the Kimi-K3 extensions (output gate, skip_rope), and
// the synthetic presets.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dcp {

struct RopeScaling {  // rope_scaling with type "yarn"
  double factor = 1.0;
  double original_max_position_embeddings = 4096;
  double beta_fast = 32;
  double beta_slow = 1;
  double mscale = 1;
  double mscale_all_dim = 0;
};

// rope_scaling with type "longrope" (MiniCPM3): each rotary frequency divided by its factor,
// short_factor at positions below original_max_position_embeddings and long_factor from there
// (vLLM's choice per position), cos and sin times attention_factor.
struct LongRope {
  std::vector<double> short_factor, long_factor;  // qk_rope_head_dim / 2 each
  double original_max_position_embeddings = 0;
  // rope_scaling.attention_factor, else sqrt(1 + ln(s) / ln(original)) for
  // s = max_position_embeddings / original > 1, else 1.
  double attention_factor = 1.0;
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
  std::optional<LongRope> longrope;  // instead of rope_scaling, never both
  // DeepSeek's rotary embedding takes the rope dims as interleaved pairs (x0, x1), (x2, x3), ...;
  // MiniCPM3's as two halves (x[i], x[i + d/2]), GPT-NeoX style.
  bool rope_interleaved = true;
  // The context the model was trained for (with YaRN: factor x original): prompt and generated
  // tokens together may not pass it. Absent from config.json: the Hugging Face config class's
  // default (2048 for deepseek_v2, 4096 otherwise), as Transformers and vLLM read it.
  int max_position_embeddings = 163840;
  bool skip_rope = false;         // Kimi-K3: no rotary embedding
  bool attn_output_gate = false;  // Kimi-K3: x * sigmoid(g_proj(hidden)) before o_proj
  // MiniCPM's muP scaling (model_type minicpm3): embeddings times scale_emb, each attention and
  // MLP output times scale_depth / sqrt(num_hidden_layers) before it joins the residual, the
  // final hidden state divided by hidden_size / dim_model_base before lm_head. 1 elsewhere.
  double scale_emb = 1.0;
  double scale_depth = 1.0;
  double dim_model_base = 1.0;
  // lm_head is model.embed_tokens. Absent from config.json: tied when the checkpoint has no
  // lm_head.weight (Transformers ties by default and saves a tied head once; DeepSeek's configs
  // say false).
  std::optional<bool> tie_word_embeddings;
  // Whether lm_head reads the embedding, for weights that have (or lack) lm_head.weight.
  bool ties(bool has_lm_head) const noexcept { return tie_word_embeddings.value_or(!has_lm_head); }
  // The family, from model_type: deepseek_v2 (V2, V2-Lite), deepseek_v3 (V3, R1, Moonlight),
  // kimi_k2 or minicpm3; architectures[0] is DeepseekV2ForCausalLM, DeepseekV3ForCausalLM or
  // MiniCPM3ForCausalLM.
  std::string model_type = "deepseek_v3";
  std::string architecture = "DeepseekV3ForCausalLM";
  // quantization_config: "" (none), "fp8" (E4M3 weights with F32 weight_scale_inv blocks) or
  // "compressed-tensors" (Kimi-K2-Thinking: symmetric INT4 weights packed eight to an int32, one
  // scale per group of int4_group_size columns of a row).
  std::string quant_method;
  int weight_block_rows = 128, weight_block_cols = 128;  // weight_block_size
  bool quantized = false;                                // FP8 projections: quant_method fp8
  // compressed-tensors: config_groups' weights.group_size, and `ignore`: the Linear modules left
  // unquantized, each a module name or, after "re:", a regular expression matched from the start
  // of the name (as Python's re.match).
  int int4_group_size = 0;
  std::vector<std::string> int4_ignore;
  // Mixture of experts: layer i is MoE iff n_routed_experts > 0, i >= first_k_dense_replace and
  // i % moe_layer_freq == 0.
  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;
  std::string scoring_func = "softmax";  // softmax (deepseek_v2) or sigmoid (v3, kimi_k2)
  std::string topk_method = "greedy";    // greedy, group_limited_greedy (v2) or noaux_tc (v3)
  int n_group = 1;
  int topk_group = 1;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  // Multi-token-prediction layers stored after the main ones (tensors of layer
  // num_hidden_layers and up): not part of the main model, skipped.
  int num_nextn_predict_layers = 0;

  // DeepSeek-V2's gate scales by routed_scaling_factor only when it does not normalise; V3's
  // (and Kimi-K2's) always does.
  bool scale_always() const noexcept { return model_type != "deepseek_v2"; }
  bool mup() const noexcept { return model_type == "minicpm3"; }
  // What an attention or MLP output is multiplied by before it joins the residual stream.
  double residual_scale() const noexcept;
  // What the final normed hidden state is multiplied by before lm_head.
  double logit_scale() const noexcept;
  int q_head_dim() const noexcept { return qk_nope_head_dim + qk_rope_head_dim; }
  int latent_width() const noexcept { return kv_lora_rank + qk_rope_head_dim; }
  bool is_moe_layer(int layer) const noexcept {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && moe_layer_freq > 0 &&
           layer % moe_layer_freq == 0;
  }
  // compressed-tensors: whether `module` (a Linear's name, e.g. "model.layers.1.mlp.experts.0.
  // up_proj") is left unquantized by int4_ignore; throws naming the entry for a bad expression.
  bool int4_ignores(const std::string& module) const;
  // 1/sqrt(q_head_dim), times mscale^2 under YaRN with mscale_all_dim (as DeepSeek does).
  double softmax_scale() const;
  // Throws dcp::Error naming the field when a value is out of range.
  void validate() const;

 private:
  void validate_int4() const;
};

// Parses a config.json text; throws dcp::Error(io) on malformed JSON or missing fields.
ModelConfig parse_model_config(const std::string& json_text);
std::string model_config_to_json(const ModelConfig& c);

// Geometries for synthetic weights (num_layers overrides the layer count when > 0):
//   tiny                  small and fast, every attention feature on the path
//   deepseek-v2-lite, deepseek-v3, kimi-k2, kimi-k2-thinking, moonlight
//                         the published configs at full width: MoE layers where the model has
//                         them, FP8 projections for deepseek-v3 and kimi-k2, INT4 routed experts
//                         for kimi-k2-thinking
//   minicpm3-4b           MiniCPM3-4B's geometry (dense, muP scaling), without its LongRoPE
//                         factors
//   deepseek-v3-attn      DeepSeek-V3's attention with a small dense MLP and vocabulary
//   kimi-k3               Kimi-K3's attention (96 heads, output gate, no RoPE), small MLP
// Throws naming the legal presets otherwise.
ModelConfig preset_config(const std::string& name, int num_layers = 0);
// The presets preset_config knows, comma-separated.
const char* preset_names() noexcept;

// The MLA families as published, scaled down so that a random checkpoint of one runs in seconds:
// "deepseek-v2-lite", "deepseek-v2", "deepseek-v3", "kimi-k2", "kimi-k2-thinking", "moonlight",
// "minicpm3" (dense, LongRoPE over a trained context cut to 16 tokens, muP scaling).
// Each keeps its family's config fields (model_type, architecture, routing, q-LoRA or not, RoPE,
// weight dtype: FP8 block-quantized for deepseek-v3 and kimi-k2, INT4 routed experts for
// kimi-k2-thinking) and the real ratios where it can (experts per token, groups); widths and
// counts are small. Throws naming the legal families otherwise.
ModelConfig family_config(const std::string& family);
// The families family_config knows, comma-separated.
const char* family_names() noexcept;

// Kimi-K2-Thinking's quantization_config on `c`: its routed experts in compressed-tensors INT4
// (groups of 32 columns); attention, shared experts, dense MLPs and lm_head left in 16 bits.
void quantize_experts_int4(ModelConfig& c);

// YaRN helper (DeepSeek): 0.1 * mscale * ln(scale) + 1 for scale > 1, else 1.
double yarn_get_mscale(double scale, double mscale);

}  // namespace dcp

#include "dcp/model_config.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "dcp/error.h"
#include "ignore_pattern.h"

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

double ModelConfig::residual_scale() const noexcept {
  return mup() ? scale_depth / std::sqrt(static_cast<double>(num_hidden_layers)) : 1.0;
}

double ModelConfig::logit_scale() const noexcept {
  return mup() ? dim_model_base / static_cast<double>(hidden_size) : 1.0;
}

void ModelConfig::validate() const {
  const auto positive = [](int v, const char* field) {
    DCP_CHECK(v >= 1, io, "model config: ", field, " = ", v, " must be >= 1");
  };
  positive(vocab_size, "vocab_size");
  positive(max_position_embeddings, "max_position_embeddings");
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
  DCP_CHECK(rms_norm_eps > 0 && std::isfinite(rms_norm_eps), io, "model config: rms_norm_eps = ",
            rms_norm_eps, " must be a finite number > 0");
  DCP_CHECK(rope_theta > 0 && std::isfinite(rope_theta), io, "model config: rope_theta = ",
            rope_theta, " must be a finite number > 0");
  if (rope_scaling) {
    const RopeScaling& r = *rope_scaling;
    const auto finite_positive = [](double v, const char* field) {
      DCP_CHECK(v > 0 && std::isfinite(v), io, "model config: rope_scaling.", field, " = ", v,
                " must be a finite number > 0");
    };
    finite_positive(r.factor, "factor");
    finite_positive(r.original_max_position_embeddings, "original_max_position_embeddings");
    finite_positive(r.beta_fast, "beta_fast");
    finite_positive(r.beta_slow, "beta_slow");
    DCP_CHECK(std::isfinite(r.mscale) && std::isfinite(r.mscale_all_dim) && r.mscale >= 0 &&
                  r.mscale_all_dim >= 0,
              io, "model config: rope_scaling.mscale = ", r.mscale, " and mscale_all_dim = ",
              r.mscale_all_dim, " must be finite numbers >= 0");
  }
  if (longrope) {
    const LongRope& r = *longrope;
    DCP_CHECK(!rope_scaling, io, "model config: rope_scaling is either yarn or longrope, not both");
    const std::size_t half = static_cast<std::size_t>(qk_rope_head_dim / 2);
    for (const auto& [factors, field] :
         {std::pair{&r.short_factor, "short_factor"}, std::pair{&r.long_factor, "long_factor"}}) {
      DCP_CHECK(factors->size() == half, io, "model config: rope_scaling.", field, " holds ",
                factors->size(), " factors; qk_rope_head_dim / 2 = ", half, " are needed");
      for (double f : *factors) {
        DCP_CHECK(f > 0 && std::isfinite(f), io, "model config: rope_scaling.", field, " holds ", f,
                  "; every factor must be a finite number > 0");
      }
    }
    DCP_CHECK(r.original_max_position_embeddings >= 1 &&
                  r.original_max_position_embeddings <= 2147483647.0,
              io, "model config: rope_scaling.original_max_position_embeddings = ",
              r.original_max_position_embeddings, " must be in [1, 2^31)");
    DCP_CHECK(r.attention_factor > 0 && std::isfinite(r.attention_factor), io,
              "model config: rope_scaling.attention_factor = ", r.attention_factor,
              " must be a finite number > 0");
  }
  DCP_CHECK(model_type == "deepseek_v2" || model_type == "deepseek_v3" || model_type == "kimi_k2" ||
                model_type == "minicpm3",
            unsupported, "model config: model_type = '", model_type,
            "' is not an MLA family dcp runs (legal: deepseek_v2, deepseek_v3, kimi_k2, "
            "minicpm3)");
  if (mup()) {
    DCP_CHECK(architecture == "MiniCPM3ForCausalLM", unsupported,
              "model config: architectures = ['", architecture,
              "'] is not the architecture of model_type minicpm3 (legal: MiniCPM3ForCausalLM)");
    DCP_CHECK(n_routed_experts == 0, unsupported,
              "model config: n_routed_experts = ", n_routed_experts,
              " for minicpm3, whose layers are all dense (legal: 0)");
    for (const auto& [v, field] :
         {std::pair{scale_emb, "scale_emb"}, std::pair{scale_depth, "scale_depth"},
          std::pair{dim_model_base, "dim_model_base"}}) {
      DCP_CHECK(v > 0 && std::isfinite(v), io, "model config: ", field, " = ", v,
                " must be a finite number > 0");
    }
  } else {
    DCP_CHECK(architecture == "DeepseekV2ForCausalLM" || architecture == "DeepseekV3ForCausalLM",
              unsupported, "model config: architectures = ['", architecture,
              "'] is not an MLA architecture dcp runs for model_type ", model_type,
              " (legal: DeepseekV2ForCausalLM, DeepseekV3ForCausalLM)");
  }
  DCP_CHECK(quant_method.empty() || quant_method == "fp8" || quant_method == "compressed-tensors",
            unsupported, "model config: quantization_config.quant_method = '", quant_method,
            "' is not supported (legal: fp8, compressed-tensors, or no quantization_config)");
  if (quant_method == "fp8") {
    positive(weight_block_rows, "quantization_config.weight_block_size[0]");
    positive(weight_block_cols, "quantization_config.weight_block_size[1]");
  }
  DCP_CHECK(n_routed_experts >= 0, io, "model config: n_routed_experts = ", n_routed_experts,
            " must be >= 0");
  DCP_CHECK(first_k_dense_replace >= 0, io,
            "model config: first_k_dense_replace = ", first_k_dense_replace, " must be >= 0");
  positive(moe_layer_freq, "moe_layer_freq");
  DCP_CHECK(num_nextn_predict_layers >= 0, io,
            "model config: num_nextn_predict_layers = ", num_nextn_predict_layers, " must be >= 0");
  if (n_routed_experts > 0) {
    positive(moe_intermediate_size, "moe_intermediate_size");
    DCP_CHECK(num_experts_per_tok >= 1 && num_experts_per_tok <= n_routed_experts, io,
              "model config: num_experts_per_tok = ", num_experts_per_tok, " must be in [1, ",
              n_routed_experts, "] (n_routed_experts)");
    DCP_CHECK(n_shared_experts >= 0, io, "model config: n_shared_experts = ", n_shared_experts,
              " must be >= 0");
    DCP_CHECK(n_group >= 1 && n_routed_experts % n_group == 0, io,
              "model config: n_group = ", n_group,
              " must be >= 1 and divide n_routed_experts = ", n_routed_experts);
    DCP_CHECK(topk_group >= 1 && topk_group <= n_group, io,
              "model config: topk_group = ", topk_group, " must be in [1, n_group = ", n_group,
              "]");
    DCP_CHECK(routed_scaling_factor > 0 && std::isfinite(routed_scaling_factor), io,
              "model config: routed_scaling_factor = ", routed_scaling_factor, " must be > 0");
    const bool v2 = model_type == "deepseek_v2";
    DCP_CHECK(scoring_func == (v2 ? "softmax" : "sigmoid"), unsupported,
              "model config: scoring_func = '", scoring_func, "' is not supported for ", model_type,
              " (legal: ", v2 ? "softmax" : "sigmoid", ")");
    DCP_CHECK(v2 ? (topk_method == "greedy" || topk_method == "group_limited_greedy")
                 : topk_method == "noaux_tc",
              unsupported, "model config: topk_method = '", topk_method, "' is not supported for ",
              model_type, " (legal: ", v2 ? "greedy, group_limited_greedy" : "noaux_tc", ")");
    if (topk_method != "greedy") {
      const int per_group = n_routed_experts / n_group;
      DCP_CHECK(topk_method != "noaux_tc" || per_group >= 2, io,
                "model config: noaux_tc scores a group by its top 2 experts; n_routed_experts / "
                "n_group = ",
                per_group, " must be >= 2");
      DCP_CHECK(num_experts_per_tok <= topk_group * per_group, io,
                "model config: num_experts_per_tok = ", num_experts_per_tok,
                " exceeds the experts of topk_group = ", topk_group, " groups");
    }
  }
  if (quant_method == "compressed-tensors") validate_int4();
}

bool ModelConfig::int4_ignores(const std::string& module) const {
  for (const std::string& entry : int4_ignore) {
    if (entry.rfind("re:", 0) != 0) {
      if (entry == module) return true;
      continue;
    }
    if (ignore_pattern_matches(entry.substr(3), module)) return true;
  }
  return false;
}

void ModelConfig::validate_int4() const {
  DCP_CHECK(int4_group_size >= 32 && int4_group_size % 32 == 0, unsupported,
            "model config: quantization_config.config_groups weights.group_size = ",
            int4_group_size, " is not supported (legal: a multiple of 32)");
  // The columns of every INT4 weight hold whole groups: hidden (the MLPs' gate and up, lm_head)
  // and the MLPs' widths (their down projections). Each kind is asked about by its first layer
  // and expert (every layer would cost a config of 2^31 layers that long; a weight of another
  // layer whose groups do not fit is refused when it loads).
  const auto whole_groups = [&](const std::string& module, std::int64_t columns,
                                const char* field) {
    DCP_CHECK(int4_ignores(module) || columns % int4_group_size == 0, unsupported,
              "model config: ", field, " = ", columns, " (the columns of INT4 ", module,
              ") is not a multiple of quantization_config weights.group_size = ", int4_group_size);
  };
  whole_groups("lm_head", hidden_size, "hidden_size");
  const auto mlp = [&](int layer) {
    if (layer < 0 || layer >= num_hidden_layers) return;
    const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
    const bool moe = is_moe_layer(layer);
    for (const char* m : {"gate_proj", "up_proj"}) {
      whole_groups(p + (moe ? "experts.0." : "") + m, hidden_size, "hidden_size");
    }
    if (!moe) {
      whole_groups(p + "down_proj", intermediate_size, "intermediate_size");
      return;
    }
    whole_groups(p + "experts.0.down_proj", moe_intermediate_size, "moe_intermediate_size");
    if (n_shared_experts > 0) {
      whole_groups(p + "shared_experts.down_proj",
                   std::int64_t{moe_intermediate_size} * n_shared_experts,
                   "moe_intermediate_size x n_shared_experts");
    }
  };
  mlp(0);                      // dense unless every layer is MoE
  if (n_routed_experts > 0) {  // the first MoE layer
    mlp((std::max(first_k_dense_replace, 0) + moe_layer_freq - 1) / moe_layer_freq *
        moe_layer_freq);
  }
}

namespace {

template <typename T>
T get(const nlohmann::json& j, const char* key) {
  DCP_CHECK(j.contains(key) && !j[key].is_null(), io, "config.json: missing field '", key, "'");
  const nlohmann::json& v = j[key];
  if constexpr (std::is_same_v<T, int>) {  // an integer, exactly: never 128.7 as 128
    DCP_CHECK(v.is_number_integer(), io, "config.json: field '", key, "' = ", v.dump(),
              " must be an integer");
    const auto wide = v.is_number_unsigned() ? static_cast<long double>(v.get<std::uint64_t>())
                                             : static_cast<long double>(v.get<std::int64_t>());
    DCP_CHECK(wide >= std::numeric_limits<int>::min() && wide <= std::numeric_limits<int>::max(),
              io, "config.json: field '", key, "' = ", v.dump(), " is out of range");
    return static_cast<int>(wide);
  }
  if constexpr (std::is_same_v<T, bool>) {
    DCP_CHECK(v.is_boolean(), io, "config.json: field '", key, "' = ", v.dump(),
              " must be true or false");
  }
  if constexpr (std::is_same_v<T, double>) {
    DCP_CHECK(v.is_number(), io, "config.json: field '", key, "' = ", v.dump(),
              " must be a number");
  }
  try {
    return v.get<T>();
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

// o[key], or null when o has no such key.
nlohmann::json field(const nlohmann::json& o, const char* key) {
  return o.contains(key) ? o[key] : nlohmann::json();
}

// compressed-tensors' pack-quantized INT4, as Kimi-K2-Thinking ships its experts: one group of
// Linear targets with symmetric 4-bit integer weights, a scale per group of columns, activations
// unquantized. Every field that changes what the weights mean is read: a value dcp does not run
// is refused by name.
void parse_compressed_tensors(const nlohmann::json& q, ModelConfig& c) {
  const auto refuse_unless = [](bool ok, const std::string& field, const nlohmann::json& v,
                                const char* legal) {
    DCP_CHECK(ok, unsupported, "config.json: quantization_config.", field, " = ", v.dump(),
              " is not supported (legal: ", legal, ")");
  };
  const nlohmann::json format = field(q, "format");
  refuse_unless(format == "pack-quantized", "format", format, "\"pack-quantized\"");
  const nlohmann::json status = field(q, "quantization_status");
  refuse_unless(status.is_null() || status == "compressed", "quantization_status", status,
                "\"compressed\"");
  for (const char* key : {"kv_cache_scheme", "sparsity_config", "transform_config"}) {
    const nlohmann::json v = field(q, key);
    refuse_unless(v.is_null() || (v.is_object() && v.empty()), key, v, "null");
  }
  const nlohmann::json groups = field(q, "config_groups");
  DCP_CHECK(groups.is_object() && groups.size() == 1, unsupported,
            "config.json: quantization_config.config_groups = ", groups.dump(),
            " is not supported (legal: an object of one group)");
  const std::string name = groups.begin().key();
  const nlohmann::json& g = groups.begin().value();
  const std::string at = "config_groups." + name + ".";
  DCP_CHECK(g.is_object(), io, "config.json: quantization_config.", at, " must be an object");
  refuse_unless(field(g, "targets") == nlohmann::json::array({"Linear"}), at + "targets",
                field(g, "targets"), "[\"Linear\"]");
  refuse_unless(field(g, "format").is_null() || field(g, "format") == "pack-quantized",
                at + "format", field(g, "format"), "\"pack-quantized\"");
  for (const char* key : {"input_activations", "output_activations"}) {
    refuse_unless(field(g, key).is_null(), at + key, field(g, key),
                  "null: weight-only quantization");
  }
  const nlohmann::json w = field(g, "weights");
  DCP_CHECK(w.is_object(), io, "config.json: quantization_config.", at,
            "weights must be an object");
  const std::string wat = at + "weights.";
  refuse_unless(field(w, "num_bits") == 4, wat + "num_bits", field(w, "num_bits"), "4");
  refuse_unless(field(w, "type") == "int", wat + "type", field(w, "type"), "\"int\"");
  refuse_unless(field(w, "symmetric") == true, wat + "symmetric", field(w, "symmetric"), "true");
  refuse_unless(field(w, "strategy") == "group", wat + "strategy", field(w, "strategy"),
                "\"group\"");
  refuse_unless(field(w, "dynamic").is_null() || field(w, "dynamic") == false, wat + "dynamic",
                field(w, "dynamic"), "false");
  for (const char* key : {"actorder", "block_structure", "zp_dtype"}) {
    refuse_unless(field(w, key).is_null(), wat + key, field(w, key), "null");
  }
  const nlohmann::json scale_dtype = field(w, "scale_dtype");
  refuse_unless(scale_dtype.is_null() || scale_dtype == "torch.bfloat16" ||
                    scale_dtype == "torch.float16" || scale_dtype == "torch.float32",
                wat + "scale_dtype", scale_dtype,
                "null, \"torch.bfloat16\", \"torch.float16\" or \"torch.float32\"");
  const nlohmann::json size = field(w, "group_size");
  DCP_CHECK(size.is_number_integer() && size.get<std::int64_t>() > 0 &&
                size.get<std::int64_t>() <= (1 << 20),
            io, "config.json: quantization_config.", wat, "group_size = ", size.dump(),
            " must be a positive integer");
  c.int4_group_size = size.get<int>();
  const nlohmann::json ignore = field(q, "ignore");
  DCP_CHECK(ignore.is_null() || ignore.is_array(), io,
            "config.json: quantization_config.ignore must be a list of module names");
  c.int4_ignore.clear();
  if (ignore.is_array()) {
    for (const auto& e : ignore) {
      DCP_CHECK(e.is_string(), io, "config.json: quantization_config.ignore holds ", e.dump(),
                ", not a module name (a string)");
      c.int4_ignore.push_back(e.get<std::string>());
    }
  }
}

// rope_scaling of type longrope (or its first name, su): the factors, the original context
// (in rope_scaling or, as Phi-3 has it, beside it) and the attention factor.
LongRope parse_longrope(const nlohmann::json& j, int max_position_embeddings) {
  const nlohmann::json& rs = j["rope_scaling"];
  LongRope r;
  for (const auto& [out, key] :
       {std::pair{&r.short_factor, "short_factor"}, std::pair{&r.long_factor, "long_factor"}}) {
    const nlohmann::json v = field(rs, key);
    DCP_CHECK(v.is_array(), io, "config.json: rope_scaling.", key,
              " must be a list of numbers, got ", v.dump());
    for (const auto& f : v) {
      DCP_CHECK(f.is_number(), io, "config.json: rope_scaling.", key, " holds ", f.dump(),
                ", not a number");
      out->push_back(f.get<double>());
    }
  }
  const nlohmann::json inner = field(rs, "original_max_position_embeddings");
  const nlohmann::json outer = field(j, "original_max_position_embeddings");
  const nlohmann::json& original = inner.is_null() ? outer : inner;
  DCP_CHECK(original.is_number(), io,
            "config.json: rope_scaling.original_max_position_embeddings must be a number (longrope "
            "needs the context it was trained at), got ",
            original.dump());
  r.original_max_position_embeddings = original.get<double>();
  const nlohmann::json factor = field(rs, "attention_factor");
  if (!factor.is_null()) {
    DCP_CHECK(factor.is_number(), io,
              "config.json: rope_scaling.attention_factor must be a "
              "number, got ",
              factor.dump());
    r.attention_factor = factor.get<double>();
  } else {
    const double trained = r.original_max_position_embeddings;
    const double scale = max_position_embeddings / trained;  // ln(1) = 0: no factor for 1
    r.attention_factor =
        trained < 2 || !(scale > 1.0) ? 1.0 : std::sqrt(1.0 + std::log(scale) / std::log(trained));
  }
  return r;
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
  const bool minicpm3 = get_or<std::string>(j, "model_type", "") == "minicpm3";
  // MiniCPM3's value heads default to hidden_size / num_attention_heads, as its config class has.
  c.v_head_dim = minicpm3 && !j.contains("v_head_dim")
                     ? c.hidden_size / std::max(1, c.num_attention_heads)
                     : get<int>(j, "v_head_dim");
  c.rms_norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6);
  c.rope_theta = get_or<double>(j, "rope_theta", 10000.0);
  c.max_position_embeddings = get_or<int>(
      j, "max_position_embeddings",
      get_or<std::string>(j, "model_type", "deepseek_v3") == "deepseek_v2" ? 2048 : 4096);
  DCP_CHECK(
      !j.contains("rope_scaling") || j["rope_scaling"].is_null() || j["rope_scaling"].is_object(),
      io, "config.json: field 'rope_scaling' = ",
      j.contains("rope_scaling") ? j["rope_scaling"].dump() : "",
      " must be an object (type yarn or longrope) or null");
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    const auto& rs = j["rope_scaling"];
    const std::string type =
        get_or<std::string>(rs, "type", get_or<std::string>(rs, "rope_type", ""));
    DCP_CHECK(type == "yarn" || type == "longrope" || type == "su", unsupported,
              "config.json: rope_scaling type '", type,
              "' is not supported (legal: yarn, longrope)");
  }
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object() &&
      get_or<std::string>(j["rope_scaling"], "type",
                          get_or<std::string>(j["rope_scaling"], "rope_type", "")) != "yarn") {
    c.longrope = parse_longrope(j, c.max_position_embeddings);
  } else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    const auto& rs = j["rope_scaling"];
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
  // What the projections and MLPs compute: biases and other activations are not run, so a
  // config asking for them is refused rather than run without them.
  DCP_CHECK(!get_or<bool>(j, "attention_bias", false), unsupported,
            "config.json: attention_bias = true is not supported (legal: false; the attention "
            "projections are run without biases)");
  const std::string act = get_or<std::string>(j, "hidden_act", "silu");
  DCP_CHECK(act == "silu", unsupported, "config.json: hidden_act = '", act,
            "' is not supported (legal: silu)");
  c.skip_rope = get_or<bool>(j, "skip_rope", false);
  if (j.contains("tie_word_embeddings") && !j["tie_word_embeddings"].is_null())
    c.tie_word_embeddings = get<bool>(j, "tie_word_embeddings");
  if (minicpm3) {  // the defaults of MiniCPM's config class
    c.rope_interleaved = false;
    c.scale_emb = get_or<double>(j, "scale_emb", 1.0);
    c.scale_depth = get_or<double>(j, "scale_depth", 1.0);
    c.dim_model_base = get_or<double>(j, "dim_model_base", 1.0);
    DCP_CHECK(get_or<int>(j, "num_experts", 0) == 0, unsupported,
              "config.json: num_experts = ", get_or<int>(j, "num_experts", 0),
              " for minicpm3: MiniCPM's mixture of experts is not an MLA model dcp runs "
              "(legal: 0 or absent)");
  }
  c.attn_output_gate = get_or<bool>(j, "attn_output_gate", false);
  c.model_type = get_or<std::string>(j, "model_type", "deepseek_v3");
  c.name = c.model_type;
  if (j.contains("architectures") && !j["architectures"].is_null()) {
    const auto& a = j["architectures"];
    DCP_CHECK(a.is_array() && a.size() == 1 && a[0].is_string(), io,
              "config.json: field 'architectures' must be a list of one name, got ", a.dump());
    c.architecture = a[0].get<std::string>();
  } else {
    c.architecture = minicpm3                        ? "MiniCPM3ForCausalLM"
                     : c.model_type == "deepseek_v2" ? "DeepseekV2ForCausalLM"
                                                     : "DeepseekV3ForCausalLM";
  }
  if (j.contains("quantization_config") && !j["quantization_config"].is_null()) {
    const auto& q = j["quantization_config"];
    DCP_CHECK(q.is_object(), io, "config.json: field 'quantization_config' must be an object");
    c.quant_method = get<std::string>(q, "quant_method");
    if (c.quant_method == "compressed-tensors") parse_compressed_tensors(q, c);
    if (q.contains("weight_block_size") && !q["weight_block_size"].is_null()) {
      const auto& b = q["weight_block_size"];
      DCP_CHECK(
          b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer(), io,
          "config.json: quantization_config.weight_block_size must be two integers, got ",
          b.dump());
      c.weight_block_rows = b[0].get<int>();
      c.weight_block_cols = b[1].get<int>();
    }
    if (q.contains("activation_scheme")) {  // activations stay fp32: exact for "dynamic" only
      const std::string scheme = get<std::string>(q, "activation_scheme");
      DCP_CHECK(scheme == "dynamic", unsupported,
                "config.json: quantization_config.activation_scheme = '", scheme,
                "' is not supported (legal: dynamic)");
    }
    if (q.contains("fmt")) {
      const std::string fmt = get<std::string>(q, "fmt");
      DCP_CHECK(fmt == "e4m3", unsupported, "config.json: quantization_config.fmt = '", fmt,
                "' is not supported (legal: e4m3)");
    }
  }
  c.quantized = c.quant_method == "fp8";
  c.n_routed_experts = get_or<int>(j, "n_routed_experts", 0);
  c.n_shared_experts = get_or<int>(j, "n_shared_experts", 0);
  c.num_experts_per_tok = get_or<int>(j, "num_experts_per_tok", 0);
  c.moe_intermediate_size = get_or<int>(j, "moe_intermediate_size", 0);
  c.first_k_dense_replace = get_or<int>(j, "first_k_dense_replace", 0);
  c.moe_layer_freq = get_or<int>(j, "moe_layer_freq", 1);
  const bool v2 = c.model_type == "deepseek_v2";
  c.scoring_func = get_or<std::string>(j, "scoring_func", v2 ? "softmax" : "sigmoid");
  c.topk_method = get_or<std::string>(j, "topk_method", v2 ? "greedy" : "noaux_tc");
  c.n_group = get_or<int>(j, "n_group", 1);
  c.topk_group = get_or<int>(j, "topk_group", 1);
  c.norm_topk_prob = get_or<bool>(j, "norm_topk_prob", false);
  c.routed_scaling_factor = get_or<double>(j, "routed_scaling_factor", 1.0);
  c.num_nextn_predict_layers = get_or<int>(j, "num_nextn_predict_layers", 0);
  c.validate();
  return c;
}

std::string model_config_to_json(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {c.architecture};
  j["model_type"] = c.model_type;
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
  j["max_position_embeddings"] = c.max_position_embeddings;
  if (c.rope_scaling) {
    const RopeScaling& s = *c.rope_scaling;
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", s.factor},
                         {"original_max_position_embeddings", s.original_max_position_embeddings},
                         {"beta_fast", s.beta_fast},
                         {"beta_slow", s.beta_slow},
                         {"mscale", s.mscale},
                         {"mscale_all_dim", s.mscale_all_dim}};
  } else if (c.longrope) {
    const LongRope& s = *c.longrope;
    j["rope_scaling"] = {{"type", "longrope"},
                         {"short_factor", s.short_factor},
                         {"long_factor", s.long_factor},
                         {"original_max_position_embeddings", s.original_max_position_embeddings},
                         {"attention_factor", s.attention_factor}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (c.skip_rope) j["skip_rope"] = true;
  if (c.tie_word_embeddings) j["tie_word_embeddings"] = *c.tie_word_embeddings;
  if (c.mup()) {
    j["scale_emb"] = c.scale_emb;
    j["scale_depth"] = c.scale_depth;
    j["dim_model_base"] = c.dim_model_base;
  }
  if (c.attn_output_gate) j["attn_output_gate"] = true;
  j["n_routed_experts"] = c.n_routed_experts > 0 ? nlohmann::ordered_json(c.n_routed_experts)
                                                 : nlohmann::ordered_json(nullptr);
  if (c.n_routed_experts > 0) {
    j["n_shared_experts"] = c.n_shared_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["scoring_func"] = c.scoring_func;
    j["topk_method"] = c.topk_method;
    j["n_group"] = c.n_group;
    j["topk_group"] = c.topk_group;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["routed_scaling_factor"] = c.routed_scaling_factor;
  }
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["moe_layer_freq"] = c.moe_layer_freq;
  if (c.num_nextn_predict_layers > 0) j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  if (c.quant_method == "compressed-tensors") {
    nlohmann::ordered_json weights = {{"num_bits", 4},
                                      {"type", "int"},
                                      {"symmetric", true},
                                      {"strategy", "group"},
                                      {"group_size", c.int4_group_size},
                                      {"dynamic", false},
                                      {"actorder", nullptr}};
    j["quantization_config"] = {{"config_groups",
                                 {{"group_0",
                                   {{"targets", {"Linear"}},
                                    {"weights", weights},
                                    {"input_activations", nullptr},
                                    {"output_activations", nullptr}}}}},
                                {"format", "pack-quantized"},
                                {"ignore", c.int4_ignore},
                                {"kv_cache_scheme", nullptr},
                                {"quant_method", c.quant_method},
                                {"quantization_status", "compressed"}};
  } else if (c.quantized) {
    j["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", c.quant_method},
                                {"weight_block_size", {c.weight_block_rows, c.weight_block_cols}}};
  }
  return j.dump(2);
}

void quantize_experts_int4(ModelConfig& c) {
  c.quant_method = "compressed-tensors";
  c.quantized = false;
  c.int4_group_size = 32;
  c.int4_ignore = {"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                   "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"};
}

const char* family_names() noexcept {
  return "deepseek-v2-lite, deepseek-v2, deepseek-v3, kimi-k2, kimi-k2-thinking, moonlight, "
         "minicpm3";
}

ModelConfig family_config(const std::string& family) {
  ModelConfig c;
  c.name = family;
  // Shared small geometry: 8 heads (TP 1, 2, 4 divide them), a 48+16-wide latent row.
  c.vocab_size = 320;
  c.hidden_size = 96;
  c.intermediate_size = 160;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 8;
  c.kv_lora_rank = 48;
  c.qk_nope_head_dim = 24;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 24;
  c.moe_intermediate_size = 40;
  c.first_k_dense_replace = 1;
  c.moe_layer_freq = 1;
  if (family == "deepseek-v2-lite") {  // 64 experts, 6 per token, 2 shared; no q-LoRA; YaRN
    c.model_type = "deepseek_v2";
    c.architecture = "DeepseekV2ForCausalLM";
    c.q_lora_rank.reset();
    c.rope_scaling = RopeScaling{40, 4096, 32, 1, 0.707, 0.707};
    c.n_routed_experts = 16;
    c.num_experts_per_tok = 6;
    c.n_shared_experts = 2;
    c.scoring_func = "softmax";
    c.topk_method = "greedy";
    c.norm_topk_prob = false;
    c.routed_scaling_factor = 1.0;
  } else if (family == "deepseek-v2") {  // 160 experts in 8 groups, 3 kept, 6 per token, x16
    c.model_type = "deepseek_v2";
    c.architecture = "DeepseekV2ForCausalLM";
    c.q_lora_rank = 48;
    c.rope_scaling = RopeScaling{40, 4096, 32, 1, 0.707, 0.707};
    c.n_routed_experts = 32;
    c.n_group = 8;
    c.topk_group = 3;
    c.num_experts_per_tok = 6;
    c.n_shared_experts = 2;
    c.scoring_func = "softmax";
    c.topk_method = "group_limited_greedy";
    c.norm_topk_prob = false;
    c.routed_scaling_factor = 16.0;
  } else if (family == "deepseek-v3") {  // 256 experts in 8 groups, 4 kept, 8 per token; FP8
    c.model_type = "deepseek_v3";
    c.architecture = "DeepseekV3ForCausalLM";
    c.q_lora_rank = 48;
    c.rope_scaling = RopeScaling{40, 4096, 32, 1, 1.0, 1.0};
    c.n_routed_experts = 32;
    c.n_group = 8;
    c.topk_group = 4;
    c.num_experts_per_tok = 8;
    c.n_shared_experts = 1;
    c.scoring_func = "sigmoid";
    c.topk_method = "noaux_tc";
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.5;
    c.num_nextn_predict_layers = 1;
    c.quant_method = "fp8";
    c.weight_block_rows = c.weight_block_cols = 32;  // partial edge blocks at these widths
  } else if (family == "kimi-k2" || family == "kimi-k2-thinking") {
    // 384 experts in 1 group, 8 per token, x2.827; FP8, or Thinking's INT4 experts
    c.model_type = "kimi_k2";
    c.architecture = "DeepseekV3ForCausalLM";
    c.q_lora_rank = 48;
    c.rope_theta = 50000;
    c.rope_scaling = RopeScaling{32, 4096, 1, 1, 1.0, 1.0};
    c.n_routed_experts = 24;
    c.num_experts_per_tok = 8;
    c.n_shared_experts = 1;
    c.scoring_func = "sigmoid";
    c.topk_method = "noaux_tc";
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.827;
    c.max_position_embeddings = 131072;
    if (family == "kimi-k2") {
      c.quant_method = "fp8";
      c.weight_block_rows = c.weight_block_cols = 32;
    } else {
      quantize_experts_int4(c);
      c.moe_intermediate_size = 128;  // whole groups of 32 in each rank's slice at TP 1, 2, 4
    }
  } else if (family == "moonlight") {  // 64 experts in 1 group, 6 per token, 2 shared; no q-LoRA
    c.model_type = "deepseek_v3";
    c.architecture = "DeepseekV3ForCausalLM";
    c.q_lora_rank.reset();
    c.rope_theta = 50000;
    c.n_routed_experts = 16;
    c.num_experts_per_tok = 6;
    c.n_shared_experts = 2;
    c.scoring_func = "sigmoid";
    c.topk_method = "noaux_tc";
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.446;
    c.max_position_embeddings = 8192;
  } else if (family == "minicpm3") {
    // Dense, q-LoRA, GPT-NeoX rotary halves with LongRoPE, muP scaling (12, 1.4, 256). The
    // trained context is cut to 16 so that a short test crosses into the long factors.
    c.model_type = "minicpm3";
    c.architecture = "MiniCPM3ForCausalLM";
    c.q_lora_rank = 48;
    c.rms_norm_eps = 1e-5;
    c.rope_interleaved = false;
    c.max_position_embeddings = 8192;
    LongRope r;
    r.short_factor = {1.0, 1.05, 1.2, 1.5, 2.1, 3.4, 5.2, 7.9};
    r.long_factor = {1.0, 1.1, 1.6, 2.9, 5.5, 9.8, 16.0, 24.5};
    r.original_max_position_embeddings = 16;
    r.attention_factor = std::sqrt(1.0 + std::log(8192.0 / 16) / std::log(16.0));
    c.longrope = r;
    c.scale_emb = 12;
    c.scale_depth = 1.4;
    c.dim_model_base = 256;
    c.first_k_dense_replace = 0;
  } else {
    throw Error(ErrorCategory::invalid_argument,
                str("family = '", family, "' is not one of: ", family_names()));
  }
  c.quantized = c.quant_method == "fp8";
  c.validate();
  return c;
}

const char* preset_names() noexcept {
  return "tiny, deepseek-v2-lite, deepseek-v3, kimi-k2, kimi-k2-thinking, moonlight, "
         "minicpm3-4b, deepseek-v3-attn, kimi-k3";
}

namespace {

// DeepSeek-V3's attention layer (q-LoRA 1536, latent 512 + 64, 128 heads), without its MoE.
ModelConfig v3_attention() {
  ModelConfig c;
  c.hidden_size = 7168;
  c.num_attention_heads = 128;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.rope_scaling = RopeScaling{40, 4096, 32, 1, 1.0, 1.0};
  return c;
}

// DeepSeek-V2-Lite's and Moonlight's shared shape: hidden 2048, 16 heads without q-LoRA, 64
// experts (6 per token, 2 shared) of width 1408, the first layer dense.
ModelConfig lite_shape() {
  ModelConfig c;
  c.hidden_size = 2048;
  c.num_hidden_layers = 27;
  c.num_attention_heads = 16;
  c.q_lora_rank.reset();
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.n_routed_experts = 64;
  c.num_experts_per_tok = 6;
  c.n_shared_experts = 2;
  c.moe_intermediate_size = 1408;
  c.first_k_dense_replace = 1;
  return c;
}

// DeepSeek-V3's and Kimi-K2's shared shape: V3's attention, 61 layers, experts of width 2048
// (8 per token, 1 shared), FP8 projections in 128 x 128 blocks.
ModelConfig v3_shape() {
  ModelConfig c = v3_attention();
  c.num_hidden_layers = 61;
  c.intermediate_size = 18432;
  c.num_experts_per_tok = 8;
  c.n_shared_experts = 1;
  c.moe_intermediate_size = 2048;
  c.scoring_func = "sigmoid";
  c.topk_method = "noaux_tc";
  c.norm_topk_prob = true;
  c.quant_method = "fp8";
  c.quantized = true;
  c.weight_block_rows = c.weight_block_cols = 128;
  return c;
}

}  // namespace

ModelConfig preset_config(const std::string& name, int num_layers) {
  DCP_ARG_CHECK(num_layers >= 0, "num_layers = ", num_layers, " must be >= 0 (0: the preset's)");
  ModelConfig c;
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
    // V3's context, so long synthetic contexts run.
    c.max_position_embeddings = 163840;
  } else if (name == "deepseek-v2-lite") {  // deepseek-ai/DeepSeek-V2-Lite
    c = lite_shape();
    c.model_type = "deepseek_v2";
    c.architecture = "DeepseekV2ForCausalLM";
    c.vocab_size = 102400;
    c.intermediate_size = 10944;
    c.rope_scaling = RopeScaling{40, 4096, 32, 1, 0.707, 0.707};
    c.scoring_func = "softmax";
    c.topk_method = "greedy";
    c.norm_topk_prob = false;
    c.routed_scaling_factor = 1.0;
  } else if (name == "moonlight") {  // moonshotai/Moonlight-16B-A3B
    c = lite_shape();
    c.vocab_size = 163840;
    c.intermediate_size = 11264;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 50000;
    c.max_position_embeddings = 8192;
    c.scoring_func = "sigmoid";
    c.topk_method = "noaux_tc";
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.446;
  } else if (name == "deepseek-v3") {  // deepseek-ai/DeepSeek-V3 (and R1)
    c = v3_shape();
    c.vocab_size = 129280;
    c.n_routed_experts = 256;
    c.n_group = 8;
    c.topk_group = 4;
    c.first_k_dense_replace = 3;
    c.routed_scaling_factor = 2.5;
    c.num_nextn_predict_layers = 1;
  } else if (name == "kimi-k2") {  // moonshotai/Kimi-K2-Instruct
    c = v3_shape();
    c.model_type = "kimi_k2";
    c.vocab_size = 163840;
    c.num_attention_heads = 64;
    c.n_routed_experts = 384;
    c.first_k_dense_replace = 1;
    c.routed_scaling_factor = 2.827;
    c.rope_theta = 50000;
    c.rope_scaling = RopeScaling{32, 4096, 1, 1, 1.0, 1.0};
    c.max_position_embeddings = 131072;
  } else if (name == "kimi-k2-thinking") {  // moonshotai/Kimi-K2-Thinking: INT4 experts
    c = preset_config("kimi-k2", 0);
    quantize_experts_int4(c);
    c.rope_scaling = RopeScaling{64, 4096, 1, 1, 1.0, 1.0};
    c.max_position_embeddings = 262144;
  } else if (name == "minicpm3-4b") {  // openbmb/MiniCPM3-4B: dense, 40 heads of a 256 latent
    c.model_type = "minicpm3";
    c.architecture = "MiniCPM3ForCausalLM";
    c.vocab_size = 73448;
    c.hidden_size = 2560;
    c.intermediate_size = 6400;
    c.num_hidden_layers = 62;
    c.num_attention_heads = 40;
    c.q_lora_rank = 768;
    c.kv_lora_rank = 256;
    c.qk_nope_head_dim = 64;
    c.qk_rope_head_dim = 32;
    c.v_head_dim = 64;
    c.rms_norm_eps = 1e-5;
    c.rope_interleaved = false;
    c.max_position_embeddings = 32768;  // the trained context: LongRoPE's short factors (not
                                        // in the preset; a checkpoint brings its own)
    c.scale_emb = 12;
    c.scale_depth = 1.4;
    c.dim_model_base = 256;
  } else if (name == "deepseek-v3-attn") {
    // DeepSeek-V3's attention with a small dense MLP and vocabulary: what the attention and DCP
    // benchmarks run, where the feed-forward half would only add time.
    c = v3_attention();
    c.vocab_size = 4096;
    c.intermediate_size = 1024;
    c.num_hidden_layers = 2;
  } else if (name == "kimi-k3") {
    // Kimi-K3's attention: DeepSeek-V3's latent geometry with 96 heads, an output gate and no
    // rotary embedding; a small dense MLP and vocabulary like deepseek-v3-attn.
    c = v3_attention();
    c.vocab_size = 4096;
    c.intermediate_size = 1024;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 96;
    c.rope_theta = 50000;
    c.rope_scaling.reset();
    c.skip_rope = true;
    c.attn_output_gate = true;
    c.max_position_embeddings = 1048576;  // the contexts its plans are made for
  } else {
    throw Error(ErrorCategory::invalid_argument,
                str("preset = '", name, "' is not one of: ", preset_names()));
  }
  c.name = name;
  if (num_layers > 0) c.num_hidden_layers = num_layers;
  c.validate();
  return c;
}

}  // namespace dcp

// Checkpoint directories: config.json plus safetensors files, optionally with an index.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dcp/error.h"
#include "dcp/weights.h"
#include "safetensors.h"

namespace dcp {
namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  DCP_CHECK(in.good(), io, "cannot read ", p.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class CheckpointWeights final : public WeightSource {
 public:
  explicit CheckpointWeights(const std::string& dir) : dir_(dir) {
    DCP_CHECK(fs::is_directory(dir), io, "model_path = ", dir, " is not a directory");
    std::vector<fs::path> files;
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    if (fs::exists(index)) {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(read_text(index));
      } catch (const nlohmann::json::exception& e) {
        throw Error(ErrorCategory::io, str(index.string(), ": malformed: ", e.what()));
      }
      DCP_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), io, index.string(),
                ": no weight_map");
      std::map<std::string, bool> seen;
      for (const auto& [name, file] : j["weight_map"].items()) {
        const std::string f = file.get<std::string>();
        if (!seen[f]) files.push_back(fs::path(dir) / f);
        seen[f] = true;
      }
    } else {
      for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() == ".safetensors") files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
    }
    DCP_CHECK(!files.empty(), io, "model_path = ", dir, " holds no .safetensors files");
    for (const fs::path& f : files) {
      files_.push_back(std::make_unique<safetensors::File>(f.string()));
      for (const auto& [name, info] : files_.back()->tensors()) {
        DCP_CHECK(where_.count(name) == 0, io, "tensor '", name, "' appears in two files");
        where_[name] = files_.back().get();
      }
    }
  }

  std::vector<float> load(const std::string& name, const std::vector<std::int64_t>& shape,
                          Range rows, Range cols) const override {
    const auto it = where_.find(name);
    DCP_CHECK(it != where_.end(), io, "checkpoint ", dir_, ": missing tensor '", name, "'");
    const auto& info = it->second->tensors().at(name);
    DCP_CHECK(info.shape == shape, io, "checkpoint ", dir_, ": tensor '", name, "' has shape ",
              shape_str(info.shape), ", the model config needs ", shape_str(shape));
    const std::int64_t n_rows = shape[0];
    const std::int64_t n_cols = shape.size() == 2 ? shape[1] : 1;
    return it->second->read(name, rows.whole() ? 0 : rows.begin, rows.whole() ? n_rows : rows.end,
                            cols.whole() ? 0 : cols.begin, cols.whole() ? n_cols : cols.end);
  }
  bool contains(const std::string& name) const override { return where_.count(name) != 0; }
  std::string describe() const override {
    return str("checkpoint ", dir_, " (", files_.size(), " files)");
  }

 private:
  static std::string shape_str(const std::vector<std::int64_t>& s) {
    std::string out = "[";
    for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  }
  std::string dir_;
  std::vector<std::unique_ptr<safetensors::File>> files_;
  std::map<std::string, const safetensors::File*> where_;
};

}  // namespace

std::unique_ptr<WeightSource> open_checkpoint(const std::string& dir) {
  return std::make_unique<CheckpointWeights>(dir);
}

ModelConfig read_checkpoint_config(const std::string& dir) {
  const fs::path p = fs::path(dir) / "config.json";
  DCP_CHECK(fs::exists(p), io, "checkpoint directory ", dir, " has no config.json");
  return parse_model_config(read_text(p));
}

std::vector<std::pair<std::string, std::vector<std::int64_t>>> checkpoint_tensors(
    const ModelConfig& c) {
  using Shape = std::vector<std::int64_t>;
  std::vector<std::pair<std::string, Shape>> t;
  const std::int64_t h = c.hidden_size, heads = c.num_attention_heads;
  t.push_back({"model.embed_tokens.weight", Shape{c.vocab_size, h}});
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "input_layernorm.weight", Shape{h}});
    if (c.q_lora_rank) {
      t.push_back({p + "self_attn.q_a_proj.weight", Shape{*c.q_lora_rank, h}});
      t.push_back({p + "self_attn.q_a_layernorm.weight", Shape{*c.q_lora_rank}});
      t.push_back({p + "self_attn.q_b_proj.weight", Shape{heads * c.q_head_dim(), *c.q_lora_rank}});
    } else {
      t.push_back({p + "self_attn.q_proj.weight", Shape{heads * c.q_head_dim(), h}});
    }
    t.push_back({p + "self_attn.kv_a_proj_with_mqa.weight", Shape{c.latent_width(), h}});
    t.push_back({p + "self_attn.kv_a_layernorm.weight", Shape{c.kv_lora_rank}});
    t.push_back({p + "self_attn.kv_b_proj.weight",
                 Shape{heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}});
    if (c.attn_output_gate)
      t.push_back({p + "self_attn.g_proj.weight", Shape{heads * c.v_head_dim, h}});
    t.push_back({p + "self_attn.o_proj.weight", Shape{h, heads * c.v_head_dim}});
    t.push_back({p + "post_attention_layernorm.weight", Shape{h}});
    const auto mlp = [&](const std::string& prefix, std::int64_t inter) {
      t.push_back({prefix + "gate_proj.weight", Shape{inter, h}});
      t.push_back({prefix + "up_proj.weight", Shape{inter, h}});
      t.push_back({prefix + "down_proj.weight", Shape{h, inter}});
    };
    if (c.is_moe_layer(i)) {
      t.push_back({p + "mlp.gate.weight", Shape{c.n_routed_experts, h}});
      if (c.topk_method == "noaux_tc")
        t.push_back({p + "mlp.gate.e_score_correction_bias", Shape{c.n_routed_experts}});
      for (int e = 0; e < c.n_routed_experts; ++e)
        mlp(p + "mlp.experts." + std::to_string(e) + ".", c.moe_intermediate_size);
      if (c.n_shared_experts > 0)
        mlp(p + "mlp.shared_experts.",
            static_cast<std::int64_t>(c.moe_intermediate_size) * c.n_shared_experts);
    } else {
      mlp(p + "mlp.", c.intermediate_size);
    }
  }
  t.push_back({"model.norm.weight", Shape{h}});
  t.push_back({"lm_head.weight", Shape{c.vocab_size, h}});
  return t;
}

void write_checkpoint(const std::string& dir, const ModelConfig& config, const WeightSource& source,
                      const std::string& dtype, int num_files) {
  DCP_ARG_CHECK(num_files >= 1, "num_files = ", num_files, " must be >= 1");
  std::error_code ec;
  fs::create_directories(dir, ec);
  DCP_CHECK(!ec, io, "cannot create the checkpoint directory ", dir, ": ", ec.message());
  {
    std::ofstream cfg(fs::path(dir) / "config.json");
    cfg << model_config_to_json(config) << "\n";
    DCP_CHECK(cfg.good(), io, "cannot write ", dir, "/config.json");
  }
  const auto tensors = checkpoint_tensors(config);
  std::vector<std::vector<safetensors::NamedTensor>> per_file(static_cast<std::size_t>(num_files));
  nlohmann::ordered_json weight_map;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::size_t f = i * static_cast<std::size_t>(num_files) / tensors.size();
    const auto& [name, shape] = tensors[i];
    per_file[f].push_back({name, shape, source.load(name, shape)});
    weight_map[name] = num_files == 1 ? std::string("model.safetensors")
                                      : str("model-", f + 1, "-of-", num_files, ".safetensors");
  }
  for (int f = 0; f < num_files; ++f) {
    const std::string name = num_files == 1
                                 ? std::string("model.safetensors")
                                 : str("model-", f + 1, "-of-", num_files, ".safetensors");
    safetensors::write_file((fs::path(dir) / name).string(), per_file[f], dtype);
  }
  if (num_files > 1) {
    std::ofstream idx(fs::path(dir) / "model.safetensors.index.json");
    idx << nlohmann::ordered_json{{"metadata", nlohmann::ordered_json::object()},
                                  {"weight_map", weight_map}}
               .dump(2)
        << "\n";
  }
}

}  // namespace dcp

// Checkpoint directories: config.json plus safetensors files (else torch.save's
// pytorch_model.bin), optionally with an index.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dcp/dtype.h"
#include "dcp/error.h"
#include "dcp/weights.h"
#include "safetensors.h"
#include "torch_file.h"

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

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// `prefix.weight` -> `prefix.weight_scale_inv`, where an FP8 weight keeps its block scales.
std::string scale_name(const std::string& weight) {
  return weight + "_scale_inv";
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// Weights are checked as they are read: a NaN or an infinity in a checkpoint (a corrupted or
// badly converted file) would otherwise run silently and serve NaN logits. The error names the
// tensor and the first bad element by its place in the whole tensor.
[[noreturn]] void non_finite(const std::string& dir, const std::string& name, std::int64_t row,
                             std::int64_t col, bool vector, const std::string& value) {
  throw Error(ErrorCategory::io,
              vector ? str("checkpoint ", dir, ": tensor '", name, "' holds ", value, " at [",
                           row, "]")
                     : str("checkpoint ", dir, ": tensor '", name, "' holds ", value, " at [",
                           row, ", ", col, "]"));
}

// values: rows [r0, ...) x cols [c0, c0 + cols) of the tensor, row-major.
void check_finite(const std::vector<float>& values, std::int64_t r0, std::int64_t c0,
                  std::int64_t cols, bool vector, const std::string& dir, const std::string& name) {
  // One branch-free pass over the exponent bits (it vectorises); the search only on failure.
  std::size_t bad = 0;
  for (float v : values) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    bad += (bits & 0x7f800000u) == 0x7f800000u;
  }
  if (bad == 0) return;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      const std::int64_t k = static_cast<std::int64_t>(i);
      non_finite(dir, name, vector ? r0 + k : r0 + k / cols, vector ? 0 : c0 + k % cols, vector,
                 std::isnan(values[i]) ? "NaN" : "an infinity");
    }
  }
}

// Raw BF16 (exponent all ones: infinity or NaN) or FP8 E4M3 (only NaN: 0x7f, 0xff) codes.
void check_finite(const WeightMatrix& m, const std::string& dir, const std::string& name) {
  const std::size_t n = static_cast<std::size_t>(m.rows * m.cols);
  std::size_t bad = n;
  if (m.dtype == WeightDtype::bf16) {
    const auto* v = reinterpret_cast<const std::uint16_t*>(m.data.data());
    std::size_t count = 0;
    for (std::size_t i = 0; i < n; ++i) count += (v[i] & 0x7f80u) == 0x7f80u;
    if (count > 0)
      for (bad = 0; (v[bad] & 0x7f80u) != 0x7f80u;) ++bad;
  } else if (m.dtype == WeightDtype::f8_e4m3) {
    const std::uint8_t* v = m.data.data();
    std::size_t count = 0;
    for (std::size_t i = 0; i < n; ++i) count += (v[i] & 0x7fu) == 0x7fu;
    if (count > 0)
      for (bad = 0; (v[bad] & 0x7fu) != 0x7fu;) ++bad;
  }
  if (bad < n) {
    const std::int64_t k = static_cast<std::int64_t>(bad);
    non_finite(dir, name, m.row0 + k / m.cols, m.col0 + k % m.cols, false,
               m.dtype == WeightDtype::bf16 ? "a non-finite BF16 value" : "an FP8 NaN");
  }
}

class CheckpointWeights final : public WeightSource {
 public:
  explicit CheckpointWeights(const std::string& dir) : dir_(dir) {
    std::error_code ec;
    DCP_CHECK(fs::is_directory(dir, ec), io, "model_path = ", dir, " is not a directory",
              ec ? str(" (", ec.message(), ")") : std::string());
    if (fs::exists(fs::path(dir) / "config.json")) {
      const ModelConfig c = read_checkpoint_config(dir);
      block_rows_ = c.weight_block_rows;
      block_cols_ = c.weight_block_cols;
      int4_group_ = c.quant_method == "compressed-tensors" ? c.int4_group_size : 0;
    }
    // Hugging Face's order: safetensors (indexed, else every file), then torch.save's
    // pytorch_model.bin (indexed, else the one file).
    const fs::path root(dir);
    std::vector<fs::path> files;
    std::map<std::string, std::string> indexed;  // tensor -> the file the index names
    bool torch = false;
    if (fs::exists(root / "model.safetensors.index.json")) {
      files = read_index(root / "model.safetensors.index.json", indexed);
    } else {
      for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() == ".safetensors") files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
      torch = files.empty();
      if (torch && fs::exists(root / "pytorch_model.bin.index.json")) {
        files = read_index(root / "pytorch_model.bin.index.json", indexed);
      } else if (torch && fs::exists(root / "pytorch_model.bin")) {
        files.push_back(root / "pytorch_model.bin");
      }
    }
    DCP_CHECK(!files.empty(), io, "model_path = ", dir,
              " holds no .safetensors files and no pytorch_model.bin");
    for (const fs::path& f : files) {
      if (torch) {
        files_.push_back(std::make_unique<torch_file::File>(f.string()));
      } else {
        files_.push_back(std::make_unique<safetensors::File>(f.string()));
      }
      for (const auto& [name, info] : files_.back()->tensors()) {
        DCP_CHECK(where_.count(name) == 0, io, "tensor '", name, "' appears in two files");
        where_[name] = files_.back().get();
      }
    }
    for (const auto& [name, file] : indexed) {
      const auto it = where_.find(name);
      DCP_CHECK(it != where_.end(), io, "the index of ", dir, " puts tensor '", name, "' in ", file,
                ", which does not hold it");
      DCP_CHECK(fs::path(it->second->path()).filename() == file, io, "the index of ", dir,
                " puts tensor '", name, "' in ", file, ", but it is in ",
                fs::path(it->second->path()).filename().string());
    }
  }

  std::vector<float> load(const std::string& name, const std::vector<std::int64_t>& shape,
                          Range rows, Range cols) const override {
    if (packed(name)) return load_matrix(name, shape, rows, cols).to_float();
    const auto& [file, info] = find(name, shape);
    if (info.dtype == "F8_E4M3") return load_matrix(name, shape, rows, cols).to_float();
    const std::int64_t n_rows = shape[0];
    const std::int64_t n_cols = shape.size() == 2 ? shape[1] : 1;
    const std::int64_t r0 = rows.whole() ? 0 : rows.begin, c0 = cols.whole() ? 0 : cols.begin;
    const std::int64_t c1 = cols.whole() ? n_cols : cols.end;
    std::vector<float> v =
        file->read(name, r0, rows.whole() ? n_rows : rows.end, c0, c1);
    check_finite(v, r0, c0, c1 - c0, shape.size() == 1, dir_, name);
    return v;
  }

  WeightMatrix load_matrix(const std::string& name, const std::vector<std::int64_t>& shape,
                           Range rows, Range cols) const override {
    const std::int64_t n_rows = shape[0], n_cols = shape.size() == 2 ? shape[1] : 1;
    const std::int64_t r0 = rows.whole() ? 0 : rows.begin, r1 = rows.whole() ? n_rows : rows.end;
    const std::int64_t c0 = cols.whole() ? 0 : cols.begin, c1 = cols.whole() ? n_cols : cols.end;
    if (packed(name)) return load_int4(name, shape, r0, r1, c0, c1);
    const auto& [file, info] = find(name, shape);
    if (info.dtype != "BF16" && info.dtype != "F8_E4M3") {  // F32 and F16 are held as fp32
      std::vector<float> v = file->read(name, r0, r1, c0, c1);
      check_finite(v, r0, c0, c1 - c0, shape.size() == 1, dir_, name);
      return WeightMatrix::from_float(std::move(v), r1 - r0, c1 - c0);
    }
    WeightMatrix m;
    m.dtype = info.dtype == "BF16" ? WeightDtype::bf16 : WeightDtype::f8_e4m3;
    m.rows = r1 - r0;
    m.cols = c1 - c0;
    const std::size_t eb = dtype_bytes(info.dtype);
    m.data.resize(static_cast<std::size_t>(m.rows * m.cols) * eb);
    const std::uint8_t* src = file->bytes(info);
    for (std::int64_t r = r0; r < r1; ++r) {
      std::memcpy(m.data.data() + static_cast<std::size_t>((r - r0) * m.cols) * eb,
                  src + static_cast<std::size_t>(r * n_cols + c0) * eb,
                  static_cast<std::size_t>(m.cols) * eb);
    }
    m.row0 = r0;  // for the error's position (FP8 keeps them for its scale blocks)
    m.col0 = c0;
    check_finite(m, dir_, name);
    if (m.dtype == WeightDtype::bf16) {
      m.row0 = m.col0 = 0;
      return m;
    }
    // FP8: the F32 block scales of the whole tensor, indexed by global row and column.
    const std::string sname = scale_name(name);
    const auto it = where_.find(sname);
    DCP_CHECK(it != where_.end(), io, "checkpoint ", dir_, ": FP8 tensor '", name,
              "' has no scale tensor '", sname, "'");
    const TensorInfo& si = it->second->tensors().at(sname);
    const std::vector<std::int64_t> want{ceil_div(n_rows, block_rows_),
                                         ceil_div(n_cols, block_cols_)};
    DCP_CHECK(si.dtype == "F32" && si.shape == want, io, "checkpoint ", dir_, ": scale tensor '",
              sname, "' is ", si.dtype, " ", shape_str(si.shape), "; the ", shape_str(shape),
              " weight in ", block_rows_, " x ", block_cols_, " blocks needs F32 ",
              shape_str(want));
    m.block_rows = block_rows_;
    m.block_cols = block_cols_;
    m.row0 = r0;
    m.col0 = c0;
    const std::int64_t b_r0 = r0 / block_rows_, b_r1 = ceil_div(r1, block_rows_);
    const std::int64_t b_c0 = c0 / block_cols_, b_c1 = ceil_div(c1, block_cols_);
    m.scale_rows = b_r1 - b_r0;
    m.scale_cols = b_c1 - b_c0;
    m.scale_inv = it->second->read(sname, b_r0, b_r1, b_c0, b_c1);
    check_finite(m.scale_inv, b_r0, b_c0, b_c1 - b_c0, false, dir_, sname);
    return m;
  }

  bool contains(const std::string& name) const override {
    return where_.count(name) != 0 || packed(name);
  }
  std::string describe() const override {
    return str("checkpoint ", dir_, " (", files_.size(), " files)");
  }

 private:
  std::pair<const TensorFile*, const TensorInfo&> find(
      const std::string& name, const std::vector<std::int64_t>& shape) const {
    const auto it = where_.find(name);
    DCP_CHECK(it != where_.end(), io, "checkpoint ", dir_, ": missing tensor '", name, "'");
    const auto& info = it->second->tensors().at(name);
    DCP_CHECK(info.shape == shape, io, "checkpoint ", dir_, ": tensor '", name, "' has shape ",
              shape_str(info.shape), ", the model config needs ", shape_str(shape));
    return {it->second, info};
  }

  // Whether weight `name` is stored as compressed-tensors packs INT4: `name`_packed beside it.
  bool packed(const std::string& name) const {
    return where_.count(name) == 0 && where_.count(name + "_packed") != 0;
  }

  // One tensor of compressed-tensors' INT4 weight `name`: its dtype and shape checked.
  const TensorInfo& int4_part(const std::string& name, const std::string& part,
                              const std::vector<std::string>& dtypes,
                              const std::vector<std::int64_t>& shape) const {
    const auto it = where_.find(name + part);
    DCP_CHECK(it != where_.end(), io, "checkpoint ", dir_, ": INT4 tensor '", name,
              "_packed' has no '", name, part, "' beside it");
    const TensorInfo& info = it->second->tensors().at(name + part);
    const bool dtype_ok = std::find(dtypes.begin(), dtypes.end(), info.dtype) != dtypes.end();
    std::string legal;
    for (const std::string& d : dtypes) legal += (legal.empty() ? "" : " or ") + d;
    DCP_CHECK(dtype_ok && info.shape == shape, io, "checkpoint ", dir_, ": tensor '", name, part,
              "' is ", info.dtype, " ", shape_str(info.shape), "; it must be ", legal, " ",
              shape_str(shape));
    return info;
  }

  // compressed-tensors' pack-quantized INT4: the packed int32 words of rows [r0, r1) (eight codes
  // each, the first in the low bits, so their little-endian bytes are the codes in column order,
  // two a byte) and the scales of their groups. Columns [c0, c1) must hold whole groups.
  WeightMatrix load_int4(const std::string& name, const std::vector<std::int64_t>& shape,
                         std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) const {
    DCP_CHECK(int4_group_ > 0, io, "checkpoint ", dir_, ": tensor '", name,
              "_packed' is INT4, but config.json has no compressed-tensors quantization_config");
    DCP_CHECK(shape.size() == 2 && shape[1] % int4_group_ == 0, io, "checkpoint ", dir_,
              ": INT4 weight '", name, "' of shape ", shape_str(shape),
              " does not hold whole groups of ", int4_group_, " columns");
    const std::int64_t n_rows = shape[0], n_cols = shape[1], group = int4_group_;
    DCP_ARG_CHECK(0 <= r0 && r0 <= r1 && r1 <= n_rows && 0 <= c0 && c0 <= c1 && c1 <= n_cols,
                  "tensor ", name, ": slice rows [", r0, ", ", r1, ") x columns [", c0, ", ", c1,
                  ") is outside its shape ", shape_str(shape));
    DCP_CHECK(c0 % group == 0 && c1 % group == 0, unsupported, "checkpoint ", dir_,
              ": INT4 weight '", name, "' would be split at column ", c0 % group ? c0 : c1,
              ", inside a group of ", group,
              " columns (choose a tp_size that splits it into whole groups)");
    const TensorInfo& words = int4_part(name, "_packed", {"I32"}, {n_rows, n_cols / 8});
    int4_part(name, "_scale", {"BF16", "F16", "F32"}, {n_rows, n_cols / group});
    if (where_.count(name + "_shape")) {
      const TensorInfo& dims = int4_part(name, "_shape", {"I32", "I64"}, {2});
      const std::uint8_t* p = where_.at(name + "_shape")->bytes(dims);
      std::int64_t stored[2];
      for (int i = 0; i < 2; ++i) {
        if (dims.dtype == "I32") {
          std::int32_t v;
          std::memcpy(&v, p + 4 * i, 4);
          stored[i] = v;
        } else {
          std::memcpy(&stored[i], p + 8 * i, 8);
        }
      }
      DCP_CHECK(stored[0] == n_rows && stored[1] == n_cols, io, "checkpoint ", dir_, ": tensor '",
                name, "_shape' says [", stored[0], ", ", stored[1], "]; the model config needs ",
                shape_str(shape));
    }
    WeightMatrix m;
    m.dtype = WeightDtype::int4;
    m.rows = r1 - r0;
    m.cols = c1 - c0;
    m.block_rows = 1;
    m.block_cols = static_cast<int>(group);
    m.row0 = r0;
    m.col0 = c0;
    m.data.resize(static_cast<std::size_t>(m.rows * m.cols / 2));
    const std::uint8_t* src = where_.at(name + "_packed")->bytes(words);
    for (std::int64_t r = r0; r < r1; ++r) {
      std::memcpy(m.data.data() + static_cast<std::size_t>((r - r0) * m.cols / 2),
                  src + static_cast<std::size_t>((r * n_cols + c0) / 2),
                  static_cast<std::size_t>(m.cols / 2));
    }
    m.scale_rows = m.rows;
    m.scale_cols = m.cols / group;
    m.scale_inv = where_.at(name + "_scale")->read(name + "_scale", r0, r1, c0 / group, c1 / group);
    check_finite(m.scale_inv, r0, c0 / group, m.scale_cols, false, dir_, name + "_scale");
    return m;
  }

  // The shards an index's weight_map names, each once, in the order first named; `indexed` gets
  // tensor -> shard.
  std::vector<fs::path> read_index(const fs::path& index,
                                   std::map<std::string, std::string>& indexed) const {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_text(index));
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCategory::io, str(index.string(), ": malformed JSON: ", e.what()));
    }
    DCP_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), io,
              index.string(), ": field 'weight_map' must be an object of tensor -> file");
    std::vector<fs::path> files;
    std::map<std::string, bool> seen;
    for (const auto& [name, file] : j["weight_map"].items()) {
      DCP_CHECK(file.is_string(), io, index.string(), ": weight_map['", name,
                "'] must be a file name (a string), got ", file.dump());
      const std::string f = file.get<std::string>();
      // A shard is a file of the checkpoint directory, never a path out of it.
      DCP_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..", io,
                index.string(), ": weight_map['", name, "'] = '", f,
                "' must be a file name in the checkpoint directory");
      DCP_CHECK(fs::exists(fs::path(dir_) / f), io, index.string(), ": weight_map names shard '", f,
                "' (for '", name, "'), which is missing from ", dir_);
      indexed[name] = f;
      if (!seen[f]) files.push_back(fs::path(dir_) / f);
      seen[f] = true;
    }
    return files;
  }

  std::string dir_;
  int block_rows_ = 128, block_cols_ = 128;
  int int4_group_ = 0;  // compressed-tensors' group size; 0 without it
  std::vector<std::unique_ptr<TensorFile>> files_;
  std::map<std::string, const TensorFile*> where_;
};

}  // namespace

std::unique_ptr<WeightSource> open_checkpoint(const std::string& dir) {
  return std::make_unique<CheckpointWeights>(dir);
}

ModelConfig read_checkpoint_config(const std::string& dir) {
  const fs::path p = fs::path(dir) / "config.json";
  std::error_code ec;  // a name the system refuses (too long) has none either
  DCP_CHECK(fs::exists(p, ec), io, "checkpoint directory ", dir, " has no config.json",
            ec ? str(" (", ec.message(), ")") : std::string());
  return parse_model_config(read_text(p));
}

bool is_replicated_weight(const std::string& name, const std::vector<std::int64_t>& shape) {
  const auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return shape.size() == 1 || ends_with("q_a_proj.weight") ||
         ends_with("kv_a_proj_with_mqa.weight") || ends_with("mlp.gate.weight");
}

double weight_bytes_per_rank(const ModelConfig& c, int tp_size,
                             const std::function<double(const std::string&)>& element_bytes) {
  double bytes = 0;
  for (const auto& [name, shape] : checkpoint_tensors(c)) {
    double values = 1;
    for (std::int64_t d : shape) values *= static_cast<double>(d);
    bytes += values * element_bytes(name) /
             (is_replicated_weight(name, shape) ? 1.0 : static_cast<double>(std::max(1, tp_size)));
  }
  return bytes;
}

std::function<double(const std::string&)> checkpoint_element_bytes(const ModelConfig& c,
                                                                   double dtype_bytes) {
  const double scale = 4.0 / (static_cast<double>(c.weight_block_rows) * c.weight_block_cols);
  // INT4: half a byte a value, and its group's scale as a rank holds it (fp32; the file's BF16
  // takes half that).
  const double int4 = c.int4_group_size > 0 ? 0.5 + 4.0 / c.int4_group_size : 0.0;
  return [c, dtype_bytes, scale, int4](const std::string& name) {
    if (is_fp8_weight(c, name)) return 1.0 + scale;
    return is_int4_weight(c, name) ? int4 : dtype_bytes;
  };
}

bool is_int4_weight(const ModelConfig& c, const std::string& name) {
  if (c.quant_method != "compressed-tensors") return false;
  const auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  const bool linear = name == "lm_head.weight" ||
                      (name.rfind("model.layers.", 0) == 0 &&
                       (ends_with("_proj.weight") || ends_with("_proj_with_mqa.weight")));
  return linear && !c.int4_ignores(name.substr(0, name.size() - std::string(".weight").size()));
}

bool is_fp8_weight(const ModelConfig& c, const std::string& name) {
  if (!c.quantized) return false;
  const auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return name.rfind("model.layers.", 0) == 0 &&
         (ends_with("_proj.weight") || ends_with("_proj_with_mqa.weight")) &&
         !ends_with("mlp.gate.weight");
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
  if (!c.ties(true)) t.push_back({"lm_head.weight", Shape{c.vocab_size, h}});
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
  const auto file_name = [&](std::size_t f) {
    return num_files == 1 ? std::string("model.safetensors")
                          : str("model-", f + 1, "-of-", num_files, ".safetensors");
  };
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::size_t f = i * static_cast<std::size_t>(num_files) / tensors.size();
    const auto& [name, shape] = tensors[i];
    std::vector<float> values = source.load(name, shape);
    if (is_int4_weight(config, name)) {
      // compressed-tensors' three tensors; the codes' bytes are the int32 words' little-endian
      // bytes.
      WeightMatrix q =
          WeightMatrix::quantize_int4(values, shape[0], shape[1], config.int4_group_size);
      const std::int32_t dims[2] = {static_cast<std::int32_t>(shape[0]),
                                    static_cast<std::int32_t>(shape[1])};
      std::vector<std::uint8_t> dim_bytes(sizeof dims);
      std::memcpy(dim_bytes.data(), dims, sizeof dims);
      per_file[f].push_back(
          {name + "_packed", {shape[0], shape[1] / 8}, {}, "I32", {q.data.begin(), q.data.end()}});
      per_file[f].push_back(
          {name + "_scale", {q.scale_rows, q.scale_cols}, std::move(q.scale_inv), "BF16", {}});
      per_file[f].push_back({name + "_shape", {2}, {}, "I32", std::move(dim_bytes)});
      for (const char* part : {"_packed", "_scale", "_shape"})
        weight_map[name + part] = file_name(f);
      continue;
    }
    if (!is_fp8_weight(config, name)) {
      per_file[f].push_back({name, shape, std::move(values), dtype, {}});
      weight_map[name] = file_name(f);
      continue;
    }
    WeightMatrix q = WeightMatrix::quantize_fp8(values, shape[0], shape[1],
                                                config.weight_block_rows, config.weight_block_cols);
    per_file[f].push_back({name, shape, {}, "F8_E4M3", {q.data.begin(), q.data.end()}});
    per_file[f].push_back(
        {scale_name(name), {q.scale_rows, q.scale_cols}, std::move(q.scale_inv), "F32", {}});
    weight_map[name] = file_name(f);
    weight_map[scale_name(name)] = file_name(f);
  }
  // The multi-token-prediction layer of V3 checkpoints: present, never part of the main model.
  for (int m = 0; m < config.num_nextn_predict_layers; ++m) {
    const std::string name =
        "model.layers." + std::to_string(config.num_hidden_layers + m) + ".eh_proj.weight";
    const std::vector<std::int64_t> shape{config.hidden_size, 2LL * config.hidden_size};
    per_file.back().push_back({name, shape, source.load(name, shape), dtype, {}});
    weight_map[name] = file_name(per_file.size() - 1);
  }
  for (int f = 0; f < num_files; ++f)
    safetensors::write_file((fs::path(dir) / file_name(f)).string(), per_file[f]);
  if (num_files > 1) {
    std::ofstream idx(fs::path(dir) / "model.safetensors.index.json");
    idx << nlohmann::ordered_json{{"metadata", nlohmann::ordered_json::object()},
                                  {"weight_map", weight_map}}
               .dump(2)
        << "\n";
  }
}

}  // namespace dcp

#include "dcp/generation_config.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "dcp/error.h"

namespace dcp {
namespace {

// One of the checkpoint's JSON files; errors name it.
nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  DCP_CHECK(in.good() || in.eof(), io, "cannot read ", path.string());
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCategory::io, str(path.string(), " is not valid JSON: ", e.what()));
  }
}

}  // namespace

std::vector<std::int32_t> checkpoint_eos_token_ids(const std::string& model_dir, int vocab_size) {
  namespace fs = std::filesystem;
  for (const char* name : {"generation_config.json", "config.json"}) {
    const fs::path path = fs::path(model_dir) / name;
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) continue;
    const nlohmann::json j = read_json(path);
    // generation_config.json, when there is one, is the whole answer (as vLLM reads it).
    if (!j.is_object() || !j.contains("eos_token_id") || j["eos_token_id"].is_null()) return {};
    const nlohmann::json& v = j["eos_token_id"];
    const nlohmann::json list = v.is_array() ? v : nlohmann::json::array({v});
    std::vector<std::int32_t> ids;
    for (const nlohmann::json& id : list) {
      DCP_CHECK(id.is_number_integer() && id.get<std::int64_t>() >= 0 &&
                    id.get<std::int64_t>() < vocab_size,
                io, path.string(), ": eos_token_id ", v.dump(), " must be a token id in [0, ",
                vocab_size, ") or a list of them");
      ids.push_back(id.get<std::int32_t>());
    }
    return ids;
  }
  return {};
}

SamplingDefaults checkpoint_sampling_defaults(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(model_dir) / "generation_config.json";
  SamplingDefaults d;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return d;
  const nlohmann::json j = read_json(path);
  if (!j.is_object()) return d;
  // A number in [lo, hi] (lo excluded where `open_low`), or none when the field is absent.
  const auto number = [&](const char* key, double lo, double hi,
                          bool open_low) -> std::optional<double> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    const nlohmann::json& v = j[key];
    DCP_CHECK(v.is_number() && (open_low ? v.get<double>() > lo : v.get<double>() >= lo) &&
                  v.get<double>() <= hi,
              io, path.string(), ": ", key, " = ", v.dump(), " must be a number in ",
              open_low ? "(" : "[", lo, ", ", hi, "]");
    return v.get<double>();
  };
  d.temperature = number("temperature", 0, 100, false);
  d.top_p = number("top_p", 0, 1, true);
  d.min_p = number("min_p", 0, 1, false);
  d.repetition_penalty = number("repetition_penalty", 0, 1e30, true);
  if (const auto k = number("top_k", -1, 1 << 30, false)) {
    DCP_CHECK(*k == static_cast<double>(static_cast<int>(*k)), io, path.string(),
              ": top_k = ", j["top_k"].dump(), " must be an integer");
    if (*k != 50) d.top_k = static_cast<int>(*k);  // 50 is transformers' default: vLLM drops it
  }
  return d;
}

}  // namespace dcp

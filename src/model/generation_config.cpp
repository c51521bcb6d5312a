#include "dcp/generation_config.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "dcp/error.h"

namespace dcp {

std::vector<std::int32_t> checkpoint_eos_token_ids(const std::string& model_dir, int vocab_size) {
  namespace fs = std::filesystem;
  for (const char* name : {"generation_config.json", "config.json"}) {
    const fs::path path = fs::path(model_dir) / name;
    if (!fs::is_regular_file(path)) continue;
    std::ifstream in(path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    DCP_CHECK(in.good() || in.eof(), io, "cannot read ", path.string());
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCategory::io, str(path.string(), " is not valid JSON: ", e.what()));
    }
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

}  // namespace dcp

#include "safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dcp/dtype.h"
#include "dcp/error.h"

namespace dcp::safetensors {
namespace {

std::uint16_t float_to_half(float f) noexcept {
  // Round to nearest even through float arithmetic; enough for writing test checkpoints.
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (a >= 65520.0f) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (a < 6.103515625e-05f) {  // subnormal half
    return static_cast<std::uint16_t>(sign |
                                      static_cast<std::uint16_t>(std::nearbyint(a * 16777216.0f)));
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  auto man = static_cast<std::uint32_t>(std::nearbyint((m * 2.0f - 1.0f) * 1024.0f));
  if (man == 1024) {
    man = 0;
    ++e;
  }
  return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>((e + 14) << 10) | man);
}

}  // namespace

File::File(const std::string& path) : TensorFile(path, "safetensors file") {
  const std::uint8_t* file = map();
  const std::size_t file_size = size();
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file[i];
  DCP_CHECK(header_len <= file_size - 8, io, path, ": header length ", header_len,
            " exceeds the file (", file_size - 8, " bytes after the length)");
  set_data(file + 8 + header_len);
  const std::size_t data_size = file_size - 8 - header_len;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file + 8, file + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCategory::io, str(path, ": malformed header: ", e.what()));
  }
  DCP_CHECK(header.is_object(), io, path, ": header is not a JSON object");
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    DCP_CHECK(
        v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
        io, path, ": tensor '", name, "' lacks dtype, shape or data_offsets");
    TensorInfo t;
    try {
      t.dtype = v["dtype"].get<std::string>();
      // Integers only: a number past 64 bits parses as a float, and converting that is
      // undefined, so it is refused here.
      DCP_CHECK(v["shape"].is_array(), io, path, ": tensor '", name, "' shape must be a list");
      for (const auto& d : v["shape"]) {
        DCP_CHECK(d.is_number_integer(), io, path, ": tensor '", name, "' shape entry ", d.dump(),
                  " is not a 64-bit integer");
        t.shape.push_back(d.get<std::int64_t>());
      }
      const auto& off = v["data_offsets"];
      DCP_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                    off[1].is_number_unsigned(),
                io, path, ": tensor '", name,
                "' data_offsets must be two unsigned 64-bit integers, got ", off.dump());
      t.begin = off[0].get<std::uint64_t>();
      t.end = off[1].get<std::uint64_t>();
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCategory::io,
                  str(path, ": tensor '", name, "' has a malformed entry: ", e.what()));
    }
    const std::size_t eb = dtype_bytes(t.dtype);
    DCP_CHECK(eb > 0, io, path, ": tensor '", name, "' has unknown dtype '", t.dtype, "'");
    std::uint64_t elems = 1;
    for (std::int64_t d : t.shape) {
      DCP_CHECK(d >= 0, io, path, ": tensor '", name, "' has a negative dimension");
      DCP_CHECK(d == 0 || elems <= data_size / static_cast<std::uint64_t>(d), io, path,
                ": tensor '", name, "' has a shape larger than the file");
      elems *= static_cast<std::uint64_t>(d);
    }
    DCP_CHECK(t.begin <= t.end && t.end <= data_size, io, path, ": tensor '", name, "' data [",
              t.begin, ", ", t.end, ") lies outside the data section of ", data_size,
              " bytes (truncated file?)");
    DCP_CHECK(t.end - t.begin == elems * eb, io, path, ": tensor '", name, "' claims ",
              t.end - t.begin, " bytes but its shape and dtype ", t.dtype, " need ", elems * eb);
    DCP_CHECK(tensors_.count(name) == 0, io, path, ": tensor '", name, "' appears twice");
    tensors_.emplace(name, std::move(t));
  }
  // The tensors tile the data section, in some order, without a gap or an overlap (as the
  // format requires): two tensors sharing bytes would let the model run on aliased weights.
  std::vector<std::pair<std::uint64_t, const std::string*>> order;
  for (const auto& [name, t] : tensors_) order.emplace_back(t.begin, &name);
  std::sort(order.begin(), order.end());
  std::uint64_t next = 0;
  const std::string* prev = nullptr;
  for (const auto& [begin, name] : order) {
    const TensorInfo& t = tensors_.at(*name);
    DCP_CHECK(begin >= next, io, path, ": tensor '", *name, "' data [", t.begin, ", ", t.end,
              ") overlaps tensor '", prev ? *prev : std::string(), "' (ending at ", next, ")");
    DCP_CHECK(begin == next, io, path, ": the data section has ", begin - next,
              " bytes no tensor holds, before tensor '", *name, "'");
    next = t.end;
    prev = name;
  }
  DCP_CHECK(next == data_size, io, path, ": the data section has ", data_size - next,
            " bytes no tensor holds at its end (", data_size, " bytes, tensors end at ", next, ")");
}

void write_file(const std::string& path, const std::vector<NamedTensor>& tensors) {
  nlohmann::ordered_json header;
  std::uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const std::size_t eb = dtype_bytes(t.dtype);
    DCP_ARG_CHECK(!t.raw.empty() || t.dtype == "F32" || t.dtype == "F16" || t.dtype == "BF16",
                  "tensor '", t.name, "': dtype '", t.dtype,
                  "' takes raw bytes (values convert to F32, F16, BF16)");
    DCP_ARG_CHECK(eb > 0, "tensor '", t.name, "': unknown dtype '", t.dtype, "'");
    const std::uint64_t bytes = t.raw.empty() ? t.values.size() * eb : t.raw.size();
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  header["__metadata__"] = {{"format", "pt"}, {"writer", "dcp"}};
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text += ' ';  // align the data section
  std::ofstream out(path, std::ios::binary);
  DCP_CHECK(out.good(), io, "cannot write ", path);
  std::uint8_t len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(text.size()) >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<std::uint8_t> buf;
  for (const NamedTensor& t : tensors) {
    if (!t.raw.empty()) {
      out.write(reinterpret_cast<const char*>(t.raw.data()),
                static_cast<std::streamsize>(t.raw.size()));
      continue;
    }
    const std::size_t eb = dtype_bytes(t.dtype);
    buf.resize(t.values.size() * eb);
    for (std::size_t i = 0; i < t.values.size(); ++i) {
      if (t.dtype == "F32") {
        std::memcpy(&buf[4 * i], &t.values[i], 4);
      } else {
        const std::uint16_t h =
            t.dtype == "BF16" ? float_to_bf16(t.values[i]) : float_to_half(t.values[i]);
        std::memcpy(&buf[2 * i], &h, 2);
      }
    }
    out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
  }
  DCP_CHECK(out.good(), io, "failed writing ", path);
}

}  // namespace dcp::safetensors

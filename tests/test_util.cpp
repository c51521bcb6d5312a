#include "test_util.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <string>

#include "dcp/error.h"
#include "dcp/layout.h"

namespace dcp::test {

std::uint64_t test_seed() {
  static const std::uint64_t seed = [] {
    std::uint64_t s;
    if (const char* env = std::getenv("DCP_TEST_SEED")) {
      s = std::stoull(env);
    } else {
      s = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    }
    std::cout << "[dcp] test seed " << s << " (replay with DCP_TEST_SEED=" << s << ")\n";
    return s;
  }();
  return seed;
}

Rng make_rng() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "";
  return Rng(test_seed() ^ std::hash<std::string>{}(name));
}

::testing::AssertionResult close(const std::vector<float>& actual,
                                 const std::vector<double>& expected, Tolerance tol,
                                 const char* what) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << what << ": size " << actual.size() << " vs expected " << expected.size();
  }
  double err = 0, ref = 0, max_abs = 0, max_ref = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i];
    const double b = expected[i];
    if (std::isnan(a) || std::isnan(b)) {
      return ::testing::AssertionFailure()
             << what << "[" << i << "]: NaN (actual " << a << ", expected " << b << ")";
    }
    if (std::isinf(a) || std::isinf(b)) {
      if (a != b) {
        return ::testing::AssertionFailure()
               << what << "[" << i << "]: " << a << " vs expected " << b;
      }
      continue;
    }
    err += (a - b) * (a - b);
    ref += b * b;
    max_abs = std::max(max_abs, std::abs(a - b));
    max_ref = std::max(max_ref, std::abs(b));
  }
  const double nmse = ref > 0 ? err / ref : err;
  const double max_rel = max_ref > 0 ? max_abs / max_ref : max_abs;
  if (nmse > tol.nmse || max_rel > tol.max_abs) {
    return ::testing::AssertionFailure()
           << what << ": nmse " << nmse << " (limit " << tol.nmse << "), max abs " << max_abs
           << " / max |ref| " << max_ref << " = " << max_rel << " (limit " << tol.max_abs << ")";
  }
  return ::testing::AssertionSuccess();
}

// The LSE is a log: its error is absolute (e^lse is off by a factor 1 + err), and adding a
// constant to every score shifts it without changing O. So it is checked against an absolute
// bound on the scale of the largest |LSE| (at least 1), not a relative one, which fails LSEs near
// zero whose absolute error is a few ulps of 1.
::testing::AssertionResult lse_close(const std::vector<float>& got,
                                     const std::vector<double>& expect, const std::string& what) {
  if (got.size() != expect.size()) {
    return ::testing::AssertionFailure()
           << what << ": " << got.size() << " values, expected " << expect.size();
  }
  double scale = 1, worst = 0;
  std::size_t at = 0;
  for (double x : expect) {
    if (std::isfinite(x)) scale = std::max(scale, std::abs(x));
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(expect[i]) && got[i] == expect[i]) continue;  // no rows: -inf both
    const double err = std::abs(got[i] - expect[i]);
    if (!(err <= worst)) {  // NaN counts as the worst
      worst = err;
      at = i;
    }
  }
  if (worst <= 1e-5 * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": |LSE error| " << worst << " at " << at << " (got " << got[at]
         << ", expected " << expect[at] << ") exceeds 1e-5 x " << scale;
}

::testing::AssertionResult close_runs(const std::vector<float>& actual,
                                      const std::vector<float>& expected, Tolerance tol,
                                      const char* what) {
  return close(actual, std::vector<double>(expected.begin(), expected.end()), tol, what);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

::testing::AssertionResult throws_error(const std::function<void()>& f, ErrorCategory category,
                                        const std::string& needle) {
  try {
    f();
  } catch (const Error& e) {
    if (e.category() != category) {
      return ::testing::AssertionFailure() << "category " << to_string(e.category()) << ", not "
                                           << to_string(category) << ": " << e.what();
    }
    if (std::string(e.what()).find(needle) == std::string::npos) {
      return ::testing::AssertionFailure() << "'" << e.what() << "' lacks '" << needle << "'";
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no dcp::Error thrown (expected '" << needle << "')";
}

std::vector<Shard> stripe(const ref::FullAttentionInput& in, int dcp_size, int interleave,
                          int page_size, KvDtype dtype, Rng& rng) {
  const int width = in.kv_lora_rank + in.rope_dim;
  const int requests = static_cast<int>(in.kv.size());
  std::vector<Shard> shards(dcp_size);
  for (int r = 0; r < dcp_size; ++r) {
    Shard& s = shards[r];
    s.local_len.resize(requests);
    std::int64_t max_pages = 0, total_pages = 0;
    for (int b = 0; b < requests; ++b) {
      const std::int64_t len = static_cast<std::int64_t>(in.kv[b].size()) / width;
      s.local_len[b] = layout::count(len, r, dcp_size, interleave);
      const std::int64_t pages = (s.local_len[b] + page_size - 1) / page_size;
      max_pages = std::max(max_pages, pages);
      total_pages += pages;
    }
    s.stride = static_cast<int>(max_pages) + 1;  // one unused column: strides need not be tight
    s.num_pages = total_pages + 3;               // spare pages hold poison
    std::vector<std::int32_t> free_pages(static_cast<std::size_t>(s.num_pages));
    std::iota(free_pages.begin(), free_pages.end(), 0);
    std::shuffle(free_pages.begin(), free_pages.end(), rng.engine());
    s.page_table.assign(static_cast<std::size_t>(requests) * s.stride, -1);
    const std::size_t elems = static_cast<std::size_t>(s.num_pages) * page_size * width;
    // Poison: rows nobody wrote (spare pages, tails of partial pages) must never be read.
    if (dtype == KvDtype::fp32)
      s.kv_fp32.assign(elems, std::nanf(""));
    else
      s.kv_bf16.assign(elems, 0x7fc0);
    std::size_t next = 0;
    for (int b = 0; b < requests; ++b) {
      const std::int64_t pages = (s.local_len[b] + page_size - 1) / page_size;
      for (std::int64_t j = 0; j < pages; ++j) s.page_table[b * s.stride + j] = free_pages[next++];
      const std::int64_t len = static_cast<std::int64_t>(in.kv[b].size()) / width;
      for (std::int64_t p = 0; p < len; ++p) {
        if (layout::owner(p, dcp_size, interleave) != r) continue;
        const std::int64_t row = layout::row(p, dcp_size, interleave);
        const std::int64_t phys =
            s.page_table[b * s.stride + row / page_size] * page_size + row % page_size;
        for (int d = 0; d < width; ++d) {
          const float v = in.kv[b][p * width + d];
          if (dtype == KvDtype::fp32)
            s.kv_fp32[phys * width + d] = v;
          else
            s.kv_bf16[phys * width + d] = float_to_bf16(v);
        }
      }
    }
  }
  return shards;
}

MlaAttentionParams shard_params(const ref::FullAttentionInput& in, const Shard& shard,
                                KvDtype dtype, int page_size, int dcp_size, int dcp_rank,
                                int interleave) {
  MlaAttentionParams p;
  p.num_heads = in.num_heads;
  p.kv_lora_rank = in.kv_lora_rank;
  p.rope_dim = in.rope_dim;
  p.softmax_scale = static_cast<float>(in.softmax_scale);
  p.num_requests = static_cast<int>(in.q_start.size()) - 1;
  p.q_start = in.q_start.data();
  p.q = in.q.data();
  p.q_pos = in.q_pos.data();
  p.kv = dtype == KvDtype::fp32 ? static_cast<const void*>(shard.kv_fp32.data())
                                : static_cast<const void*>(shard.kv_bf16.data());
  p.kv_dtype = dtype;
  p.num_pages = shard.num_pages;
  p.page_size = page_size;
  p.page_table = shard.page_table.data();
  p.page_table_stride = shard.stride;
  p.local_len = shard.local_len.data();
  p.dcp_size = dcp_size;
  p.dcp_rank = dcp_rank;
  p.interleave = interleave;
  p.causal = in.causal;
  p.window = in.window;
  p.softcap = static_cast<float>(in.softcap);
  p.sinks = in.sinks.empty() ? nullptr : in.sinks.data();
  p.topk = in.topk.empty() ? nullptr : in.topk.data();
  p.topk_k = in.topk_k;
  return p;
}

ref::FullAttentionInput random_context(const ContextSpec& spec, KvDtype dtype, Rng& rng) {
  ref::FullAttentionInput in;
  in.num_heads = spec.heads;
  in.kv_lora_rank = spec.kv_lora_rank;
  in.rope_dim = spec.rope_dim;
  const int width = spec.kv_lora_rank + spec.rope_dim;
  // Scores of O(1..3): softmax is neither flat nor one-hot.
  in.softmax_scale = 1.5 / std::sqrt(static_cast<double>(width));
  const int requests = static_cast<int>(spec.lengths.size());
  in.q_start.push_back(0);
  for (int b = 0; b < requests; ++b) {
    const std::int64_t len = spec.lengths[b];
    const int q_len = spec.q_lens[b];
    std::vector<float> kv(static_cast<std::size_t>(len) * width);
    for (float& v : kv) {
      v = rng.normal();
      if (dtype == KvDtype::bf16) v = bf16_to_float(float_to_bf16(v));
    }
    in.kv.push_back(std::move(kv));
    for (int t = 0; t < q_len; ++t) {
      // The last q_len tokens of the sequence (decode: q_len 1 at position len - 1).
      in.q_pos.push_back(std::max<std::int64_t>(0, len - q_len + t));
      for (int i = 0; i < spec.heads * width; ++i) in.q.push_back(rng.normal());
    }
    in.q_start.push_back(in.q_start.back() + q_len);
  }
  return in;
}

std::string byte_char(int b) {
  int cp = b;
  const auto kept = [](int x) {
    return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
  };
  if (!kept(b)) {
    cp = 256;
    for (int x = 0; x < b; ++x)
      if (!kept(x)) ++cp;
  }
  std::string u;
  if (cp < 0x80) {
    u += static_cast<char>(cp);
  } else {
    u += static_cast<char>(0xC0 | (cp >> 6));
    u += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return u;
}

std::optional<nlohmann::json> python_oracle(const nlohmann::json& cases,
                                            const std::string& script) {
  const char* python = "/usr/bin/python3";
  if (!std::filesystem::exists(python)) return std::nullopt;
  const auto dir =
      std::filesystem::temp_directory_path() / ("dcp_oracle_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "cases.json") << cases.dump();
  std::ofstream(dir / "oracle.py") << script;
  const std::string command = std::string(python) + " " + (dir / "oracle.py").string() + " " +
                              (dir / "cases.json").string() + " " +
                              (dir / "expected.json").string();
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  nlohmann::json out = nlohmann::json::parse(std::ifstream(dir / "expected.json"));
  std::filesystem::remove_all(dir);
  return out;
}

}  // namespace dcp::test

// `dcp demo`: the DCP identity on random data. Stripes random contexts over N shards through the
// KV cache, runs local attention on each shard, merges with the LSE merge and compares with full
// attention in float64; also shows what averaging without the LSE would give.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "dcp/attention.h"
#include "dcp/dtype.h"
#include "dcp/error.h"
#include "dcp/kv_cache.h"
#include "dcp/merge.h"
#include "dcp/reference.h"

namespace dcp::cli {
namespace {

int g_exit_code = 0;

struct DemoOptions {
  int dcp_size = 4;
  int heads = 16;
  int context = 4096;
  int batch = 2;
  int page_size = 64;
  std::string kv_dtype = "bf16";
  std::uint64_t seed = 1;
};

int run_demo(const DemoOptions& opt) {
  const KvDtype dtype = parse_kv_dtype(opt.kv_dtype);
  const int n = opt.dcp_size, heads = opt.heads, dc = 512, dr = 64, width = dc + dr;
  {  // the full contexts in fp32 and the shards built from them, about twice the full KV
    double rows_total = 0;
    for (int b = 0; b < opt.batch; ++b) rows_total += std::max(1.0, opt.context - 37.0 * b);
    check_fits_in_memory(2.0 * rows_total * width * sizeof(float) +
                             static_cast<double>(n) * opt.batch * heads * dc * sizeof(float),
                         str("--context ", opt.context, " x --batch ", opt.batch),
                         "lower --context or --batch");
  }
  std::mt19937_64 gen(opt.seed);
  std::normal_distribution<float> normal;

  // Full contexts (rounded to the KV dtype so both sides see the same numbers) and queries.
  ref::FullAttentionInput in;
  in.num_heads = heads;
  in.kv_lora_rank = dc;
  in.rope_dim = dr;
  in.softmax_scale = 1.0 / std::sqrt(192.0);  // DeepSeek: 1/sqrt(qk_nope + qk_rope)
  in.q_start = {0};
  for (int b = 0; b < opt.batch; ++b) {
    // Mixed lengths, none a multiple of N; at least the query token itself.
    const std::int64_t len = std::max<std::int64_t>(1, opt.context - 37 * b);
    std::vector<float> kv(static_cast<std::size_t>(len) * width);
    for (float& v : kv) v = bf16_to_float(float_to_bf16(normal(gen)));
    if (dtype == KvDtype::fp32)
      for (float& v : kv) v += 1e-3f * normal(gen);
    in.kv.push_back(std::move(kv));
    in.q_pos.push_back(len - 1);
    for (int i = 0; i < heads * width; ++i) in.q.push_back(normal(gen));
    in.q_start.push_back(b + 1);
  }
  const std::int64_t rows = static_cast<std::int64_t>(opt.batch) * heads;

  std::vector<float> o_parts(static_cast<std::size_t>(n) * rows * dc),
      lse_parts(static_cast<std::size_t>(n) * rows);
  double local_ms = 0;
  std::printf(
      "dcp demo: %d requests, contexts up to %d tokens, %d heads, latent %d+%d, %s KV, page %d, "
      "DCP %d\n",
      opt.batch, opt.context, heads, dc, dr, std::string(to_string(dtype)).c_str(), opt.page_size,
      n);
  // Each rank's shard through the KV cache, as the engine builds it: an allocator replica, the
  // rank's pool, owner-only writes, and the planner's rank-local lengths and page tables.
  const std::int64_t vp = static_cast<std::int64_t>(opt.page_size) * n;
  std::int64_t pages = 0;
  for (const auto& kv : in.kv)
    pages += (static_cast<std::int64_t>(kv.size()) / width + vp - 1) / vp;
  for (int r = 0; r < n; ++r) {
    KvAllocator alloc(n, opt.page_size, pages);
    LatentPool pool(pages, opt.page_size, {dc, dr, dtype});
    KvShard shard(alloc, pool, r);
    std::vector<BatchEntry> batch;
    for (int b = 0; b < opt.batch; ++b) {
      const std::int64_t len = static_cast<std::int64_t>(in.kv[b].size()) / width;
      alloc.allocate(b, len);
      shard.write(b, 0, len, in.kv[b].data());
      batch.push_back({b, 1});  // decode: the last token is the query
    }
    const ForwardPlan plan = plan_forward(alloc, batch, r);
    MlaAttentionParams p = plan.kernel_params(pool);
    p.num_heads = heads;
    p.softmax_scale = static_cast<float>(in.softmax_scale);
    p.q = in.q.data();
    p.out = o_parts.data() + r * rows * dc;
    p.lse = lse_parts.data() + r * rows;
    const auto t0 = std::chrono::steady_clock::now();
    mla_attention(p);
    local_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  rank %d: %lld KV rows, local attention done\n", r,
                static_cast<long long>(std::accumulate(plan.local_len.begin(), plan.local_len.end(),
                                                       std::int64_t{0})));
  }
  std::vector<float> out(static_cast<std::size_t>(rows) * dc), lse(rows);
  merge_attention_states(o_parts.data(), lse_parts.data(), n, rows, dc, LseBase::e, out.data(),
                         lse.data());
  const ref::AttentionResult full = ref::full_attention(in);

  const auto errors = [&](const std::vector<float>& o) {
    double err = 0, norm = 0, max_abs = 0;
    for (std::size_t i = 0; i < o.size(); ++i) {
      const double d = o[i] - full.out[i];
      err += d * d;
      norm += full.out[i] * full.out[i];
      max_abs = std::max(max_abs, std::abs(d));
    }
    return std::pair{norm > 0 ? err / norm : err, max_abs};
  };
  const auto [nmse, max_abs] = errors(out);
  std::vector<float> averaged(out.size(), 0.0f);
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < averaged.size(); ++i) averaged[i] += o_parts[r * rows * dc + i] / n;
  }
  const auto [avg_nmse, avg_max] = errors(averaged);
  double lse_err = 0;
  for (std::int64_t i = 0; i < rows; ++i)
    lse_err = std::max(lse_err, std::abs(lse[i] - full.lse[i]));
  std::printf("local attention on %d shards: %.1f ms in all\n", n, local_ms);
  std::printf("LSE merge vs float64 full attention: nmse %.3g, max |dO| %.3g, max |dLSE| %.3g\n",
              nmse, max_abs, lse_err);
  std::printf("averaging O without LSE (wrong):     nmse %.3g, max |dO| %.3g\n", avg_nmse, avg_max);
  const bool ok = nmse < 1e-9 && (n == 1 || avg_nmse > 100 * nmse);
  std::printf("%s\n", ok ? "OK: the merged result equals full attention up to float rounding"
                         : "FAILED: merged result differs from full attention");
  return ok ? 0 : 1;
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto opt = std::make_shared<DemoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "Stripe random contexts over N shards, attend, merge, compare with full attention");
  cmd->add_option("--dcp-size", opt->dcp_size, "DCP group size N")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--heads", opt->heads, "query heads")->check(at_least(1))->capture_default_str();
  cmd->add_option("--context", opt->context, "context length of the first request")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--batch", opt->batch, "requests")->check(at_least(1))->capture_default_str();
  cmd->add_option("--page-size", opt->page_size, "rows per KV page")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--kv-cache-dtype", opt->kv_dtype, "fp32 or bf16")
      ->check(one_of({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--seed", opt->seed, "random seed")->check(at_least(0))->capture_default_str();
  cmd->callback([opt] { set_exit_code(run_demo(*opt)); });
}

int exit_code() {
  return g_exit_code;
}
void set_exit_code(int code) {
  g_exit_code = code;
}

}  // namespace dcp::cli

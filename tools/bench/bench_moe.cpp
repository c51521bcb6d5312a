// dcp bench moe: one mixture-of-experts layer at decode batch sizes, against the bytes of the
// expert weights it reads and the read ceiling measured in the same run.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "cli/cli_checks.h"
#include "dcp/deployment.h"
#include "dcp/error.h"
#include "dcp/feed_forward.h"
#include "dcp/model.h"
#include "dcp/weights.h"

namespace dcp::cli {
namespace {

// The preset's geometry with its weights held in `dtype`: "bf16", "fp8" (E4M3 projections in
// 128 x 128 blocks, as DeepSeek-V3 ships them) or "int4" (routed experts in INT4 groups of 32,
// the rest bf16, as Kimi-K2-Thinking ships them).
ModelConfig moe_config(const std::string& preset, const std::string& dtype, int* layer) {
  ModelConfig c = preset_config(preset);
  *layer = -1;
  for (int i = 0; i < c.num_hidden_layers && *layer < 0; ++i)
    if (c.is_moe_layer(i)) *layer = i;
  DCP_ARG_CHECK(*layer >= 0, "--preset ", preset, " has no mixture-of-experts layer (use one of: ",
                "deepseek-v2-lite, deepseek-v3, kimi-k2, kimi-k2-thinking, moonlight)");
  c.num_hidden_layers = *layer + 1;
  c.weight_block_rows = c.weight_block_cols = 128;
  hold_weights_as(c, dtype);
  return c;
}

// The layer over `ranks` thread ranks for each EP size (1: every expert sliced over the ranks):
// time of a forward and the reduction that completes it, and the bytes the ranks send per token.
void bench_moe_parallel(const MoeBenchOptions& o, const std::vector<std::int64_t>& batches,
                        const std::vector<std::string>& dtypes) {
  const std::vector<std::int64_t> eps = parse_list(o.ep_sizes, "--ep-sizes");
  DCP_ARG_CHECK(!o.threads_given || o.threads == "1", "--threads ", o.threads,
                " with --ranks > 1: each rank runs one thread (legal: 1, or leave it out)");
  const bool cold = parse_cache_state(o.cache, "--cache") == CacheState::cold;
  {
    int layer = 0;
    const ModelConfig c = moe_config(o.preset, dtypes.front(), &layer);
    for (std::int64_t ep : eps) {
      DCP_ARG_CHECK(ep >= 1 && o.ranks % ep == 0 && c.n_routed_experts % ep == 0, "--ep-sizes: ",
                    ep, " must divide --ranks ", o.ranks, " and the ", c.n_routed_experts,
                    " routed experts");
    }
  }
  std::printf(
      "one MoE layer of %s over %d thread ranks: TP-sliced experts (ep 1) vs expert parallel, "
      "medians of %d calls, %s caches; ms = rank 0's forward plus the sum over ranks that "
      "completes it; sent/token = bytes all ranks send to each other per token\n",
      o.preset.c_str(), o.ranks, o.repeats, cold ? "cold" : "warm");
  std::printf("%-5s %4s %5s | %10s %14s %14s %12s\n", "dtype", "ep", "batch", "ms",
              "sent/token B", "dispatch+ret B", "read MB r0");
  CsvFile csv(o.csv, {"preset", "dtype", "ranks", "ep_size", "batch", "ms", "bytes_sent_per_token",
                      "ep_bytes_sent_per_token", "weight_bytes_read_rank0", "cache"});
  for (const std::string& dtype : dtypes) {
    int layer = 0;
    const ModelConfig c = moe_config(o.preset, dtype, &layer);
    const auto w = make_synthetic_weights(o.seed, c, WeightDtype::bf16);
    for (std::int64_t ep : eps) {
      for (std::int64_t batch : batches) {
        std::vector<double> ms;
        double sent = 0, ep_sent = 0, read0 = 0;
        std::vector<double> rank_sent(static_cast<std::size_t>(o.ranks)),
            rank_ep(static_cast<std::size_t>(o.ranks));
        launch_ranks({RankTransport::threads, o.ranks, {}}, [&](Communicator& world, bool) {
          const MoeLayer moe(c, *w, layer, world.rank(), o.ranks,
                             {static_cast<int>(ep), &world});
          std::optional<CacheFlusher> memory;  // its buffer only when caches are flushed
          if (cold) memory.emplace();
          std::vector<float> x(static_cast<std::size_t>(batch * c.hidden_size)), y(x.size());
          fill(x.data(), x.size(), static_cast<std::uint64_t>(batch));
          const auto step = [&](MoeStats& s) {
            moe.forward(x.data(), batch, y.data(), &s);
            world.all_reduce(y.data(), y.data(), y.size(), ScalarType::f32);
          };
          MoeStats s;
          const CommStats before = world.stats();
          step(s);  // warm-up, and the bytes of one step
          rank_sent[static_cast<std::size_t>(world.rank())] =
              static_cast<double>((world.stats() - before).total_bytes());
          rank_ep[static_cast<std::size_t>(world.rank())] =
              static_cast<double>(s.dispatch_bytes_sent + s.return_bytes_sent);
          for (int r = 0; r < o.repeats; ++r) {
            if (memory) memory->flush(1);
            world.barrier();
            const auto t0 = Clock::now();
            step(s);
            if (world.rank() == 0) ms.push_back(ms_since(t0));
          }
          if (world.rank() == 0) read0 = static_cast<double>(s.weight_bytes_read);
        });
        for (std::size_t r = 0; r < rank_sent.size(); ++r) {
          sent += rank_sent[r];
          ep_sent += rank_ep[r];
        }
        const double med = median(ms), per_token = sent / static_cast<double>(batch);
        const double ep_per_token = ep_sent / static_cast<double>(batch);
        std::printf("%-5s %4lld %5lld | %10.3f %14.0f %14.0f %12.1f\n", dtype.c_str(),
                    static_cast<long long>(ep), static_cast<long long>(batch), med, per_token,
                    ep_per_token, read0 / 1e6);
        std::fflush(stdout);
        csv.row({o.preset, dtype, str(o.ranks), str(ep), str(batch), str(med), str(per_token),
                 str(ep_per_token), str(read0), o.cache});
      }
    }
  }
}

}  // namespace

void bench_moe(const MoeBenchOptions& o) {
  const std::vector<std::int64_t> batches = parse_list(o.batches, "--batches");
  const std::vector<std::int64_t> threads = parse_list(o.threads, "--threads");
  const std::vector<std::string> dtypes = comma_items(o.dtypes);  // checked by the flag's validator
  const bool cold = parse_cache_state(o.cache, "--cache") == CacheState::cold;
  for (std::int64_t b : batches)
    DCP_ARG_CHECK(b >= 1 && b <= 65536, "--batches: ", b, " must be in [1, 65536]");
  for (std::int64_t t : threads)
    DCP_ARG_CHECK(t >= 1 && t <= 256, "--threads: ", t, " must be in [1, 256]");
  DCP_ARG_CHECK(o.ranks <= 64, "--ranks ", o.ranks, " must be in [1, 64]");
  DCP_ARG_CHECK(o.ranks > 1 || o.ep_sizes == "1", "--ep-sizes ", o.ep_sizes,
                " needs --ranks > 1 (expert parallelism spans ranks)");
  if (o.ranks > 1) {
    DCP_ARG_CHECK(o.svg.empty(), "--svg plots the single-rank rows; with --ranks > 1 use --csv");
    bench_moe_parallel(o, batches, dtypes);
    return;
  }
  CacheFlusher memory;
  std::printf(
      "one MoE layer of %s at TP 1 (router, shared and routed experts), medians of %d calls, %s "
      "caches; weights read = the router, the shared experts and the routed experts the batch "
      "ran; read = the read ceiling measured now with as many threads\n",
      o.preset.c_str(), o.repeats, cold ? "cold" : "warm");
  std::printf("%-5s %7s %5s | %8s %9s %10s %8s %8s %6s\n", "dtype", "threads", "batch", "experts",
              "read MB", "ms", "GB/s", "read", "%read");
  CsvFile csv(o.csv, {"preset", "dtype", "threads", "batch", "experts_run", "weight_bytes_read",
                      "ms", "gbps", "read_gbps", "fraction_of_read", "cache"});
  std::vector<Series> chart;
  for (const std::string& dtype : dtypes) {
    int layer = 0;
    const ModelConfig c = moe_config(o.preset, dtype, &layer);
    const auto w = make_synthetic_weights(o.seed, c, WeightDtype::bf16);
    // The bytes of the MoE layer alone (all layers up to it, less those before it), checked
    // before it is drawn.
    ModelConfig before = c;
    before.num_hidden_layers = layer;
    const double layer_bytes = weight_bytes_per_rank(c, 1, checkpoint_element_bytes(c, 2.0)) -
                               weight_bytes_per_rank(before, 1, checkpoint_element_bytes(c, 2.0));
    check_fits_in_memory(layer_bytes + 2.0 * memory.bytes(),
                         str("one MoE layer of ", o.preset, " in ", dtype),
                         "choose a smaller --preset");
    const MoeLayer moe(c, *w, layer, 0, 1);
    for (std::int64_t t : threads) {
      set_blas_threads(static_cast<int>(t));
      const ScopedWeightThreads weight_threads(static_cast<int>(t));
      const double read = memory.read_gbps(static_cast<int>(t));
      for (std::int64_t batch : batches) {
        std::vector<float> x(static_cast<std::size_t>(batch * c.hidden_size)), y(x.size());
        fill(x.data(), x.size(), static_cast<std::uint64_t>(batch));
        MoeStats stats;
        moe.forward(x.data(), batch, y.data(), &stats);  // warm-up: allocations, BLAS threads
        std::vector<double> ms;
        for (int r = 0; r < o.repeats; ++r) {
          if (cold) memory.flush(static_cast<int>(t));
          const auto t0 = Clock::now();
          moe.forward(x.data(), batch, y.data(), &stats);
          ms.push_back(ms_since(t0));
        }
        const double med = median(ms);
        const double gbps = static_cast<double>(stats.weight_bytes_read) / med / 1e6;
        std::printf("%-5s %7lld %5lld | %8d %9.1f %10.3f %8.1f %8.1f %5.0f%%\n", dtype.c_str(),
                    static_cast<long long>(t), static_cast<long long>(batch), stats.experts_run,
                    stats.weight_bytes_read / 1e6, med, gbps, read, 100 * gbps / read);
        std::fflush(stdout);
        csv.row({o.preset, dtype, str(t), str(batch), str(stats.experts_run),
                 str(stats.weight_bytes_read), str(med), str(gbps), str(read), str(gbps / read),
                 o.cache});
        add_point(chart, str(dtype, ", ", t, " thread(s)"), static_cast<double>(batch),
                  100 * gbps / read);
      }
    }
  }
  set_blas_threads(1);
  if (!o.svg.empty()) {
    write_svg_chart(o.svg, str("one MoE layer of ", o.preset, ": weight reads vs read ceiling"),
                    "batch (tokens)", "% of read ceiling", chart, true);
  }
}

void add_moe_bench(CLI::App* bench) {
  auto o = std::make_shared<MoeBenchOptions>();
  CLI::App* cmd = bench->add_subcommand(
      "moe", "one MoE layer at decode batches: expert weight bytes read vs the read ceiling");
  cmd->add_option("--preset", o->preset, "a geometry with MoE layers")
      ->check(
          one_of({"deepseek-v2-lite", "deepseek-v3", "kimi-k2", "kimi-k2-thinking", "moonlight"}))
      ->capture_default_str();
  cmd->add_option("--batches", o->batches, "tokens per forward (comma-separated)")
      ->check(list_at_least(1))
      ->capture_default_str();
  cmd->add_option("--dtypes", o->dtypes,
                  "weight dtypes (comma-separated): bf16, fp8, int4 (routed experts; the rest "
                  "bf16)")
      ->check(list_of({"bf16", "fp8", "int4"}))
      ->capture_default_str();
  cmd->add_option("--threads", o->threads,
                  "threads of the weight products and BLAS (comma-separated)")
      ->check(list_at_least(1))
      ->capture_default_str();
  cmd->add_option("--ranks", o->ranks,
                  "thread ranks the layer spans (> 1: TP-sliced vs expert parallel rows)")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--ep-sizes", o->ep_sizes,
                  "with --ranks > 1: expert parallel sizes to compare (comma-separated; 1: "
                  "experts sliced over the ranks)")
      ->check(list_at_least(1))
      ->capture_default_str();
  cmd->add_option("--repeats", o->repeats, "timed calls per point (median)")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--cache", o->cache,
                  "cold: flush the caches before every timed call; warm: repeat on warm caches")
      ->check(one_of({"cold", "warm"}))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "weight seed")->capture_default_str();
  add_output_files(cmd, o->csv, o->svg, "a plot (% of the read ceiling vs batch)");
  cmd->callback([o, cmd] {
    o->threads_given = cmd->count("--threads") > 0;
    bench_moe(*o);
  });
}

}  // namespace dcp::cli

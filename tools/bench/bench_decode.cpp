// dcp bench decode: whole decode steps of a family geometry with its weights held in fp32, bf16
// or FP8, against the step's roofline measured in the same run: the bytes a step must read
// (the weights it touches, with only the routed experts a batch is expected to use, plus the KV)
// over this machine's read ceiling, or its FLOPs over its compute ceiling (the faster of BLAS's
// sgemm and dcp's blocked product), whichever is longer.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "cli/cli_checks.h"
#include "dcp/blas.h"
#include "dcp/deployment.h"
#include "dcp/engine.h"
#include "dcp/error.h"
#include "dcp/kv_cache.h"
#include "dcp/memory.h"
#include "dcp/model.h"
#include "dcp/timing.h"
#include "dcp/weights.h"
#include "plan/plan_model.h"

namespace dcp::cli {
namespace {

struct DecodeConfig {
  int tp = 1, dcp = 1;
};

std::vector<DecodeConfig> parse_configs(const std::string& text) {
  std::vector<DecodeConfig> out;
  for (const std::string& item : comma_items(text)) {
    DecodeConfig c;
    int used = 0;
    if (std::sscanf(item.c_str(), "tp%ddcp%d%n", &c.tp, &c.dcp, &used) != 2 ||
        used != static_cast<int>(item.size()) || c.tp < 1 || c.dcp < 1 || c.tp % c.dcp != 0) {
      throw Error(ErrorCategory::invalid_argument,
                  str("--configs item '", item,
                      "' must be tpTdcpN with N dividing T (tp1dcp1, "
                      "tp2dcp2, ...)"));
    }
    out.push_back(c);
  }
  return out;
}

// The model as the dtype row holds it: fp32 or bf16 everywhere, FP8 block-scaled projections
// (the other matrices bf16) as DeepSeek-V3 ships, or INT4 routed experts (the rest bf16) as
// Kimi-K2-Thinking ships.
ModelSource model_in(const ModelConfig& base, const std::string& dtype) {
  ModelSource m;
  m.config = base;
  hold_weights_as(m.config, dtype);
  m.synthetic_dtype = dtype == "f32" ? WeightDtype::f32 : WeightDtype::bf16;
  return m;
}

// Puts `spec`'s prompt into the model's KV as random rows and hands the request to `engine` in
// decode state (Engine::adopt). Every rank of the model's groups calls it alike.
void adopt_with_random_kv(MlaModel& model, Engine& engine, const RequestSpec& spec) {
  const auto tokens = static_cast<std::int64_t>(spec.prompt.size());
  model.allocator().allocate(spec.id, tokens);
  const std::int64_t width = model.config().latent_width();
  constexpr std::int64_t kChunk = 1024;
  std::vector<float> rows(static_cast<std::size_t>(std::min(tokens, kChunk) * width));
  for (int l = 0; l < model.config().num_hidden_layers; ++l) {
    for (std::int64_t start = 0; start < tokens; start += kChunk) {
      const std::int64_t length = std::min(kChunk, tokens - start);
      fill(rows.data(), static_cast<std::size_t>(length * width),
           static_cast<std::uint64_t>(spec.id * 7919 + l * 104729 + start));
      model.kv_shard(l).write(spec.id, start, length, rows.data());
    }
  }
  engine.adopt(spec, spec.prompt.back());
}

}  // namespace

void bench_decode(const DecodeBenchOptions& o) {
  const ModelConfig base = preset_config(o.preset, o.num_layers);
  const std::vector<DecodeConfig> configs = parse_configs(o.configs);
  for (const DecodeConfig& c : configs) check_divides_heads(base, c.tp, "--configs");
  const auto contexts = parse_list(o.contexts, "--contexts");
  const auto batches = parse_list(o.batches, "--batches");
  const auto rank_threads = parse_list(o.threads, "--threads");
  std::vector<std::int64_t> prefill_tokens;
  for (const std::int64_t p : parse_list(o.prefill_tokens, "--prefill-tokens"))
    if (p > 0) prefill_tokens.push_back(p);
  for (const std::int64_t t : rank_threads) {
    DCP_ARG_CHECK(t >= 1 && t <= kMaxRankThreads, "--threads ", t, " must be in [1, ",
                  kMaxRankThreads, "] (threads per rank)");
  }
  const std::vector<std::string> dtypes = comma_items(o.dtypes);  // checked by the flag's validator
  DCP_ARG_CHECK(
      base.n_routed_experts > 0 || std::find(dtypes.begin(), dtypes.end(), "int4") == dtypes.end(),
      "--dtypes int4 holds the routed experts in INT4 (Kimi-K2-Thinking's layout); "
      "--preset ",
      o.preset,
      " has none (legal: deepseek-v2-lite, deepseek-v3, kimi-k2, "
      "kimi-k2-thinking, moonlight)");
  const KernelPath weight_kernel = parse_weight_kernel(o.weight_kernel);
  DCP_ARG_CHECK(weight_kernel != KernelPath::avx512_bf16 ||
                    std::find(dtypes.begin(), dtypes.end(), "f32") == dtypes.end(),
                "--weight-kernel avx512_bf16 multiplies bf16 and FP8 weights in pairs; --dtypes ",
                o.dtypes, " includes f32, whose model holds neither (legal with it: bf16, fp8)");
  const KernelPath attention_kernel = parse_attention_kernel(o.attention_kernel, KvDtype::bf16);

  // Before anything runs: an unwritable --csv fails at once.
  CsvFile csv(o.csv,
              {"mode", "config", "context", "batch", "threads", "weights_dtype", "tokens_per_s",
               "step_ms", "bytes_per_step", "flops_per_step", "read_gbps", "sgemm_gflops",
               "blocked_gflops", "compute_gflops", "roofline_ms", "roofline_fraction"});
  // Ceilings of this machine, per thread count the configurations use.
  CacheFlusher flusher;
  std::printf(
      "decode steps, %s %d layer(s), bf16 KV, ranks as threads; medians over %d steps; weights "
      "and KV advised onto transparent huge pages (THP mode: %s)\n",
      o.preset.c_str(), base.num_hidden_layers, o.new_tokens - 1, transparent_huge_pages().c_str());
  std::printf(
      "roofline: max(bytes / read ceiling, flops / compute ceiling), both measured now on all "
      "the threads (ranks x threads per rank); bytes: weights touched (routed experts: "
      "expected distinct per step) + KV\n");
  std::printf("weight kernel (decode shapes): %s; prefill shapes: %s\n",
              weight_kernel_label(weight_kernel).c_str(),
              weight_prefill_kernel_label(weight_kernel).c_str());
  // The compute ceiling is the weight products'; a bf16-pair attention path runs its FLOPs on
  // bf16 pairs, faster than an fp32 ceiling allows.
  const std::string attention_label =
      is_bf16_pair_path(attention_kernel)
          ? str(to_string(attention_kernel),
                " (bf16 pairs, q and P rounded to bf16: its FLOPs can run above an fp32 compute "
                "ceiling)")
          : str(to_string(resolve_exact_path(attention_kernel)), " (exact)");
  std::printf("attention kernel: %s\n", attention_label.c_str());
  std::printf("%-7s %-8s %5s %8s %6s %8s | %10s %9s %9s %9s %9s | %8s\n", "mode", "config", "dtype",
              "context", "batch", "threads", "tokens/s", "step ms", "MB/step", "GFLOP", "roof ms",
              "% roof");
  for (const DecodeConfig& pc_in : configs) {
    for (const std::int64_t per_rank : rank_threads) {
      const int threads = pc_in.tp * static_cast<int>(per_rank);
      const double read_gbps = flusher.read_gbps(threads);
      // dcp's product first: OpenBLAS's workers spin on after a call and would take a core
      // from it (dcp's pool spins 200 us, which sgemm's untimed first call absorbs).
      const double blocked_gflops = measure_blocked_gflops(threads, 1024, weight_kernel);
      const double sgemm_gflops = measure_sgemm_gflops(threads, 1024);
      const double compute_gflops = std::max(sgemm_gflops, blocked_gflops);
      // avx512_bf16 runs bf16 and FP8 weights in pairs: their rows' ceiling is that product's rate
      // (timed for the dtypes this run has).
      const bool pairs = weight_kernel == KernelPath::avx512_bf16;
      const auto pairs_gflops = [&](const char* dtype, WeightDtype d) {
        const bool asked = std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
        return pairs && asked ? measure_blocked_gflops(threads, 1024, weight_kernel, d) : 0.0;
      };
      const double pairs_bf16_gflops = pairs_gflops("bf16", WeightDtype::bf16);
      const double pairs_fp8_gflops = pairs_gflops("fp8", WeightDtype::f8_e4m3);
      char blocked_label[48];
      if (blocked_gflops > 0) {
        std::snprintf(blocked_label, sizeof blocked_label, "%.1f", blocked_gflops);
      } else {
        const std::string_view path = to_string(resolve_exact_path(weight_kernel));
        std::snprintf(blocked_label, sizeof blocked_label, "not on the %.*s path",
                      static_cast<int>(path.size()), path.data());
      }
      std::string pairs_label;
      for (const auto& [name, gflops] :
           {std::pair{"bf16", pairs_bf16_gflops}, std::pair{"FP8", pairs_fp8_gflops}}) {
        char part[64];
        std::snprintf(part, sizeof part, "; bf16 pairs on %s weights %.1f GFLOP/s", name, gflops);
        if (gflops > 0) pairs_label += part;
      }
      std::printf(
          "# tp %d dcp %d, %lld thread(s) per rank: read ceiling %.1f GB/s, compute ceiling %.1f "
          "GFLOP/s (%d thread%s; sgemm %.1f with %s, dcp's blocked product %s)%s\n",
          pc_in.tp, pc_in.dcp, static_cast<long long>(per_rank), read_gbps, compute_gflops, threads,
          threads == 1 ? "" : "s", sgemm_gflops, blas_kernels_label().c_str(), blocked_label,
          pairs_label.c_str());
      for (const std::string& dtype : dtypes) {
        const ModelSource model = model_in(base, dtype);
        const ModelConfig& c = model.config;
        const double other_bytes = dtype == "f32" ? 4.0 : 2.0;
        const auto element_bytes = checkpoint_element_bytes(c, other_bytes);
        // Weights touched by a forward of `tokens` tokens over all ranks, and the parameters
        // each token multiplies (plan_model.h).
        const auto weights_for = [&](std::int64_t tokens) {
          WeightTraffic t = weight_traffic(c, pc_in.tp, static_cast<double>(tokens), element_bytes);
          t.bytes *= pc_in.tp;
          t.params *= pc_in.tp;
          t.head_params *= pc_in.tp;
          return t;
        };
        // Attention FLOPs per query token and context row (absorbed MLA: scores and values).
        const double attn_flops_per_row = c.num_attention_heads *
                                          (2.0 * c.latent_width() + 2.0 * c.kv_lora_rank) *
                                          c.num_hidden_layers;
        const std::string config = str("tp", pc_in.tp, "dcp", pc_in.dcp);
        const double ceiling = !pairs            ? compute_gflops
                               : dtype == "bf16" ? std::max(compute_gflops, pairs_bf16_gflops)
                               : dtype == "fp8"  ? std::max(compute_gflops, pairs_fp8_gflops)
                                                 : compute_gflops;
        const auto report = [&](const char* mode, std::int64_t context, std::int64_t batch,
                                double ms, double tokens, double bytes, double flops) {
          const double roof_ms = std::max(bytes / (read_gbps * 1e9), flops / (ceiling * 1e9)) * 1e3;
          const double tokens_per_s = tokens / (ms / 1e3);
          std::printf("%-7s %-8s %5s %8lld %6lld %8d | %10.1f %9.2f %9.1f %9.2f %9.2f | %7.0f%%\n",
                      mode, config.c_str(), dtype.c_str(), static_cast<long long>(context),
                      static_cast<long long>(batch), threads, tokens_per_s, ms, bytes / 1e6,
                      flops / 1e9, roof_ms, 100.0 * roof_ms / ms);
          std::fflush(stdout);
          csv.row({mode, config, str(context), str(batch), str(threads), dtype, str(tokens_per_s),
                   str(ms), str(bytes), str(flops), str(read_gbps), str(sgemm_gflops),
                   str(blocked_gflops), str(ceiling), str(roof_ms), str(roof_ms / ms)});
        };
        ParallelConfig pc;
        pc.tp_size = pc_in.tp;
        pc.dcp_size = pc_in.dcp;
        const Topology topo = resolve(pc);
        LaunchOptions lo;
        lo.world_size = topo.world_size;
        // One model per (configuration, threads, dtype), its KV sized for the largest point.
        ModelOptions mo;
        mo.kv_dtype = KvDtype::bf16;
        mo.threads = static_cast<int>(per_rank);
        mo.weight_kernel = weight_kernel;
        mo.attention_kernel = attention_kernel;
        // Each request rounds up to whole (virtual) pages.
        const std::int64_t page = static_cast<std::int64_t>(mo.page_size) * pc_in.dcp;
        const auto pages = [&](std::int64_t tokens) { return (tokens + page - 1) / page * page; };
        for (const std::int64_t batch : batches)
          for (const std::int64_t context : contexts)
            mo.kv_capacity_tokens =
                std::max(mo.kv_capacity_tokens,
                         batch * pages(std::max<std::int64_t>(1, context) + o.new_tokens));
        for (const std::int64_t prompt : prefill_tokens)
          mo.kv_capacity_tokens = std::max(mo.kv_capacity_tokens, pages(prompt + 2));
        mo.kv_capacity_tokens += page;
        launch_ranks(lo, [&](Communicator& world, bool) {
          RankSystem sys(world, topo, model, mo, EngineOptions{});
          const bool reporter = world.rank() == 0;
          for (const std::int64_t batch : batches) {
            const WeightTraffic all = weights_for(batch);
            for (const std::int64_t context_in : contexts) {
              // The context's KV is written directly (random rows) and the requests adopted in
              // decode state, as a disaggregated decode side receives them: a step's time does
              // not depend on the KV's values, and prefilling 32K-token contexts here would take
              // longer than all the decode rows.
              const std::int64_t context = std::max<std::int64_t>(1, context_in);
              EngineOptions eo;
              eo.max_running_requests = static_cast<int>(batch);
              Engine engine(sys.model(), eo);
              for (const RequestSpec& r :
                   random_requests(batch, context, o.new_tokens, c.vocab_size)) {
                adopt_with_random_kv(sys.model(), engine, r);
              }
              engine.run();
              if (!reporter) continue;
              const double step_ms = median(engine.stats().decode_step_ms);
              // KV read per step: every token's context over all layers, once over the DCP
              // group (each attention-TP group of the TP ranks reads its own copy when DCP < TP).
              const double kv_bytes = static_cast<double>(batch) * (context + o.new_tokens / 2) *
                                      c.latent_width() * 2.0 * c.num_hidden_layers *
                                      (static_cast<double>(pc_in.tp) / pc_in.dcp);
              const double attn_flops =
                  static_cast<double>(batch) * (context + o.new_tokens / 2) * attn_flops_per_row;
              report("decode", context_in, batch, step_ms, static_cast<double>(batch),
                     all.bytes + kv_bytes, 2.0 * batch * all.params + attn_flops);
            }
          }
          // Prefill: one request's prompt of P tokens in one chunk, three requests one after the
          // other; the mean of their prefill forwards. One untimed prompt first: the first
          // forward of a size grows the per-thread work buffers and faults their pages in (up to
          // a fifth of its time), which a serving engine pays once, not per prompt.
          for (const std::int64_t prompt : prefill_tokens) {
            constexpr int kRequests = 3;
            EngineOptions eo;
            eo.chunked_prefill_size = static_cast<int>(prompt);
            eo.max_running_requests = 1;
            {
              Engine warm_up(sys.model(), eo);
              warm_up.submit(random_requests(1, prompt, 1, c.vocab_size).front());
              warm_up.run();
            }
            Engine engine(sys.model(), eo);
            for (const RequestSpec& r : random_requests(kRequests, prompt, 1, c.vocab_size))
              engine.submit(r);
            engine.run();
            if (!reporter) continue;
            const double prefill_ms = engine.stats().prefill_ms / kRequests;
            const WeightTraffic all = weights_for(prompt);
            const double p = static_cast<double>(prompt);
            const double kv_bytes = p * c.latent_width() * 2.0 * c.num_hidden_layers *
                                    (static_cast<double>(pc_in.tp) / pc_in.dcp);
            report("prefill", prompt, 1, prefill_ms, p, all.bytes + kv_bytes,
                   2.0 * (p * (all.params - all.head_params) + all.head_params) +
                       p * (p + 1) / 2 * attn_flops_per_row);
          }
        });
      }
    }
  }
}

void add_decode_bench(CLI::App* bench) {
  auto o = std::make_shared<DecodeBenchOptions>();
  CLI::App* cmd = bench->add_subcommand(
      "decode",
      "Whole decode steps with weights in fp32, bf16 or FP8, against the step's roofline");
  cmd->add_option("--preset", o->preset, std::string("model geometry: ") + preset_names())
      ->capture_default_str();
  cmd->add_option("--num-layers", o->num_layers, "layers")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--configs", o->configs, "comma-separated tpTdcpN (ranks as threads)")
      ->capture_default_str();
  cmd->add_option("--dtypes", o->dtypes,
                  "comma-separated weight dtypes: f32, bf16, fp8, int4 (routed experts; the rest "
                  "bf16)")
      ->check(list_of({"f32", "bf16", "fp8", "int4"}))
      ->capture_default_str();
  cmd->add_option("--contexts", o->contexts,
                  "comma-separated context lengths (0: a 1-token prompt)")
      ->check(list_at_least(0))
      ->capture_default_str();
  cmd->add_option("--batches", o->batches, "comma-separated batch sizes")
      ->check(list_at_least(1))
      ->capture_default_str();
  cmd->add_option("--threads", o->threads,
                  "comma-separated threads per rank (the table's threads column counts all ranks')")
      ->check(list_at_least(1))
      ->capture_default_str();
  cmd->add_option("--prefill-tokens", o->prefill_tokens,
                  "comma-separated prompt lengths of the prefill rows, each prefilled in one chunk "
                  "(0: none)")
      ->check(list_at_least(0))
      ->capture_default_str();
  cmd->add_option("--new-tokens", o->new_tokens, "tokens generated per request (steps + 1)")
      ->check(at_least(2))
      ->capture_default_str();
  cmd->add_option("--weight-kernel", o->weight_kernel, kWeightKernelHelp)->capture_default_str();
  cmd->add_option("--attention-kernel", o->attention_kernel, kAttentionKernelHelp)
      ->capture_default_str();
  cmd->add_option("--csv", o->csv, "write the table as CSV")->check(writable_file());
  cmd->callback([o] { bench_decode(*o); });
}

}  // namespace dcp::cli

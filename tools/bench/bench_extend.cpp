// dcp bench extend: gather vs DCP-native extend against prefix length.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "dcp/attention.h"
#include "dcp/comm_mpi.h"
#include "dcp/dcp_attention.h"
#include "dcp/deployment.h"
#include "dcp/error.h"
#include "dcp/kv_cache.h"
#include "dcp/merge.h"
#include "dcp/model.h"
#include "dcp/weights.h"

namespace dcp::cli {

std::vector<ExtendRow> bench_extend(const ExtendBenchOptions& o) {
  const ModelConfig config = preset_config(o.preset, o.num_layers);
  check_divides_heads(config, o.dcp_size, "--dcp-size");
  const std::vector<std::int64_t> prefixes = parse_list(o.prefix_lens, "--prefix-lens");
  const std::int64_t longest = *std::max_element(prefixes.begin(), prefixes.end());
  std::vector<ExtendRow> rows(prefixes.size());
  ParallelConfig pc;  // one group: TP = DCP
  pc.tp_size = o.dcp_size;
  pc.dcp_size = o.dcp_size;
  if (o.dcp_size > 1) pc.dcp_comm_backend = CombineBackend::a2a;
  const Topology topo = resolve(pc);
  ModelSource source;
  source.config = config;  // synthetic weights
  ModelOptions mo;
  mo.kv_dtype = KvDtype::bf16;
  mo.kv_capacity_tokens = longest + o.chunk + 64LL * o.dcp_size;
  LaunchOptions lo;
  lo.world_size = topo.world_size;
  launch_ranks(lo, [&](Communicator& world, bool) {
    RankSystem sys(world, topo, source, mo, EngineOptions{});
    MlaModel& model = sys.model();
    std::mt19937 gen(7);
    std::uniform_int_distribution<std::int32_t> token(0, config.vocab_size - 1);
    for (std::size_t i = 0; i < prefixes.size(); ++i) {
      const RequestId id = static_cast<RequestId>(i);
      const std::int64_t prefix = prefixes[i];
      // Build the prefix once (in chunks, native path: cheap), then time extends over it.
      model.allocator().allocate(id, 0);
      for (std::int64_t at = 0; at < prefix;) {
        const std::int64_t n = std::min<std::int64_t>(2048, prefix - at);
        model.extend(id, n);
        ForwardBatch b;
        b.mode = ForwardMode::extend_native;
        b.entries = {{id, static_cast<std::int32_t>(n)}};
        for (std::int64_t k = 0; k < n; ++k) b.tokens.push_back(token(gen));
        model.forward(b);
        at += n;
      }
      std::vector<std::int32_t> chunk(static_cast<std::size_t>(o.chunk));
      for (auto& t : chunk) t = token(gen);
      for (ForwardMode mode : {ForwardMode::extend, ForwardMode::extend_native}) {
        std::vector<double> ms;
        double bytes = 0;
        for (int r = 0; r < o.repeats; ++r) {
          model.extend(id, o.chunk);
          ForwardBatch b;
          b.mode = mode;
          b.entries = {{id, o.chunk}};
          b.tokens = chunk;
          ForwardTimings t;
          world.barrier();
          model.forward(b, &t);
          ms.push_back(t.total_ms);
          bytes = static_cast<double>(t.dcp_comm.total_bytes()) / config.num_hidden_layers;
          model.allocator().truncate(id,
                                     prefix);  // roll back: every repeat extends the same prefix
        }
        if (world.rank() != 0) continue;
        if (mode == ForwardMode::extend) {
          rows[i].gather_ms = median(ms);
          rows[i].gather_bytes = bytes;
        } else {
          rows[i].native_ms = median(ms);
          rows[i].native_bytes = bytes;
        }
      }
      rows[i].prefix = prefix;
      model.allocator().free(id);
    }
  });
  return rows;
}

void add_extend_bench(CLI::App* bench) {
  auto o = std::make_shared<ExtendBenchOptions>();
  CLI::App* ext = bench->add_subcommand(
      "extend", "Extend (prefill chunk over a cached prefix): gather vs DCP-native");
  ext->add_option("--preset", o->preset, "model geometry")->capture_default_str();
  ext->add_option("--num-layers", o->num_layers, "layers")
      ->check(at_least(1))
      ->capture_default_str();
  ext->add_option("--dcp-size", o->dcp_size, "DCP size (= TP size; ranks as threads)")
      ->check(at_least(1))
      ->capture_default_str();
  ext->add_option("--chunk", o->chunk, "tokens per extend")
      ->check(at_least(1))
      ->capture_default_str();
  ext->add_option("--prefix-lens", o->prefix_lens, "comma-separated prefix lengths")
      ->check(list_at_least(0))
      ->capture_default_str();
  ext->add_option("--repeats", o->repeats, "timed extends per point (median reported)")
      ->check(at_least(1))
      ->capture_default_str();
  add_output_files(ext, o->csv, o->svg, "a plot (gather and native ms vs prefix)");
  ext->callback([o] {
    const auto rows = bench_extend(*o);
    std::printf(
        "extend of %d tokens, %s, %d layer(s), DCP %d (threads); bytes are DCP bytes sent per rank "
        "per layer\n",
        o->chunk, o->preset.c_str(), o->num_layers, o->dcp_size);
    std::printf("%10s %14s %14s %16s %16s %12s\n", "prefix", "gather ms", "native ms",
                "gather bytes", "native bytes", "native/gather");
    for (const auto& r : rows) {
      std::printf("%10lld %14.2f %14.2f %16.0f %16.0f %12.2f\n", static_cast<long long>(r.prefix),
                  r.gather_ms, r.native_ms, r.gather_bytes, r.native_bytes,
                  r.gather_ms > 0 ? r.native_ms / r.gather_ms : 0.0);
    }
    CsvFile csv(o->csv, {"prefix", "gather_ms", "native_ms", "gather_bytes_per_rank_layer",
                         "native_bytes_per_rank_layer"});
    for (const auto& r : rows) {
      csv.row({str(r.prefix), str(r.gather_ms), str(r.native_ms), str(r.gather_bytes),
               str(r.native_bytes)});
    }
    if (!o->svg.empty()) {
      Series gather{"gather (all-gather the prefix)", {}, {}}, native{"DCP-native", {}, {}};
      for (const auto& r : rows) {
        const auto x = static_cast<double>(std::max<std::int64_t>(r.prefix, 1));  // log axis
        gather.x.push_back(x);
        gather.y.push_back(r.gather_ms);
        native.x.push_back(x);
        native.y.push_back(r.native_ms);
      }
      write_svg_chart(o->svg, str("extend of ", o->chunk, " tokens, DCP ", o->dcp_size),
                      "prefix tokens (0 plotted at 1)", "ms", {gather, native}, true);
    }
  });
}

}  // namespace dcp::cli

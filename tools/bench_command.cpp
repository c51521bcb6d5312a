// `dcp bench ...`: measurements, each beside a baseline taken in the same run.
//   dcp bench extend   time and DCP bytes per extend (prefill chunk over a cached prefix),
//                      gather path vs DCP-native path, against prefix length.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "commands.h"
#include "dcp/comm_threads.h"
#include "dcp/error.h"
#include "dcp/model.h"
#include "dcp/weights.h"

namespace dcp::cli {
namespace {

struct ExtendBenchOptions {
  std::string preset = "tiny";
  int num_layers = 1;
  int dcp_size = 4;
  int chunk = 256;
  std::string prefix_lens = "0,256,1024,4096,16384";
  int repeats = 5;
  std::string csv;
};

struct ExtendRow {
  std::int64_t prefix = 0;
  double gather_ms = 0, native_ms = 0;           // median forward time
  double gather_bytes = 0, native_bytes = 0;     // DCP bytes sent per rank per layer
};

std::vector<std::int64_t> parse_list(const std::string& text, const char* flag) {
  std::vector<std::int64_t> v;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      v.push_back(std::stoll(item));
    } catch (const std::exception&) {
      throw Error(ErrorCategory::invalid_argument, str(flag, ": '", item, "' is not an integer"));
    }
    DCP_ARG_CHECK(v.back() >= 0, flag, ": ", v.back(), " must be >= 0");
  }
  DCP_ARG_CHECK(!v.empty(), flag, " is empty");
  return v;
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

std::vector<ExtendRow> bench_extend(const ExtendBenchOptions& o) {
  DCP_ARG_CHECK(o.dcp_size >= 1 && o.chunk >= 1 && o.repeats >= 1, "--dcp-size, --chunk and --repeats must be >= 1");
  const ModelConfig config = preset_config(o.preset, o.num_layers);
  const std::vector<std::int64_t> prefixes = parse_list(o.prefix_lens, "--prefix-lens");
  const std::int64_t longest = *std::max_element(prefixes.begin(), prefixes.end());
  std::vector<ExtendRow> rows(prefixes.size());
  set_blas_threads(1);
  run_threads(o.dcp_size, [&](Communicator& world) {
    auto dcp = world.split(0, world.rank());
    const auto weights = make_synthetic_weights(1234);
    ModelOptions mo;
    mo.backend = o.dcp_size > 1 ? CombineBackend::a2a : CombineBackend::ag_rs;
    mo.kv_dtype = KvDtype::bf16;
    mo.kv_capacity_tokens = longest + o.chunk + 64LL * o.dcp_size;
    MlaModel model(config, *weights, world, *dcp, mo);
    std::mt19937 gen(7);
    std::uniform_int_distribution<std::int32_t> token(0, config.vocab_size - 1);
    for (std::size_t i = 0; i < prefixes.size(); ++i) {
      const RequestId id = static_cast<RequestId>(i);
      const std::int64_t prefix = prefixes[i];
      // Build the prefix once (in chunks, native path: cheap), then time extends over it.
      model.allocator().allocate(id, 0);
      for (std::int64_t at = 0; at < prefix;) {
        const std::int64_t n = std::min<std::int64_t>(2048, prefix - at);
        model.allocator().extend(id, n);
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
          model.allocator().extend(id, o.chunk);
          ForwardBatch b;
          b.mode = mode;
          b.entries = {{id, o.chunk}};
          b.tokens = chunk;
          ForwardTimings t;
          world.barrier();
          model.forward(b, &t);
          ms.push_back(t.total_ms);
          bytes = static_cast<double>(t.dcp_comm.total_bytes()) / config.num_hidden_layers;
          model.allocator().truncate(id, prefix);  // roll back: every repeat extends the same prefix
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

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks, each against a baseline measured in the same run");
  bench->require_subcommand(1);
  auto o = std::make_shared<ExtendBenchOptions>();
  CLI::App* ext = bench->add_subcommand("extend", "Extend (prefill chunk over a cached prefix): gather vs DCP-native");
  ext->add_option("--preset", o->preset, "model geometry")->capture_default_str();
  ext->add_option("--num-layers", o->num_layers, "layers")->capture_default_str();
  ext->add_option("--dcp-size", o->dcp_size, "DCP size (= TP size; ranks as threads)")->capture_default_str();
  ext->add_option("--chunk", o->chunk, "tokens per extend")->capture_default_str();
  ext->add_option("--prefix-lens", o->prefix_lens, "comma-separated prefix lengths")->capture_default_str();
  ext->add_option("--repeats", o->repeats, "timed extends per point (median reported)")->capture_default_str();
  ext->add_option("--csv", o->csv, "also write the table as CSV");
  ext->callback([o] {
    const auto rows = bench_extend(*o);
    std::printf("extend of %d tokens, %s, %d layer(s), DCP %d (threads); bytes are DCP bytes sent per rank per layer\n",
                o->chunk, o->preset.c_str(), o->num_layers, o->dcp_size);
    std::printf("%10s %14s %14s %16s %16s %12s\n", "prefix", "gather ms", "native ms", "gather bytes", "native bytes", "native/gather");
    for (const auto& r : rows) {
      std::printf("%10lld %14.2f %14.2f %16.0f %16.0f %12.2f\n", static_cast<long long>(r.prefix), r.gather_ms,
                  r.native_ms, r.gather_bytes, r.native_bytes, r.gather_ms > 0 ? r.native_ms / r.gather_ms : 0.0);
    }
    if (!o->csv.empty()) {
      std::ofstream out(o->csv);
      out << "prefix,gather_ms,native_ms,gather_bytes_per_rank_layer,native_bytes_per_rank_layer\n";
      for (const auto& r : rows) {
        out << r.prefix << "," << r.gather_ms << "," << r.native_ms << "," << r.gather_bytes << "," << r.native_bytes << "\n";
      }
      DCP_CHECK(out.good(), io, "--csv: cannot write ", o->csv);
    }
  });
}

}  // namespace dcp::cli

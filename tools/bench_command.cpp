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

#include <cblas.h>

#include "bench_util.h"
#include "commands.h"
#include "dcp/attention.h"
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

// ---- local attention against the machine's ceilings and a two-GEMM peer ----

struct AttentionBenchOptions {
  std::string contexts = "4096,32768,131072";
  std::string heads = "1,4,16,128";
  std::string batches = "1,8";
  std::string dtypes = "fp32,bf16";
  int threads = 1;
  int repeats = 3;
  std::string csv, svg;
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Cheap deterministic fill (the values only need to be varied and finite).
void fill(float* x, std::size_t n, std::uint64_t seed) {
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (std::size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = static_cast<float>(static_cast<std::int64_t>(s >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
  }
}

// The peer: per request, scores = Q K^T (sgemm), a row softmax, O = P V (sgemm), on a contiguous
// fp32 copy of the rows (buffers allocated once, outside the timed loop).
struct TwoGemmPeer {
  int heads;
  std::int64_t rows;
  const float* kv;  // [B, rows, 576]
  std::vector<float> scores, out;
  TwoGemmPeer(int h, std::int64_t r, const float* k)
      : heads(h), rows(r), kv(k), scores(static_cast<std::size_t>(h) * r), out(static_cast<std::size_t>(h) * 512) {}
  void run(const float* q, int batch, float scale) {
    for (int b = 0; b < batch; ++b) {
      const float* k = kv + static_cast<std::size_t>(b) * rows * 576;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, heads, static_cast<int>(rows), 576, scale,
                  q + static_cast<std::size_t>(b) * heads * 576, 576, k, 576, 0.0f, scores.data(), static_cast<int>(rows));
      for (int h = 0; h < heads; ++h) {
        float* s = scores.data() + static_cast<std::size_t>(h) * rows;
        const float m = *std::max_element(s, s + rows);
        float z = 0;
        for (std::int64_t j = 0; j < rows; ++j) z += (s[j] = std::exp(s[j] - m));
        const float inv = 1.0f / z;
        for (std::int64_t j = 0; j < rows; ++j) s[j] *= inv;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, heads, 512, static_cast<int>(rows), 1.0f, scores.data(),
                  static_cast<int>(rows), k, 576, 0.0f, out.data(), 512);
    }
  }
};

void bench_attention(const AttentionBenchOptions& o) {
  DCP_ARG_CHECK(o.threads >= 1 && o.repeats >= 1, "--threads and --repeats must be >= 1");
  const auto contexts = parse_list(o.contexts, "--contexts");
  const auto heads = parse_list(o.heads, "--heads");
  const auto batches = parse_list(o.batches, "--batches");
  std::vector<KvDtype> dtypes;
  std::stringstream dl(o.dtypes);
  for (std::string d; std::getline(dl, d, ',');) dtypes.push_back(parse_kv_dtype(d));
  const double gemm = measure_sgemm_gflops(o.threads);
  const double read = measure_read_gbps(o.threads);
  openblas_set_num_threads(o.threads);
  const auto paths = available_kernel_paths();
  std::printf("local MLA decode attention, %d thread(s), kernel %s; ceilings measured now: sgemm %.1f GFLOP/s, read %.1f GB/s\n",
              o.threads, std::string(to_string(paths.back())).c_str(), gemm, read);
  std::printf("peer: two OpenBLAS sgemms + softmax on contiguous fp32 rows; PyTorch: not measured (python3-torch is not installed)\n");
  std::printf("%3s %7s %4s %5s | %9s %9s %6s %8s %6s | %9s %7s\n", "B", "S", "Hq", "KV", "ms", "GFLOP/s", "%gemm",
              "KV GB/s", "%read", "peer ms", "speedup");
  std::ofstream csv;
  if (!o.csv.empty()) {
    csv.open(o.csv);
    csv << "batch,context,heads,kv_dtype,threads,ms,gflops,pct_sgemm,kv_gbps,pct_read,peer_ms,speedup_vs_peer,sgemm_gflops,read_gbps\n";
  }
  std::vector<Series> series;
  for (std::int64_t batch : batches) {
    for (std::int64_t ctx : contexts) {
      const std::int64_t page = 64, pages_per = (ctx + page - 1) / page;
      std::vector<float> kv32(static_cast<std::size_t>(batch * ctx) * 576);
      fill(kv32.data(), kv32.size(), static_cast<std::uint64_t>(ctx));
      std::vector<bf16_t> kv16;
      std::vector<std::int32_t> table(static_cast<std::size_t>(batch * pages_per));
      for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<std::int32_t>(i);
      // The pool holds each request's rows contiguously, one page after another.
      std::vector<float> pool32(static_cast<std::size_t>(batch * pages_per * page) * 576, 0.0f);
      for (std::int64_t b = 0; b < batch; ++b) {
        std::copy_n(kv32.data() + b * ctx * 576, ctx * 576, pool32.data() + b * pages_per * page * 576);
      }
      for (std::int64_t h : heads) {
        std::vector<float> q(static_cast<std::size_t>(batch * h) * 576);
        fill(q.data(), q.size(), 99);
        TwoGemmPeer peer(static_cast<int>(h), ctx, kv32.data());
        peer.run(q.data(), static_cast<int>(batch), 0.07f);
        std::vector<double> peer_ms;
        for (int r = 0; r < o.repeats; ++r) {
          const auto t0 = Clock::now();
          peer.run(q.data(), static_cast<int>(batch), 0.07f);
          peer_ms.push_back(ms_since(t0));
        }
        const double peer_t = median(peer_ms);
        for (KvDtype dtype : dtypes) {
          if (dtype == KvDtype::bf16 && kv16.empty()) {
            kv16.resize(pool32.size());
            for (std::size_t i = 0; i < pool32.size(); ++i) kv16[i] = float_to_bf16(pool32[i]);
          }
          std::vector<std::int32_t> q_start(static_cast<std::size_t>(batch) + 1);
          std::vector<std::int64_t> q_pos(static_cast<std::size_t>(batch), ctx - 1), local_len(static_cast<std::size_t>(batch), ctx);
          for (std::int64_t b = 0; b <= batch; ++b) q_start[b] = static_cast<std::int32_t>(b);
          std::vector<float> out(static_cast<std::size_t>(batch * h) * 512), lse(static_cast<std::size_t>(batch * h));
          MlaAttentionParams p;
          p.num_heads = static_cast<int>(h);
          p.softmax_scale = 0.07f;
          p.num_requests = static_cast<int>(batch);
          p.q_start = q_start.data();
          p.q = q.data();
          p.q_pos = q_pos.data();
          p.kv = dtype == KvDtype::fp32 ? static_cast<const void*>(pool32.data()) : kv16.data();
          p.kv_dtype = dtype;
          p.num_pages = static_cast<std::int64_t>(table.size());
          p.page_size = static_cast<int>(page);
          p.page_table = table.data();
          p.page_table_stride = static_cast<int>(pages_per);
          p.local_len = local_len.data();
          p.num_threads = o.threads;
          p.out = out.data();
          p.lse = lse.data();
          mla_attention(p);
          std::vector<double> ms;
          for (int r = 0; r < o.repeats; ++r) {
            const auto t0 = Clock::now();
            mla_attention(p);
            ms.push_back(ms_since(t0));
          }
          const double t = median(ms);
          const double flops = 2.0 * (576 + 512) * static_cast<double>(h * ctx * batch);
          const double bytes = static_cast<double>(batch * ctx) * 576 * dtype_size(dtype);
          const double gflops = flops / t / 1e6, gbps = bytes / t / 1e6;
          std::printf("%3lld %7lld %4lld %5s | %9.2f %9.1f %5.0f%% %8.1f %5.0f%% | %9.2f %6.2fx\n", static_cast<long long>(batch),
                      static_cast<long long>(ctx), static_cast<long long>(h), std::string(to_string(dtype)).c_str(), t, gflops,
                      100 * gflops / gemm, gbps, 100 * gbps / read, peer_t, peer_t / t);
          std::fflush(stdout);
          if (csv.is_open()) {
            csv << batch << "," << ctx << "," << h << "," << to_string(dtype) << "," << o.threads << "," << t << "," << gflops
                << "," << gflops / gemm << "," << gbps << "," << gbps / read << "," << peer_t << "," << peer_t / t << ","
                << gemm << "," << read << "\n";
          }
          if (batch == batches.front() && ctx == contexts.back()) {
            const std::string name = str("S=", ctx, " B=", batch, " ", to_string(dtype));
            auto it = std::find_if(series.begin(), series.end(), [&](const Series& x) { return x.name == name; });
            if (it == series.end()) {
              series.push_back({name, {}, {}});
              it = series.end() - 1;
            }
            it->x.push_back(static_cast<double>(h));
            it->y.push_back(gflops);
          }
        }
      }
    }
  }
  if (!o.svg.empty()) {
    series.push_back({"sgemm ceiling", {}, {}});
    for (std::int64_t h : heads) {
      series.back().x.push_back(static_cast<double>(h));
      series.back().y.push_back(gemm);
    }
    write_svg_chart(o.svg, str("local MLA decode attention, ", o.threads, " thread(s)"), "query heads", "GFLOP/s", series, true);
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks, each against a baseline measured in the same run");
  bench->require_subcommand(1);
  auto ao = std::make_shared<AttentionBenchOptions>();
  CLI::App* att = bench->add_subcommand("attention", "Local MLA decode attention vs sgemm / read ceilings and a two-GEMM peer");
  att->add_option("--contexts", ao->contexts, "rank-local context lengths")->capture_default_str();
  att->add_option("--heads", ao->heads, "query heads")->capture_default_str();
  att->add_option("--batches", ao->batches, "requests per call")->capture_default_str();
  att->add_option("--dtypes", ao->dtypes, "KV dtypes")->capture_default_str();
  att->add_option("--threads", ao->threads, "threads (kernel split-KV and BLAS alike)")->capture_default_str();
  att->add_option("--repeats", ao->repeats, "timed calls per point (median)")->capture_default_str();
  att->add_option("--csv", ao->csv, "write the table as CSV");
  att->add_option("--svg", ao->svg, "write a plot (GFLOP/s vs heads) as SVG");
  att->callback([ao] { bench_attention(*ao); });

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

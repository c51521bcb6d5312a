// dcp bench attention: the local kernel against same-run ceilings, a two-GEMM peer and PyTorch.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <sstream>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "bench/torch_peer.h"
#include "dcp/attention.h"
#include "dcp/blas.h"
#include "dcp/comm_mpi.h"
#include "dcp/comm_threads.h"
#include "dcp/dcp_attention.h"
#include "dcp/error.h"
#include "dcp/kv_cache.h"
#include "dcp/memory.h"
#include "dcp/merge.h"
#include "dcp/model.h"
#include "dcp/weights.h"

namespace dcp::cli {

namespace {

// The peer: per request, scores = Q K^T (sgemm), a row softmax, O = P V (sgemm), on a contiguous
// fp32 copy of the rows (buffers allocated once, outside the timed loop). With T query tokens the
// request's T x heads query rows go through the same two products, token i seeing the first
// rows - T + i + 1 rows (the causal mask, applied in the softmax).
struct TwoGemmPeer {
  int heads, tokens;
  std::int64_t rows;
  const float* kv;  // [B, rows, 576]
  std::vector<float> scores, out;
  TwoGemmPeer(int h, int t, std::int64_t r, const float* k)
      : heads(h),
        tokens(t),
        rows(r),
        kv(k),
        scores(static_cast<std::size_t>(h) * t * r),
        out(static_cast<std::size_t>(h) * t * 512) {}
  void run(const float* q, int batch, float scale) {
    const int m_rows = heads * tokens;
    for (int b = 0; b < batch; ++b) {
      const float* k = kv + static_cast<std::size_t>(b) * rows * 576;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m_rows, static_cast<int>(rows), 576,
                  scale, q + static_cast<std::size_t>(b) * m_rows * 576, 576, k, 576, 0.0f,
                  scores.data(), static_cast<int>(rows));
      for (int r = 0; r < m_rows; ++r) {
        float* s = scores.data() + static_cast<std::size_t>(r) * rows;
        const std::int64_t seen = rows - tokens + r / heads + 1;
        const float m = *std::max_element(s, s + seen);
        float z = 0;
        for (std::int64_t j = 0; j < seen; ++j) z += (s[j] = std::exp(s[j] - m));
        const float inv = 1.0f / z;
        for (std::int64_t j = 0; j < seen; ++j) s[j] *= inv;
        std::fill(s + seen, s + rows, 0.0f);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m_rows, 512, static_cast<int>(rows),
                  1.0f, scores.data(), static_cast<int>(rows), k, 576, 0.0f, out.data(), 512);
    }
  }
};

// `value` right-aligned in `width` columns with `decimals` decimals.
std::string format_fixed(double value, int width, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%*.*f", width, decimals, value);
  return buf;
}

}  // namespace

void bench_attention(const AttentionBenchOptions& o) {
  const bool cold = parse_cache_state(o.cache, "--cache") == CacheState::cold;
  const auto contexts = parse_list(o.contexts, "--contexts");
  const auto heads = parse_list(o.heads, "--heads");
  const auto batches = parse_list(o.batches, "--batches");
  const std::int64_t tq = o.query_tokens;
  const std::int64_t shortest = *std::min_element(contexts.begin(), contexts.end());
  DCP_ARG_CHECK(tq <= shortest, "--query-tokens ", tq, " exceeds the shortest of --contexts, ",
                shortest, ": the chunk is the context's last positions");
  // Each entry is a KV dtype on the fastest exact path, or bf16 KV on a bf16-pair path: bf16-amx
  // (AMX), bf16-vdp (AVX512-BF16).
  struct Variant {
    std::string label;
    KvDtype dtype;
    KernelPath kernel;
  };
  const Variant pair_variants[] = {{"bf16-amx", KvDtype::bf16, KernelPath::amx_bf16},
                                   {"bf16-vdp", KvDtype::bf16, KernelPath::avx512_bf16}};
  std::vector<Variant> variants;
  std::stringstream dl(o.dtypes);
  for (std::string d; std::getline(dl, d, ',');) {
    const auto pair = std::find_if(std::begin(pair_variants), std::end(pair_variants),
                                   [&](const Variant& v) { return v.label == d; });
    if (pair != std::end(pair_variants)) {
      try {
        require_bf16_pair_path(pair->kernel);
        variants.push_back(*pair);
      } catch (const Error& e) {
        std::printf("%s: not measured (%s)\n", d.c_str(), e.what());
      }
      continue;
    }
    const KvDtype dtype = parse_kv_dtype(d);
    variants.push_back({std::string(to_string(dtype)), dtype, KernelPath::automatic});
  }
  const auto paths = available_kernel_paths();
  std::printf(
      "local MLA %s attention, %d thread(s), kernel %s; the ceilings (sgemm GFLOP/s, read "
      "GB/s) are measured again before each group of rows: this machine's speed drifts\n",
      tq == 1 ? "decode" : "prefill-chunk", o.threads,
      std::string(to_string(paths.back())).c_str());
  if (tq > 1) {
    std::printf(
        "query tokens: %lld per request, the context's last positions, causal (FLOPs count the "
        "rows each token sees)\n",
        static_cast<long long>(tq));
  }
  std::printf("peer: two OpenBLAS sgemms + softmax on contiguous fp32 rows; sgemm: %s\n",
              blas_kernels_label().c_str());
  CacheFlusher memory;  // also the read ceiling's buffer
  if (cold) {
    std::printf(
        "cache: cold, every timed call (kernel and peers) follows a %.0f MiB read that evicts the "
        "caches (--cache warm repeats calls instead)\n",
        static_cast<double>(memory.bytes()) / (1 << 20));
  } else {
    std::printf("cache: warm, calls repeat on whatever the caches kept (L3: %.0f MiB)\n",
                static_cast<double>(last_level_cache_bytes()) / (1 << 20));
  }
  // The PyTorch peer times decode only (one query token per request).
  const TorchPeer torch(tq == 1 ? o.torch_python : "off", o.threads, cold ? memory.bytes() : 0);
  if (torch.available()) {
    std::printf(
        "torch: %s, baddbmm + softmax + bmm in the KV dtype (bf16 rows: bf16 scores and "
        "softmax), buffers allocated once, same thread count\n",
        torch.version().c_str());
  } else if (tq > 1) {
    std::printf("torch: not measured (it times decode, --query-tokens 1)\n");
  } else {
    std::printf("torch: not measured (%s)\n", torch.reason().c_str());
  }
  std::string torch_dtypes;  // the dtypes the rows compare against
  for (const Variant& v : variants) {
    const std::string d(to_string(v.dtype));
    if (torch_dtypes.find(d) == std::string::npos)
      torch_dtypes += (torch_dtypes.empty() ? "" : ",") + d;
  }
  std::printf("%3s %7s %4s %8s | %9s %9s %6s %8s %6s | %9s %7s | %9s %8s | %6s %5s\n", "B", "S",
              "Hq", "KV", "ms", "GFLOP/s", "%gemm", "KV GB/s", "%read", "peer ms", "speedup",
              "torch ms", "vs torch", "sgemm", "read");
  std::vector<double> gemm_seen;  // for the plot's ceiling line
  CsvFile csv(o.csv, {"batch", "context", "query_tokens", "heads", "kv_dtype", "threads", "ms",
                      "gflops", "pct_sgemm", "kv_gbps", "pct_read", "peer_ms", "speedup_vs_peer",
                      "torch_ms", "speedup_vs_torch", "sgemm_gflops", "read_gbps"});
  std::vector<Series> series;
  for (std::int64_t batch : batches) {
    for (std::int64_t ctx : contexts) {
      const std::int64_t page = 64, pages_per = (ctx + page - 1) / page;
      std::vector<float> kv32(static_cast<std::size_t>(batch * ctx) * 576);
      fill(kv32.data(), kv32.size(), static_cast<std::uint64_t>(ctx));
      HugePageBuffer kv16_buf;
      std::vector<std::int32_t> table(static_cast<std::size_t>(batch * pages_per));
      for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<std::int32_t>(i);
      // The pool holds each request's rows contiguously, one page after another, in memory
      // allocated as LatentPool allocates it (huge pages where the kernel allows).
      const std::size_t pool_elems = static_cast<std::size_t>(batch * pages_per * page) * 576;
      HugePageBuffer pool32_buf(pool_elems * sizeof(float));
      auto* pool32 = reinterpret_cast<float*>(pool32_buf.data());
      for (std::int64_t b = 0; b < batch; ++b) {
        std::copy_n(kv32.data() + b * ctx * 576, ctx * 576, pool32 + b * pages_per * page * 576);
      }
      for (std::int64_t h : heads) {
        std::vector<float> q(static_cast<std::size_t>(batch * tq * h) * 576);
        fill(q.data(), q.size(), 99);
        TwoGemmPeer peer(static_cast<int>(h), static_cast<int>(tq), ctx, kv32.data());
        // The peer's BLAS on the benchmark's thread count: OpenBLAS starts with every core.
        openblas_set_num_threads(o.threads);
        peer.run(q.data(), static_cast<int>(batch), 0.07f);
        std::vector<double> peer_ms;
        for (int r = 0; r < o.repeats; ++r) {
          if (cold) memory.flush(o.threads);
          const auto t0 = Clock::now();
          peer.run(q.data(), static_cast<int>(batch), 0.07f);
          peer_ms.push_back(ms_since(t0));
        }
        const double peer_t = median(peer_ms);
        const auto torch_ms = torch.available() ? torch.time(batch, ctx, h, o.repeats, torch_dtypes)
                                                : std::map<std::string, double>{};
        const double gemm = measure_sgemm_gflops(o.threads);
        const double read = memory.read_gbps(o.threads);
        gemm_seen.push_back(gemm);
        for (const Variant& variant : variants) {
          const KvDtype dtype = variant.dtype;
          if (dtype == KvDtype::bf16 && kv16_buf.size() == 0) {
            kv16_buf = HugePageBuffer(pool_elems * sizeof(bf16_t));
            floats_to_bf16(pool32, reinterpret_cast<bf16_t*>(kv16_buf.data()), pool_elems);
          }
          std::vector<std::int32_t> q_start(static_cast<std::size_t>(batch) + 1);
          std::vector<std::int64_t> q_pos(static_cast<std::size_t>(batch * tq)),
              local_len(static_cast<std::size_t>(batch), ctx);
          for (std::int64_t b = 0; b <= batch; ++b) q_start[b] = static_cast<std::int32_t>(b * tq);
          for (std::int64_t i = 0; i < batch * tq; ++i) q_pos[i] = ctx - tq + i % tq;
          std::vector<float> out(static_cast<std::size_t>(batch * tq * h) * 512),
              lse(static_cast<std::size_t>(batch * tq * h));
          MlaAttentionParams p;
          p.num_heads = static_cast<int>(h);
          p.softmax_scale = 0.07f;
          p.num_requests = static_cast<int>(batch);
          p.q_start = q_start.data();
          p.q = q.data();
          p.q_pos = q_pos.data();
          p.kv = dtype == KvDtype::fp32 ? static_cast<const void*>(pool32)
                                        : static_cast<const void*>(kv16_buf.data());
          p.kv_dtype = dtype;
          p.num_pages = static_cast<std::int64_t>(table.size());
          p.page_size = static_cast<int>(page);
          p.page_table = table.data();
          p.page_table_stride = static_cast<int>(pages_per);
          p.local_len = local_len.data();
          p.num_threads = o.threads;
          p.kernel = variant.kernel;
          p.out = out.data();
          p.lse = lse.data();
          mla_attention(p);
          std::vector<double> ms;
          for (int r = 0; r < o.repeats; ++r) {
            if (cold) memory.flush(o.threads);
            const auto t0 = Clock::now();
            mla_attention(p);
            ms.push_back(ms_since(t0));
          }
          const double t = median(ms);
          // Rows seen: ctx for decode; for a causal chunk, ctx - T + 1 .. ctx.
          const double seen = static_cast<double>(tq) * (ctx - tq) + tq * (tq + 1) / 2.0;
          const double flops = 2.0 * (576 + 512) * static_cast<double>(h * batch) * seen;
          const double bytes = static_cast<double>(batch * ctx) * 576 * dtype_size(dtype);
          const double gflops = flops / t / 1e6, gbps = bytes / t / 1e6;
          const auto torch_it = torch_ms.find(std::string(to_string(dtype)));
          const std::string torch_cols =
              torch_it == torch_ms.end() ? str(std::string(9, ' '), " ", std::string(7, ' '), "-")
                                         : format_fixed(torch_it->second, 9, 2) + " " +
                                               format_fixed(torch_it->second / t, 7, 2) + "x";
          std::printf(
              "%3lld %7lld %4lld %8s | %9.2f %9.1f %5.0f%% %8.1f %5.0f%% | %9.2f %6.2fx | %s | "
              "%6.1f %5.1f\n",
              static_cast<long long>(batch), static_cast<long long>(ctx), static_cast<long long>(h),
              variant.label.c_str(), t, gflops, 100 * gflops / gemm, gbps, 100 * gbps / read,
              peer_t, peer_t / t, torch_cols.c_str(), gemm, read);
          std::fflush(stdout);
          const bool has_torch = torch_it != torch_ms.end();
          csv.row({str(batch), str(ctx), str(tq), str(h), variant.label, str(o.threads), str(t),
                   str(gflops), str(gflops / gemm), str(gbps), str(gbps / read), str(peer_t),
                   str(peer_t / t), has_torch ? str(torch_it->second) : "",
                   has_torch ? str(torch_it->second / t) : "", str(gemm), str(read)});
          if (batch == batches.front() && ctx == contexts.back()) {
            add_point(series, str("S=", ctx, " B=", batch, " ", variant.label),
                      static_cast<double>(h), gflops);
          }
        }
      }
    }
  }
  if (!o.svg.empty()) {
    series.push_back({"sgemm ceiling (median)", {}, {}});
    for (std::int64_t h : heads) {
      series.back().x.push_back(static_cast<double>(h));
      series.back().y.push_back(median(gemm_seen));
    }
    write_svg_chart(o.svg,
                    str("local MLA ", tq == 1 ? "decode" : str("prefill-chunk (T=", tq, ")"),
                        " attention, ", o.threads, " thread(s)"),
                    "query heads", "GFLOP/s", series, true);
  }
}

void add_attention_bench(CLI::App* bench) {
  auto ao = std::make_shared<AttentionBenchOptions>();
  CLI::App* att = bench->add_subcommand(
      "attention", "Local MLA decode attention vs sgemm / read ceilings and a two-GEMM peer");
  att->add_option("--contexts", ao->contexts, "rank-local context lengths")
      ->check(list_at_least(1))
      ->capture_default_str();
  att->add_option("--heads", ao->heads, "query heads")
      ->check(list_at_least(1))
      ->capture_default_str();
  att->add_option("--batches", ao->batches, "requests per call")
      ->check(list_at_least(1))
      ->capture_default_str();
  att->add_option("--query-tokens", ao->query_tokens,
                  "query tokens per request: 1 is decode, T > 1 a causal prefill chunk of the "
                  "context's last T positions (no PyTorch peer then)")
      ->check(at_least(1))
      ->capture_default_str();
  att->add_option("--dtypes", ao->dtypes,
                  "KV dtypes on the fastest exact path (fp32, bf16), or bf16 KV on an opt-in "
                  "bf16-pair path: bf16-amx (AMX), bf16-vdp (AVX512-BF16)")
      ->check(list_of({"fp32", "bf16", "bf16-amx", "bf16-vdp"}))
      ->capture_default_str();
  att->add_option("--threads", ao->threads, "threads (kernel split-KV and BLAS alike)")
      ->check(at_least(1))
      ->capture_default_str();
  att->add_option("--repeats", ao->repeats, "timed calls per point (median)")
      ->check(at_least(1))
      ->capture_default_str();
  att->add_option("--torch-python", ao->torch_python,
                  "Python that runs the PyTorch peer (Debian's python3-torch lives under "
                  "/usr/bin/python3), or off")
      ->capture_default_str();
  att->add_option("--cache", ao->cache,
                  "cold: read a buffer twice the last-level cache before every timed call (decode "
                  "reads each layer's KV once per step); warm: repeat calls on warm caches")
      ->check(one_of({"cold", "warm"}))
      ->capture_default_str();
  add_output_files(att, ao->csv, ao->svg, "a plot (GFLOP/s vs heads)");
  att->callback([ao] { bench_attention(*ao); });
}

}  // namespace dcp::cli

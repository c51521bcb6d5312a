// Prefill-shaped weight products on one thread: oneDNN's matmul beside dcp's own path, to decide
// whether oneDNN should run dcp's prefill products. dcp::linear runs its blocked product on
// AVX2 and AVX-512 CPUs (x packed once, bf16 and FP8 widened in registers' reach) and on the
// portable path widens a tile of rows at a time for OpenBLAS's sgemm; oneDNN picks its kernels from
// the CPU itself and offers a bf16 matmul where the CPU has bf16 arithmetic, as does dcp's opt-in
// avx512_bf16 path (bf16 and FP8 weights in vdpbf16ps pairs, x rounded to bf16; rows of their own
// where the CPU has AVX512-BF16). Every product is timed in this run against OpenBLAS's sgemm on
// the same values held in fp32, and checked against it.
//
//   bench_prefill_onednn [--rows M] [--shapes KxN,KxN,...] [--path automatic|portable|avx2|avx512]
//
// --path forces dcp::linear's path (as on a CPU whose widest is that one); automatic by default.
// Up to 16 rows (8 for fp32 weights) dcp::linear runs its decode-shaped products, here on a
// weight in cache: their compute rate, not their reads.
//
// Built only when CMake finds oneDNN (Debian: apt-get install libdnnl-dev).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <dnnl.hpp>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dcp/blas.h"
#include "dcp/dtype.h"
#include "dcp/error.h"
#include "dcp/kernel_path.h"
#include "dcp/weights.h"

namespace {

constexpr int kBlock = 128;  // FP8 scale blocks, as DeepSeek-V3's checkpoints have them

struct Shape {
  std::int64_t k = 0, n = 0;
};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr,
               "bench_prefill_onednn: %s\nusage: bench_prefill_onednn [--rows M >= 1] "
               "[--shapes KxN,KxN,...]  (K, N >= 1) [--path automatic|portable|avx2|avx512]\n",
               what.c_str());
  std::exit(2);
}

std::int64_t parse_positive(const std::string& text, const std::string& flag) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 1 || v > (1 << 20)) {
    usage_error(flag + " = '" + text + "': expected an integer in [1, 1048576]");
  }
  return v;
}

std::vector<Shape> parse_shapes(const std::string& text) {
  std::vector<Shape> shapes;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t comma = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, comma - begin);
    const std::size_t x = item.find('x');
    if (x == std::string::npos) usage_error("--shapes item '" + item + "': expected KxN");
    shapes.push_back({parse_positive(item.substr(0, x), "--shapes K"),
                      parse_positive(item.substr(x + 1), "--shapes N")});
    begin = comma + 1;
  }
  return shapes;
}

// max |a - b| over max |b|.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

dcp::WeightMatrix to_bf16(const std::vector<float>& w, std::int64_t n, std::int64_t k) {
  dcp::WeightMatrix m;
  m.dtype = dcp::WeightDtype::bf16;
  m.rows = n;
  m.cols = k;
  m.data.resize(static_cast<std::size_t>(n * k) * sizeof(dcp::bf16_t));
  dcp::floats_to_bf16(w.data(), reinterpret_cast<dcp::bf16_t*>(m.data.data()), w.size());
  return m;
}

// One way of computing y = x w^T, timed and checked against sgemm on the same values.
struct Product {
  std::string name, kernel;
  std::function<void()> run;  // empty when this CPU has no implementation
  const std::vector<float>* reference = nullptr;
  double tolerance = 1e-4;  // fp32 sums of K terms in another order agree to about this
  std::vector<float> y;
  double seconds = 1e30, error = 0;
};

// oneDNN's matmul of x [m, k] (f32) by w^T (w [n, k] row-major, f32) with the source and the
// weights held in `dt`; `run` stays empty when this CPU has no implementation for that type.
void add_onednn_matmul(dnnl::memory::data_type dt, const std::vector<float>& x,
                       const std::vector<float>& w, std::int64_t m, std::int64_t k, std::int64_t n,
                       Product& p) {
  using dnnl::memory;
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const memory::desc src_md({m, k}, dt, memory::format_tag::ab);
  const memory::desc wei_md({k, n}, dt, memory::format_tag::ba);  // w [n, k] is w^T [k, n] "ba"
  const memory::desc dst_md({m, n}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_md, wei_md, dst_md), engine);
  } catch (const dnnl::error&) {
    p.kernel = "none on this CPU";
    return;
  }
  p.kernel = pd.impl_info_str();
  auto stream = std::make_shared<dnnl::stream>(engine);
  memory src_f32({{m, k}, memory::data_type::f32, memory::format_tag::ab}, engine,
                 const_cast<float*>(x.data()));
  memory wei_f32({{k, n}, memory::data_type::f32, memory::format_tag::ba}, engine,
                 const_cast<float*>(w.data()));
  memory src(src_md, engine), wei(wei_md, engine), dst(dst_md, engine, p.y.data());
  dnnl::reorder(src_f32, src).execute(*stream, src_f32, src);
  dnnl::reorder(wei_f32, wei).execute(*stream, wei_f32, wei);
  stream->wait();
  p.run = [stream, product = dnnl::matmul(pd), src, wei, dst] {
    product.execute(*stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    stream->wait();
  };
}

// The products of one shape take turns, seven rounds, each keeping its best time: a slow spell
// of a shared host then falls on all of them rather than on one.
void time_in_turns(std::vector<Product>& products) {
  for (Product& p : products)
    if (p.run) p.run();  // warm-up: first-touch pages, oneDNN's JIT, BLAS buffers
  for (int round = 0; round < 7; ++round) {
    for (Product& p : products) {
      if (!p.run) continue;
      const auto t0 = std::chrono::steady_clock::now();
      p.run();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      p.seconds = std::min(p.seconds, s);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  dcp::restart_with_better_blas_kernels(argv);
  std::int64_t m = 512;
  dcp::KernelPath path = dcp::KernelPath::automatic;
  // DeepSeek-V2-Lite's prefill projections: q, kv_a, o, the dense MLP's gate (and up), its down.
  std::vector<Shape> shapes = parse_shapes("2048x3072,2048x576,2048x2048,2048x10944,10944x2048");
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag != "--rows" && flag != "--shapes" && flag != "--path") {
      usage_error("unknown flag '" + flag + "'");
    }
    if (i + 1 >= argc) usage_error(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--rows") {
      m = parse_positive(value, "--rows");
    } else if (flag == "--shapes") {
      shapes = parse_shapes(value);
    } else {
      try {
        path = dcp::parse_kernel_path(value);
        if (dcp::is_bf16_pair_path(path)) {
          usage_error("--path = '" + value +
                      "': the bf16-pair product has a row of its own; legal: automatic, portable, "
                      "avx2, avx512");
        }
        dcp::weight_prefill_kernel_label(path);  // refuses a path this CPU lacks
      } catch (const dcp::Error& e) {
        usage_error("--path = '" + value + "': " + e.what());
      }
    }
  }
  openblas_set_num_threads(1);
  omp_set_num_threads(1);  // oneDNN's threads (Debian builds it on OpenMP)
  std::printf(
      "one thread, %lld rows of x; baseline: sgemm of %s on fp32 weights; dcp::linear: %s\n",
      static_cast<long long>(m), dcp::blas_kernels_label().c_str(),
      dcp::weight_prefill_kernel_label(path).c_str());
  std::printf("%-11s %-34s %-18s %9s %9s %9s\n", "K x N", "product", "kernel", "GFLOP/s",
              "vs sgemm", "rel err");
  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  int mismatches = 0;
  for (const Shape& s : shapes) {
    std::vector<float> x(static_cast<std::size_t>(m * s.k)), w(static_cast<std::size_t>(s.n * s.k));
    for (float& v : x) v = normal(gen);
    for (float& v : w) v = 0.02f * normal(gen);
    // Each weight dtype is checked against sgemm on the values it holds, widened to fp32.
    const dcp::WeightMatrix wb = to_bf16(w, s.n, s.k);
    const dcp::WeightMatrix w8 = dcp::WeightMatrix::quantize_fp8(w, s.n, s.k, kBlock, kBlock);
    const std::vector<float> wb_f32 = wb.to_float(), w8_f32 = w8.to_float();
    const std::size_t out_size = static_cast<std::size_t>(m * s.n);
    const auto sgemm = [&, k = s.k, n = s.n](const std::vector<float>& weight, float* out) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                  static_cast<int>(k), 1.0f, x.data(), static_cast<int>(k), weight.data(),
                  static_cast<int>(k), 0.0f, out, static_cast<int>(n));
    };
    std::vector<float> ref_8(out_size);
    sgemm(w8_f32, ref_8.data());
    const dcp::WeightMatrix wf = dcp::WeightMatrix::from_float(wb_f32, s.n, s.k);
    std::vector<Product> products(8);
    for (Product& p : products) p.y.resize(out_size);
    const bool blocked = dcp::prefill_runs_blocked_product(path);
    const std::string path_name(dcp::to_string(dcp::resolve_exact_path(path)));
    // Up to weight_gemv_max_rows rows of x, dcp::linear runs its decode-shaped product.
    const auto dcp_kernel = [&](dcp::WeightDtype d, const char* prefill) {
      return m <= dcp::weight_gemv_max_rows(d) ? "decode " + path_name
             : blocked                         ? "blocked " + path_name
                                               : std::string(prefill);
    };
    products[0].name = "openblas sgemm, fp32 weights";
    products[0].kernel = dcp::blas_info().core;
    products[0].run = [&, y = products[0].y.data()] { sgemm(wb_f32, y); };
    products[1].name = "dcp::linear, fp32 weights";
    products[1].kernel = dcp_kernel(dcp::WeightDtype::f32, "sgemm");
    products[1].run = [&, y = products[1].y.data()] {
      dcp::linear(x.data(), m, wf, y, -1, -1, path);
    };
    products[2].name = "dcp::linear, bf16 weights";
    products[2].kernel = dcp_kernel(dcp::WeightDtype::bf16, "widen + sgemm");
    products[2].run = [&, y = products[2].y.data()] {
      dcp::linear(x.data(), m, wb, y, -1, -1, path);
    };
    products[3].name = "dcp::linear, fp8 weights";
    products[3].kernel = dcp_kernel(dcp::WeightDtype::f8_e4m3, "widen + sgemm");
    products[3].run = [&, y = products[3].y.data()] {
      dcp::linear(x.data(), m, w8, y, -1, -1, path);
    };
    products[3].reference = &ref_8;
    products[4].name = "onednn matmul, f32";
    add_onednn_matmul(dnnl::memory::data_type::f32, x, wb_f32, m, s.k, s.n, products[4]);
    products[5].name = "onednn matmul, bf16 x and weights";
    products[5].tolerance = 2e-2;  // x is rounded to bf16 too
    add_onednn_matmul(dnnl::memory::data_type::bf16, x, wb_f32, m, s.k, s.n, products[5]);
    products[6].name = "dcp::linear, bf16 weights, bf16 x";
    products[6].kernel = "bf16 pairs";
    products[6].tolerance = 2e-2;  // x is rounded to bf16
    products[7].name = "dcp::linear, fp8 weights, bf16 x";
    // Decode shapes pair FP8 where the CPU has AVX512-VBMI for its widening.
    products[7].kernel = m > dcp::weight_gemv_max_rows(dcp::WeightDtype::f8_e4m3) ||
                                 __builtin_cpu_supports("avx512vbmi")
                             ? "bf16 pairs"
                             : "decode avx512";
    products[7].tolerance = 2e-2;
    products[7].reference = &ref_8;
    if (dcp::avx512_bf16_available()) {
      products[6].run = [&, y = products[6].y.data()] {
        dcp::linear(x.data(), m, wb, y, -1, -1, dcp::KernelPath::avx512_bf16);
      };
      products[7].run = [&, y = products[7].y.data()] {
        dcp::linear(x.data(), m, w8, y, -1, -1, dcp::KernelPath::avx512_bf16);
      };
    }
    time_in_turns(products);
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(s.n * s.k);
    const std::string shape = std::to_string(s.k) + "x" + std::to_string(s.n);
    for (Product& p : products) {
      if (!p.run) {
        std::printf("%-11s %-34s %-18s %9s %9s %9s\n", shape.c_str(), p.name.c_str(),
                    p.kernel.c_str(), "-", "-", "-");
        continue;
      }
      p.error = relative_error(p.y, p.reference != nullptr ? *p.reference : products[0].y);
      const bool ok = p.error <= p.tolerance;
      mismatches += ok ? 0 : 1;
      std::printf("%-11s %-34s %-18s %9.1f %8.2fx %9.1e%s\n", shape.c_str(), p.name.c_str(),
                  p.kernel.c_str(), flops / p.seconds / 1e9, products[0].seconds / p.seconds,
                  p.error, ok ? "" : "  MISMATCH");
    }
  }
  return mismatches == 0 ? 0 : 1;
}

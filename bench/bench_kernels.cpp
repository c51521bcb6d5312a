// Google Benchmark binaries for the local MLA kernel, the merge and the prefix cache's eviction.
// The performance issue
// adds machine ceilings (sgemm, STREAM-like read) measured in the same run; these report the
// raw rates (FLOP/s, KV bytes/s) so they can be put beside those ceilings. They repeat each call
// on warm caches, and this host's 480 MiB L3 holds KV of tens of MiB after a few calls: for
// decode as it runs (each layer's KV read once per step, from memory), use `dcp bench attention`
// and `dcp bench merge`, which flush the caches before every timed call.
#include <benchmark/benchmark.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "dcp/attention.h"
#include "dcp/merge.h"
#include "dcp/prefix_cache.h"

namespace {

// Decode: B requests, one query token each, S rows of KV on this rank.
void BM_LocalAttentionDecode(benchmark::State& state) {
  const int heads = static_cast<int>(state.range(0));
  const std::int64_t rows = state.range(1);
  const auto dtype = state.range(2) == 0 ? dcp::KvDtype::fp32 : dcp::KvDtype::bf16;
  const int batch = 1, dc = 512, width = 576, page = 64;
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  const std::int64_t pages = (rows + page - 1) / page;
  std::vector<float> kv32(dtype == dcp::KvDtype::fp32 ? pages * page * width : 0);
  std::vector<dcp::bf16_t> kv16(dtype == dcp::KvDtype::bf16 ? pages * page * width : 0);
  for (float& v : kv32) v = normal(gen);
  for (auto& v : kv16) v = dcp::float_to_bf16(normal(gen));
  std::vector<float> q(static_cast<std::size_t>(heads) * width);
  for (float& v : q) v = normal(gen);
  std::vector<std::int32_t> table(static_cast<std::size_t>(pages));
  std::iota(table.begin(), table.end(), 0);
  std::vector<std::int32_t> q_start = {0, 1};
  std::vector<std::int64_t> q_pos = {rows - 1}, local_len = {rows};
  std::vector<float> out(static_cast<std::size_t>(heads) * dc), lse(heads);
  dcp::MlaAttentionParams p;
  p.num_heads = heads;
  p.softmax_scale = 0.07f;
  p.num_requests = batch;
  p.q_start = q_start.data();
  p.q = q.data();
  p.q_pos = q_pos.data();
  p.kv = dtype == dcp::KvDtype::fp32 ? static_cast<const void*>(kv32.data()) : kv16.data();
  p.kv_dtype = dtype;
  p.num_pages = pages;
  p.page_size = page;
  p.page_table = table.data();
  p.page_table_stride = static_cast<int>(pages);
  p.local_len = local_len.data();
  p.out = out.data();
  p.lse = lse.data();
  for (auto _ : state) {
    dcp::mla_attention(p);
    benchmark::DoNotOptimize(out.data());
  }
  const double flops = 2.0 * (width + dc) * heads * rows;
  state.counters["FLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["KV_B/s"] =
      benchmark::Counter(static_cast<double>(rows) * width * (dtype == dcp::KvDtype::fp32 ? 4 : 2),
                         benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_LocalAttentionDecode)
    ->ArgNames({"heads", "rows", "bf16"})
    ->ArgsProduct({{1, 16, 128}, {4096}, {0, 1}})
    ->Unit(benchmark::kMillisecond);

void BM_Merge(benchmark::State& state) {
  const int parts = static_cast<int>(state.range(0));
  const std::int64_t rows = state.range(1);
  const int dim = 512;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  std::vector<float> o(static_cast<std::size_t>(parts) * rows * dim),
      lse(static_cast<std::size_t>(parts) * rows);
  for (float& v : o) v = normal(gen);
  for (float& v : lse) v = normal(gen);
  std::vector<float> out(static_cast<std::size_t>(rows) * dim), out_lse(rows);
  for (auto _ : state) {
    dcp::merge_attention_states(o.data(), lse.data(), parts, rows, dim, dcp::LseBase::e, out.data(),
                                out_lse.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["read_B/s"] = benchmark::Counter(static_cast<double>(o.size() + lse.size()) * 4,
                                                  benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Merge)->ArgNames({"parts", "rows"})->ArgsProduct({{2, 4, 8}, {16 * 128}});

// Eviction under pressure: a prefix cache holding `pages` pages of finished prompts (1024 pages
// of 16 tokens each, only the cache holds them) frees an eighth of them, with or without a host
// tier. The time per page freed should not grow with the cache.
void BM_PrefixCacheMakeRoom(benchmark::State& state) {
  const std::int64_t pages = state.range(0), page = 16, prompt_pages = 1024;
  const bool host = state.range(1) != 0;
  std::mt19937 gen(5);
  std::vector<std::vector<std::int32_t>> prompts(static_cast<std::size_t>(pages / prompt_pages));
  for (auto& t : prompts) {
    t.resize(static_cast<std::size_t>(prompt_pages * page));
    for (std::int32_t& x : t) x = static_cast<std::int32_t>(gen() % 32000);
  }
  const std::int64_t total = pages + pages / 8;
  for (auto _ : state) {
    state.PauseTiming();
    dcp::KvAllocator alloc(1, static_cast<int>(page), total);
    dcp::LatentPool pool(total, static_cast<int>(page),
                         dcp::LatentGeometry{8, 4, dcp::KvDtype::bf16});
    dcp::PrefixCache cache(alloc, {&pool}, 0, host ? pages / 4 * page : 0);
    dcp::RequestId id = 0;
    for (const auto& t : prompts) {
      alloc.allocate(id, static_cast<std::int64_t>(t.size()));
      cache.insert(t, id);
      alloc.free(id++);
    }
    state.ResumeTiming();
    benchmark::DoNotOptimize(cache.make_room(total - pages + pages / 8));
  }
  state.SetItemsProcessed(state.iterations() * (pages / 8));
}
BENCHMARK(BM_PrefixCacheMakeRoom)
    ->ArgNames({"pages", "host"})
    ->ArgsProduct({{4096, 16384, 65536}, {0, 1}})
    ->Unit(benchmark::kMillisecond);

// A hit on a prompt of `pages` / 32 pages that went to the host tier, the device full of other
// finished prompts: each page comes back in place of the least recently used device page.
void BM_PrefixCacheHostHit(benchmark::State& state) {
  const std::int64_t pages = state.range(0), page = 16, prompt_pages = 1024, hot = pages / 32;
  std::mt19937 gen(7);
  const auto prompt = [&](std::int64_t n) {
    std::vector<std::int32_t> t(static_cast<std::size_t>(n * page));
    for (std::int32_t& x : t) x = static_cast<std::int32_t>(gen() % 32000);
    return t;
  };
  std::vector<std::int32_t> hot_prompt = prompt(hot);
  hot_prompt.push_back(1);  // a token past its pages: the hit may cover all of them
  std::vector<std::vector<std::int32_t>> others;
  for (std::int64_t p = 0; p < pages; p += prompt_pages) others.push_back(prompt(prompt_pages));
  for (auto _ : state) {
    state.PauseTiming();
    dcp::KvAllocator alloc(1, static_cast<int>(page), pages);
    dcp::LatentPool pool(pages, static_cast<int>(page),
                         dcp::LatentGeometry{8, 4, dcp::KvDtype::bf16});
    dcp::PrefixCache cache(alloc, {&pool}, 0, hot * page);
    dcp::RequestId id = 0;
    const auto finish = [&](const std::vector<std::int32_t>& t) {
      alloc.allocate(id, static_cast<std::int64_t>(t.size()));
      cache.insert(t, id);
      alloc.free(id++);
    };
    finish(hot_prompt);
    cache.make_room(pages);  // all of it to the host tier
    for (const auto& t : others) finish(t);
    state.ResumeTiming();
    const std::vector<std::int32_t> hit = cache.match(hot_prompt);
    if (static_cast<std::int64_t>(hit.size()) != hot) state.SkipWithError("the hit was cut short");
    benchmark::DoNotOptimize(hit.data());
  }
  state.SetItemsProcessed(state.iterations() * hot);
}
BENCHMARK(BM_PrefixCacheHostHit)
    ->ArgNames({"pages"})
    ->Arg(4096)
    ->Arg(16384)
    ->Arg(65536)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

// Prefix cache and host tier: shared prefixes reuse KV pages, eviction to host and reload are
// bit-exact, each rank moves 1/N of a page, pages in use are never evicted.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "dcp/error.h"
#include "dcp/prefix_cache.h"
#include "engine_util.h"
#include "test_util.h"

namespace dcp {
namespace {

std::vector<RequestSpec> shared_prefix_requests(test::Rng& rng, int vocab, int prefix_len,
                                                int count) {
  const std::vector<std::int32_t> prefix = test::random_tokens(rng, prefix_len, vocab);
  std::vector<RequestSpec> reqs;
  for (int i = 0; i < count; ++i) {
    std::vector<std::int32_t> prompt = prefix;
    const auto tail = test::random_tokens(rng, 5 + 7 * i, vocab);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    reqs.push_back(test::request(i, prompt, 4));
  }
  return reqs;
}

// TP x DCP (a2a) with pages of 8 tokens and prefill chunks of 64: prompts span several of each.
test::EngineSetup small_pages(int tp, int dcp) {
  test::EngineSetup s;
  s.tp = tp;
  s.dcp = dcp;
  s.backend = CombineBackend::a2a;
  s.page_size = 8;
  s.chunk = 64;
  return s;
}

// The cache changes what is computed, not the result: the same tokens, and logits within the
// rounding of attention over a cached prefix (an extend) instead of one prefill.
void expect_as_without_cache(const test::EngineRun& got, const test::EngineRun& want,
                             const std::string& what) {
  ASSERT_EQ(got.results.size(), want.results.size()) << what;
  for (std::size_t i = 0; i < want.results.size(); ++i) {
    ASSERT_EQ(got.results[i].output_tokens, want.results[i].output_tokens)
        << what << " request " << i;
    EXPECT_TRUE(test::close_runs(got.results[i].step_logits, want.results[i].step_logits,
                                 {1e-10, 1e-4}, what.c_str()));
  }
}

TEST(PrefixCache, SharedPrefixesGiveIdenticalOutputsWithTheCacheOnAndOff) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(61);
  const auto reqs = shared_prefix_requests(rng, c.vocab_size, 150, 6);
  for (int n : {1, 2, 4}) {
    test::EngineSetup off = small_pages(4, n);
    off.max_running = 2;  // later requests arrive after earlier prompts are cached
    const auto expect = test::run_engine(c, *w, off, reqs);
    test::EngineSetup on = off;
    on.prefix_cache = true;
    const auto got = test::run_engine(c, *w, on, reqs);
    const std::string what = "dcp " + std::to_string(n);
    expect_as_without_cache(got, expect, what);
    // The first request misses; the second, which arrives with it, waits for the prefix's pages
    // to be written, and it and each later one reuse the prefix's whole virtual pages (P x N
    // tokens each), and its result says so.
    const std::int64_t vp = 8LL * n;
    EXPECT_EQ(got.cache_stats[0].hit_tokens, 5 * (150 / vp) * vp) << what;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got.results[i].cached_prompt_tokens, i < 1 ? 0 : 150 / vp * vp) << what << " " << i;
      EXPECT_EQ(expect.results[i].cached_prompt_tokens, 0) << what << " " << i;
    }
  }
}

// Requests that arrive together and share a prompt's prefix (the choices of one prompt, a system
// prompt) compute it once: a request waits while another's prefill writes pages it would hit, and
// requests behind it that share nothing pass it meanwhile. Tokens as with the cache off.
TEST(PrefixCache, ARequestWaitsForThePagesAnotherPrefillIsWriting) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(71);
  const std::vector<std::int32_t> a = test::random_tokens(rng, 200, c.vocab_size);
  std::vector<std::int32_t> b(a.begin(), a.begin() + 170);  // then 10 others
  const std::vector<std::int32_t> tail = test::random_tokens(rng, 10, c.vocab_size);
  b.insert(b.end(), tail.begin(), tail.end());
  b[170] = (a[170] + 1) % c.vocab_size;
  std::vector<RequestSpec> reqs = {test::request(0, a, 4), test::request(1, b, 4),
                                   test::request(2, test::random_tokens(rng, 40, c.vocab_size), 4),
                                   test::request(3, a, 4), test::request(4, a, 4)};
  for (int i : {3, 4}) {  // two more choices of the first prompt, sampled
    reqs[static_cast<std::size_t>(i)].sampling.temperature = 1;
    reqs[static_cast<std::size_t>(i)].sampling.seed = static_cast<std::uint64_t>(i);
  }
  for (int n : {1, 2}) {
    const test::EngineSetup off = small_pages(2, n);  // the first prompt takes 4 steps
    const auto expect = test::run_engine(c, *w, off, reqs);
    test::EngineSetup on = off;
    on.prefix_cache = true;
    // The step after which each request left the queue (world rank 0's engine).
    std::vector<int> admitted(reqs.size(), -1);
    int steps = 0;
    on.after_step = [&](int rank, const Engine& e) {
      if (rank != 0) return;
      ++steps;
      for (std::size_t i = 0; i < reqs.size(); ++i) {
        if (admitted[i] < 0 && e.results()[i].state != RequestState::waiting) admitted[i] = steps;
      }
    };
    const auto got = test::run_engine(c, *w, on, reqs);
    const std::string what = "dcp " + std::to_string(n);
    expect_as_without_cache(got, expect, what);
    const std::int64_t vp = 8LL * n;
    const std::vector<std::int64_t> cached = {0, 170 / vp * vp, 0, 199 / vp * vp, 199 / vp * vp};
    std::int64_t prompts = 0;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got.results[i].cached_prompt_tokens, cached[i]) << what << " request " << i;
      prompts += static_cast<std::int64_t>(reqs[i].prompt.size());
    }
    // A waiting request is looked up once, when it is admitted, and its hit counted once.
    EXPECT_EQ(got.cache_stats[0].lookup_tokens, prompts) << what;
    EXPECT_EQ(got.cache_stats[0].hit_tokens, cached[1] + cached[3] + cached[4]) << what;
    // The unrelated request went first; the others waited for pages the first writes 64 a step.
    EXPECT_EQ(admitted[0], 1) << what;
    EXPECT_EQ(admitted[2], 1) << what;
    for (std::size_t i : {1, 3, 4})
      EXPECT_GE(admitted[i], (cached[i] + 63) / 64 + 1) << what << " request " << i;
  }
}

// Speculative decoding over cached prefixes: the target shares the prefix's pages, the draft (no
// cache of its own) computes their KV itself; greedy verification gives the plain greedy tokens.
TEST(PrefixCache, SpeculativeDecodingOverACachedPrefixEqualsGreedy) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(67);
  auto reqs = shared_prefix_requests(rng, c.vocab_size, 150, 6);
  for (RequestSpec& r : reqs) r.max_new_tokens = 7;
  for (int n : {1, 2}) {
    test::EngineSetup plain = small_pages(2, n);
    plain.max_running = 2;
    const auto expect = test::run_engine(c, *w, plain, reqs);
    test::EngineSetup spec = plain;
    spec.prefix_cache = true;
    spec.num_draft_tokens = 3;
    spec.draft_config = preset_config("tiny", 1);
    spec.draft_weights = w.get();
    const auto got = test::run_engine(c, *w, spec, reqs);
    const std::string what = "dcp " + std::to_string(n);
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_EQ(got.results[i].state, RequestState::finished)
          << what << ": " << got.results[i].error;
      EXPECT_EQ(got.results[i].output_tokens, expect.results[i].output_tokens)
          << what << " request " << i;
    }
    const std::int64_t vp = 8LL * n;  // every request but the first hits
    EXPECT_EQ(got.cache_stats[0].hit_tokens, 5 * (150 / vp) * vp) << what;
    // The draft's KV of the cached prefix is right: it proposes what it proposes without the
    // cache (same draft, same tokens), so as many drafts are accepted.
    test::EngineSetup spec_only = spec;
    spec_only.prefix_cache = false;
    const auto uncached = test::run_engine(c, *w, spec_only, reqs);
    EXPECT_GT(uncached.stats.spec_accepted, 0) << what;
    EXPECT_EQ(got.stats.spec_proposed, uncached.stats.spec_proposed) << what;
    EXPECT_EQ(got.stats.spec_accepted, uncached.stats.spec_accepted) << what;
    // Where the target shares the prefix but the draft holds every token: a cache that fits all
    // six requests in the target (one prefix) but about two in the draft. Admission waits for
    // the draft instead of overrunning it.
    test::EngineSetup tight = spec;
    tight.capacity = 480;
    tight.max_running = 6;
    const auto waited = test::run_engine(c, *w, tight, reqs);
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_EQ(waited.results[i].state, RequestState::finished)
          << what << ": " << waited.results[i].error;
      EXPECT_EQ(waited.results[i].output_tokens, expect.results[i].output_tokens)
          << what << " request " << i << " (tight)";
    }
    EXPECT_LT(waited.stats.peak_running, 6) << what << ": the draft's capacity limited admission";
  }
}

TEST(PrefixCache, UnderPressurePagesGoToTheHostTierAndComeBackExactly) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(63);
  // Two groups of requests with different prefixes, interleaved, in a cache too small for both:
  // the idle group's pages are offloaded and reloaded on its next hit.
  auto a = shared_prefix_requests(rng, c.vocab_size, 96, 3);
  auto b = shared_prefix_requests(rng, c.vocab_size, 96, 3);
  std::vector<RequestSpec> reqs;
  for (int i = 0; i < 3; ++i) {
    a[i].id = 2 * i;
    b[i].id = 2 * i + 1;
    reqs.push_back(a[i]);
    reqs.push_back(b[i]);
  }
  test::EngineSetup off;
  off.tp = 2;
  off.dcp = 2;
  off.page_size = 8;  // virtual pages of 16 tokens
  off.max_running = 1;
  off.capacity = 208;  // 13 pages: one request plus one prefix, not two prefixes
  const auto expect = test::run_engine(c, *w, off, reqs);
  for (std::int64_t host : {0, 512}) {
    test::EngineSetup on = off;
    on.prefix_cache = true;
    on.host_tokens = host;
    const auto got = test::run_engine(c, *w, on, reqs);
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_EQ(got.results[i].output_tokens, expect.results[i].output_tokens)
          << "host " << host << " request " << i;
      EXPECT_TRUE(test::close_runs(got.results[i].step_logits, expect.results[i].step_logits,
                                   {1e-10, 1e-4}, "pressure"));
    }
    const PrefixCacheStats& st = got.cache_stats[0];
    if (host > 0) {
      EXPECT_GT(st.pages_offloaded, 0);
      EXPECT_GT(st.pages_reloaded, 0);
    } else {
      EXPECT_EQ(st.pages_offloaded, 0);
      EXPECT_GT(st.pages_dropped, 0);
    }
    // Each rank moves its own rows only: exactly P rows x row bytes x layers per page.
    const std::int64_t per_page = 8 * 80 * 4 * 2;  // P x (kv_lora + rope) x fp32 x layers
    for (const PrefixCacheStats& r : got.cache_stats) {
      EXPECT_EQ(r.bytes_to_host, r.pages_offloaded * per_page);
      EXPECT_EQ(r.bytes_to_device, r.pages_reloaded * per_page);
    }
  }
}

// Direct: offload is a copy of exactly this rank's rows; reload restores them bit for bit; a page
// a request still uses is never evicted.
TEST(PrefixCache, OffloadAndReloadAreBitExactAndInUsePagesStay) {
  auto rng = test::make_rng();
  const int n = 3, page = 4, layers = 2;
  const std::int64_t vp = page * n;
  const LatentGeometry geo{8, 4, KvDtype::bf16};
  for (int rank = 0; rank < n; ++rank) {
    KvAllocator alloc(n, page, 6);
    std::vector<std::unique_ptr<LatentPool>> pools;
    std::vector<std::unique_ptr<KvShard>> shards;
    std::vector<LatentPool*> raw;
    for (int l = 0; l < layers; ++l) {
      pools.push_back(std::make_unique<LatentPool>(6, page, geo));
      shards.push_back(std::make_unique<KvShard>(alloc, *pools.back(), rank));
      raw.push_back(pools.back().get());
    }
    PrefixCache cache(alloc, raw, rank, 10 * vp);
    const std::vector<std::int32_t> prompt =
        test::random_tokens(rng, static_cast<int>(2 * vp + 1), 100);
    alloc.allocate(1, static_cast<std::int64_t>(prompt.size()));
    std::vector<float> rows(prompt.size() * geo.width());
    for (float& v : rows) v = rng.normal();
    for (auto& s : shards) s->write(1, 0, static_cast<std::int64_t>(prompt.size()), rows.data());
    const std::vector<std::int32_t> pages = alloc.pages(1);
    // Snapshot this rank's raw rows of the two whole pages.
    std::vector<std::vector<std::uint8_t>> before;
    for (int l = 0; l < layers; ++l) {
      for (int k = 0; k < 2; ++k) {
        for (int r = 0; r < page; ++r) {
          const std::uint8_t* p = pools[l]->raw_row(static_cast<std::int64_t>(pages[k]) * page + r);
          before.emplace_back(p, p + geo.row_bytes());
        }
      }
    }
    cache.insert(prompt, 1);
    EXPECT_EQ(cache.device_pages(), 2);
    // Request 1 still uses the pages: nothing can be evicted.
    cache.make_room(6);
    EXPECT_EQ(cache.device_pages(), 2) << "evicted a page in use";
    alloc.free(1);
    cache.make_room(6);  // now they go to the host tier
    EXPECT_EQ(cache.device_pages(), 0);
    EXPECT_EQ(cache.host_pages(), 2);
    EXPECT_EQ(cache.stats().bytes_to_host,
              2LL * page * static_cast<std::int64_t>(geo.row_bytes()) * layers);
    // Scribble over the freed device pages, then reload through a hit.
    for (int l = 0; l < layers; ++l) pools[l]->poison();
    const std::vector<std::int32_t> hit = cache.match(prompt);
    ASSERT_EQ(hit.size(), 2u);
    std::size_t i = 0;
    for (int l = 0; l < layers; ++l) {
      for (int k = 0; k < 2; ++k) {
        for (int r = 0; r < page; ++r, ++i) {
          const std::uint8_t* p = pools[l]->raw_row(static_cast<std::int64_t>(hit[k]) * page + r);
          ASSERT_EQ(std::memcmp(p, before[i].data(), geo.row_bytes()), 0)
              << "rank " << rank << " layer " << l << " page " << k;
        }
      }
    }
    alloc.allocate_shared(2, hit);
    cache.unpin(hit);
    alloc.check_invariants();
    EXPECT_EQ(alloc.length(2), 2 * vp);
  }
}

}  // namespace
}  // namespace dcp

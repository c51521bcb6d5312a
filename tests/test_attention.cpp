// Local MLA attention: the kernel against its float64 reference, and the DCP identity:
// striping a context over N ranks, attending locally and merging equals full attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "dcp/attention.h"
#include "dcp/error.h"
#include "dcp/layout.h"
#include "dcp/merge.h"
#include "dcp/reference.h"
#include "test_util.h"

namespace dcp {
namespace {

enum class Variant { causal, window, sinks, softcap, topk, non_causal, everything };
const char* name(Variant v) {
  switch (v) {
    case Variant::causal: return "causal";
    case Variant::window: return "window";
    case Variant::sinks: return "sinks";
    case Variant::softcap: return "softcap";
    case Variant::topk: return "topk";
    case Variant::non_causal: return "non_causal";
    case Variant::everything: return "window+sinks+softcap+topk";
  }
  return "?";
}
constexpr Variant kVariants[] = {Variant::causal,    Variant::window, Variant::sinks,
                                 Variant::softcap,   Variant::topk,   Variant::non_causal,
                                 Variant::everything};

void apply_variant(Variant v, ref::FullAttentionInput& in, test::Rng& rng) {
  in.causal = v != Variant::non_causal;
  if (v == Variant::window || v == Variant::everything) in.window = rng.range(1, 40);
  if (v == Variant::sinks || v == Variant::everything) {
    in.sinks.resize(in.num_heads);
    for (float& s : in.sinks) s = rng.uniform(-2, 4);
    if (in.num_heads > 1) in.sinks[0] = kNegInf;  // a head without a sink
  }
  if (v == Variant::softcap || v == Variant::everything) in.softcap = 1.5;
  if (v == Variant::topk || v == Variant::everything) {
    in.topk_k = 12;
    const int width = in.kv_lora_rank + in.rope_dim;
    const int requests = static_cast<int>(in.kv.size());
    for (int b = 0; b < requests; ++b) {
      const std::int64_t len = static_cast<std::int64_t>(in.kv[b].size()) / width;
      for (int t = in.q_start[b]; t < in.q_start[b + 1]; ++t) {
        // A unique global selection (shuffled prefix of the positions), padded with -1.
        std::vector<std::int32_t> pos(static_cast<std::size_t>(len));
        std::iota(pos.begin(), pos.end(), 0);
        std::shuffle(pos.begin(), pos.end(), rng.engine());
        for (int i = 0; i < in.topk_k; ++i) {
          in.topk.push_back(i < len && rng.coin(0.85) ? pos[i] : -1);
        }
      }
    }
  }
}

test::ContextSpec random_spec(test::Rng& rng, int dcp_size, int max_len) {
  test::ContextSpec spec;
  const int requests = static_cast<int>(rng.range(1, 4));
  for (int b = 0; b < requests; ++b) {
    // Mix empty contexts, contexts shorter than N and long ones.
    const int kind = static_cast<int>(rng.range(0, 5));
    const std::int64_t len = kind == 0   ? 0
                             : kind == 1 ? rng.range(1, dcp_size)
                                         : rng.range(1, max_len);
    spec.lengths.push_back(len);
    spec.q_lens.push_back(static_cast<int>(rng.range(1, 4)));
  }
  return spec;
}

struct RankOutput {
  std::vector<float> out, lse;
};

// The opt-in bf16-pair paths this CPU (and OS) runs.
std::vector<KernelPath> available_pair_paths() {
  std::vector<KernelPath> paths;
  if (amx_bf16_available()) paths.push_back(KernelPath::amx_bf16);
  if (avx512_bf16_available()) paths.push_back(KernelPath::avx512_bf16);
  return paths;
}

RankOutput run_rank(const MlaAttentionParams& p, KernelPath kernel = KernelPath::automatic,
                    int threads = 1) {
  const std::int64_t tokens = num_query_tokens(p);
  RankOutput r;
  // Poisoned: the kernel must write every element.
  r.out.assign(static_cast<std::size_t>(tokens) * p.num_heads * p.kv_lora_rank, std::nanf(""));
  r.lse.assign(static_cast<std::size_t>(tokens) * p.num_heads, std::nanf(""));
  MlaAttentionParams q = p;
  q.kernel = kernel;
  q.num_threads = threads;
  q.out = r.out.data();
  q.lse = r.lse.data();
  mla_attention(q);
  return r;
}

// The float64 reference for one rank's params (it validates them, so it gets scratch outputs).
ref::AttentionResult local_reference(MlaAttentionParams p) {
  const std::int64_t tokens = num_query_tokens(p);
  std::vector<float> out(static_cast<std::size_t>(tokens) * p.num_heads * p.kv_lora_rank),
      lse(static_cast<std::size_t>(tokens) * p.num_heads);
  p.out = out.data();
  p.lse = lse.data();
  return ref::mla_attention_local(p);
}

// An exact path against the reference: fp32 tolerances for O, tighter for the LSE.
::testing::AssertionResult matches_reference(const RankOutput& got,
                                             const ref::AttentionResult& expect,
                                             const std::string& what) {
  auto o = test::close(got.out, expect.out, test::kFp32Tol, (what + " O").c_str());
  if (!o) return o;
  return test::lse_close(got.lse, expect.lse, what + " LSE");
}

TEST(Attention, KernelMatchesLocalReference) {
  auto rng = test::make_rng();
  for (KernelPath kernel : available_kernel_paths()) {
    for (int threads : {1, 3}) {
      for (KvDtype dtype : {KvDtype::fp32, KvDtype::bf16}) {
        for (Variant v : kVariants) {
          for (int n : {1, 3, 4}) {
            const auto spec = random_spec(rng, n, 200);
            auto in = test::random_context(spec, dtype, rng);
            apply_variant(v, in, rng);
            const int page = static_cast<int>(rng.range(1, 20));
            const auto shards = test::stripe(in, n, 1, page, dtype, rng);
            for (int r = 0; r < n; ++r) {
              MlaAttentionParams p = test::shard_params(in, shards[r], dtype, page, n, r, 1);
              const RankOutput got = run_rank(p, kernel, threads);
              const std::string what = std::string(to_string(kernel)) + " threads " +
                                       std::to_string(threads) + " " + name(v) + " " +
                                       std::string(to_string(dtype)) + " N=" + std::to_string(n) +
                                       " r=" + std::to_string(r);
              ASSERT_TRUE(matches_reference(got, local_reference(p), what));
            }
          }
        }
      }
    }
  }
}

TEST(Attention, EveryKernelPathWithSplitKvOnLongContexts) {
  // Decode over a long shard: with threads > tokens the rows are split (split-KV) and the
  // partial states merged; DeepSeek widths and 20 heads (not a multiple of the head blocks).
  auto rng = test::make_rng();
  test::ContextSpec spec;
  spec.heads = 20;
  spec.kv_lora_rank = 512;
  spec.rope_dim = 64;
  spec.lengths = {9000, 37};
  spec.q_lens = {1, 2};
  for (KvDtype dtype : {KvDtype::fp32, KvDtype::bf16}) {
    auto in = test::random_context(spec, dtype, rng);
    apply_variant(Variant::sinks, in, rng);
    const auto shards = test::stripe(in, 2, 1, 64, dtype, rng);
    MlaAttentionParams p = test::shard_params(in, shards[1], dtype, 64, 2, 1, 1);
    const ref::AttentionResult expect = local_reference(p);
    for (KernelPath kernel : available_kernel_paths()) {
      for (int threads : {1, 4}) {
        const RankOutput got = run_rank(p, kernel, threads);
        const std::string what = std::string(to_string(kernel)) + " threads " +
                                 std::to_string(threads) + " " + std::string(to_string(dtype));
        EXPECT_TRUE(matches_reference(got, expect, what));
      }
    }
  }
}

TEST(Attention, EveryHeadCountAndWidthOnEveryPath) {
  // The SIMD paths switch kernels by head count, width and dtype (row-wise up to 7 heads, or 9 or
  // 11 at the MLA width: attention_simd.h) and block heads, rows and columns in registers; these
  // head counts hit every switch, block size and remainder, and the widths include ones no vector
  // width divides and one (80) that ends in half a row-kernel chunk.
  auto rng = test::make_rng();
  const int head_counts[] = {1,  2,  5,  7,  8,  9,  10, 11, 12, 13, 15,  16,
                             17, 23, 31, 32, 33, 47, 48, 49, 64, 65, 100, 128};
  struct Width {
    int dc, dr;
  };
  const Width widths[] = {{512, 64}, {37, 5}, {16, 0}, {80, 16}, {64, 16}};
  for (int heads : head_counts) {
    for (const Width w : widths) {
      for (const KvDtype dtype : {KvDtype::fp32, KvDtype::bf16}) {  // bf16 reads its own way
        test::ContextSpec spec = random_spec(rng, 3, 700);          // several 48-row tiles per rank
        spec.heads = heads;
        spec.kv_lora_rank = w.dc;
        spec.rope_dim = w.dr;
        auto in = test::random_context(spec, dtype, rng);
        const Variant v = kVariants[rng.range(0, 6)];
        apply_variant(v, in, rng);
        const int page = static_cast<int>(rng.range(1, 20));
        const auto shards = test::stripe(in, 3, 1, page, dtype, rng);
        const int r = static_cast<int>(rng.range(0, 2));
        MlaAttentionParams p = test::shard_params(in, shards[r], dtype, page, 3, r, 1);
        const ref::AttentionResult expect = local_reference(p);
        for (KernelPath kernel : available_kernel_paths()) {
          const RankOutput got = run_rank(p, kernel);
          const std::string what = std::string(to_string(kernel)) + " heads " +
                                   std::to_string(heads) + " width " + std::to_string(w.dc) + "+" +
                                   std::to_string(w.dr) + " " + name(v) + " " +
                                   std::string(to_string(dtype));
          ASSERT_TRUE(matches_reference(got, expect, what));
        }
      }
    }
  }
}

TEST(Attention, PrefillChunksInTokenBlocksMatchTheReference) {
  // Prefill and verification attend many consecutive tokens of a request: with up to 32 heads
  // they run in blocks (the rows every token of a block sees in one task, each token's own last
  // rows in another, LSE-merged). Long query runs cross block boundaries and leave remainders;
  // a short shard leaves blocks too small to form; threads cut the tasks by their work.
  auto rng = test::make_rng();
  for (const int heads : {1, 3, 8, 16, 32, 33}) {
    for (const KvDtype dtype : {KvDtype::fp32, KvDtype::bf16}) {
      for (const Variant v : {Variant::causal, Variant::sinks, Variant::softcap,
                              Variant::non_causal, Variant::window}) {
        test::ContextSpec spec;
        spec.heads = heads;
        spec.lengths = {rng.range(150, 500), rng.range(2, 40), rng.range(60, 300)};
        spec.q_lens = {static_cast<int>(rng.range(20, 140)),
                       static_cast<int>(std::min<std::int64_t>(spec.lengths[1], 7)),
                       static_cast<int>(rng.range(5, 60))};
        auto in = test::random_context(spec, dtype, rng);
        apply_variant(v, in, rng);
        const int n = static_cast<int>(rng.range(1, 3));
        const int page = static_cast<int>(rng.range(1, 20));
        const auto shards = test::stripe(in, n, 1, page, dtype, rng);
        const int r = static_cast<int>(rng.range(0, n - 1));
        MlaAttentionParams p = test::shard_params(in, shards[r], dtype, page, n, r, 1);
        const ref::AttentionResult expect = local_reference(p);
        for (KernelPath kernel : available_kernel_paths()) {
          for (int threads : {1, 2, 3}) {
            const std::string what = std::string(to_string(kernel)) + " heads " +
                                     std::to_string(heads) + " " + name(v) + " " +
                                     std::string(to_string(dtype)) + " N=" + std::to_string(n) +
                                     " threads " + std::to_string(threads);
            ASSERT_TRUE(matches_reference(run_rank(p, kernel, threads), expect, what));
          }
        }
      }
    }
  }
}

TEST(Attention, BlockedQueryLayoutIsReadInPlace) {
  // q_head_block: the query as a DCP gather leaves it, [Hq / H, T, H, W]. Every path, and the
  // reference, must read it as the plain [T, Hq, W] query it permutes.
  auto rng = test::make_rng();
  for (const int heads : {4, 12, 32}) {
    test::ContextSpec spec = random_spec(rng, 2, 300);
    spec.heads = heads;
    const KvDtype dtype = heads == 12 ? KvDtype::bf16 : KvDtype::fp32;
    auto in = test::random_context(spec, dtype, rng);
    const auto shards = test::stripe(in, 2, 1, 16, dtype, rng);
    MlaAttentionParams p = test::shard_params(in, shards[0], dtype, 16, 2, 0, 1);
    const ref::AttentionResult expect = local_reference(p);
    const std::int64_t tokens = num_query_tokens(p);
    const int width = p.kv_lora_rank + p.rope_dim;
    for (const int block : {1, heads / 4, heads / 2, heads}) {
      std::vector<float> blocked(static_cast<std::size_t>(tokens) * heads * width);
      for (std::int64_t t = 0; t < tokens; ++t) {
        for (int h = 0; h < heads; ++h) {
          const std::size_t at =
              ((static_cast<std::size_t>(h / block) * tokens + t) * block + h % block) * width;
          std::copy_n(p.q + (t * heads + h) * width, width, blocked.data() + at);
        }
      }
      MlaAttentionParams pb = p;
      pb.q = blocked.data();
      pb.q_head_block = block;
      const ref::AttentionResult ref_blocked = local_reference(pb);  // same values, same order
      EXPECT_TRUE(ref_blocked.out == expect.out && ref_blocked.lse == expect.lse)
          << "reference, block " << block;
      for (const KernelPath pair : available_pair_paths()) {  // approximate: against itself
        if (dtype != KvDtype::bf16) break;
        const RankOutput plain = run_rank(p, pair), got = run_rank(pb, pair);
        EXPECT_TRUE(got.out == plain.out && got.lse == plain.lse)
            << to_string(pair) << " block " << block;
      }
      for (KernelPath kernel : available_kernel_paths()) {
        const RankOutput got = run_rank(pb, kernel);
        EXPECT_TRUE(matches_reference(got, expect,
                                      std::string(to_string(kernel)) + " heads " +
                                          std::to_string(heads) + " block " +
                                          std::to_string(block)));
      }
    }
  }
}

TEST(Attention, BlockedOutputLayoutWritesEachBlockInPlace) {
  // out_head_block: the outputs in per-destination blocks [T, H, D_c] + [T, H] at a stride, as
  // the combines send them: the a2a chunk [O | LSE] (lse_block_stride 0), or ag_rs's O blocks
  // with the LSE blocks apart at their own stride. Every path, with split-KV threads (parts
  // merged per block) and without; padding between blocks must stay untouched.
  auto rng = test::make_rng();
  test::ContextSpec spec;
  spec.heads = 12;
  spec.kv_lora_rank = 37;
  spec.rope_dim = 5;
  spec.lengths = {9000, 40};  // long enough that 4 threads split the KV range
  spec.q_lens = {1, 2};
  const float sentinel = 12345.0f;
  const int pad = 5;
  for (const KvDtype dtype : {KvDtype::fp32, KvDtype::bf16}) {
    auto in = test::random_context(spec, dtype, rng);
    apply_variant(Variant::sinks, in, rng);
    const auto shards = test::stripe(in, 2, 1, 16, dtype, rng);
    MlaAttentionParams p = test::shard_params(in, shards[1], dtype, 16, 2, 1, 1);
    const ref::AttentionResult expect = local_reference(p);
    const std::int64_t tokens = num_query_tokens(p);
    const int heads = p.num_heads, dc = p.kv_lora_rank;
    for (const int block : {1, 3, 4, 12}) {
      const int blocks = heads / block;
      const std::int64_t rows = tokens * block;
      for (const bool lse_apart : {false, true}) {
        // a2a: chunk k = [O rows*dc | LSE rows | pad]; ag_rs: O blocks [rows*dc | pad] and
        // LSE blocks [rows | pad] in a buffer of their own.
        const std::int64_t stride = lse_apart ? rows * dc + pad : rows * (dc + 1) + pad;
        const std::int64_t lse_stride = lse_apart ? rows + pad : stride;
        for (KernelPath kernel : available_kernel_paths()) {
          for (int threads : {1, 4}) {
            std::vector<float> buf(static_cast<std::size_t>(stride * blocks), sentinel);
            std::vector<float> lse_buf(static_cast<std::size_t>(lse_stride * blocks), sentinel);
            MlaAttentionParams pb = p;
            pb.kernel = kernel;
            pb.num_threads = threads;
            pb.out = buf.data();
            pb.lse = lse_apart ? lse_buf.data() : buf.data() + rows * dc;
            pb.out_head_block = block;
            pb.out_block_stride = stride;
            pb.lse_block_stride = lse_apart ? lse_stride : 0;
            mla_attention(pb);
            RankOutput got;  // back to the plain layout
            got.out.resize(static_cast<std::size_t>(tokens) * heads * dc);
            got.lse.resize(static_cast<std::size_t>(tokens) * heads);
            for (std::int64_t t = 0; t < tokens; ++t) {
              for (int h = 0; h < heads; ++h) {
                const std::int64_t k = h / block, i = t * block + h % block;
                std::copy_n(buf.data() + k * stride + i * dc, dc,
                            got.out.data() + (t * heads + h) * dc);
                got.lse[t * heads + h] = pb.lse[k * lse_stride + i];
              }
            }
            const std::string what = std::string(to_string(kernel)) + " threads " +
                                     std::to_string(threads) + " block " + std::to_string(block) +
                                     (lse_apart ? " lse apart" : "");
            EXPECT_TRUE(matches_reference(got, expect, what));
            for (int k = 0; k < blocks; ++k) {
              for (int e = 0; e < pad; ++e) {
                EXPECT_EQ(buf[k * stride + stride - pad + e], sentinel) << what;
                if (lse_apart) {
                  EXPECT_EQ(lse_buf[k * lse_stride + rows + e], sentinel) << what;
                }
              }
            }
          }
        }
      }
    }
  }
}

// The bf16-pair paths round q * scale and the probabilities to bf16. With bf16-exact queries
// and a power-of-two scale the first rounding is exact, so what remains is P: each weight within
// 2^-9 of its value, the denominator kept in fp32, hence |O - O_ref| <= 2^-8 * max|V|. The scores
// are exact products summed in fp32, so the LSE is as accurate as the fp32 paths'. Makes `in`
// such a context and checks one rank of it (N = 3 ranks, or `n`) on `path` at 1 and 3 threads.
void check_pair_path_within_rounding(KernelPath path, ref::FullAttentionInput& in, test::Rng& rng,
                                     const std::string& what, int n = 3) {
  in.softmax_scale = 0.125;
  for (float& x : in.q) x = bf16_to_float(float_to_bf16(x));
  const int width = in.kv_lora_rank + in.rope_dim;
  double max_v = 0;
  for (const auto& rows : in.kv) {
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (static_cast<int>(i % width) < in.kv_lora_rank)
        max_v = std::max<double>(max_v, std::abs(rows[i]));
    }
  }
  const int page = static_cast<int>(rng.range(1, 70));
  const auto shards = test::stripe(in, n, 1, page, KvDtype::bf16, rng);
  const int r = static_cast<int>(rng.range(0, n - 1));
  MlaAttentionParams p = test::shard_params(in, shards[r], KvDtype::bf16, page, n, r, 1);
  const ref::AttentionResult expect = local_reference(p);
  for (int threads : {1, 3}) {
    const RankOutput got = run_rank(p, path, threads);
    const std::string where =
        std::string(to_string(path)) + " " + what + " threads " + std::to_string(threads);
    double worst = 0;
    for (std::size_t i = 0; i < got.out.size(); ++i)
      worst = std::max(worst, std::abs(got.out[i] - expect.out[i]));
    ASSERT_LE(worst, std::ldexp(max_v, -8)) << where;
    ASSERT_TRUE(test::lse_close(got.lse, expect.lse, where + " LSE"));
  }
}

void pair_path_within_rounding(KernelPath path) {
  auto rng = test::make_rng();
  struct Width {
    int dc, dr;
  };
  for (int heads : {1, 5, 16, 17, 33, 128}) {
    for (const Width w : {Width{512, 64}, Width{37, 5}, Width{80, 16}}) {
      // Long enough for several tiles per rank: 256 rows from 128 heads, 128 below.
      test::ContextSpec spec = random_spec(rng, 3, heads >= 128 ? 2400 : 1200);
      spec.heads = heads;
      spec.kv_lora_rank = w.dc;
      spec.rope_dim = w.dr;
      auto in = test::random_context(spec, KvDtype::bf16, rng);
      const Variant v = kVariants[rng.range(0, 6)];
      apply_variant(v, in, rng);
      check_pair_path_within_rounding(path, in, rng,
                                      "heads " + std::to_string(heads) + " width " +
                                          std::to_string(w.dc) + "+" + std::to_string(w.dr) + " " +
                                          name(v));
    }
  }
}

TEST(Attention, AmxPathIsWithinItsBf16RoundingOfTheReference) {
  if (!amx_bf16_available()) GTEST_SKIP() << "this CPU or OS offers no AMX-BF16";
  pair_path_within_rounding(KernelPath::amx_bf16);
}

TEST(Attention, Avx512Bf16PathIsWithinItsBf16RoundingOfTheReference) {
  if (!avx512_bf16_available()) GTEST_SKIP() << "this CPU offers no AVX512-BF16";
  pair_path_within_rounding(KernelPath::avx512_bf16);
}

// Prefill chunks on a bf16-pair path: blocks of up to 128 / heads tokens, heads x tokens in the
// lanes (so 128 lanes and 256-row tiles with 8 or more heads), across block boundaries.
void pair_path_in_token_blocks_within_rounding(KernelPath path) {
  auto rng = test::make_rng();
  for (const int heads : {1, 3, 8, 16, 32}) {
    for (const Variant v :
         {Variant::causal, Variant::sinks, Variant::softcap, Variant::non_causal}) {
      test::ContextSpec spec;
      spec.heads = heads;
      spec.kv_lora_rank = 80;
      spec.rope_dim = 16;
      spec.lengths = {rng.range(300, 900), rng.range(60, 300)};
      spec.q_lens = {static_cast<int>(rng.range(20, 140)), static_cast<int>(rng.range(5, 60))};
      auto in = test::random_context(spec, KvDtype::bf16, rng);
      apply_variant(v, in, rng);
      check_pair_path_within_rounding(path, in, rng,
                                      "heads " + std::to_string(heads) + " " + name(v),
                                      static_cast<int>(rng.range(1, 3)));
    }
  }
}

TEST(Attention, AmxPathInTokenBlocksIsWithinItsBf16Rounding) {
  if (!amx_bf16_available()) GTEST_SKIP() << "this CPU or OS offers no AMX-BF16";
  pair_path_in_token_blocks_within_rounding(KernelPath::amx_bf16);
}

TEST(Attention, Avx512Bf16PathInTokenBlocksIsWithinItsBf16Rounding) {
  if (!avx512_bf16_available()) GTEST_SKIP() << "this CPU offers no AVX512-BF16";
  pair_path_in_token_blocks_within_rounding(KernelPath::avx512_bf16);
}

TEST(Attention, Bf16PairPathsRefuseWhatTheyCannotRun) {
  auto rng = test::make_rng();
  test::ContextSpec spec;
  spec.lengths = {40};
  spec.q_lens = {1};
  auto in = test::random_context(spec, KvDtype::fp32, rng);
  const auto shards = test::stripe(in, 1, 1, 16, KvDtype::fp32, rng);
  MlaAttentionParams p = test::shard_params(in, shards[0], KvDtype::fp32, 16, 1, 0, 1);
  const std::string err = test::error_of([&] { run_rank(p, KernelPath::amx_bf16); });
  if (amx_bf16_available()) {
    EXPECT_NE(err.find("kernel path amx_bf16 needs kv_dtype bf16, got fp32"), std::string::npos)
        << err;
  } else {
    EXPECT_NE(err.find("kernel path amx_bf16 is not available"), std::string::npos) << err;
  }
  const std::string vdp = test::error_of([&] { run_rank(p, KernelPath::avx512_bf16); });
  if (avx512_bf16_available()) {
    EXPECT_NE(vdp.find("kernel path avx512_bf16 needs kv_dtype bf16, got fp32"), std::string::npos)
        << vdp;
  } else {
    EXPECT_NE(vdp.find("kernel path avx512_bf16 is not available: it needs a CPU with AVX-512 "
                       "and AVX512-BF16"),
              std::string::npos)
        << vdp;
  }
}

TEST(Attention, PortablePathIsAlwaysAvailable) {
  const auto paths = available_kernel_paths();
  ASSERT_FALSE(paths.empty());
  EXPECT_EQ(paths.front(), KernelPath::portable);
  std::cout << "[dcp] kernel paths on this CPU:";
  for (KernelPath k : paths) std::cout << " " << to_string(k);
  std::cout << "\n";
}

// The DCP identity, for one configuration. Sinks go to rank 0 only.
void check_striped_equals_full(test::Rng& rng, KvDtype dtype, Variant v, int n, int interleave,
                               int page, const test::ContextSpec& spec) {
  auto in = test::random_context(spec, dtype, rng);
  apply_variant(v, in, rng);
  const auto shards = test::stripe(in, n, interleave, page, dtype, rng);
  const std::int64_t tokens = in.q_start.back();
  const std::int64_t rows = tokens * in.num_heads;
  const int dc = in.kv_lora_rank;
  std::vector<float> o_parts(static_cast<std::size_t>(n) * rows * dc),
      lse_parts(static_cast<std::size_t>(n) * rows);
  for (int r = 0; r < n; ++r) {
    MlaAttentionParams p = test::shard_params(in, shards[r], dtype, page, n, r, interleave);
    if (r != 0) p.sinks = nullptr;
    const RankOutput got = run_rank(p);
    std::copy(got.out.begin(), got.out.end(), o_parts.begin() + r * rows * dc);
    std::copy(got.lse.begin(), got.lse.end(), lse_parts.begin() + r * rows);
  }
  std::vector<float> out(static_cast<std::size_t>(rows) * dc, std::nanf("")),
      lse(rows, std::nanf(""));
  merge_attention_states(o_parts.data(), lse_parts.data(), n, rows, dc, LseBase::e, out.data(),
                         lse.data());
  const ref::AttentionResult expect = ref::full_attention(in);
  const std::string what = std::string(name(v)) + " " + std::string(to_string(dtype)) +
                           " N=" + std::to_string(n) + " I=" + std::to_string(interleave) +
                           " P=" + std::to_string(page);
  const test::Tolerance tol = dtype == KvDtype::fp32 ? test::kFp32Tol : test::kBf16Tol;
  EXPECT_TRUE(test::close(out, expect.out, tol, (what + " O").c_str()));
  EXPECT_TRUE(test::lse_close(lse, expect.lse, what + " LSE"));
}

TEST(Attention, StripedThenMergedEqualsFullAttention) {
  auto rng = test::make_rng();
  for (KvDtype dtype : {KvDtype::fp32, KvDtype::bf16}) {
    for (Variant v : kVariants) {
      for (int n : {1, 2, 3, 4, 5, 8}) {
        const int page = static_cast<int>(rng.range(1, 24));
        check_striped_equals_full(rng, dtype, v, n, 1, page, random_spec(rng, n, 300));
      }
    }
  }
}

TEST(Attention, StripedWithInterleave) {
  auto rng = test::make_rng();
  for (int interleave : {2, 16}) {
    for (int n : {2, 3, 4}) {
      for (Variant v : {Variant::causal, Variant::window, Variant::topk}) {
        check_striped_equals_full(rng, KvDtype::fp32, v, n, interleave, 16,
                                  random_spec(rng, n, 300));
      }
    }
  }
}

TEST(Attention, DeepSeekGeometry) {
  // The real widths (512 + 64), 16 heads, a long-ish context, decode and verify queries.
  auto rng = test::make_rng();
  test::ContextSpec spec;
  spec.heads = 16;
  spec.kv_lora_rank = 512;
  spec.rope_dim = 64;
  spec.lengths = {700, 3};
  spec.q_lens = {1, 3};
  for (KvDtype dtype : {KvDtype::fp32, KvDtype::bf16}) {
    check_striped_equals_full(rng, dtype, Variant::causal, 4, 1, 64, spec);
  }
}

TEST(Attention, ContextShorterThanNLeavesRanksEmpty) {
  auto rng = test::make_rng();
  test::ContextSpec spec;
  spec.lengths = {2};
  spec.q_lens = {1};
  auto in = test::random_context(spec, KvDtype::fp32, rng);
  const int n = 5;
  const auto shards = test::stripe(in, n, 1, 4, KvDtype::fp32, rng);
  for (int r = 0; r < n; ++r) {
    const RankOutput got = run_rank(test::shard_params(in, shards[r], KvDtype::fp32, 4, n, r, 1));
    for (float l : got.lse) {
      if (r < 2) {
        EXPECT_TRUE(std::isfinite(l)) << "rank " << r;
      } else {
        EXPECT_EQ(l, kNegInf) << "rank " << r;
      }
    }
    if (r >= 2) {
      for (float o : got.out) ASSERT_EQ(o, 0.0f);
    }
  }
}

TEST(Attention, SinkAddedAtMergeEqualsSinkInKernel) {
  auto rng = test::make_rng();
  test::ContextSpec spec;
  spec.lengths = {90, 1, 0};
  spec.q_lens = {2, 1, 1};
  auto in = test::random_context(spec, KvDtype::fp32, rng);
  apply_variant(Variant::sinks, in, rng);
  const int n = 3;
  const auto shards = test::stripe(in, n, 1, 8, KvDtype::fp32, rng);
  const std::int64_t rows = in.q_start.back() * in.num_heads;
  const int dc = in.kv_lora_rank;
  std::vector<float> o_parts, lse_parts;
  for (int r = 0; r < n; ++r) {
    MlaAttentionParams p = test::shard_params(in, shards[r], KvDtype::fp32, 8, n, r, 1);
    p.sinks = nullptr;
    const RankOutput got = run_rank(p);
    o_parts.insert(o_parts.end(), got.out.begin(), got.out.end());
    lse_parts.insert(lse_parts.end(), got.lse.begin(), got.lse.end());
  }
  std::vector<float> out(static_cast<std::size_t>(rows) * dc), lse(rows);
  merge_attention_states(o_parts.data(), lse_parts.data(), n, rows, dc, LseBase::e, out.data(),
                         lse.data());
  std::vector<float> sink_rows(rows);
  for (std::int64_t i = 0; i < rows; ++i) sink_rows[i] = in.sinks[i % in.num_heads];
  merge_sink(out.data(), lse.data(), sink_rows.data(), rows, dc);
  const ref::AttentionResult expect = ref::full_attention(in);
  EXPECT_TRUE(test::close(out, expect.out, test::kFp32Tol, "O"));
  EXPECT_TRUE(test::lse_close(lse, expect.lse, "LSE"));
}

// Invalid params are rejected before anything is written.
class AttentionValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    auto rng = test::make_rng();
    test::ContextSpec spec;
    spec.lengths = {40, 9};
    spec.q_lens = {1, 2};
    in_ = test::random_context(spec, KvDtype::fp32, rng);
    shards_ = test::stripe(in_, 2, 1, 4, KvDtype::fp32, rng);
    params_ = test::shard_params(in_, shards_[1], KvDtype::fp32, 4, 2, 1, 1);
    out_.assign(static_cast<std::size_t>(3) * in_.num_heads * in_.kv_lora_rank, 123.0f);
    lse_.assign(static_cast<std::size_t>(3) * in_.num_heads, 123.0f);
    params_.out = out_.data();
    params_.lse = lse_.data();
  }
  void expect_rejected(const MlaAttentionParams& p, const std::string& needle) {
    try {
      mla_attention(p);
      ADD_FAILURE() << "expected rejection mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    for (float v : out_) ASSERT_EQ(v, 123.0f) << "output written despite rejection";
    for (float v : lse_) ASSERT_EQ(v, 123.0f) << "LSE written despite rejection";
  }
  ref::FullAttentionInput in_;
  std::vector<test::Shard> shards_;
  MlaAttentionParams params_;
  std::vector<float> out_, lse_;
};

TEST_F(AttentionValidation, AcceptsTheBaseline) {
  EXPECT_NO_THROW(mla_attention(params_));
}

TEST_F(AttentionValidation, RejectsPageOutsidePool) {
  std::vector<std::int32_t> table = shards_[1].page_table;
  table[0] = static_cast<std::int32_t>(shards_[1].num_pages);
  MlaAttentionParams p = params_;
  p.page_table = table.data();
  expect_rejected(p, "outside the pool");
}

TEST_F(AttentionValidation, RejectsNegativeAndOversizedLengths) {
  std::vector<std::int64_t> len = shards_[1].local_len;
  len[1] = -1;
  MlaAttentionParams p = params_;
  p.local_len = len.data();
  expect_rejected(p, "local_len[1] = -1");
  len[1] = 1000;
  expect_rejected(p, "local_len[1] = 1000");
}

TEST_F(AttentionValidation, RejectsBadShapesAndRanges) {
  MlaAttentionParams p = params_;
  p.num_heads = 0;
  expect_rejected(p, "num_heads");
  p = params_;
  p.dcp_rank = 2;
  expect_rejected(p, "dcp_rank = 2");
  p = params_;
  p.softmax_scale = std::nanf("");
  expect_rejected(p, "softmax_scale");
  p = params_;
  std::vector<std::int32_t> starts = {0, 1, 1};
  p.q_start = starts.data();
  expect_rejected(p, "q_len 0");
  p = params_;
  p.window = -1;
  expect_rejected(p, "window");
  p = params_;
  p.q_head_block = p.num_heads + 1;
  expect_rejected(p, "q_head_block");
  p = params_;
  p.out_head_block = 1;
  p.out_block_stride = 1;
  expect_rejected(p, "out_block_stride");
  p.out_block_stride = num_query_tokens(p) * p.kv_lora_rank;
  p.lse_block_stride = num_query_tokens(p) - 1;
  expect_rejected(p, "lse_block_stride");
  p.lse_block_stride = -1;
  expect_rejected(p, "lse_block_stride");
  p = params_;
  p.topk_k = 2;
  expect_rejected(p, "topk must not be null");
  p = params_;
  std::vector<std::int32_t> topk = {0, 1, 2, 3, 4, -2};
  p.topk = topk.data();
  p.topk_k = 2;
  expect_rejected(p, "topk[2][1] = -2");
  topk = {1, 85, 0, 1, 2, 3};  // 85 is beyond request 0's 40 tokens and owned by rank 1
  expect_rejected(p, "beyond request 0");
  p = params_;
  std::vector<float> sinks(in_.num_heads, std::numeric_limits<float>::infinity());
  p.sinks = sinks.data();
  expect_rejected(p, "sinks[0]");
}

}  // namespace
}  // namespace dcp

// The bf16-pair paths for bf16 KV: both products of a KV tile run on bf16 pairs with fp32 sums,
// the online softmax on AVX-512 with the heads in the lanes. Like GPU MLA kernels they round the
// scaled query and the probabilities to bf16; the LSE keeps fp32 probabilities.
//
//   scores  C[16 rows][16 heads]  += K tile [16 rows][32 cols]   x Qv [16 col pairs][16 heads]
//   values  C[16 heads][16 cols]  += Pt     [16 heads][32 rows]  x Vv [16 row pairs][16 cols]
//
// Qv (query pairs, VNNI layout) is packed once per task; K is loaded from the pool in place
// where a block's rows are consecutive (else from a zero-padded copy); Vv interleaves the words
// of row pairs; Pt is the probabilities transposed. Both products run on the same micro-kernels
// (block_2x2 and its 4 x 1 / 1 x 4 forms), four 16 x 16 accumulators at a time, which one of
// two engines provides:
//   - AmxDot (KernelPath::amx_bf16): AMX tiles, TDPBF16PS;
//   - VectorDot (KernelPath::avx512_bf16): AVX512-BF16 vectors, VDPBF16PS, for CPUs without AMX
//     (AMD Zen 4 and 5): a 16 x 16 block is 16 vector accumulators, one per row of A, each
//     adding B's pair rows times the broadcast pair of its A row.
// Compiled with AMX, AVX512-BF16 and AVX-512 flags (src/CMakeLists.txt); each engine is called
// only when the CPU (and, for AMX, the OS) offers it.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention_tasks.h"
#include "convert_simd.h"
#include "dcp/merge.h"
#include "line_vector.h"
#include "simd.h"
#include "simd_state.h"
#include "transpose.h"

namespace dcp::kernels {
namespace {

// KV rows per tile. Each tile loads and stores the whole output accumulator (lanes x 512 fp32,
// 256 KB at 128 heads) through the value product's tiles, so many heads want long tiles; few
// heads want short ones, whose operands stay in L1.
constexpr int kMaxTileRows = 256;
int tile_rows_for(int lanes) {
  return lanes >= 128 ? 256 : 128;
}

struct TileConfig {  // the LDTILECFG memory layout, palette 1
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};

// All eight tiles 16 rows x 64 bytes: tmm0-3 accumulate, tmm4-7 hold operands. A constant in
// memory, not a local: GCC 12 does not see that LDTILECFG reads its operand and dropped the
// stores to a local configuration's bytes_per_row (the instruction then faults).
constexpr TileConfig make_tile_config() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.bytes_per_row[t] = 64;
    c.rows[t] = 16;
  }
  return c;
}
alignas(64) constexpr TileConfig kTileConfig = make_tile_config();

void configure_tiles() {
  _tile_loadconfig(&kTileConfig);
}

// Word interleave of two rows of 32 words (vpermt2w indices): output word 2k is a[k] and 2k+1
// is b[k], for k over the low (lo) or the high (hi) 16 words.
struct InterleaveIndices {
  alignas(64) std::uint16_t lo[32], hi[32];
  constexpr InterleaveIndices() : lo{}, hi{} {
    for (int k = 0; k < 16; ++k) {
      lo[2 * k] = static_cast<std::uint16_t>(k);
      lo[2 * k + 1] = static_cast<std::uint16_t>(32 + k);
      hi[2 * k] = static_cast<std::uint16_t>(16 + k);
      hi[2 * k + 1] = static_cast<std::uint16_t>(48 + k);
    }
  }
};
constexpr InterleaveIndices kInterleave;

// The work buffers, kept per thread (thread_buffers). Nothing carries over between calls:
// every buffer is written before it is read, except zero_row, which only ever holds zeros.
struct PairBuffers {
  LineVector<std::uint32_t> qv, vv;
  LineVector<std::uint16_t> kbuf, zero_row, pt;
  LineVector<float> s, acc, m, l, corr;
};

// Operand tiles over the steps of a product: tile i of step s starts at base[i] + s * step
// bytes, its 16 rows `stride` bytes apart.
struct TileStream {
  const char* base[4];
  std::size_t step;
  int stride;
  const void* at(int i, int s) const { return base[i] + static_cast<std::size_t>(s) * step; }
};
// Four 16 x 16 fp32 accumulator blocks, rows `stride` bytes apart, zeroed first or loaded from
// `out`.
struct AccTiles {
  float* out[4];
  int stride;
  bool accumulate;
};

// The AMX engine: accumulators in tmm0-3, operands in tmm4-7.
struct AmxDot {
  // The micro-kernels keep four accumulators in flight: one chain of TDPBF16PS would wait on the
  // instruction's latency, several times its issue interval. tmm4-7 hold operands. Each shape is
  // written out: GCC's tile intrinsics paste the tile number into the asm text, so it must be a
  // literal, not a template argument or a loop index.
  static void load_acc(const AccTiles& c) {
    if (c.accumulate) {
      _tile_loadd(0, c.out[0], c.stride);
      _tile_loadd(1, c.out[1], c.stride);
      _tile_loadd(2, c.out[2], c.stride);
      _tile_loadd(3, c.out[3], c.stride);
    } else {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
    }
  }
  static void store_acc(const AccTiles& c) {
    _tile_stored(0, c.out[0], c.stride);
    _tile_stored(1, c.out[1], c.stride);
    _tile_stored(2, c.out[2], c.stride);
    _tile_stored(3, c.out[3], c.stride);
  }

  // C[2i + j] += A_i x B_j: each operand loaded once for two products.
  static void block_2x2(const AccTiles& c, const TileStream& a, const TileStream& b, int steps) {
    load_acc(c);
    for (int s = 0; s < steps; ++s) {
      _tile_loadd(4, a.at(0, s), a.stride);
      _tile_loadd(6, b.at(0, s), b.stride);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, b.at(1, s), b.stride);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, a.at(1, s), a.stride);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    store_acc(c);
  }

  // C[i] += A_i x B_0; the A tiles alternate between tmm4 and tmm5.
  static void block_4x1(const AccTiles& c, const TileStream& a, const TileStream& b, int steps) {
    load_acc(c);
    for (int s = 0; s < steps; ++s) {
      _tile_loadd(6, b.at(0, s), b.stride);
      _tile_loadd(4, a.at(0, s), a.stride);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(5, a.at(1, s), a.stride);
      _tile_dpbf16ps(1, 5, 6);
      _tile_loadd(4, a.at(2, s), a.stride);
      _tile_dpbf16ps(2, 4, 6);
      _tile_loadd(5, a.at(3, s), a.stride);
      _tile_dpbf16ps(3, 5, 6);
    }
    store_acc(c);
  }

  // C[j] += A_0 x B_j; the B tiles alternate between tmm6 and tmm7.
  static void block_1x4(const AccTiles& c, const TileStream& a, const TileStream& b, int steps) {
    load_acc(c);
    for (int s = 0; s < steps; ++s) {
      _tile_loadd(4, a.at(0, s), a.stride);
      _tile_loadd(6, b.at(0, s), b.stride);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, b.at(1, s), b.stride);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(6, b.at(2, s), b.stride);
      _tile_dpbf16ps(2, 4, 6);
      _tile_loadd(7, b.at(3, s), b.stride);
      _tile_dpbf16ps(3, 4, 7);
    }
    store_acc(c);
  }

  // One accumulated block, for columns no wider block covers.
  static void block_1x1(float* out, int stride, const TileStream& a, const TileStream& b,
                        int steps) {
    _tile_loadd(0, out, stride);
    for (int s = 0; s < steps; ++s) {
      _tile_loadd(4, a.at(0, s), a.stride);
      _tile_loadd(6, b.at(0, s), b.stride);
      _tile_dpbf16ps(0, 4, 6);
    }
    _tile_stored(0, out, stride);
  }
};

// The AVX512-BF16 engine. Row r of C[j] (16 fp32 lanes, one per column) += sum over pairs p of
// B_j[p] (16 column pairs) . broadcast(A[r][pair p]): VDPBF16PS computes per lane
// c += a.lo * b.lo + a.hi * b.hi, as TDPBF16PS does per element. A panel keeps R rows of NC
// blocks in registers over all its steps, so that each broadcast pair of A serves NC products
// and each pair row of B serves R (a 16 x 16 block alone would load once per product).
struct VectorDot {
  // Rows [r0, r0 + R) of C[j] = A_ai x B_bj[j] for j < NC.
  template <int R, int NC>
  static void panel(float* const* out, int stride, bool accumulate, const TileStream& a, int ai,
                    const TileStream& b, const int* bj, int r0, int steps) {
    __m512 c[R][NC];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int j = 0; j < NC; ++j) {
        c[r][j] = accumulate
                      ? _mm512_loadu_ps(reinterpret_cast<const char*>(out[j]) + (r0 + r) * stride)
                      : _mm512_setzero_ps();
      }
    }
    for (int s = 0; s < steps; ++s) {
      const char* pa = static_cast<const char*>(a.at(ai, s)) + r0 * a.stride;
      const char* pb[NC];
      for (int j = 0; j < NC; ++j) pb[j] = static_cast<const char*>(b.at(bj[j], s));
      for (int p = 0; p < 16; ++p) {
        __m512bh bv[NC];
#pragma GCC unroll 4
        for (int j = 0; j < NC; ++j) {
          bv[j] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(pb[j] + p * b.stride));
        }
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          std::int32_t pair;
          std::memcpy(&pair, pa + r * a.stride + 4 * p, sizeof pair);
          const __m512bh bc = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
#pragma GCC unroll 4
          for (int j = 0; j < NC; ++j) c[r][j] = _mm512_dpbf16_ps(c[r][j], bv[j], bc);
        }
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int j = 0; j < NC; ++j) {
        _mm512_storeu_ps(reinterpret_cast<char*>(out[j]) + (r0 + r) * stride, c[r][j]);
      }
    }
  }

  // C[2i + j] += A_i x B_j: panels of 8 rows x 2 blocks.
  static void block_2x2(const AccTiles& c, const TileStream& a, const TileStream& b, int steps) {
    static constexpr int kBoth[2] = {0, 1};
    for (int i = 0; i < 2; ++i) {
      for (int r0 = 0; r0 < 16; r0 += 8) {
        panel<8, 2>(c.out + 2 * i, c.stride, c.accumulate, a, i, b, kBoth, r0, steps);
      }
    }
  }
  // C[i] += A_i x B_0: whole blocks (one B, so nothing to share a broadcast with).
  static void block_4x1(const AccTiles& c, const TileStream& a, const TileStream& b, int steps) {
    static constexpr int kFirst[1] = {0};
    for (int i = 0; i < 4; ++i) {
      panel<16, 1>(c.out + i, c.stride, c.accumulate, a, i, b, kFirst, 0, steps);
    }
  }
  // C[j] += A_0 x B_j: panels of 4 rows x 4 blocks.
  static void block_1x4(const AccTiles& c, const TileStream& a, const TileStream& b, int steps) {
    static constexpr int kAll[4] = {0, 1, 2, 3};
    for (int r0 = 0; r0 < 16; r0 += 4) {
      panel<4, 4>(c.out, c.stride, c.accumulate, a, 0, b, kAll, r0, steps);
    }
  }
  static void block_1x1(float* out, int stride, const TileStream& a, const TileStream& b,
                        int steps) {
    static constexpr int kFirst[1] = {0};
    panel<16, 1>(&out, stride, true, a, 0, b, kFirst, 0, steps);
  }
};

template <typename Dot>
class PairKernel {
 public:
  explicit PairKernel(const MlaAttentionParams& p)
      : p_(p),
        dc_(p.kv_lora_rank),
        dcp_((p.kv_lora_rank + 15) / 16 * 16),
        width_(p.kv_lora_rank + p.rope_dim),
        wp_((p.kv_lora_rank + p.rope_dim + 31) / 32 * 32),
        buf_(thread_buffers<PairBuffers>()),
        qv_(buf_.qv),
        kbuf_(buf_.kbuf),
        zero_row_(buf_.zero_row),
        s_(buf_.s),
        pt_(buf_.pt),
        vv_(buf_.vv),
        acc_(buf_.acc),
        m_(buf_.m),
        l_(buf_.l),
        corr_(buf_.corr) {
    grow_to(zero_row_, static_cast<std::size_t>(wp_));
    size_for(p.num_heads);
  }

  // A task over a block of tokens (prefill, verification) puts all their heads in the lanes,
  // token after token: lane h is head h % H of token t + h / H.
  void run(const Task& task) {
    size_for(task.tokens * p_.num_heads);
    pack_query(task.t);
    std::fill_n(acc_.begin(), static_cast<std::size_t>(lanes_) * dcp_, 0.0f);
    std::fill_n(m_.begin(), lanes_, kNegInf);
    std::fill_n(l_.begin(), lanes_, 0.0f);
    for (std::int64_t start = task.first; start < task.last; start += tile_rows_) {
      const int n = static_cast<int>(std::min<std::int64_t>(tile_rows_, task.last - start));
      load_tile(task.b, task.rows, start, n);
      scores(n);
      softmax(n);
      values(n);
    }
    write_task_state(p_, task, acc_.data(), dcp_, m_.data(), l_.data());
  }

 private:
  using S = Simd<16>;
  using vec = S::vec;
  using uvec = S::uvec;

  // Query vectors (heads x tokens) of the task at hand; the buffers grow to the largest seen.
  void size_for(int heads) {
    heads_ = heads;
    lanes_ = (heads + 15) / 16 * 16;
    tile_rows_ = tile_rows_for(lanes_);
    const std::size_t lanes = static_cast<std::size_t>(lanes_), rows = tile_rows_;
    grow_to(qv_, static_cast<std::size_t>(wp_ / 2) * lanes);
    grow_to(kbuf_, rows * wp_);
    grow_to(s_, rows * lanes);
    grow_to(pt_, lanes * rows);
    grow_to(vv_, rows / 2 * dcp_);
    grow_to(acc_, lanes * dcp_);
    grow_to(m_, lanes);
    grow_to(l_, lanes);
    grow_to(corr_, lanes);
  }

  // dcp::float_to_bf16 on 16 lanes (the word in the low half).
  static uvec round_to_bf16(vec x) {
    uvec bits;
    std::memcpy(&bits, &x, sizeof bits);
    round_to_bf16_words(bits);
    return bits;
  }

  // Qv[c][h] = the bf16 pair (q[h][2c], q[h][2c+1]) * scale; zero past the width and the heads.
  // Per 16 heads and 32 elements: 16 vectors of pairs, one per head, transposed into 16 rows of
  // Qv, one per pair.
  void pack_query(std::int64_t t) {
    using Halves = std::uint16_t __attribute__((vector_size(32)));
    std::fill_n(qv_.begin(), static_cast<std::size_t>(wp_ / 2) * lanes_, 0u);
    const vec scale = S::splat(p_.softmax_scale);
    heads_to_lanes(
        heads_, width_ / 2,
        [&](int h, int c, Words16& row) {
          const float* qh = query_lane(p_, tokens_, t, h) + 2 * c;
          const Halves halves[2] = {
              __builtin_convertvector(round_to_bf16(S::load(qh) * scale), Halves),
              __builtin_convertvector(round_to_bf16(S::load(qh + 16) * scale), Halves)};
          std::memcpy(&row, halves, sizeof row);
        },
        [&](int c, int hb, int, const Words16& row) {  // lanes_ is a multiple of 16
          std::memcpy(qv_.data() + static_cast<std::size_t>(c) * lanes_ + hb, &row, sizeof row);
        });
    for (int h = 0; h < heads_; ++h) {  // the last width % 32 elements
      const float* qh = query_lane(p_, tokens_, t, h);
      for (int d = width_ / 32 * 32; d < width_; ++d) {
        const std::uint32_t word = float_to_bf16(qh[d] * p_.softmax_scale);
        qv_[static_cast<std::size_t>(d / 2) * lanes_ + h] |= d % 2 ? word << 16 : word;
      }
    }
  }

  // The score operand per 16-row block: straight from the pool when the block's rows are
  // consecutive there at a stride the tile can load (the common case: a page holds a request's
  // rows in order), else copied into kbuf_ zero-padded to wp_ columns. Then the value operand:
  // Vv[i][d] = the pair (V[2i][d], V[2i+1][d]), interleaved from the rows where they are.
  void load_tile(int b, const RowSet& rows, std::int64_t start, int n) {
    const bf16_t* pool = static_cast<const bf16_t*>(p_.kv);
    std::int64_t phys[kMaxTileRows];
    physical_rows(p_, b, rows, start, n, phys);
    for (int j = 0; j < n; ++j) row_[j] = pool + phys[j] * width_;
    for (int j = n; j < tile_rows_; ++j) row_[j] = zero_row_.data();
    for (int rb = 0; rb < tile_rows_ / 16; ++rb) {
      const bf16_t* const* r = row_ + rb * 16;
      bool direct = wp_ == width_ && rb * 16 + 16 <= n;
      for (int i = 1; i < 16 && direct; ++i) direct = r[i] == r[0] + i * width_;
      if (direct) {
        kblock_[rb] = r[0];
        continue;
      }
      std::uint16_t* dst = kbuf_.data() + static_cast<std::size_t>(rb) * 16 * wp_;
      for (int i = 0; i < 16; ++i, dst += wp_) {
        std::memcpy(dst, r[i], width_ * 2);
        std::fill(dst + width_, dst + wp_, std::uint16_t{0});
      }
      kblock_[rb] = kbuf_.data() + static_cast<std::size_t>(rb) * 16 * wp_;
    }
    const __m512i lo = _mm512_load_si512(kInterleave.lo), hi = _mm512_load_si512(kInterleave.hi);
    for (int i = 0; i < (n + 1) / 2; ++i) {
      const std::uint16_t* a = row_[2 * i];
      const std::uint16_t* c = row_[2 * i + 1];
      std::uint32_t* out = vv_.data() + static_cast<std::size_t>(i) * dcp_;
      int d = 0;
      for (; d + 32 <= dc_; d += 32) {
        const __m512i va = _mm512_loadu_si512(a + d), vc = _mm512_loadu_si512(c + d);
        _mm512_storeu_si512(out + d, _mm512_permutex2var_epi16(va, lo, vc));
        _mm512_storeu_si512(out + d + 16, _mm512_permutex2var_epi16(va, hi, vc));
      }
      for (; d < dcp_; ++d) {
        out[d] = d < dc_ ? static_cast<std::uint32_t>(a[d]) | static_cast<std::uint32_t>(c[d]) << 16
                         : 0u;
      }
    }
    for (int i = (n + 1) / 2; i < tile_rows_ / 2; ++i) {
      std::fill_n(vv_.data() + static_cast<std::size_t>(i) * dcp_, dcp_, 0u);
    }
  }

  // S[j][h] for the tile's 16-row blocks that hold rows: 2 row blocks x 2 head blocks, or 4 row
  // blocks x 1 for the last odd head block. Blocks past n multiply zero rows (kblock_ covers
  // the whole tile).
  void scores(int n) {
    const int row_blocks = (n + 15) / 16, steps = wp_ / 32;
    const auto k_stream = [&](int rb, int count) {
      TileStream k{{}, 64, wp_ * 2};
      for (int i = 0; i < count; ++i) k.base[i] = reinterpret_cast<const char*>(kblock_[rb + i]);
      return k;
    };
    const auto q_stream = [&](int hb, int count) {
      TileStream q{{}, std::size_t{16} * lanes_ * 4, lanes_ * 4};
      for (int i = 0; i < count; ++i) q.base[i] = reinterpret_cast<const char*>(&qv_[hb + 16 * i]);
      return q;
    };
    const auto s_block = [&](int rb, int hb) {
      return s_.data() + static_cast<std::size_t>(rb) * 16 * lanes_ + hb;
    };
    const int s_stride = lanes_ * 4;
    int hb = 0;
    for (; hb + 32 <= lanes_; hb += 32) {
      for (int rb = 0; rb < row_blocks; rb += 2) {
        const AccTiles c{
            {s_block(rb, hb), s_block(rb, hb + 16), s_block(rb + 1, hb), s_block(rb + 1, hb + 16)},
            s_stride,
            false};
        Dot::block_2x2(c, k_stream(rb, 2), q_stream(hb, 2), steps);
      }
    }
    for (; hb < lanes_; hb += 16) {
      for (int rb = 0; rb < row_blocks; rb += 4) {
        const AccTiles c{
            {s_block(rb, hb), s_block(rb + 1, hb), s_block(rb + 2, hb), s_block(rb + 3, hb)},
            s_stride,
            false};
        Dot::block_4x1(c, k_stream(rb, 4), q_stream(hb, 1), steps);
      }
    }
    if (p_.softcap > 0) {
      for (int j = 0; j < n; ++j) {
        float* s = s_.data() + static_cast<std::size_t>(j) * lanes_;
        for (int h = 0; h < heads_; ++h) s[h] = p_.softcap * std::tanh(s[h] / p_.softcap);
      }
    }
  }

  // Online softmax with heads in lanes; P goes to pt_ transposed and in bf16 (zero past n).
  void softmax(int n) {
    for (int v = 0; v < lanes_; v += 16) {
      const vec m_old = S::load(m_.data() + v);
      const vec m_new = state_max<S>(m_old, s_.data() + v, n, lanes_);
      const vec c = state_rescale<S>(m_old, m_new);
      const vec base = state_base<S>(m_new);
      vec sum = S::splat(0.0f);
      // P for rows j, j+1 as one bf16 pair per head: the 32-bit word k of Pt's row h. Sixteen
      // pair vectors (heads in lanes) are transposed into words k..k+15 of Pt's rows v..v+15.
      const auto probability = [&](int j) {
        if (j >= n) return S::splat(0.0f);  // rows past n: exactly nothing
        const vec x = S::exp(S::load(s_.data() + static_cast<std::size_t>(j) * lanes_ + v) - base);
        sum += x;
        return x;
      };
      auto* pt_words = reinterpret_cast<std::uint32_t*>(pt_.data());
      const int row_words = tile_rows_ / 2;
      for (int k0 = 0; k0 < row_words; k0 += 16) {
        Words16 r[16];
        for (int k = 0; k < 16; ++k) {
          const int j = 2 * (k0 + k);
          const uvec pair = round_to_bf16(probability(j)) | round_to_bf16(probability(j + 1)) << 16;
          std::memcpy(&r[k], &pair, sizeof pair);
        }
        transpose_16x16(r);
        for (int h = 0; h < 16; ++h) {
          std::memcpy(pt_words + static_cast<std::size_t>(v + h) * row_words + k0, &r[h],
                      sizeof r[h]);
        }
      }
      S::store(m_.data() + v, m_new);
      S::store(l_.data() + v, S::load(l_.data() + v) * c + sum);
      S::store(corr_.data() + v, c);
    }
  }

  // O[h][d] = O[h][d] * corr[h] + sum_j P[h][j] V[j][d]; the rescale only where the max moved.
  // 2 head blocks x 2 column blocks, or 1 x 4 for the last odd head block; single blocks for
  // leftover columns.
  void values(int n) {
    for (int h = 0; h < lanes_; ++h) {
      if (corr_[h] == 1.0f) continue;
      float* o = acc_.data() + static_cast<std::size_t>(h) * dcp_;
      const vec c = S::splat(corr_[h]);
      for (int d = 0; d < dcp_; d += 16) S::store(o + d, S::load(o + d) * c);
    }
    const int steps = (n + 31) / 32;
    const auto p_stream = [&](int hb, int count) {
      TileStream pt{{}, 64, tile_rows_ * 2};
      for (int i = 0; i < count; ++i) {
        pt.base[i] =
            reinterpret_cast<const char*>(&pt_[static_cast<std::size_t>(hb + 16 * i) * tile_rows_]);
      }
      return pt;
    };
    const auto v_stream = [&](int db, int count) {
      TileStream v{{}, std::size_t{16} * dcp_ * 4, dcp_ * 4};
      for (int i = 0; i < count; ++i) v.base[i] = reinterpret_cast<const char*>(&vv_[db + 16 * i]);
      return v;
    };
    const auto o_block = [&](int hb, int db) {
      return acc_.data() + static_cast<std::size_t>(hb) * dcp_ + db;
    };
    const int o_stride = dcp_ * 4;
    int hb = 0;
    for (; hb + 32 <= lanes_; hb += 32) {
      int db = 0;
      for (; db + 32 <= dcp_; db += 32) {
        const AccTiles c{{o_block(hb, db), o_block(hb, db + 16), o_block(hb + 16, db),
                          o_block(hb + 16, db + 16)},
                         o_stride,
                         true};
        Dot::block_2x2(c, p_stream(hb, 2), v_stream(db, 2), steps);
      }
      for (; db < dcp_; db += 16) {
        Dot::block_1x1(o_block(hb, db), o_stride, p_stream(hb, 1), v_stream(db, 1), steps);
        Dot::block_1x1(o_block(hb + 16, db), o_stride, p_stream(hb + 16, 1), v_stream(db, 1),
                       steps);
      }
    }
    for (; hb < lanes_; hb += 16) {
      int db = 0;
      for (; db + 64 <= dcp_; db += 64) {
        const AccTiles c{
            {o_block(hb, db), o_block(hb, db + 16), o_block(hb, db + 32), o_block(hb, db + 48)},
            o_stride,
            true};
        Dot::block_1x4(c, p_stream(hb, 1), v_stream(db, 4), steps);
      }
      for (; db < dcp_; db += 16) {
        Dot::block_1x1(o_block(hb, db), o_stride, p_stream(hb, 1), v_stream(db, 1), steps);
      }
    }
  }

  const MlaAttentionParams& p_;
  int heads_ = 0, lanes_ = 0;  // query vectors of the current task (size_for), padded to 16
  int dc_, dcp_, width_, wp_;
  int tile_rows_ = 0;                           // tile_rows_for(lanes_), a multiple of 64
  std::int64_t tokens_ = num_query_tokens(p_);  // T, for query_lane
  PairBuffers& buf_;                            // this thread's, grown by size_for
  LineVector<std::uint32_t>& qv_;               // [wp/2, lanes] query pairs
  LineVector<std::uint16_t>& kbuf_;       // [tile_rows_, wp] rows of blocks not loadable in place
  LineVector<std::uint16_t>& zero_row_;   // [wp] stands for rows past n
  const bf16_t* row_[kMaxTileRows] = {};  // the tile's rows in the pool
  const std::uint16_t* kblock_[kMaxTileRows / 16] = {};  // each 16-row block's score operand
  LineVector<float>& s_;                                 // [tile_rows_, lanes] scores
  LineVector<std::uint16_t>& pt_;     // [lanes, tile_rows_] probabilities, transposed, bf16
  LineVector<std::uint32_t>& vv_;     // [tile_rows_/2, dcp] row pairs of the value columns
  LineVector<float>& acc_;            // [lanes, dcp] unnormalised output
  LineVector<float>&m_, &l_, &corr_;  // [lanes]
};

}  // namespace

bool amx_bf16_supported() {
  // CPUID.(7,0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE; CPUID.(7,1):EAX bit 5 AVX512-BF16 (not
  // needed) - plus the kernel's permission to use the tile data state (Linux >= 5.16).
  static const bool ok = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) return false;
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!(d & (1u << 22)) || !(d & (1u << 24))) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

void run_amx_bf16(const MlaAttentionParams& p, const Task* tasks, std::size_t n) {
  configure_tiles();  // per thread: the tile configuration is thread state
  {
    PairKernel<AmxDot> k(p);
    for (std::size_t i = 0; i < n; ++i) k.run(tasks[i]);
  }
  _tile_release();
}

void run_avx512_bf16(const MlaAttentionParams& p, const Task* tasks, std::size_t n) {
  PairKernel<VectorDot> k(p);
  for (std::size_t i = 0; i < n; ++i) k.run(tasks[i]);
}

}  // namespace dcp::kernels

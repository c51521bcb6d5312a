// The AMX path for bf16 KV (KernelPath::amx_bf16): both products of a KV tile run on the AMX
// tile unit (TDPBF16PS: bf16 pairs, fp32 accumulation), the online softmax on AVX-512 with the
// heads in the lanes. Like GPU MLA kernels it rounds the scaled query and the probabilities to
// bf16; the LSE keeps fp32 probabilities. Compiled with AMX and AVX-512 flags (src/CMakeLists.txt)
// and called only when amx_bf16_available().
//
//   scores  C[16 rows][16 heads]  += K tile [16 rows][32 cols]   x Qv [16 col pairs][16 heads]
//   values  C[16 heads][16 cols]  += Pt     [16 heads][32 rows]  x Vv [16 row pairs][16 cols]
//
// Qv (query pairs, VNNI layout) is packed once per task; K is loaded from the pool in place
// where a block's rows are consecutive (else from a zero-padded copy); Vv interleaves the words
// of row pairs; Pt is the probabilities transposed.
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
#include "simd.h"

namespace dcp::kernels {
namespace {

constexpr int kTileRows = 64;  // KV rows per tile: two 32-row K chunks of the value product

struct TileConfig {  // the LDTILECFG memory layout, palette 1
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};

// tmm0: accumulator, tmm1: A, tmm2: B; all 16 rows x 64 bytes. A constant in memory, not a
// local: GCC 12 does not see that LDTILECFG reads its operand and dropped the stores to a local
// configuration's bytes_per_row (the instruction then faults).
constexpr TileConfig make_tile_config() {
  TileConfig c;
  for (int t = 0; t < 3; ++t) {
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

// Word offsets of Pt's rows h = 0..15 ([lanes][kTileRows / 2] words), for the P scatter. A
// constant array, not an __m512i: a vector global would run AVX-512 code at program start.
struct PtColumn {
  alignas(64) int offset[16];
  constexpr PtColumn() : offset{} {
    for (int h = 0; h < 16; ++h) offset[h] = h * (kTileRows / 2);
  }
};
constexpr PtColumn kPtColumn;

class AmxKernel {
 public:
  explicit AmxKernel(const MlaAttentionParams& p)
      : p_(p),
        heads_(p.num_heads),
        lanes_((p.num_heads + 15) / 16 * 16),
        dc_(p.kv_lora_rank),
        dcp_((p.kv_lora_rank + 15) / 16 * 16),
        width_(p.kv_lora_rank + p.rope_dim),
        wp_((p.kv_lora_rank + p.rope_dim + 31) / 32 * 32),
        qv_(static_cast<std::size_t>(wp_ / 2) * lanes_),
        kbuf_(static_cast<std::size_t>(kTileRows) * wp_),
        zero_row_(static_cast<std::size_t>(wp_), 0),
        s_(static_cast<std::size_t>(kTileRows) * lanes_),
        pt_(static_cast<std::size_t>(lanes_) * kTileRows),
        vv_(static_cast<std::size_t>(kTileRows / 2) * dcp_),
        acc_(static_cast<std::size_t>(lanes_) * dcp_),
        m_(lanes_),
        l_(lanes_),
        corr_(lanes_) {}

  void run(const Task& task) {
    pack_query(task.t);
    std::fill(acc_.begin(), acc_.end(), 0.0f);
    std::fill(m_.begin(), m_.end(), kNegInf);
    std::fill(l_.begin(), l_.end(), 0.0f);
    for (std::int64_t start = task.first; start < task.last; start += kTileRows) {
      const int n = static_cast<int>(std::min<std::int64_t>(kTileRows, task.last - start));
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

  // dcp::float_to_bf16 on 16 lanes (the word in the low half).
  static uvec round_to_bf16(vec x) {
    uvec bits;
    std::memcpy(&bits, &x, sizeof bits);
    round_to_bf16_words(bits);
    return bits;
  }

  // Qv[c][h] = the bf16 pair (q[h][2c], q[h][2c+1]) * scale; zero past the width and the heads.
  void pack_query(std::int64_t t) {
    std::fill(qv_.begin(), qv_.end(), 0u);
    for (int h = 0; h < heads_; ++h) {
      const float* qh = query_head(p_, tokens_, t, h);
      for (int d = 0; d < width_; ++d) {
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
    for (int j = 0; j < n; ++j) row_[j] = pool + physical_row(p_, b, rows.at(start + j)) * width_;
    for (int j = n; j < kTileRows; ++j) row_[j] = zero_row_.data();
    for (int rb = 0; rb < kTileRows / 16; ++rb) {
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
    for (int i = (n + 1) / 2; i < kTileRows / 2; ++i) {
      std::fill_n(vv_.data() + static_cast<std::size_t>(i) * dcp_, dcp_, 0u);
    }
  }

  // S[j][h] for the tile's 16-row blocks that hold rows.
  void scores(int n) {
    const int row_blocks = (n + 15) / 16;
    for (int hb = 0; hb < lanes_; hb += 16) {
      for (int rb = 0; rb < row_blocks; ++rb) {
        _tile_zero(0);
        for (int c = 0; c < wp_; c += 32) {
          _tile_loadd(1, kblock_[rb] + c, wp_ * 2);
          _tile_loadd(2, qv_.data() + static_cast<std::size_t>(c / 2) * lanes_ + hb, lanes_ * 4);
          _tile_dpbf16ps(0, 1, 2);
        }
        _tile_stored(0, s_.data() + static_cast<std::size_t>(rb) * 16 * lanes_ + hb, lanes_ * 4);
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
      vec mx = S::load(s_.data() + v);
      for (int j = 1; j < n; ++j) {
        const vec x = S::load(s_.data() + static_cast<std::size_t>(j) * lanes_ + v);
        mx = x > mx ? x : mx;
      }
      const vec m_old = S::load(m_.data() + v);
      const vec m_new = mx > m_old ? mx : m_old;
      const vec c = S::exp(m_old - m_new);  // m_old = -inf: ~1e-38 times an O and l of 0
      vec sum = S::splat(0.0f);
      // P for rows j, j+1 as one bf16 pair per head: the 32-bit word k of Pt's row h. Each pair
      // vector (heads in lanes) is scattered down its column of Pt, viewed as [lanes][32] words.
      const auto probability = [&](int j) {
        if (j >= n) return S::splat(0.0f);  // rows past n: exactly nothing
        const vec x = S::exp(S::load(s_.data() + static_cast<std::size_t>(j) * lanes_ + v) - m_new);
        sum += x;
        return x;
      };
      auto* pt_words =
          reinterpret_cast<int*>(pt_.data()) + static_cast<std::size_t>(v) * (kTileRows / 2);
      const __m512i column = _mm512_load_si512(kPtColumn.offset);
      for (int k = 0; k < kTileRows / 2; ++k) {
        const uvec pair = round_to_bf16(probability(2 * k)) | round_to_bf16(probability(2 * k + 1))
                                                                  << 16;
        __m512i words;
        std::memcpy(&words, &pair, sizeof words);
        _mm512_i32scatter_epi32(pt_words + k, column, words, 4);
      }
      S::store(m_.data() + v, m_new);
      S::store(l_.data() + v, S::load(l_.data() + v) * c + sum);
      S::store(corr_.data() + v, c);
    }
  }

  // O[h][d] = O[h][d] * corr[h] + sum_j P[h][j] V[j][d]; the rescale only where the max moved.
  void values(int n) {
    for (int h = 0; h < lanes_; ++h) {
      if (corr_[h] == 1.0f) continue;
      float* o = acc_.data() + static_cast<std::size_t>(h) * dcp_;
      const vec c = S::splat(corr_[h]);
      for (int d = 0; d < dcp_; d += 16) S::store(o + d, S::load(o + d) * c);
    }
    const int chunks = (n + 31) / 32;
    for (int hb = 0; hb < lanes_; hb += 16) {
      for (int db = 0; db < dcp_; db += 16) {
        float* o = acc_.data() + static_cast<std::size_t>(hb) * dcp_ + db;
        _tile_loadd(0, o, dcp_ * 4);
        for (int k = 0; k < chunks; ++k) {
          _tile_loadd(1, pt_.data() + static_cast<std::size_t>(hb) * kTileRows + k * 32,
                      kTileRows * 2);
          _tile_loadd(2, vv_.data() + static_cast<std::size_t>(k) * 16 * dcp_ + db, dcp_ * 4);
          _tile_dpbf16ps(0, 1, 2);
        }
        _tile_stored(0, o, dcp_ * 4);
      }
    }
  }

  const MlaAttentionParams& p_;
  int heads_, lanes_, dc_, dcp_, width_, wp_;
  std::int64_t tokens_ = num_query_tokens(p_);  // T, for query_head
  std::vector<std::uint32_t> qv_;               // [wp/2, lanes] query pairs
  std::vector<std::uint16_t> kbuf_;      // [kTileRows, wp] rows of blocks not loadable in place
  std::vector<std::uint16_t> zero_row_;  // [wp] stands for rows past n
  const bf16_t* row_[kTileRows] = {};    // the tile's rows in the pool
  const std::uint16_t* kblock_[kTileRows / 16] = {};  // each 16-row block's score operand
  std::vector<float> s_;                              // [kTileRows, lanes] scores
  std::vector<std::uint16_t> pt_;    // [lanes, kTileRows] probabilities, transposed, bf16
  std::vector<std::uint32_t> vv_;    // [kTileRows/2, dcp] row pairs of the value columns
  std::vector<float> acc_;           // [lanes, dcp] unnormalised output
  std::vector<float> m_, l_, corr_;  // [lanes]
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
    AmxKernel k(p);
    for (std::size_t i = 0; i < n; ++i) k.run(tasks[i]);
  }
  _tile_release();
}

}  // namespace dcp::kernels

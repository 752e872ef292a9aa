// hvd_tiles: the native forward's linear layers, y[M, N] = x[M, K] W[N, K]^T, for any number of rows M.
//
// Quantized weights are held in tiles of NT = 16 weight rows (tile_formats.h): per block of 32 columns (or
// per K-quant super-block of 8 blocks), the 16 rows' scales, their minimums (Q4 and Q5 kinds), then their
// weights as words of 4 bytes, the 16 rows side by side, so one vector holds a word of every row of the tile
// (isa.h). The inputs are quantized per block of 32 to int8
// (as llama.cpp's Q8 activations). A tile is computed against the input rows 16 at a time, in two phases per
// group of 8 blocks: the integer dot of every (row, block) (exact), then the float products and sums. On the amx
// path a pass of many rows takes its integer dots from AMX tiles (amx.h): the same integers, stored as the vector
// code stores them, so the float phase is the same code on every path.
//
// The one order every output element follows, whatever the number of rows, the tile, the thread or the
// instruction set: per block j, p_j = (d_j * dx_j) * dot_j and q_j = m_j * sx_j; per group of 8 blocks,
// each summed as ((0+1)+(2+3))+((4+5)+(6+7)) (missing blocks add zero); the groups added in order into acc
// and macc; y = acc + macc (+ bias). So a row's result is bitwise the same alone or among any number of
// rows, on AVX2 or AVX-512. A format with a scale per 16 weights (Q6S, Q6K, Q2K) has
// p_j = (d_j,0 * dx_j) * dot_j,0 + (d_j,1 * dx_j) * dot_j,1 over its two halves; Q2K's minimum per 16 weights
// q_j = m_j,0 * (dx_j * sum_j,0) + m_j,1 * (dx_j * sum_j,1), sum_j,h the half's exact integer sum of x.
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx.h"
#include "isa.h"
#include "lanes.h"
#include "team.h"
#include "tile_formats.h"

namespace hvd_tiles {

using namespace hvd_isa;
using hvd_lanes::hsum;

constexpr int RB = 16;  // input rows per pass over a tile
// A thread streams its tiles in order; asking for the lines this far ahead keeps more of them in flight than the
// hardware prefetcher does: a one-row product over a 105 MiB Q6_K weight on 2 threads ran at 39-78 GB/s with
// 1-16 KiB ahead against 31-34 GB/s without (8 KiB: 51 and 78 in two rounds)
constexpr int64_t PREFETCH_AHEAD = 8192;

// ---------------------------------------------------------------- activations

// Rows quantized in blocks of 32: q = round(x / d), d = max|x| / 127, s = d * sum(q).
struct QRows {
  std::vector<int8_t> q;     // [rows][K]
  std::vector<float> d, s;   // [rows][blocks]
  std::vector<int32_t> sum;  // [rows][blocks][2]: sum(q) of each half block
  int64_t K = 0, nb = 0;
  void resize(int64_t M, int64_t K_) {
    K = K_;
    nb = K_ / QK;
    q.resize(M * K_);
    d.resize(M * nb);
    s.resize(M * nb);
    sum.resize(M * nb * 2);
  }
  const int8_t* row(int64_t r) const { return q.data() + r * K; }
};

inline void quantize_block(const float* xb, QRows& dst, int64_t r, int64_t b) {
  int8_t* q = dst.q.data() + r * dst.K + b * QK;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm256_loadu_ps(xb + 8 * j);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float am = _mm_cvtss_f32(m);
  const float db = am / 127.0f;
  const float id = am != 0.0f ? 127.0f / am : 0.0f;
  __m256i qi[4];
  for (int j = 0; j < 4; ++j)
    qi[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], _mm256_set1_ps(id)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  // the 32 values as int8 in order (each in -127..127: the packs saturate nothing), and each half's sum (exact)
  const __m256i w01 = _mm256_packs_epi32(qi[0], qi[1]), w23 = _mm256_packs_epi32(qi[2], qi[3]);  // per 128-bit lane
  const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), bytes);
  const auto sum8 = [](__m256i a) {
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    return _mm_cvtsi128_si32(t);
  };
  const int32_t first = sum8(_mm256_add_epi32(qi[0], qi[1])), total = first + sum8(_mm256_add_epi32(qi[2], qi[3]));
  const int64_t i = r * dst.nb + b;
  dst.d[i] = db;
  dst.s[i] = db * static_cast<float>(total);
  dst.sum[2 * i] = first;
  dst.sum[2 * i + 1] = total - first;
}

// row r's values [b0 * 32, b0 * 32 + K) as blocks b0, b0 + 1, ...
inline void quantize_row(const float* x, int64_t K, QRows& dst, int64_t r, int64_t b0 = 0) {
  for (int64_t b = 0; b < K / QK; ++b) quantize_block(x + b * QK, dst, r, b0 + b);
}

// ---------------------------------------------------------------- a tile against input rows

inline VF tree8(const VF* p) {  // ((0+1)+(2+3))+((4+5)+(6+7)), lane by lane
  return f_add(f_add(f_add(p[0], p[1]), f_add(p[2], p[3])), f_add(f_add(p[4], p[5]), f_add(p[6], p[7])));
}

// Phase 1 of a pass on the vector code: dots[i][j][lane] (dots2: the second halves' of Q6S, Q6K, Q2K) = the
// integer dot (exact) of the tile's row `lane` and input row r0 + i over block g0 + j, for i < R, j < ng. Each
// block's weights are unpacked once for all the rows (Q6S, Q6K, Q2K: a dot per half block; Q6K's q - 32 as q's
// dot less 32 times the half block's sum of x).
template <int FMT>
void vector_dots(const uint8_t* tile, int64_t g0, int64_t ng, const QRows& x, int64_t r0, int64_t R,
                 int32_t (*dots)[8][NT], int32_t (*dots2)[8][NT]) {
  using Lt = Layout<FMT>;
  for (int64_t j = 0; j < ng; ++j) {
    const int64_t b = g0 + j;
    VI w[8], wabs[Lt::SIGNED ? 8 : 1];
    block_words<FMT>(block_weights<FMT>(tile, b), w);
    if constexpr (Lt::SIGNED)
      for (int k = 0; k < 8; ++k) wabs[k] = i_abs_s(w[k]);
    for (int64_t i = 0; i < R; ++i) {
      const int8_t* xb = x.row(r0 + i) + b * QK;
      const int32_t* sums = x.sum.data() + 2 * ((r0 + i) * x.nb + b);
      VI a = i_zero(), a2 = i_zero();
      if constexpr (Lt::SIGNED) {
        a = i_dots_s<4>(a, w, wabs, xb);
        (Lt::HALVES ? a2 : a) = i_dots_s<4>(Lt::HALVES ? a2 : a, w + 4, wabs + 4, xb + 16);
      } else if constexpr (Lt::HALVES) {
        a = i_dots_u<4, Lt::GROUP>(a, w, xb);
        a2 = i_dots_u<4, Lt::GROUP>(a2, w + 4, xb + 16);
      } else {
        a = i_dots_u<8, Lt::GROUP>(a, w, xb);
      }
      if constexpr (FMT == Q6S) {
        i_store(dots[i][j], i_signed_fix(a, sums[0]));
        i_store(dots2[i][j], i_signed_fix(a2, sums[1]));
      } else if constexpr (FMT == Q6K) {
        i_store(dots[i][j], i_sub1(a, 32 * sums[0]));
        i_store(dots2[i][j], i_sub1(a2, 32 * sums[1]));
      } else if constexpr (Lt::HALVES) {  // Q2K: the halves' dots of 2-bit weights
        i_store(dots[i][j], a);
        i_store(dots2[i][j], a2);
      } else if constexpr (Lt::SIGNED) {
        i_store(dots[i][j], i_signed_fix(a, sums[0] + sums[1]));
      } else {
        i_store(dots[i][j], a);
      }
    }
  }
}

// Phase 2 of a pass for one input row over a group of blocks (ng of 8; NG = 8 when the group is whole, so its
// loop is unrolled at compile time, else 0): the products and the group's sums into acc and macc, in the one order.
// xd, xs, xsum: the row's scales, scaled sums and half-block sums from the group's first block.
template <int FMT, int NG>
inline void row_group(const VF* S, const VF* S2, const VF* M, const VF* M2, const int32_t (*dots)[NT],
                      const int32_t (*dots2)[NT], const float* xd, const float* xs, const int32_t* xsum, int64_t ng,
                      VF& acc, VF& macc) {
  using Lt = Layout<FMT>;
  const auto product = [&](int64_t j) {  // block j's product
    const VF dx = f_set1(xd[j]);
    VF p = f_mul(f_mul(S[j], dx), f_cvt(i_load(dots[j])));
    if constexpr (Lt::HALVES)  // the two halves' products, first half first
      p = f_add(p, f_mul(f_mul(S2[j], dx), f_cvt(i_load(dots2[j]))));
    return p;
  };
  const auto minimum = [&](int64_t j) {  // block j's minimum's share
    if constexpr (Lt::MIN16) {  // each half's minimum times dx times the half's sum of x, first half first
      const float sx0 = xd[j] * static_cast<float>(xsum[2 * j]), sx1 = xd[j] * static_cast<float>(xsum[2 * j + 1]);
      return f_add(f_mul(M[j], f_set1(sx0)), f_mul(M2[j], f_set1(sx1)));
    } else {
      return f_mul(S2[j], f_set1(xs[j]));
    }
  };
  constexpr bool MINS = Lt::MIN || Lt::MIN16;
  if constexpr (NG == 8) {  // tree8's order, each pair added as soon as it is made (fewer vectors held)
    const VF p03 = f_add(f_add(product(0), product(1)), f_add(product(2), product(3)));
    acc = f_add(acc, f_add(p03, f_add(f_add(product(4), product(5)), f_add(product(6), product(7)))));
    if constexpr (MINS) {
      const VF q03 = f_add(f_add(minimum(0), minimum(1)), f_add(minimum(2), minimum(3)));
      macc = f_add(macc, f_add(q03, f_add(f_add(minimum(4), minimum(5)), f_add(minimum(6), minimum(7)))));
    }
  } else {
    VF P[8], Q[8];
    for (int64_t j = 0; j < 8; ++j) {
      P[j] = j < ng ? product(j) : f_zero();
      if constexpr (MINS) Q[j] = j < ng ? minimum(j) : f_zero();
    }
    acc = f_add(acc, tree8(P));
    if constexpr (MINS) macc = f_add(macc, tree8(Q));
  }
}

// out[i][lane] = the tile's row `lane` against input row r0 + i, for i in [0, R), R <= RB; the integer dots from
// tiles when on_tiles (amx.h, configured for R rows), else from the vector code: the same integers either way.
template <int FMT>
void tile_rows(const uint8_t* tile, int64_t nb, const QRows& x, int64_t r0, int64_t R, float* out, bool on_tiles) {
  using Lt = Layout<FMT>;
  alignas(64) int32_t dots[RB][8][NT];
  alignas(64) int32_t dots2[Lt::HALVES ? RB : 1][8][NT];
  VF acc[RB], macc[RB];
  for (int64_t i = 0; i < R; ++i) acc[i] = macc[i] = f_zero();
  const int64_t groups = (nb + 7) / 8;
  for (int64_t step = 0; step < groups; ++step) {
#if defined(HVD_MUTATE_MULTIROW_ORDER)  // for the tests only: calls of several rows add the groups in reverse
    const int64_t g0 = (R > 1 ? groups - 1 - step : step) * 8;
#elif defined(HVD_MUTATE_GROUP_ORDER)  // for the tests only: this build adds the groups in reverse
    const int64_t g0 = (groups - 1 - step) * 8;
#elif defined(HVD_MUTATE_AMX_GROUP_ORDER)  // for the tests only: passes on tiles add the groups in reverse
    const int64_t g0 = (on_tiles ? groups - 1 - step : step) * 8;
#else
    const int64_t g0 = step * 8;
#endif
    const int64_t ng = std::min<int64_t>(8, nb - g0);
    {  // the group's bytes, PREFETCH_AHEAD further on (past the weight's end: a hint, never a fault)
      const char* ahead = reinterpret_cast<const char*>(tile + (g0 / Lt::BLOCKS) * Lt::TRB) + PREFETCH_AHEAD;
      for (int64_t off = 0; off < Lt::TRB * 8 / Lt::BLOCKS; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T0);
    }
    // 1. the integer dots (exact)
    if (on_tiles)
      hvd_amx::group_dots<FMT>(tile, g0, ng, x.row(r0), x.K, x.sum.data() + 2 * r0 * x.nb, 2 * x.nb, R, &dots[0][0][0],
                               &dots2[0][0][0]);
    else
      vector_dots<FMT>(tile, g0, ng, x, r0, R, dots, dots2);
    // 2. per row: the products and the group's sums, in the one order (the blocks' scales read once for all rows)
    VF S[8], S2[8];  // the blocks' scales; their minimums (Lt::MIN) or second halves' scales (Lt::HALVES)
    VF M[Lt::MIN16 ? 8 : 1], M2[Lt::MIN16 ? 8 : 1];  // Q2K: the halves' minimums
    group_scales<FMT>(tile, g0, ng, S, S2, M, M2);
    for (int64_t i = 0; i < R; ++i) {
      const int64_t xi = (r0 + i) * x.nb + g0;
      if (ng == 8)  // a whole group: its loop unrolled at compile time
        row_group<FMT, 8>(S, S2, M, M2, dots[i], dots2[Lt::HALVES ? i : 0], x.d.data() + xi, x.s.data() + xi,
                          x.sum.data() + 2 * xi, 8, acc[i], macc[i]);
      else
        row_group<FMT, 0>(S, S2, M, M2, dots[i], dots2[Lt::HALVES ? i : 0], x.d.data() + xi, x.s.data() + xi,
                          x.sum.data() + 2 * xi, ng, acc[i], macc[i]);
    }
  }
  for (int64_t i = 0; i < R; ++i) f_store(out + i * NT, f_add(acc[i], macc[i]));
}

// A float weight row (F32, or F16 / BF16 converted exactly as read): 8 values at k, or one.
struct F32Row {
  const float* w;
  __m256 load8(int64_t k) const { return _mm256_loadu_ps(w + k); }
  float at(int64_t k) const { return w[k]; }
};
struct F16Row {
  const uint16_t* w;
  __m256 load8(int64_t k) const { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k))); }
  float at(int64_t k) const { return f16_value(w[k]); }
};
struct BF16Row {
  const uint16_t* w;
  __m256 load8(int64_t k) const {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  float at(int64_t k) const { return bf16_value(w[k]); }
};

// float weights: 8 lanes along k, then the lanes, then the tail (whatever the weights' storage: the same values,
// the same operations).
template <int MR, class Row>
inline void dot_float(const Row& w, int64_t K, const float* x, int64_t r0, float* out) {
  const int64_t K8 = K - K % 8;
  __m256 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    const __m256 wv = w.load8(k);
    for (int i = 0; i < MR; ++i) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (r0 + i) * K + k), wv, acc[i]);
  }
  for (int i = 0; i < MR; ++i) {
    float s = hsum(acc[i]);
    for (int64_t k = K8; k < K; ++k) s = std::fma(x[(r0 + i) * K + k], w.at(k), s);
    out[i] = s;
  }
}

// row_of(n): weight row n as a Row
template <class RowOf>
inline void float_rows(const Matrix& W, const RowOf& row_of, int64_t n0, int64_t n1, const float* xf, int64_t M,
                       const float* bias, float* y, int64_t ld, int64_t col0) {
  float out[4];
  for (int64_t n = n0; n < n1; ++n) {
    const auto w = row_of(n);
    int64_t r = 0;
    for (; r + 4 <= M; r += 4) {
      dot_float<4>(w, W.K, xf, r, out);
      for (int i = 0; i < 4; ++i) y[(r + i) * ld + col0 + n] = bias ? out[i] + bias[n] : out[i];
    }
    const int64_t left = M - r;
    if (left == 3) dot_float<3>(w, W.K, xf, r, out);
    if (left == 2) dot_float<2>(w, W.K, xf, r, out);
    if (left == 1) dot_float<1>(w, W.K, xf, r, out);
    for (int i = 0; i < left; ++i) y[(r + i) * ld + col0 + n] = bias ? out[i] + bias[n] : out[i];
  }
}

inline void f32_rows(const Matrix& W, int64_t n0, int64_t n1, const float* xf, int64_t M, const float* bias, float* y,
                     int64_t ld, int64_t col0) {
  if (W.fmt == F16)
    float_rows(W, [&](int64_t n) { return F16Row{W.hrow(n)}; }, n0, n1, xf, M, bias, y, ld, col0);
  else if (W.fmt == BF16)
    float_rows(W, [&](int64_t n) { return BF16Row{W.hrow(n)}; }, n0, n1, xf, M, bias, y, ld, col0);
  else
    float_rows(W, [&](int64_t n) { return F32Row{W.frow(n)}; }, n0, n1, xf, M, bias, y, ld, col0);
}

template <int FMT>
void quant_rows(const Matrix& W, int64_t n0, int64_t n1, const QRows& xq, int64_t M, const float* bias, float* y,
                int64_t ld, int64_t col0) {
  alignas(64) float out[RB * NT];
  hvd_amx::Tiles tiles;  // the amx path's tiles for passes of many rows (none in other builds)
  for (int64_t t = n0 / NT; t * NT < n1; ++t) {
    const int64_t lo = std::max(n0, t * NT), hi = std::min(n1, t * NT + NT);
    for (int64_t r0 = 0; r0 < M; r0 += RB) {
      const int64_t R = std::min<int64_t>(RB, M - r0);
      tile_rows<FMT>(W.tile(t), W.nb(), xq, r0, R, out, tiles.take(R));
      for (int64_t i = 0; i < R; ++i)
        for (int64_t n = lo; n < hi; ++n) {
          const float v = out[i * NT + n - t * NT];
          y[(r0 + i) * ld + col0 + n] = bias ? v + bias[n] : v;
        }
    }
  }
}

// y[r, col0 + n] = W[n] . x[r] (+ bias) for rows [0, M), weight rows [n0, n1).
inline void rows_block(const Matrix& W, int64_t n0, int64_t n1, const QRows& xq, const float* xf, int64_t M, float* y,
                       int64_t ld, int64_t col0) {
  const float* bias = W.bias.defined() ? W.bias.data_ptr<float>() : nullptr;
  const bool tiled = by_format(W.fmt, [&](auto fmt) { quant_rows<decltype(fmt)::value>(W, n0, n1, xq, M, bias, y, ld, col0); });
  if (!tiled) f32_rows(W, n0, n1, xf, M, bias, y, ld, col0);
}

// One weight, y [M, ld]; inside a team's region. Threads split the weight's tiles statically (each output
// element is computed by one thread).
inline void multi_linear(hvd_team::Ctx& c, const Matrix& W, const QRows& xq, const float* xf, int64_t M, float* y,
                         int64_t ld) {
  const int64_t tiles = (W.N + NT - 1) / NT;
  c.for_static(tiles, [&](int64_t t) { rows_block(W, t * NT, std::min(W.N, t * NT + NT), xq, xf, M, y, ld, 0); });
}

}  // namespace hvd_tiles

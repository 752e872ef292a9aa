// hvd_attention: query rows' attention over a float16 KV cache, the queries of one kv head at a time.
//
// The operations for one (query, key) and one query are fixed: a key's score is the fused multiply-add chain
// over the head's 8-lane chunks, then hsum ((0+4)+(1+5))+((2+6)+(3+7)), times the scale; then the row's max,
// exp and sum over its visible keys in cache order (8 lanes at a time), and each output element's weighted sum
// of the values in cache order, times 1 / sum. attend() computes a set of queries that read one kv head (the
// query heads of a group, the rows of a draft, a tree or a prefill chunk) together: each key and value is
// converted from float16 once for all of them, and the vectors hold 16 lanes (two keys' chunks for the scores,
// two chunks of an output for the weighted sums: isa.h, one 512-bit register or two 256-bit ones), every lane
// the same operation as it has alone. So a query's result depends on nothing but its own query and its visible
// keys and values: not on the queries beside it, the job, the thread or the instruction set.
// A sliding-window layer's row sees a suffix of its positions (its last W); it is computed as if they were
// all there is.
#pragma once

#include <torch/extension.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "isa.h"
#include "lanes.h"

namespace hvd_attention {

using hvd_isa::VF;
using hvd_lanes::exp8;
using hvd_lanes::hsum;

constexpr int64_t kMaxHeadDim = 256;
constexpr int64_t kChunk = 64;   // keys (values) converted from float16 at a time; even: keys go in pairs
constexpr int64_t kMaxQueries = 128;  // queries one attend() call takes
// kTransposeQueries: queries from which a call's scores read a transposed chunk (the transposition pays for
// itself over that many queries); kScoreQueries: queries a pass over it (a sum per query and vector of keys in
// flight: 6 x 4 of the 32 registers); kPairQueries: queries a pass over pairs of keys; kValueQueries: queries
// whose values are weighed at once (then pairs).
#if defined(__AVX512F__)
constexpr int64_t kTransposeQueries = 6;
constexpr size_t kScoreQueries = 6;
constexpr size_t kPairQueries = 4;  // queries a pass over pairs of keys
constexpr int kValueQueries = 6;  // weigh six queries' values at once (6 x 4 sums in flight)
#else  // (no transposed chunks: 16 registers hold neither a transposed pass's sums nor spare lanes)
constexpr size_t kPairQueries = 4;
constexpr int kValueQueries = 1;  // one query's values at a time: eight 8-lane sums in flight already
#endif

// One query of an attend() call: it sees the cache slots [lo, hi), then the slots extra[0 .. n_extra) (each
// at or past hi, increasing): a chain's row sees one run, a tree's row the cached run and its ancestors.
struct Query {
  const float* q;  // [hd]
  float* out;      // [hd]
  int64_t lo, hi;
  const int32_t* extra;
  int64_t n_extra;
  int64_t seen() const { return hi - lo + n_extra; }
};

// scores[0, T) -> exp(score - max), in place (scores padded to a multiple of 8); returns 1 / their sum.
inline float softmax(float* scores, int64_t T) {
  const int64_t T8 = (T + 7) / 8 * 8;
  // the largest score (a maximum is the same in any order: lanes first, then across them; scores of -0 and +0 give
  // the same exp either way)
  __m256 mv8 = _mm256_set1_ps(-INFINITY);
  int64_t k = 0;
  for (; k + 8 <= T; k += 8) mv8 = _mm256_max_ps(mv8, _mm256_loadu_ps(scores + k));
  alignas(32) float lanes8[8];
  _mm256_store_ps(lanes8, mv8);
  float mx = -INFINITY;
  for (int j = 0; j < 8; ++j) mx = std::max(mx, lanes8[j]);
  for (; k < T; ++k) mx = std::max(mx, scores[k]);
  for (int64_t t = T; t < T8; ++t) scores[t] = mx;
  __m256 sum = _mm256_setzero_ps();
  const __m256 mv = _mm256_set1_ps(mx);
  int64_t t = 0;
#if defined(__AVX512F__)  // 16 lanes at a time where no padding is among them; the sum still 8 lanes, in order
  const __m512 mv16 = _mm512_set1_ps(mx);
  for (; t + 16 <= T; t += 16) {
    const __m512 e = hvd_lanes::exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + t), mv16));
    _mm512_storeu_ps(scores + t, e);
    sum = _mm256_add_ps(sum, _mm512_castps512_ps256(e));
    sum = _mm256_add_ps(sum, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
  }
#endif
  for (; t < T8; t += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + t), mv));
    if (t + 8 > T) {  // the padding lanes count for nothing
      alignas(32) float keep[8];
      for (int j = 0; j < 8; ++j) keep[j] = t + j < T ? 1.0f : 0.0f;
      e = _mm256_mul_ps(e, _mm256_load_ps(keep));
    }
    _mm256_storeu_ps(scores + t, e);
    sum = _mm256_add_ps(sum, e);
  }
  return 1.0f / hsum(sum);
}

// acc[off0, off0 + 16 NV) += p[t] * row t, for t = 0 .. n - 1 in order (NV vectors held in registers).
template <int NV, class Load>
inline void weigh_group(float* acc, int64_t off0, const float* p, int64_t n, const Load& load16) {
  VF a[NV];
  for (int j = 0; j < NV; ++j) a[j] = hvd_isa::f_load(acc + off0 + 16 * j);
  for (int64_t t = 0; t < n; ++t) {
    const VF pv = hvd_isa::f_set1(p[t]);
    for (int j = 0; j < NV; ++j) a[j] = hvd_isa::f_fmadd(pv, load16(t, off0 + 16 * j), a[j]);
  }
  for (int j = 0; j < NV; ++j) hvd_isa::f_store(acc + off0 + 16 * j, a[j]);
}

// The same for NQ queries over the same rows (each row's vectors loaded once for all of them): NQ x NV independent
// sums in flight, which 512-bit vectors need to keep the multiply-adders busy.
template <int NQ, int NV, class Load>
inline void weigh_group_n(float* const* acc, int64_t off0, const float* const* p, int64_t n, const Load& load16) {
  VF a[NQ][NV];
  for (int u = 0; u < NQ; ++u)
    for (int j = 0; j < NV; ++j) a[u][j] = hvd_isa::f_load(acc[u] + off0 + 16 * j);
  for (int64_t t = 0; t < n; ++t) {
    VF v[NV];
    for (int j = 0; j < NV; ++j) v[j] = load16(t, off0 + 16 * j);
    for (int u = 0; u < NQ; ++u) {
      const VF pv = hvd_isa::f_set1(p[u][t]);
      for (int j = 0; j < NV; ++j) a[u][j] = hvd_isa::f_fmadd(pv, v[j], a[u][j]);
    }
  }
  for (int u = 0; u < NQ; ++u)
    for (int j = 0; j < NV; ++j) hvd_isa::f_store(acc[u] + off0 + 16 * j, a[u][j]);
}

// weigh() for NQ queries over the same n rows (an output of whole 16-lane vectors).
template <int NQ, class Load16>
inline void weigh_n(float* const* acc, int64_t hd, const float* const* p, int64_t n, const Load16& load16) {
  for (int64_t off = 0; off < hd; off += 64) {
    switch (std::min<int64_t>(4, (hd - off) / 16)) {
      case 1: weigh_group_n<NQ, 1>(acc, off, p, n, load16); break;
      case 2: weigh_group_n<NQ, 2>(acc, off, p, n, load16); break;
      case 3: weigh_group_n<NQ, 3>(acc, off, p, n, load16); break;
      default: weigh_group_n<NQ, 4>(acc, off, p, n, load16); break;
    }
  }
}

// acc[0, hd) += p[t] * row t for t = 0 .. n - 1: every element's sum over t in order, 64 elements a pass.
// load16(t, off): elements [off, off + 16) of row t; load8(t, off): [off, off + 8) (an odd last chunk).
template <class Load16, class Load8>
inline void weigh(float* acc, int64_t hd, const float* p, int64_t n, const Load16& load16, const Load8& load8) {
  const int64_t hd16 = hd - hd % 16;
  for (int64_t off = 0; off < hd16; off += 64) {
    switch (std::min<int64_t>(4, (hd16 - off) / 16)) {
      case 1: weigh_group<1>(acc, off, p, n, load16); break;
      case 2: weigh_group<2>(acc, off, p, n, load16); break;
      case 3: weigh_group<3>(acc, off, p, n, load16); break;
      default: weigh_group<4>(acc, off, p, n, load16); break;
    }
  }
  if (hd16 < hd) {
    __m256 a = _mm256_loadu_ps(acc + hd16);
    for (int64_t t = 0; t < n; ++t) a = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), load8(t, hd16), a);
    _mm256_storeu_ps(acc + hd16, a);
  }
}

inline __m256 load_h8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// hsum8 for a pass of NQ queries (a build for the tests adds a key's lanes in another order where NQ > 1).
template <int NQ>
inline __m256 hsum8_of(const __m256* h) {
#if defined(HVD_MUTATE_ATTENTION_ORDER)
  if (NQ > 1) {
    alignas(32) float out[8], v[8];
    for (int k = 0; k < 8; ++k) {
      _mm256_store_ps(v, h[k]);
      float t = v[0];
      for (int j = 1; j < 8; ++j) t += v[j];
      out[k] = t;
    }
    return _mm256_load_ps(out);
  }
#endif
  return hvd_lanes::hsum8(h);
}

// The scores of NQ queries (q[u]: [hd]) against NP pairs of keys, whose chunks a
// pair holds side by side (pair(p, i): key a's chunk i | key b's): s[2 (u NP + p) + h] is query u's score of
// pair p's key h. NQ x NP sums in flight (enough to keep the multiply-adders busy).
template <int NQ, int NP, class Pair>
inline void score_pairs(const float* const* q, int64_t hd, const Pair& pair, float scale, float* s) {
#if !defined(__AVX512F__)
  if constexpr (NP == 1) {  // AVX2: a pair's halves and each query's chunk in plain 8-lane registers (no spills)
    __m256 lo[NQ], hi[NQ];
    for (int u = 0; u < NQ; ++u) lo[u] = hi[u] = _mm256_setzero_ps();
    for (int64_t i = 0; i < hd / 8; ++i) {
      const VF k = pair(0, i);
      for (int u = 0; u < NQ; ++u) {
        const __m256 qv = _mm256_loadu_ps(q[u] + 8 * i);
        lo[u] = _mm256_fmadd_ps(qv, k.a, lo[u]);
        hi[u] = _mm256_fmadd_ps(qv, k.b, hi[u]);
      }
    }
    constexpr int kHalves = (2 * NQ + 7) / 8 * 8;
    __m256 h[kHalves];
    for (int u = 0; u < NQ; ++u) {
      h[2 * u] = lo[u];
      h[2 * u + 1] = hi[u];
    }
    for (int x = 2 * NQ; x < kHalves; ++x) h[x] = _mm256_setzero_ps();
    for (int g = 0; g < kHalves; g += 8) _mm256_storeu_ps(s + g, _mm256_mul_ps(hsum8_of<NQ>(h + g), _mm256_set1_ps(scale)));
    return;
  }
#endif
  VF a[NQ][NP];
  for (int u = 0; u < NQ; ++u)
    for (int p = 0; p < NP; ++p) a[u][p] = hvd_isa::f_zero();
  for (int64_t i = 0; i < hd / 8; ++i) {
    VF k[NP];
    for (int p = 0; p < NP; ++p) k[p] = pair(p, i);
    for (int u = 0; u < NQ; ++u) {
      const VF qv = hvd_isa::f_dup8(q[u] + 8 * i);  // chunk i, for both keys of a pair
      for (int p = 0; p < NP; ++p) a[u][p] = hvd_isa::f_fmadd(qv, k[p], a[u][p]);
    }
  }
  constexpr int kHalves = (2 * NQ * NP + 7) / 8 * 8;
  __m256 h[kHalves];
  for (int u = 0; u < NQ; ++u)
    for (int p = 0; p < NP; ++p) {
      h[2 * (u * NP + p)] = hvd_isa::f_lo(a[u][p]);
      h[2 * (u * NP + p) + 1] = hvd_isa::f_hi(a[u][p]);
    }
  for (int x = 2 * NQ * NP; x < kHalves; ++x) h[x] = _mm256_setzero_ps();
  for (int g = 0; g < kHalves; g += 8) _mm256_storeu_ps(s + g, _mm256_mul_ps(hsum8_of<NQ>(h + g), _mm256_set1_ps(scale)));
}

// Pairs a pass for NQ queries: eight sums in flight on AVX-512 (of 32 registers); on AVX2 (16 registers, a
// vector two of them) eight 8-lane sums where the pairs and the queries still fit beside them.
#if defined(__AVX512F__)
template <int NQ> constexpr int kPairsFor = NQ == 1 ? 8 : NQ == 2 ? 4 : 2;
#else
template <int NQ> constexpr int kPairsFor = NQ == 1 ? 4 : NQ == 2 ? 2 : 1;
#endif

// Scores of queries qi[0 .. NQ) against `pairs` pairs (pair(p, i) as above, p < pairs): keep(u, pair, half, score)
// for each.
template <int NQ, class Pair, class Keep>
inline void score_run(const float* const* q, int64_t hd, int64_t pairs, const Pair& pair, float scale, const Keep& keep) {
  constexpr int NP = kPairsFor<NQ>;
  alignas(32) float sc[(2 * NQ * NP + 7) / 8 * 8];
  for (int64_t p0 = 0; p0 < pairs; p0 += NP) {
    score_pairs<NQ, NP>(q, hd, [&](int p, int64_t i) { return pair(std::min<int64_t>(p0 + p, pairs - 1), i); }, scale, sc);
    for (int p = 0; p < NP && p0 + p < pairs; ++p)
      for (int u = 0; u < NQ; ++u)
        for (int half = 0; half < 2; ++half) keep(u, p0 + p, half, sc[2 * (u * NP + p) + half]);
  }
}

#if defined(__AVX512F__)
// A vector of keys for the transposed scores: 16 lanes, a lane a key (AVX-512 only: see kTransposeQueries).
using KV = __m512;
constexpr int64_t kKeys = 16;
inline KV k_zero() { return _mm512_setzero_ps(); }
inline KV k_set1(float v) { return _mm512_set1_ps(v); }
inline KV k_load(const float* p) { return _mm512_loadu_ps(p); }
inline void k_store(float* p, KV v) { _mm512_storeu_ps(p, v); }
inline KV k_add(KV a, KV b) { return _mm512_add_ps(a, b); }
inline KV k_mul(KV a, KV b) { return _mm512_mul_ps(a, b); }
inline KV k_fmadd(KV a, KV b, KV c) { return _mm512_fmadd_ps(a, b, c); }

// Keys [t0, t1) of a kv head (float16 rows of hd) into kT[d * kChunk + t - t0] (float32, a column per key),
// 8 keys by 8 dims at a time; columns past t1 up to a multiple of 8 are zero.
inline void transpose_keys(const uint16_t* K16, int64_t hd, int64_t t0, int64_t t1, float* kT) {
  for (int64_t b = t0; b < t1; b += 8) {
    for (int64_t i = 0; i < hd; i += 8) {
      __m256 r[8];
      for (int u = 0; u < 8; ++u)
        r[u] = b + u < t1 ? load_h8(K16 + (b + u) * hd + i) : _mm256_setzero_ps();
      // 8 x 8 transpose: r[u][j] -> c[j][u]
      const __m256 a0 = _mm256_unpacklo_ps(r[0], r[1]), a1 = _mm256_unpackhi_ps(r[0], r[1]);
      const __m256 a2 = _mm256_unpacklo_ps(r[2], r[3]), a3 = _mm256_unpackhi_ps(r[2], r[3]);
      const __m256 a4 = _mm256_unpacklo_ps(r[4], r[5]), a5 = _mm256_unpackhi_ps(r[4], r[5]);
      const __m256 a6 = _mm256_unpacklo_ps(r[6], r[7]), a7 = _mm256_unpackhi_ps(r[6], r[7]);
      const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xEE);
      const __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xEE);
      const __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xEE);
      const __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xEE);
      const __m256 c[8] = {_mm256_permute2f128_ps(b0, b4, 0x20), _mm256_permute2f128_ps(b1, b5, 0x20),
                           _mm256_permute2f128_ps(b2, b6, 0x20), _mm256_permute2f128_ps(b3, b7, 0x20),
                           _mm256_permute2f128_ps(b0, b4, 0x31), _mm256_permute2f128_ps(b1, b5, 0x31),
                           _mm256_permute2f128_ps(b2, b6, 0x31), _mm256_permute2f128_ps(b3, b7, 0x31)};
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(kT + (i + j) * kChunk + (b - t0), c[j]);
    }
  }
}

// The scores of NQ queries against NK vectors of kKeys keys of a transposed chunk (kT + tb: column tb on):
// key k's lane j is the fused multiply-add chain of lane j over the head's 8-lane chunks, computed here lane
// after lane (chunk i's element j for i = 0, 1, ...: the chain's own order) with NQ x NK chains in flight, each
// chain's result kept; then the lanes' hsum ((0+4)+(1+5))+((2+6)+(3+7)), taken lane-wise. So each key's score is
// the one score_pairs() gives it. Every key vector loaded serves NQ queries, every query element loaded NK
// vectors: twice the multiply-adds per load of a pass over one vector of keys.
template <int NQ, int NK>
inline void score_keys(const float* const* q, int64_t hd, const float* kT, float scale, float* const* out) {
  alignas(64) float lanes[8][NQ][NK][kKeys];
  for (int j = 0; j < 8; ++j) {
    KV acc[NQ][NK];
    for (int u = 0; u < NQ; ++u)
      for (int v = 0; v < NK; ++v) acc[u][v] = k_zero();
    for (int64_t i = j; i < hd; i += 8) {
      const float* row = kT + i * kChunk;
      KV k[NK];
      for (int v = 0; v < NK; ++v) k[v] = k_load(row + kKeys * v);
      for (int u = 0; u < NQ; ++u) {
        const KV qv = k_set1(q[u][i]);
        for (int v = 0; v < NK; ++v) acc[u][v] = k_fmadd(qv, k[v], acc[u][v]);
      }
    }
    for (int u = 0; u < NQ; ++u)
      for (int v = 0; v < NK; ++v) k_store(lanes[j][u][v], acc[u][v]);
  }
  const auto at = [&](int j, int u, int v) { return k_load(lanes[j][u][v]); };
  for (int u = 0; u < NQ; ++u)
    for (int v = 0; v < NK; ++v) {
#if defined(HVD_MUTATE_ATTENTION_ORDER)  // for the tests only: passes of several queries add a key's lanes otherwise
      const KV s = k_add(k_add(k_add(at(0, u, v), at(1, u, v)), k_add(at(2, u, v), at(3, u, v))),
                         k_add(k_add(at(4, u, v), at(5, u, v)), k_add(at(6, u, v), at(7, u, v))));
#else
      const KV s = k_add(k_add(k_add(at(0, u, v), at(4, u, v)), k_add(at(1, u, v), at(5, u, v))),
                         k_add(k_add(at(2, u, v), at(6, u, v)), k_add(at(3, u, v), at(7, u, v))));
#endif
      k_store(out[u] + kKeys * v, k_mul(s, k_set1(scale)));
    }
}
#endif  // __AVX512F__

// Ask for the cache lines of float16 rows [t0, t1) (the next chunk of keys or values) while this chunk is computed,
// in calls of kPrefetchQueries queries or more (a draft's rows, a prefill's): at 3,000 tokens of context a 4-row
// draft took 9.5-9.9 ms with it against 10.6 ms without, a 17-row draft 22.5-23.4 against 24.3; a decode step's
// calls (one or two queries) gained nothing measurable (5.8-6.3 ms either way), so they go without. (No result
// depends on it.)
constexpr int64_t kPrefetchQueries = 3;
inline void prefetch_rows(const uint16_t* rows, int64_t hd, int64_t t0, int64_t t1) {
  const char* first = reinterpret_cast<const char*>(rows + t0 * hd);
  const char* last = reinterpret_cast<const char*>(rows + t1 * hd);
  for (const char* p = first; p < last; p += 64) _mm_prefetch(p, _MM_HINT_T0);
}

// Scratch of one attend() call for up to Q queries of head_dim hd whose rows see up to `seen` keys.
struct Scratch {
  std::vector<float> scores, kv, kT, acc;
  int64_t ld = 0;
  void reserve(int64_t Q, int64_t hd, int64_t seen) {
    ld = (seen + 7) / 8 * 8;
    scores.resize(static_cast<size_t>(Q * ld));
    kv.resize(static_cast<size_t>(kChunk * hd));
    kT.resize(static_cast<size_t>(kChunk * hd));
    acc.resize(static_cast<size_t>(Q * hd));
  }
};

// Attention of queries[0 .. Q) over one kv head's keys and values (float16 [cap, hd]); see the file's comment.
inline void attend(const Query* queries, int64_t Q, const at::Half* K, const at::Half* V, int64_t hd, float scale,
                   Scratch& s) {
  const uint16_t* K16 = reinterpret_cast<const uint16_t*>(K);
  const uint16_t* V16 = reinterpret_cast<const uint16_t*>(V);
  const int64_t ld = s.ld;
  float* scores = s.scores.data();
  float* kv = s.kv.data();
  float* acc = s.acc.data();
  int64_t lo = INT64_MAX, hi = 0;  // the runs' union
  for (int64_t u = 0; u < Q; ++u) {
    const Query& x = queries[u];
    if (x.hi > x.lo) {
      lo = std::min(lo, x.lo);
      hi = std::max(hi, x.hi);
    }
  }
  // 1. the runs' scores, a chunk of keys converted at a time. Many queries: the chunk transposed (a column per
  // key), two queries against kKeys keys a pass; few: the chunk's keys in pairs (pair p: keys t0 + 2p and
  // t0 + 2p + 1, chunk by chunk side by side), four queries against a pair a pass. The same score either way.
#if defined(__AVX512F__)
  const bool transposed = Q >= kTransposeQueries;
#endif
  std::vector<int64_t> active;
  active.reserve(Q);
  for (int64_t t0 = lo; t0 < hi; t0 += kChunk) {
    const int64_t t1 = std::min(hi, t0 + kChunk), pairs = (t1 - t0 + 1) / 2;
    if (Q >= kPrefetchQueries) prefetch_rows(K16, hd, t1, std::min(hi, t1 + kChunk));
    active.clear();
    for (int64_t u = 0; u < Q; ++u)
      if (queries[u].lo < t1 && queries[u].hi > t0) active.push_back(u);
#if defined(__AVX512F__)
    if (transposed) {
      transpose_keys(K16, hd, t0, t1, s.kT.data());
      const int64_t nk = (t1 - t0 + kKeys - 1) / kKeys;  // vectors of keys in the chunk
      for (size_t a0 = 0; a0 < active.size(); a0 += kScoreQueries) {
        const size_t n = std::min<size_t>(kScoreQueries, active.size() - a0);
        const float* qs[kScoreQueries];  // a short pass repeats its last query
        for (size_t u = 0; u < kScoreQueries; ++u) qs[u] = queries[active[a0 + std::min(u, n - 1)]].q;
        alignas(64) float sc[kScoreQueries][kChunk];
        float* outs[kScoreQueries];
        for (size_t u = 0; u < kScoreQueries; ++u) outs[u] = sc[u];
        switch (nk) {
          case 1: score_keys<kScoreQueries, 1>(qs, hd, s.kT.data(), scale, outs); break;
          case 2: score_keys<kScoreQueries, 2>(qs, hd, s.kT.data(), scale, outs); break;
          case 3: score_keys<kScoreQueries, 3>(qs, hd, s.kT.data(), scale, outs); break;
          default: score_keys<kScoreQueries, 4>(qs, hd, s.kT.data(), scale, outs); break;
        }
        for (size_t u = 0; u < n; ++u) {
          const Query& x = queries[active[a0 + u]];
          const int64_t from = std::max(t0, x.lo), to = std::min(t1, x.hi);
          if (to > from) std::copy(sc[u] + (from - t0), sc[u] + (to - t0), scores + active[a0 + u] * ld + (from - x.lo));
        }
      }
      continue;
    }
#endif
    for (int64_t p = 0; p < pairs; ++p) {
      const uint16_t* ka = K16 + (t0 + 2 * p) * hd;
      const uint16_t* kb = K16 + std::min(t0 + 2 * p + 1, t1 - 1) * hd;  // the first key again at an odd end
      for (int64_t i = 0; i < hd / 8; ++i) hvd_isa::f_store(kv + p * 2 * hd + 16 * i, hvd_isa::f_load_h2(ka + 8 * i, kb + 8 * i));
    }
    for (size_t a0 = 0; a0 < active.size(); a0 += kPairQueries) {
      const size_t n = std::min<size_t>(kPairQueries, active.size() - a0);
      const float* qs[4];
      for (size_t u = 0; u < n; ++u) qs[u] = queries[active[a0 + u]].q;
      const auto pair = [kv, hd](int64_t p, int64_t i) { return hvd_isa::f_load(kv + p * 2 * hd + 16 * i); };
      const auto keep = [&](int u, int64_t p, int half, float score) {
        const int64_t t = t0 + 2 * p + half;
        const Query& x = queries[active[a0 + u]];
        if (t < t1 && t >= x.lo && t < x.hi) scores[active[a0 + u] * ld + t - x.lo] = score;
      };
      switch (n) {
        case 1: score_run<1>(qs, hd, pairs, pair, scale, keep); break;
        case 2: score_run<2>(qs, hd, pairs, pair, scale, keep); break;
        case 3: score_run<3>(qs, hd, pairs, pair, scale, keep); break;
        default: score_run<4>(qs, hd, pairs, pair, scale, keep); break;
      }
    }
  }
  // 1b. the extra slots' scores, one query at a time, in pairs of keys
  for (int64_t u = 0; u < Q; ++u) {
    const Query& x = queries[u];
    if (x.n_extra == 0) continue;
    const float* qs[1] = {x.q};
    const int32_t* extra = x.extra;
    const int64_t n = x.n_extra;
    float* row = scores + u * ld + (x.hi - x.lo);
    score_run<1>(qs, hd, (n + 1) / 2,
                 [K16, extra, n, hd](int64_t p, int64_t i) {
                   return hvd_isa::f_load_h2(K16 + static_cast<int64_t>(extra[2 * p]) * hd + 8 * i,
                                             K16 + static_cast<int64_t>(extra[std::min(2 * p + 1, n - 1)]) * hd + 8 * i);
                 },
                 scale, [row, n](int, int64_t p, int half, float score) {
                   if (2 * p + half < n) row[2 * p + half] = score;
                 });
  }
  // 2. each query's softmax
  float inv[kMaxQueries];
  for (int64_t u = 0; u < Q; ++u) inv[u] = softmax(scores + u * ld, queries[u].seen());
  // 3. the weighted values: the runs a chunk of converted values at a time, each query's sums carried across
  // chunks; then the extra slots'
  std::fill(acc, acc + Q * hd, 0.0f);
  if (Q >= kPrefetchQueries) prefetch_rows(V16, hd, lo, std::min(hi, lo + kChunk));
  for (int64_t t0 = lo; t0 < hi; t0 += kChunk) {
    const int64_t t1 = std::min(hi, t0 + kChunk);
    if (Q >= kPrefetchQueries) prefetch_rows(V16, hd, t1, std::min(hi, t1 + kChunk));
    for (int64_t i = 0; i < (t1 - t0) * hd; i += 8) _mm256_storeu_ps(kv + i, load_h8(V16 + t0 * hd + i));
    // query u over rows [begin, end) of the chunk, in order (its sums carried in acc)
    const auto one = [&](int64_t u, int64_t begin, int64_t end) {
      if (end <= begin) return;
      const float* v = kv + (begin - t0) * hd;
      weigh(acc + u * hd, hd, scores + u * ld + begin - queries[u].lo, end - begin,
            [v, hd](int64_t t, int64_t off) { return hvd_isa::f_load(v + t * hd + off); },
            [v, hd](int64_t t, int64_t off) { return _mm256_loadu_ps(v + t * hd + off); });
    };
    // queries [u, u + NQ) together: each alone up to where all of them see the rows, together there, alone after
    const auto together = [&](auto nq, int64_t u) {
      constexpr int NQ = decltype(nq)::value;
      int64_t bs[NQ], es[NQ], b = t0, e = t1;
      for (int w = 0; w < NQ; ++w) {
        bs[w] = std::max(t0, queries[u + w].lo);
        es[w] = std::min(t1, queries[u + w].hi);
        b = std::max(b, bs[w]);
        e = std::min(e, es[w]);
      }
      if (e <= b) {
        for (int w = 0; w < NQ; ++w) one(u + w, bs[w], es[w]);
        return;
      }
      float* accs[NQ];
      const float* ps[NQ];
      for (int w = 0; w < NQ; ++w) {
        one(u + w, bs[w], b);
        accs[w] = acc + (u + w) * hd;
        ps[w] = scores + (u + w) * ld + b - queries[u + w].lo;
      }
      const float* v = kv + (b - t0) * hd;
      weigh_n<NQ>(accs, hd, ps, e - b, [v, hd](int64_t t, int64_t off) { return hvd_isa::f_load(v + t * hd + off); });
      for (int w = 0; w < NQ; ++w) one(u + w, e, es[w]);
    };
    int64_t u = 0;
    if (kValueQueries > 1 && hd % 16 == 0) {  // kValueQueries at a time, then pairs
      for (; u + kValueQueries <= Q; u += kValueQueries) together(std::integral_constant<int, kValueQueries>{}, u);
      for (; u + 2 <= Q; u += 2) together(std::integral_constant<int, 2>{}, u);
    }
    for (; u < Q; ++u) one(u, std::max(t0, queries[u].lo), std::min(t1, queries[u].hi));
  }
  for (int64_t u = 0; u < Q; ++u) {
    const Query& x = queries[u];
    if (x.n_extra == 0) continue;
    const int32_t* extra = x.extra;
    weigh(acc + u * hd, hd, scores + u * ld + (x.hi - x.lo), x.n_extra,
          [V16, extra, hd](int64_t t, int64_t off) {
            const uint16_t* v = V16 + static_cast<int64_t>(extra[t]) * hd + off;
            return hvd_isa::f_load_h2(v, v + 8);
          },
          [V16, extra, hd](int64_t t, int64_t off) { return load_h8(V16 + static_cast<int64_t>(extra[t]) * hd + off); });
  }
  // 4. out = sums / softmax sum
  for (int64_t u = 0; u < Q; ++u) {
    const __m256 iv = _mm256_set1_ps(inv[u]);
    for (int64_t i = 0; i < hd; i += 8)
      _mm256_storeu_ps(queries[u].out + i, _mm256_mul_ps(_mm256_loadu_ps(acc + u * hd + i), iv));
  }
}

// The first of a row's visible slots (in cache order) inside a window of `window` positions ending at its
// position p: cached slot t (t < past) holds position t, a new slot past + j the position of the sequence's
// row j (seq_positions[j]); positions increase along the slots, so the window is a suffix of them.
inline int64_t window_first(const std::vector<int32_t>& slots, int64_t past, const int64_t* seq_positions, int64_t p,
                            int64_t window) {
  const int64_t oldest = p - window + 1;
  const auto before = [&](int32_t t) { return (t < past ? t : seq_positions[t - past]) < oldest; };
  return std::partition_point(slots.begin(), slots.end(), before) - slots.begin();
}

}  // namespace hvd_attention

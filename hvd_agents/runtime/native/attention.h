// hvd_attention: a query row's attention over a float16 KV cache, one row at a time or a block of chain rows.
//
// The operations for one (query, key) and one query are fixed: a key's score is the fused multiply-add chain
// over the head's 8-lane chunks, then hsum, times the scale; then the row's max, exp, sum and the weighted values
// in cache order. attend() computes one row over any visible positions (a tree's); attend_block() computes a
// block of rows of a chain, sharing each key's and value's conversion from float16 among the block's queries
// and summing eight scores at once (hsum8): the same operations per element, so the same bits. A sliding-window
// layer's row sees a suffix of those positions (its last W); it is computed as if they were all there is.
#pragma once

#include <torch/extension.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "lanes.h"

namespace hvd_attention {

constexpr int64_t kMaxHeadDim = 256;
constexpr int64_t kMaxLanes = kMaxHeadDim / 8;

using hvd_lanes::exp8;
using hvd_lanes::hsum;

// acc[i] += p[t] * row(t, i) for t = 0 .. n - 1 in order, for the L 8-lane chunks i of an output (held in
// registers for the whole loop: L is a constant).
template <int L, class Row>
inline void weigh(__m256* acc, const float* p, int64_t n, const Row& row) {
  __m256 a[L];
  for (int i = 0; i < L; ++i) a[i] = acc[i];
  for (int64_t t = 0; t < n; ++t) {
    const __m256 pv = _mm256_set1_ps(p[t]);
    for (int i = 0; i < L; ++i) a[i] = _mm256_fmadd_ps(pv, row(t, i), a[i]);
  }
  for (int i = 0; i < L; ++i) acc[i] = a[i];
}

// The same for an output of `lanes` chunks, eight chunks at a time: every element's sum runs over t in order,
// as one loop over all the chunks would run it.
template <class Row>
inline void weigh_lanes(__m256* acc, int64_t lanes, const float* p, int64_t n, const Row& row) {
  int64_t i0 = 0;
  const auto at = [&](int64_t base) { return [&row, base](int64_t t, int i) { return row(t, base + i); }; };
  for (; i0 + 8 <= lanes; i0 += 8) weigh<8>(acc + i0, p, n, at(i0));
  switch (lanes - i0) {
    case 1: weigh<1>(acc + i0, p, n, at(i0)); break;
    case 2: weigh<2>(acc + i0, p, n, at(i0)); break;
    case 3: weigh<3>(acc + i0, p, n, at(i0)); break;
    case 4: weigh<4>(acc + i0, p, n, at(i0)); break;
    case 5: weigh<5>(acc + i0, p, n, at(i0)); break;
    case 6: weigh<6>(acc + i0, p, n, at(i0)); break;
    case 7: weigh<7>(acc + i0, p, n, at(i0)); break;
    default: break;
  }
}

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
  for (int64_t t = 0; t < T8; t += 8) {
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

// One query row of one head over the visible positions `slots` (in cache order) of one kv head.
// Keys and values are float16 [cap, hd]. scores: scratch of at least len(slots) rounded up to 8.
inline void attend(const float* q, const at::Half* K, const at::Half* V, int64_t hd, const int32_t* slots, int64_t T,
            float scale, float* scores, float* out) {
  const int64_t T8 = (T + 7) / 8 * 8;
  // a key's score: the fmadd chain over its 8-lane chunks, then hsum; eight keys' chains interleaved
  int64_t t = 0;
  for (; t + 8 <= T; t += 8) {
    const uint16_t* k[8];
    __m256 acc[8];
    for (int u = 0; u < 8; ++u) {
      k[u] = reinterpret_cast<const uint16_t*>(K + static_cast<int64_t>(slots[t + u]) * hd);
      acc[u] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < hd; i += 8) {
      const __m256 qv = _mm256_loadu_ps(q + i);
      for (int u = 0; u < 8; ++u)
        acc[u] = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k[u] + i))), acc[u]);
    }
    for (int u = 0; u < 8; ++u) scores[t + u] = hsum(acc[u]) * scale;
  }
  for (; t < T; ++t) {
    const uint16_t* k = reinterpret_cast<const uint16_t*>(K + static_cast<int64_t>(slots[t]) * hd);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < hd; i += 8) {
      const __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + i)));
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), kv, acc);
    }
    scores[t] = hsum(acc) * scale;
  }
  const float inv = softmax(scores, T);
  __m256 acc[kMaxLanes];
  const int64_t lanes = hd / 8;
  for (int64_t i = 0; i < lanes; ++i) acc[i] = _mm256_setzero_ps();
  const uint16_t* V16 = reinterpret_cast<const uint16_t*>(V);
  weigh_lanes(acc, lanes, scores, T, [V16, slots, hd](int64_t t, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(V16 + static_cast<int64_t>(slots[t]) * hd + 8 * i)));
  });
  const __m256 iv = _mm256_set1_ps(inv);
  for (int64_t i = 0; i < lanes; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(acc[i], iv));
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

constexpr int64_t kChunk = 64;  // keys converted from float16 at a time

// Attention of Q queries of one kv head whose rows form a chain: query u sees positions [lo[u], T[u]) of K and V
// (float16 [cap, hd]); q[u] its query, out[u] its output. Scratch: scores [Q][ld] (ld >= max T rounded up to 8),
// kv [kChunk * hd], acc [Q * hd]. The same operations per (query, key) and per query as attend() over the
// slots lo[u] .. T[u] - 1.
inline void attend_block(const float* const* q, const int64_t* lo, const int64_t* T, int64_t Q, const at::Half* K,
                         const at::Half* V, int64_t hd, float scale, float* scores, int64_t ld, float* kv, float* acc,
                         float* const* out) {
  int64_t Tmax = 0, Lmin = lo[0];
  for (int64_t u = 0; u < Q; ++u) {
    Tmax = std::max(Tmax, T[u]);
    Lmin = std::min(Lmin, lo[u]);
  }
  const int64_t lanes = hd / 8;
  const __m256 sv = _mm256_set1_ps(scale);
  // 1. scores: four queries' chains at a time against two converted keys
  for (int64_t t0 = Lmin; t0 < Tmax; t0 += kChunk) {
    const int64_t t1 = std::min(Tmax, t0 + kChunk);
    for (int64_t i = 0; i < (t1 - t0) * hd; i += 8)
      _mm256_storeu_ps(kv + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(K + t0 * hd + i))));
    for (int64_t u0 = 0; u0 < Q; u0 += 4) {
      const int64_t n = std::min<int64_t>(4, Q - u0);
      const float* qs[4];
      for (int64_t u = 0; u < 4; ++u) qs[u] = q[u0 + std::min(u, n - 1)];
      int64_t all_lo = 0, all_T = Tmax;  // the keys every one of the four sees
      for (int64_t u = 0; u < n; ++u) {
        all_lo = std::max(all_lo, lo[u0 + u]);
        all_T = std::min(all_T, T[u0 + u]);
      }
      const auto keep = [&](int64_t t, const float* s) {
        if (t >= all_lo && t < all_T) {
          for (int64_t u = 0; u < n; ++u) scores[(u0 + u) * ld + t - lo[u0 + u]] = s[u];
        } else {
          for (int64_t u = 0; u < n; ++u)
            if (t >= lo[u0 + u] && t < T[u0 + u]) scores[(u0 + u) * ld + t - lo[u0 + u]] = s[u];
        }
      };
      // two keys at a time, each query's chunk loaded once for both
      for (int64_t t = t0; t < t1; t += 2) {
        const int64_t t2 = std::min(t + 1, t1 - 1);  // the pair's second key (the first again at an odd end)
        const float* ka = kv + (t - t0) * hd;
        const float* kb = kv + (t2 - t0) * hd;
        __m256 a[8];  // a[u]: query u against key t; a[4 + u]: against key t2
        for (int u = 0; u < 8; ++u) a[u] = _mm256_setzero_ps();
        for (int64_t i = 0; i < hd; i += 8) {
          const __m256 x = _mm256_loadu_ps(ka + i), y = _mm256_loadu_ps(kb + i);
          for (int u = 0; u < 4; ++u) {
            const __m256 qv = _mm256_loadu_ps(qs[u] + i);
            a[u] = _mm256_fmadd_ps(qv, x, a[u]);
            a[4 + u] = _mm256_fmadd_ps(qv, y, a[4 + u]);
          }
        }
        alignas(32) float s[8];
        _mm256_store_ps(s, _mm256_mul_ps(hvd_lanes::hsum8(a), sv));
        keep(t, s);
        if (t2 != t) keep(t2, s + 4);
      }
    }
  }
  // 2. each query's softmax
  std::vector<float> inv(Q);
  for (int64_t u = 0; u < Q; ++u) inv[u] = softmax(scores + u * ld, T[u] - lo[u]);
  // 3. the weighted values, each query's sums in cache order, carried across chunks of converted values
  std::fill(acc, acc + Q * hd, 0.0f);
  for (int64_t t0 = Lmin; t0 < Tmax; t0 += kChunk) {
    const int64_t t1 = std::min(Tmax, t0 + kChunk);
    for (int64_t i = 0; i < (t1 - t0) * hd; i += 8)
      _mm256_storeu_ps(kv + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(V + t0 * hd + i))));
    for (int64_t u = 0; u < Q; ++u) {
      const int64_t begin = std::max(t0, lo[u]), end = std::min(t1, T[u]);
      if (end <= begin) continue;
      __m256 a[kMaxLanes];
      for (int64_t i = 0; i < lanes; ++i) a[i] = _mm256_loadu_ps(acc + u * hd + 8 * i);
      const float* v = kv + (begin - t0) * hd;
      weigh_lanes(a, lanes, scores + u * ld + begin - lo[u], end - begin,
                  [v, hd](int64_t t, int64_t i) { return _mm256_loadu_ps(v + t * hd + 8 * i); });
      for (int64_t i = 0; i < lanes; ++i) _mm256_storeu_ps(acc + u * hd + 8 * i, a[i]);
    }
  }
  for (int64_t u = 0; u < Q; ++u) {
    const __m256 iv = _mm256_set1_ps(inv[u]);
    for (int64_t i = 0; i < lanes; ++i) _mm256_storeu_ps(out[u] + 8 * i, _mm256_mul_ps(_mm256_loadu_ps(acc + u * hd + 8 * i), iv));
  }
}

}  // namespace hvd_attention

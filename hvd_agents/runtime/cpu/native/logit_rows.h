// hvd_logits: what a greedy step reads from its logit rows, in one or two passes over each row.
//
// argmax_row: the index of a row's largest value, the first one where several tie (torch.argmax's rule); -1 when
// the row holds a NaN (the caller decides as torch would). token_signal: a row's log-probability of one token and
// its entropy, from its max, sum of exp(x - max) and sum of exp(x - max) (x - max). top_probs: a row's k largest
// values' indices (the lower index first among ties) and their softmax probabilities. All run on 8-lane AVX2
// operations on every path, so each result is the same bits on every x86-64 CPU.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include "lanes.h"

namespace hvd_logits {

// The row's max and whether it holds a NaN (8 lanes, four running maxima).
inline float row_max(const float* x, int64_t n, bool* nan) {
  const float lowest = -std::numeric_limits<float>::infinity();
  __m256 m[4] = {_mm256_set1_ps(lowest), _mm256_set1_ps(lowest), _mm256_set1_ps(lowest), _mm256_set1_ps(lowest)};
  __m256 unordered = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int u = 0; u < 4; ++u) {
      const __m256 v = _mm256_loadu_ps(x + i + 8 * u);
      unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      m[u] = _mm256_max_ps(m[u], v);
    }
  }
  const __m256 mm = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mm);
  float best = lanes[0];
  for (int u = 1; u < 8; ++u) best = std::max(best, lanes[u]);
  bool any_nan = _mm256_movemask_ps(unordered) != 0;
  for (; i < n; ++i) {
    any_nan |= std::isnan(x[i]);
    best = std::max(best, x[i]);
  }
  *nan = any_nan;
  return best;
}

// The first index of the row's largest value; -1 if the row holds a NaN.
inline int64_t argmax_row(const float* x, int64_t n) {
  bool nan = false;
  const float best = row_max(x, n, &nan);
  if (nan) return -1;
  const __m256 b = _mm256_set1_ps(best);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), b, _CMP_EQ_OQ));
    if (mask) return i + __builtin_ctz(static_cast<unsigned>(mask));
  }
  for (; i < n; ++i)
    if (x[i] == best) return i;
  return 0;  // unreachable: the max is one of the row's values
}

// The row's sum of exp(x - best) and, when Weighted, of exp(x - best) (x - best), entries at -inf weighing nothing:
// 8 lanes, two sums in flight, a padded tail through the same lanes.
template <bool Weighted>
inline float exp_sums(const float* x, int64_t n, float best, float* weighted) {
  const __m256 b = _mm256_set1_ps(best);
  const __m256 floor = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 s[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, w[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  const auto add = [&](__m256 v, int u) {
    const __m256 live = _mm256_cmp_ps(v, floor, _CMP_GT_OQ);
    const __m256 z = _mm256_sub_ps(v, b);
    const __m256 e = _mm256_and_ps(hvd_lanes::exp8(z), live);
    s[u] = _mm256_add_ps(s[u], e);
    if constexpr (Weighted) w[u] = _mm256_add_ps(w[u], _mm256_and_ps(_mm256_mul_ps(e, z), live));
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int u = 0; u < 2; ++u) add(_mm256_loadu_ps(x + i + 8 * u), u);
  float sum = hvd_lanes::hsum(_mm256_add_ps(s[0], s[1]));
  float wsum = hvd_lanes::hsum(_mm256_add_ps(w[0], w[1]));
  if (i < n) {  // the tail through the same lanes, padded with -inf (weighing nothing)
    alignas(32) float tail[16];
    for (int u = 0; u < 16; ++u) tail[u] = i + u < n ? x[i + u] : -std::numeric_limits<float>::infinity();
    s[0] = s[1] = w[0] = w[1] = _mm256_setzero_ps();
    for (int u = 0; u < 2; ++u) add(_mm256_load_ps(tail + 8 * u), 0);
    sum += hvd_lanes::hsum(s[0]);
    wsum += hvd_lanes::hsum(w[0]);
  }
  if constexpr (Weighted) *weighted = wsum;
  return sum;
}

// (log p(token), entropy) of softmax(row); (NaN, NaN) if the row holds a NaN. Entries at -inf weigh nothing.
inline std::pair<float, float> token_signal(const float* x, int64_t n, int64_t token) {
  bool nan = false;
  const float best = row_max(x, n, &nan);
  const float quiet = std::numeric_limits<float>::quiet_NaN();
  if (nan || !std::isfinite(best)) return {quiet, quiet};
  float weighted = 0.0f;
  const float sum = exp_sums<true>(x, n, best, &weighted);
  const float log_sum = std::log(sum);
  return {(x[token] - best) - log_sum, log_sum - weighted / sum};
}

constexpr int kMaxTop = 8;

// The k (1..kMaxTop, at most n) largest values' indices, largest first, the lower index first among ties, and their
// softmax probabilities; false (nothing written) if the row holds a NaN or no finite value.
inline bool top_probs(const float* x, int64_t n, int k, int64_t* index, float* prob) {
  bool nan = false;
  if (n < k || k < 1 || k > kMaxTop || (row_max(x, n, &nan), nan)) return false;
  float value[kMaxTop];
  int have = 0;
  const auto offer = [&](int64_t i) {  // insert x[i] after every kept value >= it
    const float v = x[i];
    if (have == k && !(v > value[k - 1])) return;
    int at = have < k ? have : k - 1;
    while (at > 0 && v > value[at - 1]) {
      value[at] = value[at - 1];
      index[at] = index[at - 1];
      --at;
    }
    value[at] = v;
    index[at] = i;
    if (have < k) ++have;
  };
  int64_t i = 0;
  for (; i < k; ++i) offer(i);
  for (; i + 8 <= n; i += 8) {  // only the lanes above the k-th kept value are offered
    const __m256 v = _mm256_loadu_ps(x + i);
    int mask = _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_set1_ps(value[k - 1]), _CMP_GT_OQ));
    while (mask) {
      offer(i + __builtin_ctz(static_cast<unsigned>(mask)));
      mask &= mask - 1;
      mask &= _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_set1_ps(value[k - 1]), _CMP_GT_OQ));
    }
  }
  for (; i < n; ++i) offer(i);
  if (!std::isfinite(value[0])) return false;
  const float sum = exp_sums<false>(x, n, value[0], nullptr);
  alignas(32) float lanes[8];
  for (int u = 0; u < 8; ++u) lanes[u] = u < k ? value[u] - value[0] : 0.0f;
  _mm256_store_ps(lanes, hvd_lanes::exp8(_mm256_load_ps(lanes)));
  for (int u = 0; u < k; ++u) prob[u] = value[u] == -std::numeric_limits<float>::infinity() ? 0.0f : lanes[u] / sum;
  return true;
}

}  // namespace hvd_logits

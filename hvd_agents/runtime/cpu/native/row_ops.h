// hvd_rows: the native forward's per-row operations (norms, rope, gated activations), the same on every path.
//
// Each computes one row (or one head of a row) in a fixed order that depends on nothing but its inputs: an RMS
// norm's sum of squares is an 8-lane fused multiply-add chain and one hsum; the activations take exp from
// lanes.h (a polynomial, the same bits whatever the instruction set), never a library's vectorized exp.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "lanes.h"

namespace hvd_rows {

using hvd_lanes::exp8;
using hvd_lanes::hsum;

// y = w * (x / rms(x)); y may be x (each element is read before it is written).
inline void rmsnorm(const float* x, const float* w, float eps, int64_t H, float* y) {
  const int64_t H8 = H - H % 8;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t k = 0; k < H8; k += 8) {
    const __m256 v = _mm256_loadu_ps(x + k);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float ss = hsum(acc);
  for (int64_t k = H8; k < H; ++k) ss = std::fma(x[k], x[k], ss);
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(H) + eps);
  for (int64_t k = 0; k < H; ++k) y[k] = w[k] * (x[k] * r);
}

// rotate_half rope (HF layout) of one head: pairs (i, i + rot/2) for i < rot/2 at the position's angles, where
// rot = 2 * half is the rotary part of the head (the rest passes unchanged).
inline void rope(float* p, int64_t half, const float* cos, const float* sin) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = p[i], b = p[i + half];
    p[i] = a * cos[i] - b * sin[i];
    p[i + half] = b * cos[i] + a * sin[i];
  }
}

enum Activation : int { SILU = 0, GELU_TANH = 1 };

// out = silu(g) * u
inline void silu_mul(const float* g, const float* u, int64_t n, float* out) {
  int64_t k = 0;
#if defined(__AVX512F__)  // 16 lanes at a time, each lane the 8-lane operations
  const __m512 one16 = _mm512_set1_ps(1.0f);
  for (; k + 16 <= n; k += 16) {
    const __m512 gv = _mm512_loadu_ps(g + k);
    const __m512 sig = _mm512_div_ps(one16, _mm512_add_ps(one16, hvd_lanes::exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
    _mm512_storeu_ps(out + k, _mm512_mul_ps(_mm512_mul_ps(gv, sig), _mm512_loadu_ps(u + k)));
  }
#endif
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; k + 8 <= n; k += 8) {
    const __m256 gv = _mm256_loadu_ps(g + k);
    const __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
    _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + k)));
  }
  for (; k < n; ++k) out[k] = g[k] / (1.0f + std::exp(-g[k])) * u[k];
}

// gelu with the tanh approximation, times u: 0.5 g (1 + tanh(z)) = g * sigmoid(2 z), z = sqrt(2/pi) (g + 0.044715 g^3)
inline __m256 gelu_tanh8(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
  const __m256 inner = _mm256_add_ps(g, _mm256_mul_ps(_mm256_set1_ps(0.044715f), g3));
  const __m256 z2 = _mm256_mul_ps(_mm256_set1_ps(2.0f * 0.7978845608028654f), inner);  // 2 z
  const __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), z2))));
  return _mm256_mul_ps(g, sig);
}

inline void gelu_mul(const float* g, const float* u, int64_t n, float* out) {
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    _mm256_storeu_ps(out + k, _mm256_mul_ps(gelu_tanh8(_mm256_loadu_ps(g + k)), _mm256_loadu_ps(u + k)));
  if (k < n) {  // the tail through the same lanes, so every element has the same operations
    alignas(32) float gt[8] = {0}, r[8];
    for (int64_t j = k; j < n; ++j) gt[j - k] = g[j];
    _mm256_store_ps(r, gelu_tanh8(_mm256_load_ps(gt)));
    for (int64_t j = k; j < n; ++j) out[j] = r[j - k] * u[j];
  }
}

inline void gated(int act, const float* g, const float* u, int64_t n, float* out) {
  if (act == GELU_TANH) gelu_mul(g, u, n, out);
  else silu_mul(g, u, n, out);
}

}  // namespace hvd_rows

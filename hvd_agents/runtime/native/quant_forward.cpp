// hvd_quant: a llama-family decoder forward over quantized weights, for up to 64 new tokens at a time.
//
// Built for the CPU decode step and for verifying drafts (chains and trees): the whole forward runs
// in one call and one parallel region (team.h), so a step pays no per-layer Python work. Linear layers read
// their weights in GGUF's own blocks (Q4_1, Q8_0; Q4_0 and Q4_K are converted to these exactly at
// load) or in float32; quantized layers take their inputs quantized per block of 32 (int8 with a
// float scale, as llama.cpp's Q8 activations), so a block's dot product runs on integers.
//
// Batch invariance, the property speculative decoding needs to stay exactly the plain decode:
// every output element (a linear layer's, an attention row's, a norm's) is computed by one thread,
// in one fixed order that depends only on its own inputs, never on how many rows share the call,
// which tile holds it or which thread runs it. So a token's logits are bitwise the same decoded
// alone or verified among up to 64 draft tokens, in a chain or a tree.
//
// Compiled at first use by hvd_agents/runtime/native_build.py (AVX2, FMA, F16C on x86-64).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "team.h"

namespace {

enum Format : int { F32 = 0, Q4_1 = 1, Q8_0 = 2, Q4F = 3 };  // Q4F: Q4_1 with float32 scale and min
constexpr int64_t QK = 32;                                    // weights per block
constexpr int64_t kMaxRows = 64;                              // rows per call on this path

inline float f16(uint16_t h) { return _cvtsh_ss(h); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 sh = _mm_movehdup_ps(s);
  s = _mm_add_ps(s, sh);
  sh = _mm_movehl_ps(sh, s);
  return _mm_cvtss_f32(_mm_add_ss(s, sh));
}

// exp on 8 lanes (Cephes' polynomial, as in avx_mathfun); inputs clamped to [-88.37, 88.37].
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
  __m256 fx = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(0.5f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(0.693359375f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

// ---------------------------------------------------------------- weights

struct Matrix {
  int fmt = F32;
  int64_t N = 0, K = 0;  // y[N] = W[N, K] x[K]
  at::Tensor data;       // uint8 blocks (row-major, K / 32 blocks a row) or float32 [N, K]
  at::Tensor bias;       // float32 [N] or undefined
  int64_t row_bytes() const {
    switch (fmt) {
      case Q4_1: return K / QK * 20;
      case Q8_0: return K / QK * 34;
      case Q4F: return K / QK * 24;
      default: return K * 4;
    }
  }
  const uint8_t* row(int64_t n) const { return data.data_ptr<uint8_t>() + n * row_bytes(); }
  const float* frow(int64_t n) const { return data.data_ptr<float>() + n * K; }
  bool quantized() const { return fmt != F32; }
};

// A row's blocks are stored in groups of up to 8: the group's scales, then its minimums (Q4 kinds),
// then its blocks' weights (16 bytes of nibbles, or 32 int8). Same bytes as GGUF's blocks, reordered
// so that one load reads a group's scales.
inline int scale_bytes(int fmt) { return fmt == Q4F ? 4 : 2; }
inline bool has_min(int fmt) { return fmt != Q8_0; }
inline int payload_bytes(int fmt) { return fmt == Q8_0 ? 32 : 16; }
inline int block_bytes(int fmt) { return scale_bytes(fmt) * (has_min(fmt) ? 2 : 1) + payload_bytes(fmt); }

at::Tensor pack_groups(const Matrix& m) {
  const int fmt = m.fmt, SZ = scale_bytes(fmt), PB = payload_bytes(fmt), BB = block_bytes(fmt);
  const int64_t nb = m.K / QK, rb = nb * BB;
  at::Tensor out = at::empty_like(m.data);
  const uint8_t* src = m.data.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, m.N, 256, [&](int64_t a, int64_t b) {
    for (int64_t n = a; n < b; ++n) {
      for (int64_t g0 = 0; g0 < nb; g0 += 8) {
        const int64_t ng = std::min<int64_t>(8, nb - g0);
        uint8_t* grp = dst + n * rb + g0 * BB;
        for (int64_t j = 0; j < ng; ++j) {
          const uint8_t* blk = src + n * rb + (g0 + j) * BB;
          std::memcpy(grp + j * SZ, blk, SZ);
          if (has_min(fmt)) std::memcpy(grp + ng * SZ + j * SZ, blk + SZ, SZ);
          std::memcpy(grp + ng * SZ * (has_min(fmt) ? 2 : 1) + j * PB, blk + SZ * (has_min(fmt) ? 2 : 1), PB);
        }
      }
    }
  });
  return out;
}

Matrix make_matrix(int64_t fmt, int64_t N, int64_t K, at::Tensor data, c10::optional<at::Tensor> bias) {
  TORCH_CHECK(fmt >= F32 && fmt <= Q4F, "unknown weight format ", fmt);
  Matrix m;
  m.fmt = static_cast<int>(fmt);
  m.N = N;
  m.K = K;
  TORCH_CHECK(N > 0 && K > 0, "a weight needs rows and columns");
  if (m.fmt != F32) TORCH_CHECK(K % QK == 0, "quantized weights need columns in blocks of 32, not ", K);
  m.data = data.contiguous();
  if (m.fmt == F32) {
    TORCH_CHECK(m.data.scalar_type() == at::kFloat && m.data.numel() == N * K, "float32 weight must hold N * K values");
  } else {
    TORCH_CHECK(m.data.scalar_type() == at::kByte && m.data.numel() == N * m.row_bytes(),
                "quantized weight must hold ", N * m.row_bytes(), " bytes, not ", m.data.numel());
  }
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == N, "bias must be float32 with N values");
    m.bias = bias->contiguous();
  }
  if (m.fmt != F32) m.data = pack_groups(m);
  return m;
}

// ---------------------------------------------------------------- activations

// Rows quantized in blocks of 32: q = round(x / d), d = max|x| / 127, s = d * sum(q); (d, s) kept as a pair.
struct QRows {
  std::vector<int8_t> q;
  std::vector<float> ds;      // [rows][blocks][2]: d, s
  std::vector<float> dT, sT;  // [blocks][rows rounded up to 8]: the same d and s, rows side by side (zero past M)
  int64_t K = 0, nb = 0, Mp = 0;
  void resize(int64_t M, int64_t K_) {
    K = K_;
    nb = K_ / QK;
    Mp = (M + 7) / 8 * 8;
    q.resize(M * K_);
    ds.resize(M * nb * 2 + 16);  // padded: a group's pairs are read 16 floats at a time
    dT.assign(nb * Mp, 0.0f);
    sT.assign(nb * Mp, 0.0f);
  }
  float* pair(int64_t r, int64_t b) { return ds.data() + (r * nb + b) * 2; }
  const float* pair(int64_t r, int64_t b) const { return ds.data() + (r * nb + b) * 2; }
  void set(int64_t r, int64_t b, float d, float s) {
    ds[(r * nb + b) * 2] = d;
    ds[(r * nb + b) * 2 + 1] = s;
    dT[b * Mp + r] = d;
    sT[b * Mp + r] = s;
  }
};

void quantize_block(const float* xb, QRows& dst, int64_t r, int64_t b) {
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
  int32_t total = 0;
  for (int j = 0; j < 4; ++j) {
    __m256i qi = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], _mm256_set1_ps(id)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), qi);
    for (int t = 0; t < 8; ++t) {
      q[8 * j + t] = static_cast<int8_t>(lanes[t]);
      total += lanes[t];
    }
  }
  dst.set(r, b, db, db * static_cast<float>(total));
}

// row r's values [b0 * 32, b0 * 32 + K) as blocks b0, b0 + 1, ...
void quantize_row(const float* x, int64_t K, QRows& dst, int64_t r, int64_t b0 = 0) {
  for (int64_t b = 0; b < K / QK; ++b) quantize_block(x + b * QK, dst, r, b0 + b);
}

// ---------------------------------------------------------------- one weight row against input rows
//
// A row's dot product, in the one order every path below follows: per block, the integer dot of its
// weights with the row's int8 block (exact); per group of 8 blocks, p_j = (d_j * dx_j) * dot_j and
// q_j = m_j * sx_j, each summed over the group as ((0+1)+(2+3))+((4+5)+(6+7)) (missing blocks add
// zero); the groups' sums added in order into acc and macc; y = acc + macc (+ bias). One row alone
// keeps a group's blocks in the lanes of a vector; several rows keep rows in the lanes, so the same
// products and sums are computed whatever the number of rows.

inline __m256i q4_weights(const uint8_t* payload) {
  const __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(payload));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp), _mm256_set1_epi8(0x0F));
}

template <int FMT>
inline __m256i block_dot(const __m256i w, const int8_t* xb) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb));
  const __m256i ones = _mm256_set1_epi16(1);
  if (FMT == Q8_0) return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w)), ones);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), ones);
}

template <int FMT>
inline __m256i load_weights(const uint8_t* payload) {
  if (FMT == Q8_0) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(payload));
  return q4_weights(payload);
}

// lane i = the (exact) sum of v[i]'s lanes
inline __m256i sum8_epi32(const __m256i* v) {
  const __m256i a01 = _mm256_hadd_epi32(v[0], v[1]), a23 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i a45 = _mm256_hadd_epi32(v[4], v[5]), a67 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i b0 = _mm256_hadd_epi32(a01, a23), b1 = _mm256_hadd_epi32(a45, a67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20), _mm256_permute2x128_si256(b0, b1, 0x31));
}

// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) of one vector's lanes
inline float tree8(__m256 v) {
  const __m256 t = _mm256_hadd_ps(v, v);  // l0+l1, l2+l3 | l4+l5, l6+l7
  const __m256 u = _mm256_hadd_ps(t, t);  // (l0+l1)+(l2+l3) | (l4+l5)+(l6+l7)
  return _mm_cvtss_f32(_mm256_castps256_ps128(u)) + _mm_cvtss_f32(_mm256_extractf128_ps(u, 1));
}

// the same sums lane by lane over 8 vectors
inline __m256 tree8v(const __m256* p) {
  return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(p[0], p[1]), _mm256_add_ps(p[2], p[3])),
                       _mm256_add_ps(_mm256_add_ps(p[4], p[5]), _mm256_add_ps(p[6], p[7])));
}

// n float scales (float16 or float32) as 8 lanes, zero past n
template <int FMT>
inline __m256 load_scales(const uint8_t* p, int64_t n) {
  if (FMT == Q4F) {
    alignas(32) float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(f, p, n * 4);
    return _mm256_load_ps(f);
  }
  alignas(16) uint16_t h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::memcpy(h, p, n * 2);
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h)));
}

template <int FMT>
inline float scale_at(const uint8_t* p, int64_t j) {
  if (FMT == Q4F) { float f; std::memcpy(&f, p + 4 * j, 4); return f; }
  uint16_t h;
  std::memcpy(&h, p + 2 * j, 2);
  return f16(h);
}

struct Group {  // where a group's scales, minimums and weights are
  const uint8_t *d, *m, *w;
  int64_t n;
};

template <int FMT>
inline Group group_at(const uint8_t* row, int64_t nb, int64_t g0) {
  constexpr int SZ = FMT == Q4F ? 4 : 2, BB = FMT == Q8_0 ? 34 : (FMT == Q4F ? 24 : 20);
  constexpr int NS = FMT == Q8_0 ? 1 : 2;
  const int64_t n = std::min<int64_t>(8, nb - g0);
  const uint8_t* g = row + g0 * BB;
  return Group{g, g + n * SZ, g + n * SZ * NS, n};
}

// one input row (x: its int8 values; ds: its (d, s) pairs)
template <int FMT>
inline float dot1(const uint8_t* row, int64_t nb, const int8_t* x, const float* ds) {
  constexpr int PB = FMT == Q8_0 ? 32 : 16;
  float acc = 0.0f, macc = 0.0f;
  for (int64_t g0 = 0; g0 < nb; g0 += 8) {
    const Group g = group_at<FMT>(row, nb, g0);
    __m256i v[8];
    __m256 D, M, DX, SX;
    if (g.n == 8) {
      for (int64_t j = 0; j < 8; ++j) v[j] = block_dot<FMT>(load_weights<FMT>(g.w + j * PB), x + (g0 + j) * QK);
      if (FMT == Q4F) {
        D = _mm256_loadu_ps(reinterpret_cast<const float*>(g.d));
        M = _mm256_loadu_ps(reinterpret_cast<const float*>(g.m));
      } else {
        D = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g.d)));
        M = FMT == Q8_0 ? _mm256_setzero_ps() : _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g.m)));
      }
      const __m256 a = _mm256_loadu_ps(ds + 2 * g0), b = _mm256_loadu_ps(ds + 2 * g0 + 8);  // d0 s0 d1 s1 ...
      DX = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
      SX = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
    } else {
      alignas(32) float dx[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t j = 0; j < 8; ++j)
        v[j] = j < g.n ? block_dot<FMT>(load_weights<FMT>(g.w + j * PB), x + (g0 + j) * QK) : _mm256_setzero_si256();
      for (int64_t j = 0; j < g.n; ++j) {
        dx[j] = ds[2 * (g0 + j)];
        sx[j] = ds[2 * (g0 + j) + 1];
      }
      D = load_scales<FMT>(g.d, g.n);
      M = FMT == Q8_0 ? _mm256_setzero_ps() : load_scales<FMT>(g.m, g.n);
      DX = _mm256_load_ps(dx);
      SX = _mm256_load_ps(sx);
    }
    const __m256 F = _mm256_cvtepi32_ps(sum8_epi32(v));
    acc += tree8(_mm256_mul_ps(_mm256_mul_ps(D, DX), F));
    if (FMT != Q8_0) macc += tree8(_mm256_mul_ps(M, SX));
  }
  return acc + macc;
}

// MR input rows (2..8) at once, rows in lanes (x: the first row's int8 values, rows K apart;
// dT, sT: the rows' d and s, 8 lanes a block, zero past MR)
template <int FMT, int MR>
inline void dotN(const uint8_t* row, int64_t nb, const int8_t* x, int64_t K, const float* dT, const float* sT, int64_t Mp, float* out) {
  constexpr int PB = FMT == Q8_0 ? 32 : 16;
  __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
  const int64_t groups = (nb + 7) / 8;
  for (int64_t step = 0; step < groups; ++step) {
#ifdef HVD_MUTATE_MULTIROW_ORDER  // for the tests only: multi-row calls add the groups in reverse
    const int64_t g0 = (groups - 1 - step) * 8;
#else
    const int64_t g0 = step * 8;
#endif
    const Group g = group_at<FMT>(row, nb, g0);
    __m256 P[8], Q[8];
    for (int64_t j = 0; j < 8; ++j) {
      if (j >= g.n) { P[j] = Q[j] = _mm256_setzero_ps(); continue; }
      const int64_t b = g0 + j;
      const __m256i w = load_weights<FMT>(g.w + j * PB);
      __m256i v[8];
      for (int i = 0; i < 8; ++i) v[i] = i < MR ? block_dot<FMT>(w, x + i * K + b * QK) : _mm256_setzero_si256();
      const __m256 F = _mm256_cvtepi32_ps(sum8_epi32(v));
      P[j] = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(scale_at<FMT>(g.d, j)), _mm256_loadu_ps(dT + b * Mp)), F);
      Q[j] = FMT != Q8_0 ? _mm256_mul_ps(_mm256_set1_ps(scale_at<FMT>(g.m, j)), _mm256_loadu_ps(sT + b * Mp)) : _mm256_setzero_ps();
    }
    acc = _mm256_add_ps(acc, tree8v(P));
    macc = _mm256_add_ps(macc, tree8v(Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(acc, macc));
  for (int i = 0; i < MR; ++i) out[i] = lanes[i];
}

// float32: 8 lanes along k, then the lanes, then the tail.
template <int MR>
inline void dot_f32(const float* w, int64_t K, const float* x, int64_t r0, float* out) {
  const int64_t K8 = K - K % 8;
  __m256 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    const __m256 wv = _mm256_loadu_ps(w + k);
    for (int i = 0; i < MR; ++i) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (r0 + i) * K + k), wv, acc[i]);
  }
  for (int i = 0; i < MR; ++i) {
    float s = hsum(acc[i]);
    for (int64_t k = K8; k < K; ++k) s = std::fma(x[(r0 + i) * K + k], w[k], s);
    out[i] = s;
  }
}

template <int FMT, int MR>
void tile_rows(const Matrix& W, int64_t n0, int64_t n1, const QRows& xq, int64_t r0, const float* bias, float* y,
               int64_t ld, int64_t col0) {
  const int64_t nb = W.K / QK;
  float out[8];
  for (int64_t n = n0; n < n1; ++n) {
    if (MR == 1) out[0] = dot1<FMT>(W.row(n), nb, xq.q.data() + r0 * xq.K, xq.pair(r0, 0));
    else dotN<FMT, MR>(W.row(n), nb, xq.q.data() + r0 * xq.K, xq.K, xq.dT.data() + r0, xq.sT.data() + r0, xq.Mp, out);
    for (int i = 0; i < MR; ++i) y[(r0 + i) * ld + col0 + n] = bias ? out[i] + bias[n] : out[i];
  }
}

template <int FMT>
void quant_rows(const Matrix& W, int64_t n0, int64_t n1, const QRows& xq, int64_t M, const float* bias, float* y,
                int64_t ld, int64_t col0) {
  for (int64_t r0 = 0; r0 < M; r0 += 8) {
    switch (std::min<int64_t>(8, M - r0)) {
      case 1: tile_rows<FMT, 1>(W, n0, n1, xq, r0, bias, y, ld, col0); break;
      case 2: tile_rows<FMT, 2>(W, n0, n1, xq, r0, bias, y, ld, col0); break;
      case 3: tile_rows<FMT, 3>(W, n0, n1, xq, r0, bias, y, ld, col0); break;
      case 4: tile_rows<FMT, 4>(W, n0, n1, xq, r0, bias, y, ld, col0); break;
      case 5: tile_rows<FMT, 5>(W, n0, n1, xq, r0, bias, y, ld, col0); break;
      case 6: tile_rows<FMT, 6>(W, n0, n1, xq, r0, bias, y, ld, col0); break;
      case 7: tile_rows<FMT, 7>(W, n0, n1, xq, r0, bias, y, ld, col0); break;
      default: tile_rows<FMT, 8>(W, n0, n1, xq, r0, bias, y, ld, col0); break;
    }
  }
}

// y[r, col0 + n] = W[n] . x[r] (+ bias) for rows [0, M), weight rows [n0, n1).
void rows_block(const Matrix& W, int64_t n0, int64_t n1, const QRows& xq, const float* xf, int64_t M, float* y,
                int64_t ld, int64_t col0) {
  const float* bias = W.bias.defined() ? W.bias.data_ptr<float>() : nullptr;
  switch (W.fmt) {
    case Q4_1: quant_rows<Q4_1>(W, n0, n1, xq, M, bias, y, ld, col0); return;
    case Q4F: quant_rows<Q4F>(W, n0, n1, xq, M, bias, y, ld, col0); return;
    case Q8_0: quant_rows<Q8_0>(W, n0, n1, xq, M, bias, y, ld, col0); return;
    default: break;
  }
  float out[4];
  for (int64_t n = n0; n < n1; ++n) {
    int64_t r = 0;
    for (; r + 4 <= M; r += 4) {
      dot_f32<4>(W.frow(n), W.K, xf, r, out);
      for (int i = 0; i < 4; ++i) y[(r + i) * ld + col0 + n] = bias ? out[i] + bias[n] : out[i];
    }
    const int64_t left = M - r;
    if (left == 3) dot_f32<3>(W.frow(n), W.K, xf, r, out);
    if (left == 2) dot_f32<2>(W.frow(n), W.K, xf, r, out);
    if (left == 1) dot_f32<1>(W.frow(n), W.K, xf, r, out);
    for (int i = 0; i < left; ++i) y[(r + i) * ld + col0 + n] = bias ? out[i] + bias[n] : out[i];
  }
}

// Several weights that read the same input, written side by side into y [M, ld]; inside a team's region.
// Threads split the weights' rows statically (each output element is computed by one thread).
void multi_linear(hvd_team::Ctx& c, const std::vector<const Matrix*>& Ws, const QRows& xq, const float* xf, int64_t M,
                  float* y, int64_t ld) {
  int64_t total = 0;
  for (const Matrix* W : Ws) total += W->N;
  const int64_t tile = 8;
  const int64_t tiles = (total + tile - 1) / tile;
  c.for_static(tiles, [&](int64_t t) {
    int64_t a = t * tile, b = std::min(total, a + tile), col0 = 0;
    for (const Matrix* W : Ws) {
      const int64_t lo = std::max(a, col0), hi = std::min(b, col0 + W->N);
      if (lo < hi) rows_block(*W, lo - col0, hi - col0, xq, xf, M, y, ld, col0);
      col0 += W->N;
    }
  });
}

// ---------------------------------------------------------------- small row operations

void rmsnorm(const float* x, const float* w, float eps, int64_t H, float* y) {
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

// rotate_half rope (HF layout): pairs (i, i + hd/2) at the position's angles.
void rope(float* v, int64_t heads, int64_t hd, const float* cos, const float* sin) {
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* p = v + h * hd;
    for (int64_t i = 0; i < half; ++i) {
      const float a = p[i], b = p[i + half];
      p[i] = a * cos[i] - b * sin[i];
      p[i + half] = b * cos[i] + a * sin[i];
    }
  }
}

void silu_mul(const float* g, const float* u, int64_t n, float* out) {
  int64_t k = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; k + 8 <= n; k += 8) {
    const __m256 gv = _mm256_loadu_ps(g + k);
    const __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
    _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + k)));
  }
  for (; k < n; ++k) out[k] = g[k] / (1.0f + std::exp(-g[k])) * u[k];
}

// ---------------------------------------------------------------- attention

// One query row of one head over the visible positions `slots` (in cache order) of one kv head.
// Keys and values are float16 [cap, hd]. scores: scratch of at least len(slots) rounded up to 8.
void attend(const float* q, const at::Half* K, const at::Half* V, int64_t hd, const int32_t* slots, int64_t T,
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
  float mx = -INFINITY;
  for (int64_t t = 0; t < T; ++t) mx = std::max(mx, scores[t]);
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
  const float inv = 1.0f / hsum(sum);
  __m256 acc[16];  // head_dim up to 128
  const int64_t lanes = hd / 8;
  for (int64_t i = 0; i < lanes; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t t = 0; t < T; ++t) {
    const uint16_t* v = reinterpret_cast<const uint16_t*>(V + static_cast<int64_t>(slots[t]) * hd);
    const __m256 p = _mm256_set1_ps(scores[t]);
    for (int64_t i = 0; i < lanes; ++i)
      acc[i] = _mm256_fmadd_ps(p, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 8 * i))), acc[i]);
  }
  const __m256 iv = _mm256_set1_ps(inv);
  for (int64_t i = 0; i < lanes; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(acc[i], iv));
}

// ---------------------------------------------------------------- the model

struct Layer {
  at::Tensor attn_norm, ffn_norm;
  Matrix q, k, v, o, gate, up, down;
};

class QuantModel {
 public:
  QuantModel(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t intermediate, double eps,
             at::Tensor cos, at::Tensor sin, Matrix embed, at::Tensor final_norm, Matrix output)
      : H_(hidden), nh_(heads), nkv_(kv_heads), hd_(head_dim), I_(intermediate), eps_(static_cast<float>(eps)),
        cos_(cos.contiguous()), sin_(sin.contiguous()), embed_(std::move(embed)), norm_(final_norm.contiguous()),
        out_(std::move(output)) {
    TORCH_CHECK(hd_ % 8 == 0 && hd_ <= 128, "head_dim must be a multiple of 8 up to 128, not ", hd_);
    TORCH_CHECK(nh_ % nkv_ == 0, "attention heads must be a multiple of kv heads");
    TORCH_CHECK(cos_.dim() == 2 && cos_.size(1) == hd_ / 2 && sin_.sizes() == cos_.sizes(), "rope tables must be [positions, head_dim / 2]");
    TORCH_CHECK(embed_.K == H_ && out_.K == H_, "embedding and output weights must have hidden-size columns");
  }

  void add_layer(at::Tensor attn_norm, at::Tensor ffn_norm, Matrix q, Matrix k, Matrix v, Matrix o, Matrix gate,
                 Matrix up, Matrix down) {
    TORCH_CHECK(q.K == H_ && k.K == H_ && v.K == H_ && gate.K == H_ && up.K == H_, "layer weights must read hidden-size inputs");
    TORCH_CHECK(q.N == nh_ * hd_ && k.N == nkv_ * hd_ && v.N == nkv_ * hd_ && o.K == nh_ * hd_ && o.N == H_, "attention shapes disagree with the heads");
    TORCH_CHECK(gate.N == I_ && up.N == I_ && down.K == I_ && down.N == H_, "MLP shapes disagree with the intermediate size");
    layers_.push_back(Layer{attn_norm.contiguous(), ffn_norm.contiguous(), std::move(q), std::move(k), std::move(v),
                            std::move(o), std::move(gate), std::move(up), std::move(down)});
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  int64_t vocab() const { return out_.N; }

  // tokens, positions: int64 [M]; visible: bool [M, M] (row i sees new row j) or an empty tensor for a chain;
  // kc, vc: float16 [layers, kv_heads, cap, head_dim], positions [0, past) filled; rows are written at past + i.
  // Returns (logits of the last `keep` rows [keep, vocab], normed hidden states [M, hidden] or empty).
  std::vector<at::Tensor> forward(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& visible,
                                  at::Tensor kc, at::Tensor vc, int64_t past, int64_t keep, bool want_hidden) {
    const int64_t M = tokens.numel();
    return forward_batch(tokens, positions, visible, {0, M}, {kc}, {vc}, {past}, keep, want_hidden);
  }

  // Several sequences in one forward: sequence b owns rows [starts[b], starts[b + 1]) and its own cache
  // (kcs[b], vcs[b], with pasts[b] positions filled); its rows see its cached positions and, among the new
  // rows, only its own (visible, when given, is [M, M] and read within each sequence's block). Every row's
  // arithmetic is the one it has alone, so a sequence's logits do not depend on the others in the call.
  // keep counts the last rows of the whole call whose logits are returned.
  std::vector<at::Tensor> forward_batch(const at::Tensor& tokens, const at::Tensor& positions,
                                        const at::Tensor& visible, std::vector<int64_t> starts,
                                        std::vector<at::Tensor> kcs, std::vector<at::Tensor> vcs,
                                        std::vector<int64_t> pasts, int64_t keep, bool want_hidden) {
    const int64_t M = tokens.numel();
    TORCH_CHECK(M >= 1 && M <= kMaxRows, "this path takes 1 to ", kMaxRows, " tokens, not ", M);
    TORCH_CHECK(keep >= 1 && keep <= M, "keep must be in 1..", M);
    const int64_t B = static_cast<int64_t>(kcs.size());
    TORCH_CHECK(B >= 1 && static_cast<int64_t>(vcs.size()) == B && static_cast<int64_t>(pasts.size()) == B &&
                static_cast<int64_t>(starts.size()) == B + 1, "one cache, one length and one row range per sequence");
    TORCH_CHECK(starts[0] == 0 && starts[B] == M, "sequence rows must cover the call's rows");
    std::vector<int64_t> seq_of(M), caps(B);
    std::vector<at::Half*> kbases(B), vbases(B);
    for (int64_t b = 0; b < B; ++b) {
      const at::Tensor& kc = kcs[b];
      const at::Tensor& vc = vcs[b];
      TORCH_CHECK(starts[b + 1] > starts[b], "sequence ", b, " has no rows");
      TORCH_CHECK(kc.scalar_type() == at::kHalf && vc.scalar_type() == at::kHalf && kc.is_contiguous() && vc.is_contiguous(), "KV must be contiguous float16");
      TORCH_CHECK(kc.dim() == 4 && kc.size(0) == num_layers() && kc.size(1) == nkv_ && kc.size(3) == hd_ && vc.sizes() == kc.sizes(), "KV shape disagrees with the model");
      caps[b] = kc.size(2);
      const int64_t rows = starts[b + 1] - starts[b];
      TORCH_CHECK(pasts[b] >= 0 && pasts[b] + rows <= caps[b], "KV has room for ", caps[b], " positions, not ", pasts[b] + rows);
      for (int64_t r = starts[b]; r < starts[b + 1]; ++r) seq_of[r] = b;
      kbases[b] = kc.data_ptr<at::Half>();
      vbases[b] = vc.data_ptr<at::Half>();
    }
    const at::Tensor tok = tokens.to(at::kLong).contiguous(), pos = positions.to(at::kLong).contiguous();
    const int64_t* tp = tok.data_ptr<int64_t>();
    const int64_t* pp = pos.data_ptr<int64_t>();
    for (int64_t i = 0; i < M; ++i) {
      TORCH_CHECK(tp[i] >= 0 && tp[i] < embed_.N, "token id ", tp[i], " is outside the vocabulary");
      TORCH_CHECK(pp[i] >= 0 && pp[i] < cos_.size(0), "position ", pp[i], " is outside the rope table");
    }
    // visible slots per row: its sequence's cached positions, then the new rows of its sequence it sees
    std::vector<std::vector<int32_t>> slots(M);
    const bool tree = visible.defined() && visible.numel() > 0;
    at::Tensor vis;
    if (tree) {
      vis = visible.to(at::kBool).contiguous();
      TORCH_CHECK(vis.dim() == 2 && vis.size(0) == M && vis.size(1) == M, "visible must be [M, M]");
    }
    int64_t longest = 0;
    for (int64_t r = 0; r < M; ++r) {
      const int64_t b = seq_of[r], s0 = starts[b], past = pasts[b], i = r - s0;
      slots[r].reserve(past + i + 1);
      for (int64_t t = 0; t < past; ++t) slots[r].push_back(static_cast<int32_t>(t));
      for (int64_t j = 0; j <= i; ++j)
        if (!tree || j == i || vis.data_ptr<bool>()[r * M + s0 + j]) slots[r].push_back(static_cast<int32_t>(past + j));
      longest = std::max(longest, static_cast<int64_t>(slots[r].size()));
    }
    const int64_t H = H_, qd = nh_ * hd_, kd = nkv_ * hd_, I = I_;
    std::vector<float> x(M * H), xn(M * H), qkv(M * (qd + 2 * kd)), att(M * qd), tmp(M * H), gu(M * 2 * I), act(M * I);
    const int64_t smax = (longest + 7) / 8 * 8;
    const int nt = std::max(1, at::get_num_threads());
    std::vector<float> scores(static_cast<size_t>(nt) * smax);
    QRows qx, qa, qf, qo;
    qx.resize(M, H);
    qo.resize(keep, H);
    qa.resize(M, qd);
    qf.resize(M, I);
    at::Tensor logits = at::empty({keep, out_.N}, at::kFloat);
    at::Tensor hidden = want_hidden ? at::empty({M, H}, at::kFloat) : at::Tensor();
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
    const int64_t group = nh_ / nkv_;
    const int64_t half = hd_ / 2;

    const bool attn_blocks = hd_ % QK == 0;  // an attention head's output is whole blocks: its job quantizes them
    const int64_t qkv_ld = qd + 2 * kd;

    // Seven phases a layer, one barrier each; every output element is computed by one thread.
    hvd_team::team().run(nt, [&](hvd_team::Ctx& c) {
      c.for_static(M, [&](int64_t r) { embed_row(tp[r], x.data() + r * H); });
      for (size_t l = 0; l < layers_.size(); ++l) {
        const Layer& L = layers_[l];
        const bool qin = L.q.quantized() || L.k.quantized() || L.v.quantized();
        // 1. norm (after the previous layer's MLP residual) and the inputs' blocks
        c.for_static(M, [&](int64_t r) {
          if (l > 0) for (int64_t k = 0; k < H; ++k) x[r * H + k] += tmp[r * H + k];
          rmsnorm(x.data() + r * H, L.attn_norm.data_ptr<float>(), eps_, H, xn.data() + r * H);
          if (qin) quantize_row(xn.data() + r * H, H, qx, r);
        });
        // 2. query, key and value heads, one head a job: project, rope, and write keys and values to the cache
        c.for_static(nh_ + 2 * nkv_, [&](int64_t job) {
          const Matrix& W = job < nh_ ? L.q : (job < nh_ + nkv_ ? L.k : L.v);
          const int64_t head = job < nh_ ? job : (job < nh_ + nkv_ ? job - nh_ : job - nh_ - nkv_);
          const int64_t col0 = job < nh_ ? 0 : (job < nh_ + nkv_ ? qd : qd + kd);
          rows_block(W, head * hd_, (head + 1) * hd_, qx, xn.data(), M, qkv.data(), qkv_ld, col0);
          for (int64_t r = 0; r < M; ++r) {
            float* v = qkv.data() + r * qkv_ld + col0 + head * hd_;
            if (job < nh_ + nkv_) rope(v, 1, hd_, cos_.data_ptr<float>() + pp[r] * half, sin_.data_ptr<float>() + pp[r] * half);
            if (job >= nh_) {
              const int64_t b = seq_of[r], cap = caps[b];
              const int64_t lbase = static_cast<int64_t>(l) * nkv_ * cap * hd_;
              at::Half* dst = (job < nh_ + nkv_ ? kbases[b] : vbases[b]) + lbase + (head * cap + pasts[b] + r - starts[b]) * hd_;
              for (int64_t i = 0; i < hd_; ++i) dst[i] = static_cast<at::Half>(v[i]);
            }
          }
        });
        // 3. attention, one (row, head) a job, each quantizing its own output blocks
        c.for_dynamic(M * nh_, [&](int64_t job) {
          const int64_t r = job / nh_, h = job % nh_, g = h / group;
          const int64_t b = seq_of[r], cap = caps[b];
          const int64_t lbase = static_cast<int64_t>(l) * nkv_ * cap * hd_;
          float* o = att.data() + r * qd + h * hd_;
          attend(qkv.data() + r * qkv_ld + h * hd_, kbases[b] + lbase + g * cap * hd_, vbases[b] + lbase + g * cap * hd_, hd_,
                 slots[r].data(), static_cast<int64_t>(slots[r].size()), scale, scores.data() + c.tid * smax, o);
          if (L.o.quantized() && attn_blocks) {
            const int64_t b0 = h * hd_ / QK;
            quantize_row(o, hd_, qa, r, b0);
          }
        });
        if (L.o.quantized() && !attn_blocks)
          c.for_static(M, [&](int64_t r) { quantize_row(att.data() + r * qd, qd, qa, r); });
        // 4. output projection
        multi_linear(c, {&L.o}, qa, att.data(), M, tmp.data(), H);
        // 5. residual, norm, the MLP inputs' blocks
        const bool gin = L.gate.quantized() || L.up.quantized();
        c.for_static(M, [&](int64_t r) {
          for (int64_t k = 0; k < H; ++k) x[r * H + k] += tmp[r * H + k];
          rmsnorm(x.data() + r * H, L.ffn_norm.data_ptr<float>(), eps_, H, xn.data() + r * H);
          if (gin) quantize_row(xn.data() + r * H, H, qx, r);
        });
        // 6. gate and up, 32 columns a job, then silu(gate) * up and its blocks
        const bool din = L.down.quantized() && I % QK == 0;
        c.for_static((I + QK - 1) / QK, [&](int64_t b) {
          const int64_t c0 = b * QK, c1 = std::min(I, c0 + QK);
          rows_block(L.gate, c0, c1, qx, xn.data(), M, gu.data(), 2 * I, 0);
          rows_block(L.up, c0, c1, qx, xn.data(), M, gu.data(), 2 * I, I);
          for (int64_t r = 0; r < M; ++r) {
            silu_mul(gu.data() + r * 2 * I + c0, gu.data() + r * 2 * I + I + c0, c1 - c0, act.data() + r * I + c0);
            if (din) quantize_block(act.data() + r * I + c0, qf, r, b);
          }
        });
        if (L.down.quantized() && !din)
          c.for_static(M, [&](int64_t r) { quantize_row(act.data() + r * I, I, qf, r); });
        // 7. down projection (its residual is added in the next layer's first phase)
        multi_linear(c, {&L.down}, qf, act.data(), M, tmp.data(), H);
      }
      const int64_t first = M - keep;
      c.for_static(M, [&](int64_t r) {
        for (int64_t k = 0; k < H; ++k) x[r * H + k] += tmp[r * H + k];
        rmsnorm(x.data() + r * H, norm_.data_ptr<float>(), eps_, H, xn.data() + r * H);
        if (want_hidden) std::memcpy(hidden.data_ptr<float>() + r * H, xn.data() + r * H, H * sizeof(float));
        if (out_.quantized() && r >= first)
          quantize_row(xn.data() + r * H, H, qo, r - first);
      });
      multi_linear(c, {&out_}, qo, xn.data() + first * H, keep, logits.data_ptr<float>(), out_.N);
    });
    return {logits, want_hidden ? hidden : at::empty({0}, at::kFloat)};
  }

  void embed_row(int64_t t, float* y) const { dequantize_row(embed_, t, y); }

  static void dequantize_row(const Matrix& W, int64_t n, float* y) {
    const int64_t nb = W.K / QK;
    switch (W.fmt) {
      case Q4_1: dequantize_groups<Q4_1>(W.row(n), nb, y); break;
      case Q4F: dequantize_groups<Q4F>(W.row(n), nb, y); break;
      case Q8_0: dequantize_groups<Q8_0>(W.row(n), nb, y); break;
      default: std::memcpy(y, W.frow(n), W.K * sizeof(float));
    }
  }

  template <int FMT>
  static void dequantize_groups(const uint8_t* row, int64_t nb, float* y) {
    constexpr int PB = FMT == Q8_0 ? 32 : 16;
    for (int64_t g0 = 0; g0 < nb; g0 += 8) {
      const Group g = group_at<FMT>(row, nb, g0);
      for (int64_t j = 0; j < g.n; ++j) {
        const float d = scale_at<FMT>(g.d, j);
        const uint8_t* p = g.w + j * PB;
        float* out = y + (g0 + j) * QK;
        if (FMT == Q8_0) {
          for (int t = 0; t < 32; ++t) out[t] = d * static_cast<float>(static_cast<int8_t>(p[t]));
        } else {
          const float m = scale_at<FMT>(g.m, j);
          for (int t = 0; t < 16; ++t) {
            out[t] = d * static_cast<float>(p[t] & 0x0F) + m;
            out[16 + t] = d * static_cast<float>(p[t] >> 4) + m;
          }
        }
      }
    }
  }

 private:
  int64_t H_, nh_, nkv_, hd_, I_;
  float eps_;
  at::Tensor cos_, sin_;
  Matrix embed_;
  at::Tensor norm_;
  Matrix out_;
  std::vector<Layer> layers_;
};

// y = x W^T (+ bias) for 1..64 float32 rows on the kernel the forward uses (inputs quantized per block
// for quantized weights): what the batch-invariance tests call directly.
at::Tensor linear(const Matrix& W, const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) == W.K, "x must be float32 [M, ", W.K, "]");
  const at::Tensor xs = x.contiguous();
  const int64_t M = xs.size(0);
  TORCH_CHECK(M >= 1 && M <= kMaxRows, "linear takes 1 to ", kMaxRows, " rows, not ", M);
  at::Tensor y = at::empty({M, W.N}, at::kFloat);
  QRows q;
  if (W.quantized()) {
    q.resize(M, W.K);
    for (int64_t r = 0; r < M; ++r)
      quantize_row(xs.data_ptr<float>() + r * W.K, W.K, q, r);
  }
  const int nt = std::max(1, at::get_num_threads());
  hvd_team::team().run(nt, [&](hvd_team::Ctx& c) { multi_linear(c, {&W}, q, xs.data_ptr<float>(), M, y.data_ptr<float>(), W.N); });
  return y;
}

// The weight as float32 [N, K] (prefill runs dense products on it).
at::Tensor dequantize(const Matrix& W) {
  at::Tensor y = at::empty({W.N, W.K}, at::kFloat);
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, W.N, 64, [&](int64_t a, int64_t b) {
    for (int64_t n = a; n < b; ++n) QuantModel::dequantize_row(W, n, yp + n * W.K);
  });
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Matrix>(m, "Matrix")
      .def(py::init(&make_matrix), py::arg("fmt"), py::arg("rows"), py::arg("cols"), py::arg("data"), py::arg("bias") = py::none())
      .def_property_readonly("fmt", [](const Matrix& w) { return w.fmt; })
      .def_property_readonly("rows", [](const Matrix& w) { return w.N; })
      .def_property_readonly("cols", [](const Matrix& w) { return w.K; })
      .def_property_readonly("nbytes", [](const Matrix& w) { return w.N * w.row_bytes(); });
  py::class_<QuantModel>(m, "QuantModel")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, at::Tensor, at::Tensor, Matrix, at::Tensor, Matrix>())
      .def("add_layer", &QuantModel::add_layer)
      .def("forward", &QuantModel::forward, py::call_guard<py::gil_scoped_release>())
      .def("forward_batch", &QuantModel::forward_batch, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("num_layers", &QuantModel::num_layers)
      .def_property_readonly("vocab", &QuantModel::vocab);
  m.def("linear", &linear, py::call_guard<py::gil_scoped_release>());
  m.def("dequantize", &dequantize, py::call_guard<py::gil_scoped_release>());
  m.attr("MAX_ROWS") = kMaxRows;
}

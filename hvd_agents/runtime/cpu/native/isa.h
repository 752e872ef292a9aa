// hvd_isa: the vector operations of the quantized linear kernel (tile_linear.h) and of attention (attention.h),
// one set per instruction set.
//
// The native forward is compiled once per path (hvd_agents/runtime/cpu/native_forward.py): AVX2 (every x86-64 CPU
// it runs on), AVX-512 with VNNI where the CPU has it, and AMX: the AVX-512 VNNI code, with the integer block
// dots of passes of many rows on AMX-INT8 tiles (amx.h). Every path computes every output element with the
// same integer block dots (exact, whatever instructions add them up) and the same float operations in the same
// order: a vector here is NT = 16 lanes, one weight row a lane, held in one 512-bit register or two 256-bit ones,
// and every float operation is lane-wise. So the paths' results are bitwise the same; a test checks it on
// every path the CPU runs, and each path other than AVX2 is enabled on a machine only after the same check.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace hvd_isa {

constexpr int NT = 16;  // lanes of a vector: the weight rows of a tile

inline int32_t word(const int8_t* p) {  // four int8 values as one 32-bit word
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

constexpr const char* kVectorName = "avx512-vnni";
using VI = __m512i;  // 16 int32 lanes
using VF = __m512;   // 16 float lanes

inline VI i_zero() { return _mm512_setzero_si512(); }
inline VI i_load(const void* p) { return _mm512_loadu_si512(p); }
inline void i_store(int32_t* p, VI v) { _mm512_storeu_si512(p, v); }
// 4-bit weights of 16 rows (a word of 4 bytes each: nibbles of 4 consecutive and 4 later positions)
inline VI i_lo(VI w) { return _mm512_and_si512(w, _mm512_set1_epi8(0x0F)); }
inline VI i_hi(VI w) { return _mm512_and_si512(_mm512_srli_epi16(w, 4), _mm512_set1_epi8(0x0F)); }
// acc + the dot of each lane's 4 unsigned weights with the 4 int8 values of x (exact)
inline VI i_dot_u(VI acc, VI w, const int8_t* x) { return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(word(x))); }
// acc + the dots of N words of unsigned weights w[0..N) with the int8 values at x, x + 4, ... (exact): one
// instruction a word here; G (how many words the AVX2 code may sum in 16 bits) is not needed
template <int N, int G>
inline VI i_dots_u(VI acc, const VI* w, const int8_t* x) {
  for (int k = 0; k < N; ++k) acc = i_dot_u(acc, w[k], x + 4 * k);
  return acc;
}
// signed weights: (w + 128) as unsigned, the 128 * sum(x) taken back once a block (i_signed_fix)
inline VI i_prep_s(VI w) { return _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80))); }
inline VI i_dot_s(VI acc, VI w_prepped, const int8_t* x) { return i_dot_u(acc, w_prepped, x); }
// what i_dots_s reads besides the prepared words: nothing here
inline VI i_abs_s(VI w) { return w; }
// acc + the dots of N prepared signed words w[0..N) with the int8 values at x, x + 4, ...
template <int N>
inline VI i_dots_s(VI acc, const VI* w, const VI*, const int8_t* x) {
  for (int k = 0; k < N; ++k) acc = i_dot_s(acc, w[k], x + 4 * k);
  return acc;
}
inline VI i_signed_fix(VI acc, int32_t xsum) { return _mm512_sub_epi32(acc, _mm512_set1_epi32(128 * xsum)); }
// acc - v in every lane (an offset's share of a dot taken back: exact)
inline VI i_sub1(VI acc, int32_t v) { return _mm512_sub_epi32(acc, _mm512_set1_epi32(v)); }
// each 32-bit lane shifted left by S bits (right by -S)
template <int S>
inline VI i_shift(VI v) {
  if constexpr (S > 0) return _mm512_slli_epi32(v, S);
  else if constexpr (S < 0) return _mm512_srli_epi32(v, -S);
  else return v;
}
// w | (i_shift<S>(plane) & mask), byte by byte: the high bits of packed weights put in place over their nibbles
template <int S>
inline VI i_with_bits(VI w, VI plane, char mask) {
  return _mm512_ternarylogic_epi32(w, i_shift<S>(plane), _mm512_set1_epi8(mask), 0xF8);  // A | (B & C)
}

// 2-bit weights of 16 rows: bits 2 S and 2 S + 1 of every byte (a shift and an and)
template <int S>
inline VI i_crumb(VI w) {
  return _mm512_and_si512(i_shift<-2 * S>(w), _mm512_set1_epi8(0x03));
}

inline VF f_zero() { return _mm512_setzero_ps(); }
inline VF f_set1(float v) { return _mm512_set1_ps(v); }
inline VF f_add(VF a, VF b) { return _mm512_add_ps(a, b); }
inline VF f_mul(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF f_cvt(VI v) { return _mm512_cvtepi32_ps(v); }
inline VF f_load(const float* p) { return _mm512_loadu_ps(p); }
inline VF f_load_h(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
// 16 bytes as floats: unsigned (K-quant sub-scales and minimums) or signed (Q6_K's sub-scales)
inline VF f_from_u8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline VF f_from_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
// 16 bytes' low (HIGH false) or high nibbles as floats (Q2_K's 4-bit scales and minimums)
template <bool HIGH>
inline VF f_from_u4(const uint8_t* p) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_cvtepi32_ps(HIGH ? _mm512_srli_epi32(v, 4) : _mm512_and_si512(v, _mm512_set1_epi32(0x0F)));
}
inline void f_store(float* p, VF v) { _mm512_storeu_ps(p, v); }
inline VF f_fmadd(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }  // a * b + c, rounded once
// the two 8-lane halves of a vector, and a vector of two halves
inline __m256 f_lo(VF v) { return _mm512_castps512_ps256(v); }
inline __m256 f_hi(VF v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }
inline VF f_pair(__m256 lo, __m256 hi) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}
// the 8 floats at p in both halves
inline VF f_dup8(const float* p) { return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(reinterpret_cast<const double*>(p)))); }
// 8 float16 values at a, then 8 at b, as one vector
inline VF f_load_h2(const uint16_t* a, const uint16_t* b) {
  const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
  return _mm512_cvtph_ps(v);
}

#else

constexpr const char* kVectorName = "avx2";
struct VI {
  __m256i a, b;  // lanes 0-7, 8-15
};
struct VF {
  __m256 a, b;
};

inline VI i_zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline VI i_load(const void* p) {
  const __m256i* v = reinterpret_cast<const __m256i*>(p);
  return {_mm256_loadu_si256(v), _mm256_loadu_si256(v + 1)};
}
inline void i_store(int32_t* p, VI v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v.a);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 8), v.b);
}
inline __m256i lo8(__m256i w) { return _mm256_and_si256(w, _mm256_set1_epi8(0x0F)); }
inline __m256i hi8(__m256i w) { return _mm256_and_si256(_mm256_srli_epi16(w, 4), _mm256_set1_epi8(0x0F)); }
inline VI i_lo(VI w) { return {lo8(w.a), lo8(w.b)}; }
inline VI i_hi(VI w) { return {hi8(w.a), hi8(w.b)}; }
// maddubs adds two u8 * s8 products into int16: at most 2 * 128 * 127 here, so never saturated (exact)
inline __m256i dot_u8(__m256i acc, __m256i w, __m256i x) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}
// acc + the dots of N words of unsigned weights w[0..N) with the int8 values at x, x + 4, ... (exact): the
// maddubs pairs of G words at a time summed in 16 bits before one madd widens them, which stays exact while
// G * 2 * max(w) * 127 <= 32767 (Layout::GROUP): 8 words of 4-bit weights need one madd instead of 8, the
// multiplier ports' other half of a many-row pass
template <int N, int G>
inline VI i_dots_u(VI acc, const VI* w, const int8_t* x) {
  static_assert(G >= 1, "a group holds one word at least");
  const __m256i ones = _mm256_set1_epi16(1);
  for (int k0 = 0; k0 < N; k0 += G) {
    __m256i sa = _mm256_setzero_si256(), sb = _mm256_setzero_si256();
    for (int k = k0; k < N && k < k0 + G; ++k) {
      const __m256i xv = _mm256_set1_epi32(word(x + 4 * k));
      sa = _mm256_add_epi16(sa, _mm256_maddubs_epi16(w[k].a, xv));
      sb = _mm256_add_epi16(sb, _mm256_maddubs_epi16(w[k].b, xv));
    }
    acc = {_mm256_add_epi32(acc.a, _mm256_madd_epi16(sa, ones)), _mm256_add_epi32(acc.b, _mm256_madd_epi16(sb, ones))};
  }
  return acc;
}
// signed weights: |w| times x with w's sign (i_dots_s)
inline VI i_prep_s(VI w) { return w; }
// |w| of signed words, the rows' loop's invariant of i_dots_s
inline VI i_abs_s(VI w) { return {_mm256_sign_epi8(w.a, w.a), _mm256_sign_epi8(w.b, w.b)}; }
// acc + the dots of N signed words w[0..N) (wabs: their i_abs_s) with the int8 values at x, x + 4, ...: |w| times x
// with w's sign
template <int N>
inline VI i_dots_s(VI acc, const VI* w, const VI* wabs, const int8_t* x) {
  for (int k = 0; k < N; ++k) {
    const __m256i xv = _mm256_set1_epi32(word(x + 4 * k));
    acc = {dot_u8(acc.a, wabs[k].a, _mm256_sign_epi8(xv, w[k].a)), dot_u8(acc.b, wabs[k].b, _mm256_sign_epi8(xv, w[k].b))};
  }
  return acc;
}
inline VI i_signed_fix(VI acc, int32_t) { return acc; }
inline VI i_sub1(VI acc, int32_t v) {
  const __m256i vv = _mm256_set1_epi32(v);
  return {_mm256_sub_epi32(acc.a, vv), _mm256_sub_epi32(acc.b, vv)};
}
template <int S>
inline __m256i shift8(__m256i v) {
  if constexpr (S > 0) return _mm256_slli_epi32(v, S);
  else if constexpr (S < 0) return _mm256_srli_epi32(v, -S);
  else return v;
}
template <int S>
inline VI i_with_bits(VI w, VI plane, char mask) {
  const __m256i m = _mm256_set1_epi8(mask);
  return {_mm256_or_si256(w.a, _mm256_and_si256(shift8<S>(plane.a), m)),
          _mm256_or_si256(w.b, _mm256_and_si256(shift8<S>(plane.b), m))};
}

template <int S>
inline VI i_crumb(VI w) {
  const __m256i m = _mm256_set1_epi8(0x03);
  return {_mm256_and_si256(shift8<-2 * S>(w.a), m), _mm256_and_si256(shift8<-2 * S>(w.b), m)};
}

inline VF f_zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline VF f_set1(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
inline VF f_add(VF x, VF y) { return {_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; }
inline VF f_mul(VF x, VF y) { return {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
inline VF f_cvt(VI v) { return {_mm256_cvtepi32_ps(v.a), _mm256_cvtepi32_ps(v.b)}; }
inline VF f_load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline VF f_load_h(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
inline void f_store(float* p, VF v) {
  _mm256_storeu_ps(p, v.a);
  _mm256_storeu_ps(p + 8, v.b);
}
inline VF f_from_u8(const uint8_t* p) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))),
          _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))))};
}
inline VF f_from_i8(const int8_t* p) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))),
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))))};
}
template <bool HIGH>
inline __m256 u4_8(const uint8_t* p) {
  const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_cvtepi32_ps(HIGH ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, _mm256_set1_epi32(0x0F)));
}
template <bool HIGH>
inline VF f_from_u4(const uint8_t* p) { return {u4_8<HIGH>(p), u4_8<HIGH>(p + 8)}; }
inline VF f_fmadd(VF x, VF y, VF z) { return {_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)}; }
inline __m256 f_lo(VF v) { return v.a; }
inline __m256 f_hi(VF v) { return v.b; }
inline VF f_pair(__m256 lo, __m256 hi) { return {lo, hi}; }
inline VF f_dup8(const float* p) {
  const __m256 v = _mm256_loadu_ps(p);
  return {v, v};
}
inline VF f_load_h2(const uint16_t* a, const uint16_t* b) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)))};
}

#endif

// The amx path's builds: AMX-INT8 tiles for the integer dots (amx.h) over this vector code; the test build runs
// the tiles on a software model of them (amx_emulate.h), over whichever vector code it was compiled for.
#if defined(HVD_AMX_EMULATE)
#define HVD_AMX 1
constexpr const char* kName = "amx-emulated";
#elif defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512VNNI__)
#define HVD_AMX 1
constexpr const char* kName = "amx";
#else
constexpr const char* kName = kVectorName;
#endif

}  // namespace hvd_isa

// hvd_tiles formats: what a quantized weight's rows hold, how they are packed into tiles of NT = 16 rows, and
// how a tile's block is read back as 8 words of weights and two scales (tile_linear.h computes with them).
//
// A format's *record* is what a row holds for `blocks` blocks of 32 weights: one block, or a K-quant super-block
// of 8 (256 weights, a group of tile_linear.h). A record is a list of fields, each `count` units of `unit` bytes;
// the converters (runtime/cpu/gguf_blocks.py) write rows of records, and a tile holds each field as
// [count][NT rows][unit], so one vector load reads a unit of every row of the tile. The last field is the
// weights: per block, 4 words of nibbles (the low nibbles weights 0-15, the high ones 16-31, 4 a word) and 0,
// 1 or 2 words of high bits (a *plane*), or 8 words of a byte a weight, or (Q2K) 2 words of 2-bit weights
// (bits 2 s and 2 s + 1 of byte i of word c hold weight 16 c + 4 s + i).
//
// The K-quant records hold the file's own fields: Q4_K and Q5_K a float16 d and -dmin per super-block and a
// 6-bit scale and minimum per block (a byte each), Q6_K a float16 d and an int8 scale per 16 weights. A
// block's float32 scale is computed as d * sc and its minimum as (-dmin) * m: one float32 product of the
// same values as the wide formats (Q4F, Q5F, Q6S) store, so the same bits, and exact (an 11-bit significand
// times a 6-bit integer).
// Q2_K's record is the file's bytes, reordered: float16 d and -dmin per super-block, the file's 16 bytes of a
// 4-bit scale (low nibble) and a 4-bit minimum (high nibble) per 16 weights, the 2-bit weights (10.5 bytes per
// 32 weights). A half block's float32 scale is d * sc and its minimum (-dmin) * m (exact: 11 x 4 bits), and
// the kernel takes the minimum's product per half block with the activations' exact sum over those 16.
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "isa.h"

namespace hvd_tiles {

using namespace hvd_isa;

// Q4_1, Q8_0: the GGUF blocks. Q4F: Q4_1 with float32 scale and minimum; Q5F: the same with 5-bit weights a
// byte each; Q6S: int8 weights with a float32 scale per 16 (Q3_K, IQ4_XS, the IQ1/IQ2/IQ3 grids). Q4K, Q5K, Q6K: the K-quants' super-blocks
// (nibbles, a plane of 5th bits, two planes of 5th and 6th bits); Q5_0, Q5_1: nibbles and a plane, float16 d
// (and m; Q5_0's minimum is -16 d); Q2K: Q2_K's super-blocks (2-bit weights, a scale and a minimum per 16)
// F16, BF16: float weights held in 16 bits (the file's), each converted to float32 exactly where it is read, so
// their products are those of F32 weights of the same values.
enum Format : int {
  F32 = 0, Q4_1 = 1, Q8_0 = 2, Q4F = 3, Q5F = 4, Q6S = 5, Q4K = 6, Q5K = 7, Q6K = 8, Q5_0 = 9, Q5_1 = 10, F16 = 11, BF16 = 12,
  Q2K = 13
};
constexpr int LAST_FORMAT = Q2K;
constexpr bool is_float(int fmt) { return fmt == F32 || fmt == F16 || fmt == BF16; }  // float inputs, not tiled
constexpr int64_t QK = 32;  // weights per block
constexpr int MAX_FIELDS = 5;

struct Record {
  int blocks;  // blocks of 32 weights per record
  int nf;      // fields
  int unit[MAX_FIELDS], count[MAX_FIELDS];
};

constexpr Record record_of(int fmt) {
  switch (fmt) {
    case Q4_1: return {1, 3, {2, 2, 4}, {1, 1, 4}};              // scale, minimum (float16); nibbles
    case Q8_0: return {1, 2, {2, 4}, {1, 8}};                    // scale (float16); int8 weights
    case Q4F: return {1, 3, {4, 4, 4}, {1, 1, 4}};               // scale, minimum (float32); nibbles
    case Q5F: case Q6S: return {1, 3, {4, 4, 4}, {1, 1, 8}};     // two float32 fields; a byte a weight
    case Q4K: return {8, 5, {2, 2, 1, 1, 4}, {1, 1, 8, 8, 32}};  // d, -dmin; 8 scales, 8 minimums; nibbles
    case Q5K: return {8, 5, {2, 2, 1, 1, 4}, {1, 1, 8, 8, 40}};  // the same; nibbles and a plane a block
    case Q6K: return {8, 3, {2, 1, 4}, {1, 16, 48}};             // d; 16 int8 scales; nibbles and 2 planes
    case Q5_0: return {1, 2, {2, 4}, {1, 5}};                    // d; nibbles and a plane
    case Q5_1: return {1, 3, {2, 2, 4}, {1, 1, 5}};              // d, m; nibbles and a plane
    case Q2K: return {8, 4, {2, 2, 1, 4}, {1, 1, 16, 16}};       // d, -dmin; 16 scale|minimum<<4; 2-bit weights
    case F16: case BF16: return {1, 1, {2}, {32}};               // 16-bit floats (not tiled)
    default: return {1, 1, {4}, {32}};                           // F32 (not tiled)
  }
}

constexpr int record_bytes(const Record& r) {
  int bytes = 0;
  for (int f = 0; f < r.nf; ++f) bytes += r.unit[f] * r.count[f];
  return bytes;
}

constexpr int field_offset(const Record& r, int field) {  // in a tile's record
  int bytes = 0;
  for (int f = 0; f < field; ++f) bytes += NT * r.unit[f] * r.count[f];
  return bytes;
}

template <int FMT>
struct Layout {
  static constexpr Record R = record_of(FMT);
  static constexpr int BLOCKS = R.blocks;
  static constexpr bool SUPER = BLOCKS == 8;                     // K-quant: d per record, integer scales per block
  static constexpr int64_t TRB = NT * record_bytes(R);           // a tile's record
  static constexpr int W_OFF = field_offset(R, R.nf - 1);        // the weights
  static constexpr int WORDS = R.count[R.nf - 1] / BLOCKS;       // words of 4 bytes a row per block
  static constexpr int64_t WB = NT * 4 * WORDS;                  // a tile's block of weights
  static constexpr bool CRUMBS = FMT == Q2K;                     // 2-bit weights, 2 words a block
  static constexpr bool NIBBLES = WORDS != 8 && !CRUMBS;
  static constexpr int PLANES = NIBBLES ? WORDS - 4 : 0;         // words of high bits per block
  static constexpr int M_OFF = field_offset(R, 1);               // the second field
  static constexpr bool WIDE = FMT == Q4F || FMT == Q5F || FMT == Q6S;  // float32 scales
  static constexpr bool MIN = FMT == Q4_1 || FMT == Q4F || FMT == Q5F || FMT == Q4K || FMT == Q5K || FMT == Q5_0 ||
                              FMT == Q5_1;
  static constexpr bool HALVES = FMT == Q6S || FMT == Q6K || FMT == Q2K;  // a scale per 16 weights
  static constexpr bool MIN16 = FMT == Q2K;                      // and a minimum per 16 weights
  static constexpr bool SIGNED = FMT == Q8_0 || FMT == Q6S;      // int8 weights
  static constexpr bool OFFSET = FMT == Q6K;                     // weights q - 32, q in 0..63
  // the largest unsigned weight (signed formats: |w| <= 128), and how many words' maddubs pairs (each pair at most
  // 2 * WMAX * 127 in magnitude against int8 inputs in -127..127) an int16 lane holds exactly (isa.h's i_dots_u)
  static constexpr int WMAX = SIGNED ? 128 : CRUMBS ? 3 : FMT == Q5F ? 31 : PLANES == 0 ? 15 : PLANES == 1 ? 31 : 63;
#if defined(HVD_MUTATE_DOT_GROUP)  // for the tests only: every format's words summed 8 at a time in 16 bits
  static constexpr int GROUP = 8;
#else
  static constexpr int GROUP = 32767 / (2 * WMAX * 127) < 1 ? 1 : (32767 / (2 * WMAX * 127) > 8 ? 8 : 32767 / (2 * WMAX * 127));
#endif
};

// ---------------------------------------------------------------- weights

struct Matrix {
  int fmt = F32;
  int64_t N = 0, K = 0;  // y[N] = W[N, K] x[K]
  at::Tensor data;       // quantized: tiles of NT rows (the last one padded with zero rows); floats: [N, K]
  at::Tensor bias;       // float32 [N] or undefined
  int64_t nb() const { return K / QK; }
  int64_t records() const { return nb() / record_of(fmt).blocks; }
  int64_t source_bytes() const { return N * records() * record_bytes(record_of(fmt)); }  // the converters' bytes
  int64_t tile_bytes() const { return records() * NT * record_bytes(record_of(fmt)); }
  const uint8_t* tile(int64_t t) const { return data.data_ptr<uint8_t>() + t * tile_bytes(); }
  const float* frow(int64_t n) const { return data.data_ptr<float>() + n * K; }                      // F32
  const uint16_t* hrow(int64_t n) const { return reinterpret_cast<const uint16_t*>(data.data_ptr<uint8_t>()) + n * K; }  // F16, BF16
  bool quantized() const { return !is_float(fmt); }
};

// zeroed bytes, in transparent huge pages where the kernel gives them: a decode step streams every tile once, and
// with 4 KiB pages a 1 GB model is a quarter of a million TLB misses a token
inline at::Tensor huge_page_bytes(int64_t n) {
  at::Tensor out = at::empty({n}, at::kByte);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(1) << 21;
  const uintptr_t a = reinterpret_cast<uintptr_t>(out.data_ptr<uint8_t>()), b = a + static_cast<uintptr_t>(n);
  const uintptr_t first = (a + kHuge - 1) & ~(kHuge - 1), last = b & ~(kHuge - 1);
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);  // before any page is touched
#endif
  out.zero_();
  return out;
}

// rows of records into tiles (each field [count][NT][unit])
inline at::Tensor pack_tiles(int fmt, int64_t N, int64_t K, const at::Tensor& src) {
  const Record r = record_of(fmt);
  const int64_t recs = K / QK / r.blocks, rb = record_bytes(r), tiles = (N + NT - 1) / NT;
  at::Tensor out = huge_page_bytes(tiles * recs * NT * rb);
  const uint8_t* s = src.data_ptr<uint8_t>();
  uint8_t* d = out.data_ptr<uint8_t>();
  at::parallel_for(0, N, 256, [&](int64_t a, int64_t b) {
    for (int64_t n = a; n < b; ++n) {
      const int64_t t = n / NT, lane = n % NT;
      for (int64_t rec = 0; rec < recs; ++rec) {
        const uint8_t* from = s + (n * recs + rec) * rb;
        uint8_t* to = d + (t * recs + rec) * NT * rb;
        for (int f = 0; f < r.nf; ++f) {
          const int u = r.unit[f];
          for (int c = 0; c < r.count[f]; ++c) std::memcpy(to + field_offset(r, f) + (c * NT + lane) * u, from + c * u, u);
          from += u * r.count[f];
        }
      }
    }
  });
  return out;
}

// block b's weights in a tile
template <int FMT>
inline const uint8_t* block_weights(const uint8_t* tile, int64_t b) {
  using Lt = Layout<FMT>;
  return tile + (b / Lt::BLOCKS) * Lt::TRB + Lt::W_OFF + (b % Lt::BLOCKS) * Lt::WB;
}

// The 8 words of a tile's block: w[k] holds weights 4k..4k+3 of every row (unsigned, or prepared for i_dots_s).
// A plane of 5th bits holds bit k of byte i for weight 4k + i; two planes of high bits hold, in plane k / 4, bits
// 2 (k % 4) and up of byte i for weight 4k + i.
template <int FMT>
inline void block_words(const uint8_t* p, VI* w) {
  using Lt = Layout<FMT>;
  if constexpr (Lt::CRUMBS) {
    for (int c = 0; c < 2; ++c) {
      const VI v = i_load(p + c * NT * 4);
      w[4 * c] = i_crumb<0>(v);
      w[4 * c + 1] = i_crumb<1>(v);
      w[4 * c + 2] = i_crumb<2>(v);
      w[4 * c + 3] = i_crumb<3>(v);
    }
  } else if constexpr (!Lt::NIBBLES) {
    for (int k = 0; k < 8; ++k) w[k] = Lt::SIGNED ? i_prep_s(i_load(p + k * NT * 4)) : i_load(p + k * NT * 4);
  } else {
    for (int k = 0; k < 4; ++k) {
      const VI v = i_load(p + k * NT * 4);
      w[k] = i_lo(v);
      w[k + 4] = i_hi(v);
    }
    if constexpr (Lt::PLANES == 1) {
      const VI h = i_load(p + 4 * NT * 4);
      w[0] = i_with_bits<4>(w[0], h, 0x10);
      w[1] = i_with_bits<3>(w[1], h, 0x10);
      w[2] = i_with_bits<2>(w[2], h, 0x10);
      w[3] = i_with_bits<1>(w[3], h, 0x10);
      w[4] = i_with_bits<0>(w[4], h, 0x10);
      w[5] = i_with_bits<-1>(w[5], h, 0x10);
      w[6] = i_with_bits<-2>(w[6], h, 0x10);
      w[7] = i_with_bits<-3>(w[7], h, 0x10);
    } else if constexpr (Lt::PLANES == 2) {
      for (int half = 0; half < 2; ++half) {
        const VI h = i_load(p + (4 + half) * NT * 4);
        VI* v = w + 4 * half;
        v[0] = i_with_bits<4>(v[0], h, 0x30);
        v[1] = i_with_bits<2>(v[1], h, 0x30);
        v[2] = i_with_bits<0>(v[2], h, 0x30);
        v[3] = i_with_bits<-2>(v[3], h, 0x30);
      }
    }
  }
}

template <int FMT>
inline VF scales(const uint8_t* p) {
  if (Layout<FMT>::WIDE) return f_load(reinterpret_cast<const float*>(p));
  return f_load_h(reinterpret_cast<const uint16_t*>(p));
}

// The float32 scales of blocks [g0, g0 + ng) of a tile: S[j] (the first half's for Q6S, Q6K and Q2K), and S2[j]
// (the minimum, or the second half's scale); Q2K's minimums of the halves in M[j] and M2[j]
template <int FMT>
inline void group_scales(const uint8_t* tile, int64_t g0, int64_t ng, VF* S, VF* S2, VF* M = nullptr,
                         VF* M2 = nullptr) {
  using Lt = Layout<FMT>;
  if constexpr (Lt::SUPER) {
    const uint8_t* rec = tile + (g0 / 8) * Lt::TRB;
    const VF d = f_load_h(reinterpret_cast<const uint16_t*>(rec));
    if constexpr (FMT == Q2K) {
      const VF nmin = f_load_h(reinterpret_cast<const uint16_t*>(rec + Lt::M_OFF));
      const uint8_t* sm = rec + field_offset(Lt::R, 2);
      for (int64_t j = 0; j < ng; ++j) {
        S[j] = f_mul(d, f_from_u4<false>(sm + 2 * j * NT));
        S2[j] = f_mul(d, f_from_u4<false>(sm + (2 * j + 1) * NT));
        M[j] = f_mul(nmin, f_from_u4<true>(sm + 2 * j * NT));
        M2[j] = f_mul(nmin, f_from_u4<true>(sm + (2 * j + 1) * NT));
      }
    } else if constexpr (FMT == Q6K) {
      const int8_t* sc = reinterpret_cast<const int8_t*>(rec + field_offset(Lt::R, 1));
      for (int64_t j = 0; j < ng; ++j) {
        S[j] = f_mul(d, f_from_i8(sc + 2 * j * NT));
        S2[j] = f_mul(d, f_from_i8(sc + (2 * j + 1) * NT));
      }
    } else {
      const VF nmin = f_load_h(reinterpret_cast<const uint16_t*>(rec + Lt::M_OFF));
      const uint8_t* sc = rec + field_offset(Lt::R, 2);
      const uint8_t* m = rec + field_offset(Lt::R, 3);
      for (int64_t j = 0; j < ng; ++j) {
        S[j] = f_mul(d, f_from_u8(sc + j * NT));
        S2[j] = f_mul(nmin, f_from_u8(m + j * NT));
      }
    }
  } else {
    for (int64_t j = 0; j < ng; ++j) {
      const uint8_t* rec = tile + (g0 + j) * Lt::TRB;
      S[j] = scales<FMT>(rec);
      if constexpr (FMT == Q5_0) S2[j] = f_mul(S[j], f_set1(-16.0f));
      else if constexpr (Lt::R.nf == 3) S2[j] = scales<FMT>(rec + Lt::M_OFF);
    }
  }
}

// ---------------------------------------------------------------- one row back as float32

inline float half_at(const uint8_t* p, int64_t i) {
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return _cvtsh_ss(h);
}

template <int FMT>
inline float scale_at(const uint8_t* p, int64_t lane) {
  if (Layout<FMT>::WIDE) {
    float f;
    std::memcpy(&f, p + 4 * lane, 4);
    return f;
  }
  return half_at(p, lane);
}

// lane's scales of block b, as group_scales computes them
template <int FMT>
inline void lane_scales(const uint8_t* tile, int64_t b, int64_t lane, float& s, float& s2) {
  using Lt = Layout<FMT>;
  const uint8_t* rec = tile + (b / Lt::BLOCKS) * Lt::TRB;
  const int64_t j = b % Lt::BLOCKS;
  if constexpr (FMT == Q6K) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(rec + field_offset(Lt::R, 1));
    s = half_at(rec, lane) * static_cast<float>(sc[2 * j * NT + lane]);
    s2 = half_at(rec, lane) * static_cast<float>(sc[(2 * j + 1) * NT + lane]);
  } else if constexpr (Lt::SUPER) {
    s = half_at(rec, lane) * static_cast<float>(rec[field_offset(Lt::R, 2) + j * NT + lane]);
    s2 = half_at(rec + Lt::M_OFF, lane) * static_cast<float>(rec[field_offset(Lt::R, 3) + j * NT + lane]);
  } else {
    s = scale_at<FMT>(rec, lane);
    s2 = FMT == Q5_0 ? s * -16.0f : (Lt::R.nf == 3 ? scale_at<FMT>(rec + Lt::M_OFF, lane) : 0.0f);
  }
}

// weight t (0..31) of lane in a tile's block of weights p, as the kernel's integer (q - 32 for Q6K)
template <int FMT>
inline int weight_at(const uint8_t* p, int64_t lane, int t) {
  using Lt = Layout<FMT>;
  const int k = t / 4, i = t % 4;
  if constexpr (Lt::CRUMBS) return (p[((k / 4) * NT + lane) * 4 + i] >> (2 * (k % 4))) & 3;
  if constexpr (!Lt::NIBBLES) {
    const uint8_t v = p[(k * NT + lane) * 4 + i];
    return Lt::SIGNED ? static_cast<int>(static_cast<int8_t>(v)) : static_cast<int>(v);
  }
  const uint8_t v = p[((k % 4) * NT + lane) * 4 + i];
  int q = k < 4 ? (v & 0x0F) : (v >> 4);
  if constexpr (Lt::PLANES == 1) q |= ((p[(4 * NT + lane) * 4 + i] >> k) & 1) << 4;
  if constexpr (Lt::PLANES == 2) q |= ((p[((4 + k / 4) * NT + lane) * 4 + i] >> (2 * (k % 4))) & 3) << 4;
  return Lt::OFFSET ? q - 32 : q;
}

// row n of a tiled weight as float32 (exact: d * q + m in float32, as the format defines it)
template <int FMT>
void dequantize_tile_row(const Matrix& W, int64_t n, float* y) {
  using Lt = Layout<FMT>;
  const uint8_t* tile = W.tile(n / NT);
  const int64_t lane = n % NT;
  for (int64_t b = 0; b < W.nb(); ++b) {
    float s, s2;
    lane_scales<FMT>(tile, b, lane, s, s2);
    const uint8_t* p = block_weights<FMT>(tile, b);
    if constexpr (Lt::MIN16) {  // Q2K: d * sc * q + (-dmin) * m, per half block
      const uint8_t* rec = tile + (b / 8) * Lt::TRB;
      const uint8_t* sm = rec + field_offset(Lt::R, 2) + 2 * (b % 8) * NT + lane;
      const float d = half_at(rec, lane), nmin = half_at(rec + Lt::M_OFF, lane);
      for (int t = 0; t < QK; ++t) {
        const uint8_t v = sm[(t / 16) * NT];
        const float q = static_cast<float>(weight_at<FMT>(p, lane, t));
        y[b * QK + t] = d * static_cast<float>(v & 0x0F) * q + nmin * static_cast<float>(v >> 4);
      }
      continue;
    }
    for (int t = 0; t < QK; ++t) {
      const float q = static_cast<float>(weight_at<FMT>(p, lane, t));
      if (Lt::HALVES) y[b * QK + t] = (t < 16 ? s : s2) * q;
      else if (Lt::MIN) y[b * QK + t] = s * q + s2;
      else y[b * QK + t] = s * q;
    }
  }
}

// f(std::integral_constant<int, FMT>) for a quantized format, or false for F32
template <class F>
inline bool by_format(int fmt, F&& f) {
  switch (fmt) {
    case Q4_1: f(std::integral_constant<int, Q4_1>{}); return true;
    case Q8_0: f(std::integral_constant<int, Q8_0>{}); return true;
    case Q4F: f(std::integral_constant<int, Q4F>{}); return true;
    case Q5F: f(std::integral_constant<int, Q5F>{}); return true;
    case Q6S: f(std::integral_constant<int, Q6S>{}); return true;
    case Q4K: f(std::integral_constant<int, Q4K>{}); return true;
    case Q5K: f(std::integral_constant<int, Q5K>{}); return true;
    case Q6K: f(std::integral_constant<int, Q6K>{}); return true;
    case Q5_0: f(std::integral_constant<int, Q5_0>{}); return true;
    case Q5_1: f(std::integral_constant<int, Q5_1>{}); return true;
    case Q2K: f(std::integral_constant<int, Q2K>{}); return true;
    default: return false;
  }
}

// a 16-bit float's value as float32 (exact)
inline float f16_value(uint16_t h) { return _cvtsh_ss(h); }
inline float bf16_value(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline void dequantize_row(const Matrix& W, int64_t n, float* y) {
  const bool tiled = by_format(W.fmt, [&](auto fmt) { dequantize_tile_row<decltype(fmt)::value>(W, n, y); });
  if (tiled) return;
  if (W.fmt == F32) {
    std::memcpy(y, W.frow(n), W.K * sizeof(float));
    return;
  }
  const uint16_t* h = W.hrow(n);
  for (int64_t k = 0; k < W.K; ++k) y[k] = W.fmt == F16 ? f16_value(h[k]) : bf16_value(h[k]);
}

}  // namespace hvd_tiles

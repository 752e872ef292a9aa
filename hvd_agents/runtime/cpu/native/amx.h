// hvd_amx: the amx path's integer block dots on AMX-INT8 tiles (tile_linear.h calls them for passes of many rows).
//
// A tile product c += a b (tdpbssd: int8 a and b; tdpbsud: int8 a, uint8 b) takes a [rows, K] bytes and b in VNNI
// layout, [K / 4, N * 4] bytes: b's row k holds bytes 4 k .. 4 k + 3 of each of the N columns side by side, which
// is what a weight tile of tile_formats.h holds per word of a block: word k of the 16 weight rows, 64 bytes. So
//
//     c = the pass's input rows (rows R, 16 int32 = 64 bytes each: one input row's 16 weight-row lanes)
//     a = the rows' int8 activations of one block (R x 32 bytes, row i at x + i * ldx)
//     b = the block's 8 words of the 16 weight rows (8 x 64 bytes)
//
// and a row of c is the vector of int32 lanes the vector code's phase 1 stores for that input row and block: the
// same integers (a block's dot is exact on any path: at most 32 products of 127 * 255), which tile_linear.h's
// phase 2 turns into floats with the same code. K is one block of 32 (a block has its own scale), or one half
// block of 16 for the formats with a scale per 16 weights (Q6S, Q6K, Q2K: a's 16 bytes and b's 4 rows each).
// Int8 weights (Q8_0, Q6S) are multiplied signed by signed as the tile holds them; the other formats' weights are
// unpacked to bytes (0..63) by the vector code's block_words and multiplied signed by unsigned; Q6K's offset
// (q - 32) is taken back after the product, as the vector code does. Every quantized format runs here; float
// weights (F32, F16, BF16) have no integer dots and stay on the vector code.
//
// Tiles (one configuration per number of rows R of a pass; loaded when a call's pass first needs it and released
// at the call's end, as another library on the same thread may load its own):
//     0, 1: c, c of the second halves        R x 64
//     2, 3: a, b of a whole block            R x 32, 8 x 64
//     4, 5: a of the first and second halves R x 16 each
//     6, 7: b of the first and second halves 4 x 64 each
//
// The real instructions are compiled where the flags enable AMX-TILE and AMX-INT8 (the amx path), their software
// model (amx_emulate.h) where HVD_AMX_EMULATE is defined (the amx path's test build); other builds have no tiles.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "isa.h"
#include "tile_formats.h"

#if defined(HVD_AMX_EMULATE)
#include "amx_emulate.h"
#endif

namespace hvd_amx {

using namespace hvd_isa;
using hvd_tiles::Layout;
using hvd_tiles::QK;

// "" when the OS lets this process use the tile state, else why not. Linux (5.16 on) keeps the 8 KiB of tile data
// out of a thread's context until the process asks for it; once granted, every thread of the process may use it.
inline std::string tile_state_refusal() {
#if defined(__linux__) && defined(__x86_64__) && defined(SYS_arch_prctl)
  constexpr long ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023;
  constexpr long XFEATURE_XTILEDATA = 18;
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
    return std::string("the OS does not grant the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
           std::strerror(errno) + "; Linux grants it from 5.16 on)";
  unsigned long granted = 0;
  if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &granted) != 0 || !(granted & (1ul << XFEATURE_XTILEDATA)))
    return "the OS did not grant the AMX tile state (arch_prctl ARCH_GET_XCOMP_PERM)";
  return "";
#else
  return "AMX tiles are requested from Linux (arch_prctl); this is not x86-64 Linux";
#endif
}

#if defined(HVD_AMX)

// A pass of fewer input rows keeps the vector code: a tile product costs about as much for 1 row as for 16, and a
// decode step or a short draft has 1 to a few rows. (Not measured: no AMX machine was at hand; to be tuned on one.)
constexpr int64_t MIN_ROWS = 8;

#if defined(HVD_AMX_EMULATE)
#define HVD_TILE_CONFIG(cfg) hvd_amx_emulate::ldtilecfg(cfg)
#define HVD_TILE_RELEASE() hvd_amx_emulate::tilerelease()
#define HVD_TILE_LOAD(t, base, stride) hvd_amx_emulate::tileloadd(t, base, stride)
#define HVD_TILE_STORE(t, base, stride) hvd_amx_emulate::tilestored(t, base, stride)
#define HVD_TILE_ZERO(t) hvd_amx_emulate::tilezero(t)
#define HVD_TILE_DPBSSD(c, a, b) hvd_amx_emulate::tdpbssd(c, a, b)
#define HVD_TILE_DPBSUD(c, a, b) hvd_amx_emulate::tdpbsud(c, a, b)
#define HVD_TILE_DPBUSD(c, a, b) hvd_amx_emulate::tdpbusd(c, a, b)
#define HVD_TILE_DPBUUD(c, a, b) hvd_amx_emulate::tdpbuud(c, a, b)
#else
// GCC 12's _tile_loadconfig and _tile_loadd name no memory they read (the configuration's first 8 bytes; none):
// a "memory" clobber keeps the stores of the configuration and of an unpacked block before the instruction.
#define HVD_TILE_CONFIG(cfg) __asm__ volatile("ldtilecfg %0" ::"m"(*(cfg)) : "memory")
#define HVD_TILE_RELEASE() _tile_release()
#define HVD_TILE_LOAD(t, base, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"(static_cast<long>(stride)) : "memory")
#define HVD_TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define HVD_TILE_ZERO(t) _tile_zero(t)
#define HVD_TILE_DPBSSD(c, a, b) _tile_dpbssd(c, a, b)
#define HVD_TILE_DPBSUD(c, a, b) _tile_dpbsud(c, a, b)
#define HVD_TILE_DPBUSD(c, a, b) _tile_dpbusd(c, a, b)
#define HVD_TILE_DPBUUD(c, a, b) _tile_dpbuud(c, a, b)
#endif

// ldtilecfg's 64 bytes (palette 1)
struct alignas(64) Config {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  void set(int t, int r, int bytes) {
    rows[t] = static_cast<uint8_t>(r);
    colsb[t] = static_cast<uint16_t>(bytes);
  }
};

// The tiles of the header comment for passes of R rows (1 <= R <= 16)
inline Config pass_config(int64_t R) {
  Config c;
  const int r = static_cast<int>(R);
  c.set(0, r, 64);
  c.set(1, r, 64);
  c.set(2, r, 32);
  c.set(3, 8, 64);
  c.set(4, r, 16);
  c.set(5, r, 16);
  c.set(6, 4, 64);
  c.set(7, 4, 64);
  return c;
}

// The tile state one call of the kernel holds on its thread: configured by the first pass that takes tiles (and
// again when a pass has another number of rows), released when the call is done.
class Tiles {
 public:
  Tiles() = default;
  Tiles(const Tiles&) = delete;
  Tiles& operator=(const Tiles&) = delete;
  ~Tiles() {
    if (rows_ > 0) HVD_TILE_RELEASE();
  }
  // Whether a pass of R input rows (at most 16) takes its dots from tiles; configures them when it does.
  bool take(int64_t R) {
    if (R < MIN_ROWS) return false;
    if (R != rows_) {
      const Config c = pass_config(R);
      HVD_TILE_CONFIG(&c);
      rows_ = R;
    }
    return true;
  }

 private:
  int64_t rows_ = 0;
};

// Phase 1 of a pass on tiles (the tiles configured for R rows): for blocks g0 + j, j < ng, and input rows i < R,
// dots[i][j][lane] (and dots2, the second halves' dots, for Q6S, Q6K, Q2K), as the vector code stores them.
// x: row i's int8 activations at x + i * ldx (block b at + 32 b); sums: row i's half-block sums of them at
// sums + i * lds + 2 b; dots, dots2: [16][8][NT] int32.
template <int FMT>
void group_dots(const uint8_t* tile, int64_t g0, int64_t ng, const int8_t* x, int64_t ldx, const int32_t* sums,
                int64_t lds, int64_t R, int32_t* dots, int32_t* dots2) {
  using Lt = Layout<FMT>;
  constexpr int64_t LD = 8 * NT * 4;  // bytes from one input row's dots to the next's
  alignas(64) int32_t unpacked[8][NT];  // a block's weights as bytes, 8 words of the 16 rows: a b tile
  for (int64_t j = 0; j < ng; ++j) {
    const int64_t b = g0 + j;
    const int8_t* a = x + b * QK;
    const uint8_t* w = hvd_tiles::block_weights<FMT>(tile, b);
    if constexpr (!Lt::SIGNED) {
      VI v[8];
      hvd_tiles::block_words<FMT>(w, v);
      for (int k = 0; k < 8; ++k) i_store(unpacked[k], v[k]);
      w = reinterpret_cast<const uint8_t*>(unpacked);
    }
    int32_t* d = dots + j * NT;
    if constexpr (Lt::HALVES) {
      int32_t* d2 = dots2 + j * NT;
      HVD_TILE_ZERO(0);
      HVD_TILE_ZERO(1);
#if defined(HVD_MUTATE_AMX_K_SPLIT)  // for the tests only: a half block's dots taken as one product of the block
      HVD_TILE_LOAD(2, a, ldx);
      HVD_TILE_LOAD(3, w, 64);
      if constexpr (Lt::SIGNED) HVD_TILE_DPBSSD(0, 2, 3);
      else HVD_TILE_DPBSUD(0, 2, 3);
#else
      HVD_TILE_LOAD(4, a, ldx);
      HVD_TILE_LOAD(5, a + 16, ldx);
      HVD_TILE_LOAD(6, w, 64);
      HVD_TILE_LOAD(7, w + 4 * 64, 64);
      if constexpr (Lt::SIGNED) {
        HVD_TILE_DPBSSD(0, 4, 6);
        HVD_TILE_DPBSSD(1, 5, 7);
      } else {
        HVD_TILE_DPBSUD(0, 4, 6);
        HVD_TILE_DPBSUD(1, 5, 7);
      }
#endif
      HVD_TILE_STORE(0, d, LD);
      HVD_TILE_STORE(1, d2, LD);
      if constexpr (Lt::OFFSET) {  // Q6K: weights q - 32, so the dot less 32 times the half's sum of x
        for (int64_t i = 0; i < R; ++i) {
          const int32_t* s = sums + i * lds + 2 * b;
          i_store(d + i * 8 * NT, i_sub1(i_load(d + i * 8 * NT), 32 * s[0]));
          i_store(d2 + i * 8 * NT, i_sub1(i_load(d2 + i * 8 * NT), 32 * s[1]));
        }
      }
    } else {
      HVD_TILE_ZERO(0);
      HVD_TILE_LOAD(2, a, ldx);
      HVD_TILE_LOAD(3, w, 64);
      if constexpr (Lt::SIGNED) HVD_TILE_DPBSSD(0, 2, 3);
      else HVD_TILE_DPBSUD(0, 2, 3);
      HVD_TILE_STORE(0, d, LD);
    }
  }
}

// c[M, N] += a[M, K] b[K / 4, 4 N] on one tile product, the bytes signed or not as asked (tdpbssd, tdpbsud,
// tdpbusd, tdpbuud); M, N <= 16, K <= 64 a multiple of 4. For the tests: the instructions' results against the
// definition (on an AMX machine, the hardware's; in the test build, the model's).
inline void product(int32_t* c, const void* a, const void* b, int64_t M, int64_t K, int64_t N, bool a_signed,
                    bool b_signed) {
  Config cfg;
  cfg.set(0, static_cast<int>(M), static_cast<int>(4 * N));
  cfg.set(2, static_cast<int>(M), static_cast<int>(K));
  cfg.set(3, static_cast<int>(K / 4), static_cast<int>(4 * N));
  HVD_TILE_CONFIG(&cfg);
  HVD_TILE_LOAD(0, c, 4 * N);
  HVD_TILE_LOAD(2, a, K);
  HVD_TILE_LOAD(3, b, 4 * N);
  if (a_signed && b_signed) HVD_TILE_DPBSSD(0, 2, 3);
  else if (a_signed) HVD_TILE_DPBSUD(0, 2, 3);
  else if (b_signed) HVD_TILE_DPBUSD(0, 2, 3);
  else HVD_TILE_DPBUUD(0, 2, 3);
  HVD_TILE_STORE(0, c, 4 * N);
  HVD_TILE_RELEASE();
}

#else

constexpr int64_t MIN_ROWS = 0;  // no tiles in this build: every pass runs on the vector code

class Tiles {
 public:
  bool take(int64_t) { return false; }
};

template <int FMT>
void group_dots(const uint8_t*, int64_t, int64_t, const int8_t*, int64_t, const int32_t*, int64_t, int64_t, int32_t*,
                int32_t*) {}

#endif

}  // namespace hvd_amx

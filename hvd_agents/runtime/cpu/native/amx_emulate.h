// hvd_amx_emulate: a software model of the AMX tile state and of the instructions amx.h uses, for a test build.
//
// Compiled in place of the tile instructions when HVD_AMX_EMULATE is defined (native_forward.py's "amx-emulated"
// build, never a path a model runs on), so the amx path's tiling, packing and float phase run, and are compared
// bit for bit with the avx2 path, on a CPU without AMX. It models what those instructions do, as Intel's SDM
// defines them:
//
// * the state is per thread: eight tiles of up to 16 rows of 64 bytes, and the configuration that
//   ldtilecfg loaded (palette 1: each tile's rows and bytes a row; palette 0 releases the state);
// * tileloadd reads `rows` rows of `colsb` bytes, row r at base + r * stride, and zeroes the rest of the
//   tile; tilestored writes the same rows and bytes; tilezero zeroes the tile;
// * tdpb[su][su]d c, a, b: for every row m of c and dword n of its rows,
//       c[m][n] += sum over k < a.colsb of a[m][k] * b[k / 4][4 n + k % 4]
//   with a's and b's bytes signed or unsigned as the mnemonic says (s: int8, u: uint8), in int32 with
//   wraparound; b is in VNNI layout (K / 4 rows of N * 4 bytes); the bytes of c past its colsb and its
//   rows past its rows are zeroed;
// * what the hardware refuses (#UD: no configuration, a tile used unconfigured, shapes that do not fit
//   a.rows == c.rows, a.colsb == 4 * b.rows, b.colsb == c.colsb; one tile in two roles; #GP: a bad
//   configuration) aborts the process with the reason, as the instruction's fault would.
//
// The model is plain scalar code: slow, and only for the tests.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace hvd_amx_emulate {

constexpr int kTiles = 8, kMaxRows = 16, kMaxColsb = 64;

struct Tile {
  int rows = 0, colsb = 0;  // 0, 0: not configured
  uint8_t data[kMaxRows][kMaxColsb] = {};
};

struct State {
  bool configured = false;  // palette 1 loaded
  Tile tile[kTiles];
};

inline State& state() {
  thread_local State s;  // the tile state is a thread's, as XTILEDATA is part of each thread's context
  return s;
}

[[noreturn]] inline void fault(const char* instruction, const char* why) {
  std::fprintf(stderr, "hvd_amx_emulate: %s faults: %s\n", instruction, why);
  std::abort();
}

inline Tile& configured(const char* instruction, int t) {
  State& s = state();
  if (!s.configured) fault(instruction, "no tile configuration is loaded");
  if (t < 0 || t >= kTiles) fault(instruction, "no such tile");
  if (s.tile[t].rows == 0) fault(instruction, "the tile is not configured");
  return s.tile[t];
}

// ldtilecfg: the 64-byte configuration at cfg (palette, start_row, 14 reserved bytes, 16 colsb as uint16, 16 rows)
inline void ldtilecfg(const void* cfg) {
  uint8_t bytes[64];
  std::memcpy(bytes, cfg, 64);
  State& s = state();
  if (bytes[0] == 0) {  // palette 0: the state released
    s = State{};
    return;
  }
  if (bytes[0] != 1) fault("ldtilecfg", "unsupported palette");
  if (bytes[1] != 0) fault("ldtilecfg", "start_row must be 0");
  for (int i = 2; i < 16; ++i)
    if (bytes[i] != 0) fault("ldtilecfg", "reserved bytes must be 0");
  State next;
  for (int t = 0; t < 16; ++t) {
    uint16_t colsb;
    std::memcpy(&colsb, bytes + 16 + 2 * t, 2);
    const int rows = bytes[48 + t];
    if (t >= kTiles) {
      if (colsb != 0 || rows != 0) fault("ldtilecfg", "palette 1 has 8 tiles");
      continue;
    }
    if (rows > kMaxRows || colsb > kMaxColsb) fault("ldtilecfg", "a tile holds at most 16 rows of 64 bytes");
    if ((rows == 0) != (colsb == 0)) fault("ldtilecfg", "a tile needs both rows and bytes, or neither");
    next.tile[t].rows = rows;
    next.tile[t].colsb = colsb;
  }
  next.configured = true;
  s = next;
}

inline void tilerelease() { state() = State{}; }

inline void tileloadd(int t, const void* base, int64_t stride) {
  Tile& d = configured("tileloadd", t);
  const uint8_t* p = static_cast<const uint8_t*>(base);
  std::memset(d.data, 0, sizeof d.data);
  for (int r = 0; r < d.rows; ++r) std::memcpy(d.data[r], p + r * stride, d.colsb);
}

inline void tilestored(int t, void* base, int64_t stride) {
  const Tile& s = configured("tilestored", t);
  uint8_t* p = static_cast<uint8_t*>(base);
  for (int r = 0; r < s.rows; ++r) std::memcpy(p + r * stride, s.data[r], s.colsb);
}

inline void tilezero(int t) {
  Tile& d = configured("tilezero", t);
  std::memset(d.data, 0, sizeof d.data);
}

// c += a b over int8 (A_SIGNED, B_SIGNED) or uint8 bytes, in int32 with wraparound
template <bool A_SIGNED, bool B_SIGNED>
inline void tdp(const char* instruction, int c, int a, int b) {
  if (c == a || c == b || a == b) fault(instruction, "a tile in two roles");
  Tile& C = configured(instruction, c);
  const Tile& A = configured(instruction, a);
  const Tile& B = configured(instruction, b);
  if (A.rows != C.rows) fault(instruction, "a's rows are not c's");
  if (A.colsb != 4 * B.rows) fault(instruction, "a's bytes a row are not 4 times b's rows");
  if (B.colsb != C.colsb || C.colsb % 4 != 0) fault(instruction, "b's bytes a row are not c's");
  const auto value = [](uint8_t v, bool is_signed) {
    return is_signed ? static_cast<int32_t>(static_cast<int8_t>(v)) : static_cast<int32_t>(v);
  };
  Tile out;
  out.rows = C.rows;
  out.colsb = C.colsb;
  for (int m = 0; m < C.rows; ++m)
    for (int n = 0; n < C.colsb / 4; ++n) {
      uint32_t acc;
      std::memcpy(&acc, C.data[m] + 4 * n, 4);
      for (int k = 0; k < A.colsb; ++k)  // each product fits int32 (at most 255 * 255); the sum wraps as uint32
        acc += static_cast<uint32_t>(value(A.data[m][k], A_SIGNED) * value(B.data[k / 4][4 * n + k % 4], B_SIGNED));
      std::memcpy(out.data[m] + 4 * n, &acc, 4);
    }
  C = out;  // the bytes past c's colsb and its rows past c's rows zeroed
}

inline void tdpbssd(int c, int a, int b) { tdp<true, true>("tdpbssd", c, a, b); }
inline void tdpbsud(int c, int a, int b) { tdp<true, false>("tdpbsud", c, a, b); }
inline void tdpbusd(int c, int a, int b) { tdp<false, true>("tdpbusd", c, a, b); }
inline void tdpbuud(int c, int a, int b) { tdp<false, false>("tdpbuud", c, a, b); }

}  // namespace hvd_amx_emulate

// hvd_cpu: which of the native forward's instruction-set paths this CPU, and for amx the OS, can run.
//
// The loader (hvd_agents/runtime/cpu/native_forward.py) asks the AVX2 build before it builds or loads another: a build
// for instructions the CPU lacks would fault at its first use. GCC's own CPUID reading says what the CPU has; the
// amx path also needs the OS to grant the process the tile state (amx.h).
#pragma once

#include <stdexcept>
#include <string>

#include "amx.h"

namespace hvd_cpu {

// "" when this CPU (GCC's own CPUID reading) and, for amx, the OS can run a path's build; else why not.
inline std::string cpu_refusal(const std::string& path) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  if (path == "avx2") return avx2 ? "" : "it has no AVX2 and FMA";
  if (path == "avx512-vnni") return vnni ? "" : "it has no AVX-512 (F, BW, VL) with VNNI";
  if (path == "amx") {
    if (!vnni) return "it has no AVX-512 (F, BW, VL) with VNNI";
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8"))
      return "it has no AMX tiles (AMX-TILE and AMX-INT8)";
    return hvd_amx::tile_state_refusal();
  }
  throw std::invalid_argument("unknown CPU path " + path);
}

}  // namespace hvd_cpu

// Runtime SIMD dispatch. The kernel library is compiled for the baseline ISA; the vector variants
// of each kernel live in files compiled with their own ISA flags and are chosen at run time from
// what the CPU (and the OS, for AVX-512 register state) supports. Never -march=native, so a wheel
// built on one machine runs on any machine of the same architecture.
#pragma once

namespace ds {

enum class SimdLevel : int {
  kScalar = 0,
  kNeon = 1,    // aarch64 Advanced SIMD (every aarch64 CPU has it)
  kAvx2 = 2,    // AVX2 + FMA + F16C
  kAvx512 = 3,  // AVX-512 F/BW/VL/DQ
  kAvx512Bf16 = 4,  // AVX-512 F/BW/VL/DQ + AVX512_BF16 (bf16 rounding in one instruction)
};

// Best level this CPU supports and this build contains (probed once, cached).
SimdLevel detected_simd_level();

// Level the kernels use now: the detected one unless lowered by set_simd_level or the DS_SIMD
// environment variable ("scalar", "neon", "avx2", "avx512",
// "avx512_bf16") read at first use.
SimdLevel simd_level();

// Lower (or restore) the level used by the kernels, e.g. to test every code path on one machine.
// Returns false (and changes nothing) if the CPU or build cannot run `level`.
bool set_simd_level(SimdLevel level);

const char* simd_level_name(SimdLevel level);
// Parses a name as printed by simd_level_name; returns false if unknown.
bool parse_simd_level(const char* name, SimdLevel* out);

// Comma-separated ISA extensions compiled into this build (e.g. "scalar,avx2,avx512,avx512_bf16").
const char* simd_levels_built();

}  // namespace ds

// What every CPU emulation of the chapters' kernels needs besides its scheduler (common/emu_warp.hpp for the sm_80
// instructions, chapter 05's tests/emu/emu_sm90.hpp for Hopper's): CUDA's keywords as nothing, and the 16-bit values of
// either dtype - emu::IsHalf<T> tells a kernel's 16-bit type T as fp16 (fa::half_t here; a chapter that uses CUDA's
// __half specialises it) or bf16.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "dtype.hpp"

// CUDA's keywords as nothing (a CUDA header the chapter includes first may have defined them as attributes).
#undef __global__
#undef __device__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#undef __align__
#undef __grid_constant__
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__
#define __launch_bounds__(...)

inline int min(int a, int b) { return a < b ? a : b; }

namespace emu {
template <class T>
struct IsHalf : std::is_same<T, fa::half_t> {};
inline uint16_t bits16(float x, bool half) {
  return half ? fa::from_float<fa::half_t>(x).bits : fa::from_float<fa::bfloat16_t>(x).bits;
}
inline float value16(uint16_t b, bool half) { return half ? fa::to_float(fa::half_t{b}) : fa::to_float(fa::bfloat16_t{b}); }
}  // namespace emu

// A warp's shuffle: each emulation defines it with its scheduler (emu_warp.hpp, chapter 05's tests/emu/emu_sm90.hpp).
inline float __shfl_xor_sync(unsigned mask, float x, int lane_mask);

namespace fa::tc {
// ptx.cuh's reductions over the 4 lanes of a quad (the lanes that share an mma row).
inline float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
// Two floats rounded to the dtype in one register, `lo` in the low half (ptx.cuh's pack2).
template <class T>
inline uint32_t pack2(float lo, float hi) {
  constexpr bool h = emu::IsHalf<T>::value;
  return uint32_t(emu::bits16(lo, h)) | (uint32_t(emu::bits16(hi, h)) << 16);
}
}  // namespace fa::tc

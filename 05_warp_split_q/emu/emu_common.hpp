// What both CPU emulations (emu.hpp for steps 1-8, emu_sm90.hpp for the Hopper steps) need besides their
// schedulers: CUDA's keywords as nothing, the host's 16-bit types as the kernels' types, and the 16-bit packing.
#pragma once
#include <cstdint>
#include <type_traits>

#include "dtype.hpp"

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__
#define __launch_bounds__(...)

inline int min(int a, int b) { return a < b ? a : b; }

namespace fa {  // the kernels' 16-bit type is the host's own here
template <class T>
struct CudaType {
  using type = T;
};
template <class T>
T* cuda_ptr(T* p) {
  return p;
}
}  // namespace fa

namespace wsq {

inline uint16_t bits16(float x, bool half) {
  return half ? fa::from_float<fa::half_t>(x).bits : fa::from_float<fa::bfloat16_t>(x).bits;
}
inline float value16(uint16_t b, bool half) { return half ? fa::to_float(fa::half_t{b}) : fa::to_float(fa::bfloat16_t{b}); }
// Two floats rounded to the dtype in one register, `lo` in the low half (ptx.cuh's pack2).
template <class T>
inline uint32_t pack2(float lo, float hi) {
  constexpr bool h = std::is_same_v<T, fa::half_t>;
  return uint32_t(bits16(lo, h)) | (uint32_t(bits16(hi, h)) << 16);
}

}  // namespace wsq

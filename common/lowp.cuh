// Device-side names of the host's 16-bit types (common/dtype.hpp), which are bit-compatible with CUDA's:
// a DeviceBuffer<half_t> holds __half values. Kernels are templated on the CUDA type; host code on fa's.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "dtype.hpp"

namespace fa {

template <class T>
struct CudaType;  // fa type -> CUDA type
template <>
struct CudaType<half_t> {
  using type = __half;
};
template <>
struct CudaType<bfloat16_t> {
  using type = __nv_bfloat16;
};
static_assert(sizeof(half_t) == sizeof(__half) && sizeof(bfloat16_t) == sizeof(__nv_bfloat16),
              "the host 16-bit types must be bit-compatible with CUDA's");

template <class T>
auto* cuda_ptr(T* p) {
  using C = typename CudaType<std::remove_const_t<T>>::type;
  if constexpr (std::is_const_v<T>) return reinterpret_cast<const C*>(p);
  else return reinterpret_cast<C*>(p);
}

}  // namespace fa

// The backward's host side on a GPU: launching a kernel (with the opt-in for more than 48 KiB of dynamic shared
// memory, checked), zeroing dQ, and the 16-bit -> fp32 widening of the D kernel. emu/emu_bwd.hpp provides the same
// names for the CPU emulation, which is why this is a guard and not #pragma once.
#ifndef WSQ_BWD_LAUNCH_CUH
#define WSQ_BWD_LAUNCH_CUH
#include <cuda_runtime.h>

#include "cuda_check.cuh"
#include "lowp.cuh"
#include "bwd_host.hpp"

namespace wsq {
namespace bwd {

template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, int threads, size_t smem_bytes, Args... args) {
  constexpr size_t kDefaultSmem = 48 * 1024;  // more needs the per-kernel opt-in (sm_80: 163 KiB, sm_90: 227 KiB)
  if (smem_bytes > kDefaultSmem)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes)));
  kernel<<<grid, threads, smem_bytes>>>(args...);
  CHECK_LAUNCH();
}

inline void zero_floats(float* p, size_t n) { CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float))); }

__device__ __forceinline__ float widen(__half x) { return __half2float(x); }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }

}  // namespace bwd
}  // namespace wsq

#endif  // WSQ_BWD_LAUNCH_CUH

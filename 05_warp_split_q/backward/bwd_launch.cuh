// The backward's host side on a GPU: launching a kernel (with the opt-in for more than 48 KiB of dynamic shared
// memory, checked), zeroing dQ, and the 16-bit -> fp32 widening of the D kernel. tests/emu/emu_bwd.hpp provides the same
// names for the CPU emulation, which is why this is a guard and not #pragma once.
#ifndef WSQ_BWD_LAUNCH_CUH
#define WSQ_BWD_LAUNCH_CUH
#include <cuda_runtime.h>

#include "cuda_check.cuh"
#include "device.cuh"
#include "lowp.cuh"
#include "bwd_host.hpp"

namespace wsq {
namespace bwd {

template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, int threads, size_t smem_bytes, Args... args) {
  fa::opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem_bytes, "this backward step");
  kernel<<<grid, threads, smem_bytes>>>(args...);
  CHECK_LAUNCH();
}

inline void zero_floats(float* p, size_t n) { CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float))); }

__device__ __forceinline__ float widen(__half x) { return __half2float(x); }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }

}  // namespace bwd
}  // namespace wsq

#endif  // WSQ_BWD_LAUNCH_CUH

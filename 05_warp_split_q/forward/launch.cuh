// Host side shared by the step files: the grid every step uses (one block per Q block, head and batch, as in
// chapter 04), the opt-in for more than 48 KiB of dynamic shared memory, and the pointer casts from the host's
// 16-bit types to CUDA's.
#ifndef WSQ_LAUNCH_CUH  // a guard, not #pragma once: tests/emu/emu.hpp provides a CPU version of this header
#define WSQ_LAUNCH_CUH
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_check.cuh"
#include "device.cuh"
#include "lowp.cuh"
#include "problem.hpp"

namespace wsq {

// Kernel signature of every step: fa::Problem by value, CUDA 16-bit pointers, LSE in fp32.
template <class Tc>
using Kernel = void (*)(fa::Problem, const Tc*, const Tc*, const Tc*, Tc*, float*);

template <class T>
void launch(Kernel<typename fa::CudaType<T>::type> kernel, int Br, int threads, size_t smem_bytes, const fa::Problem& p,
            const T* q, const T* k, const T* v, T* o, float* lse) {
  fa::opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem_bytes, "this step");
  const dim3 grid((p.q_len + Br - 1) / Br, p.heads, p.batch);
  kernel<<<grid, threads, smem_bytes>>>(p, fa::cuda_ptr(q), fa::cuda_ptr(k), fa::cuda_ptr(v), fa::cuda_ptr(o), lse);
  CHECK_LAUNCH();
}

// The same launch for a kernel that also takes a block mask (block-sparse attention, common/block_mask.hpp;
// nullptr = dense): step 8 and its block-sparse variant (README, "Block-sparse step 8").
template <class Tc>
using MaskedKernel = void (*)(fa::Problem, const Tc*, const Tc*, const Tc*, Tc*, float*, const uint8_t*);

template <class T>
void launch_masked(MaskedKernel<typename fa::CudaType<T>::type> kernel, int Br, int threads, size_t smem_bytes,
                   const fa::Problem& p, const T* q, const T* k, const T* v, T* o, float* lse, const uint8_t* block_mask) {
  fa::opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem_bytes, "this step");
  const dim3 grid((p.q_len + Br - 1) / Br, p.heads, p.batch);
  kernel<<<grid, threads, smem_bytes>>>(p, fa::cuda_ptr(q), fa::cuda_ptr(k), fa::cuda_ptr(v), fa::cuda_ptr(o), lse,
                                        block_mask);
  CHECK_LAUNCH();
}

}  // namespace wsq

#endif  // WSQ_LAUNCH_CUH

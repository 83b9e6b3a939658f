// Chapter 04, shared by its kernel files (not part of the host API): the ladder's forward steps, one file
// each, and the two host checks every launch makes. forward_steps() (fa2_forward.cu) lists the steps.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "cuda_check.cuh"
#include "fa2.cuh"

namespace fa2 {

// The forward ladder, in order; each is a complete kernel with the same contract as fa2::forward.
void forward_v1_loop_swap(const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* lse);
void forward_v2_deferred_norm(const fa::Problem& p, const float* q, const float* k, const float* v, float* o,
                              float* lse);
void forward_v3_q_grid(const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* lse);
// Step 4 also takes a block mask (nullptr = dense): fa2::forward's.
void forward_v4_micro_tile(const fa::Problem& p, const float* q, const float* k, const float* v, float* o,
                           float* lse, const uint8_t* block_mask);

namespace detail {
// check_supported(p), then the 16-byte alignment the float4 loads need (cudaMalloc's pointers have it).
void check_args(const fa::Problem& p, std::initializer_list<const void*> ptrs);
// Throws fa::UsageError ("head_dim 128 needs X KiB of shared memory per block, this GPU allows Y KiB") when
// the device's per-block opt-in limit is below `bytes`.
void check_smem(size_t bytes, int head_dim);
// check_smem, then raise the kernel's dynamic shared-memory limit (above 48 KiB a block must opt in).
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes, int head_dim) {
  check_smem(bytes, head_dim);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}
}  // namespace detail

}  // namespace fa2

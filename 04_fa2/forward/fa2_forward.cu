// Chapter 04: the FlashAttention-2 forward as a ladder of four kernels, one file each, each one idea on
// top of the previous (README §3):
//   v01_loop_swap.cu       02's kernel with the loops swapped: O_i, l_i, m_i stay on chip
//   v02_deferred_norm.cu   an unnormalised accumulator, divided by l_i once at the end
//   v03_q_grid.cu          one thread block per Q block (grid over the sequence)
//   v04_micro_tile.cu      4 x 4 register micro-tiles and float4 loads   (= fa2::forward)
// This file lists them and holds the checks every 04 launch makes.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "fa2_internal.cuh"
#include "fa2_tiles.cuh"

namespace fa2 {

const std::vector<ForwardStep>& forward_steps() {
  static const std::vector<ForwardStep> steps = {
      {"v1_loop_swap", "02's kernel, loops swapped: Q blocks outer, K/V blocks inner; O_i, l_i, m_i stay on chip",
       forward_v1_loop_swap, "fp32", fa::Arch::any},
      {"v2_deferred_norm", "unnormalised O~_i rescaled per K/V block, divided by l_i once at the end",
       forward_v2_deferred_norm, "fp32", fa::Arch::any},
      {"v3_q_grid", "grid over (Q block, head, batch) instead of (head, batch)", forward_v3_q_grid, "fp32",
       fa::Arch::any},
      {"v4_micro_tile", "4 x 4 register micro-tiles of S_ij, float4 shared-memory loads, P~ stored transposed",
       [](const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* lse) {
         forward_v4_micro_tile(p, q, k, v, o, lse, nullptr);
       },
       "fp32", fa::Arch::any},
  };
  return steps;
}

void forward(const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* lse,
             const uint8_t* block_mask) {
  forward_v4_micro_tile(p, q, k, v, o, lse, block_mask);
}

Tiles forward_tiles() { return {tile::kFwdBr, tile::kFwdBc}; }
Tiles backward_tiles() { return {tile::kBwdBr, tile::kBwdBc}; }

void check_supported(const fa::Problem& p) {
  p.validate();
  if (p.head_dim != 16 && p.head_dim != 32 && p.head_dim != 64 && p.head_dim != 128)
    throw fa::UsageError("fa2: head_dim must be 16, 32, 64 or 128 (got " + std::to_string(p.head_dim) + ")");
  if (p.heads > 65535 || p.batch > 65535)
    throw fa::UsageError("fa2: heads and batch must be <= 65535 (grid dimensions y and z)");
}

namespace detail {

void check_args(const fa::Problem& p, std::initializer_list<const void*> ptrs) {
  check_supported(p);
  for (const void* ptr : ptrs)
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      throw fa::UsageError("fa2: tensors must be 16-byte aligned (the kernels load float4)");
}

void check_smem(size_t bytes, int head_dim) {
  int dev = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (bytes > size_t(optin)) {
    char msg[160];
    std::snprintf(msg, sizeof msg, "fa2: head_dim %d needs %.1f KiB of shared memory per block, this GPU allows %.1f KiB",
                  head_dim, bytes / 1024.0, optin / 1024.0);
    throw fa::UsageError(msg);
  }
}

}  // namespace detail
}  // namespace fa2

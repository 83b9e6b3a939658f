// Chapter 02 host API: the FlashAttention-1 forward pass (FA1's Algorithm 2), fp32.
#pragma once
#include <cstddef>
#include <cstdint>

#include "problem.hpp"

namespace fa1 {

// Br, Bc from the on-chip memory M (bytes of shared memory a block may use), Algorithm 2 line 1:
// Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d), then clamped to what the kernel supports.
struct BlockSizes {
  int Br, Bc;
};
BlockSizes block_sizes(int head_dim, size_t smem_bytes);

// The dropout RNG state the forward used; the backward regenerates the same mask from it.
struct RngState {
  uint64_t seed, offset;
};

// O [B,H,Nq,d]; l, m, lse [B,H,Nq] (lse = m + log l; l = 0, m = -inf, lse = -inf for an empty row).
// head_dim in {16, 32, 64, 128}; other values are a fa::UsageError naming the supported ones.
// q, k, v must be 16-byte aligned (they are read as float4; cudaMalloc's pointers are).
RngState forward(const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* l,
                 float* m, float* lse);

// The same with explicit block sizes, 1 <= Br <= max_br(d), 1 <= Bc <= max_bc(): what forward()
// runs with block_sizes(d, device_sram_bytes()). Tests and the program's --sram-kb use it to run
// the tiling a device with less shared memory would get.
RngState forward(const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* l,
                 float* m, float* lse, BlockSizes bs);
int max_br(int head_dim);  // the kernel's capacity: min(d, 64)
int max_bc();              // 64
// Throws fa::UsageError naming what this chapter supports (head_dim 16/32/64/128, grid limits).
void check_supported(const fa::Problem& p);
// M of line 2: the shared memory a block may use on the current device (the opt-in maximum).
size_t device_sram_bytes();
// Bytes of HBM traffic forward() moves with block sizes bs: Algorithm 2 line by line (model.hpp), fp32.
double forward_hbm_bytes(const fa::Problem& p, BlockSizes bs);

}  // namespace fa1

// What the backward's kernel files share on the device: tile sizes, the padded shared-memory tiles and their
// loads, one ldmatrix call for the four operand situations (bwd_frag.hpp). The host side (launching, the driver
// D = rowsum(dO o O) -> K/V-block kernel -> dQ kernel) is bwd_launch.cuh.
#pragma once
#include "backward.cuh"
#include "bwd_frag.hpp"
#include "bwd_launch.cuh"
#include "forward/tc.cuh"

namespace wsq {
namespace bwd {

// ---- tiles ----------------------------------------------------------------------------------------------
// K/V-block kernel: Bc keys (64 in steps 1-5, 128 from step 6), Bc / 16 warps, warp w owns keys 16w .. 16w+15
// (their dK, dV rows live in its registers for the whole kernel). Br query rows per step of the Q loop: 64 at
// d = 64; at d = 128 32 in steps 1-6, because dK and dV of 16 keys x 128 columns already take 128 fp32 registers
// per lane, and 64 in step 7, which spends the last few registers on it.
template <int D, int KeysPerBlock = 64, int QueryRows = (D == 64 ? 64 : 32)>
struct KvTile {
  static_assert(D == 64 || D == 128, "the backward is compiled for head_dim 64 and 128");
  static_assert(KeysPerBlock == 64 || KeysPerBlock == 128, "4 or 8 warps of 16 keys");
  static_assert(QueryRows == 32 || QueryRows == 64, "2 or 4 row tiles of 16 queries");
  static constexpr int Bc = KeysPerBlock, Br = QueryRows;
  static constexpr int kWarps = Bc / 16, kThreads = 32 * kWarps;
};
// Deterministic dQ kernel: Br = 64 query rows, 4 warps, warp w owns rows 16w .. 16w+15; Bc = 64 keys per step,
// kStages = 2 shared buffers of K_j, V_j (the block being computed and the one being loaded).
struct DqTile {
  static constexpr int Br = 64, Bc = 64, kWarps = Br / 16, kThreads = 32 * kWarps, kStages = 2;
};

// Shared tiles are row-major with every row padded by 8 values (16 bytes). A row of 64 or 128 values is 144
// or 272 bytes, 9 or 17 sixteen-byte units: the 8 rows one ldmatrix phase reads fall into 8 different units
// mod 8, i.e. all 32 banks. The forward's XOR swizzle needs rows of at least 8 units; the backward's
// P^T / dS^T tiles at d = 128 have rows of Br = 32 values (4 units), so padding is the one rule that fits all.
constexpr int kPad = 8;

// P = exp(x) is computed as 2^(x log2(e)): MUFU.EX2 is the hardware's exponential (step 4, the dQ kernel).
constexpr float kLog2e = 1.4426950408889634f;

// Rows [row0, row0 + Rows) of a [n_rows, D] matrix -> shared [Rows][D + kPad]; rows past n_rows are zero.
template <class T, int Rows, int D, int Threads>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int row0, int n_rows) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < Rows * kChunks; c += Threads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (row0 + r < n_rows) x = *reinterpret_cast<const uint4*>(src + size_t(row0 + r) * D + col);
    *reinterpret_cast<uint4*>(dst + r * (D + kPad) + col) = x;
  }
}

// The same rows started as cp.async copies (the caller commits and waits): rows past n_rows are zero-filled
// without being read (their source address is clamped to row 0, which exists). Steps 3-7 and the dQ kernel.
template <class T, int Rows, int D, int Threads>
__device__ __forceinline__ void load_tile_async(T* dst, const T* src, int row0, int n_rows) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < Rows * kChunks; c += Threads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = row0 + r < n_rows;
    cp_async_16(dst + r * (D + kPad) + col, src + size_t(valid ? row0 + r : 0) * D + col, valid);
  }
}

// L_i and D_i of rows [i0, i0 + Rows) -> shared (0 past q_len: those rows are masked anyway).
template <int Rows, int Threads>
__device__ __forceinline__ void load_stats(float* Ls, float* Ds, const float* L, const float* Dv, int i0, int q_len) {
  for (int r = threadIdx.x; r < Rows; r += Threads) {
    const bool in = i0 + r < q_len;
    Ls[r] = in ? L[i0 + r] : 0.f;
    Ds[r] = in ? Dv[i0 + r] : 0.f;
  }
}

// One ldmatrix x4 of the 16 x 16 tile whose top-left element is `tile` (row stride ld), as operand `op`.
template <bwd_frag::Operand op, class T>
__device__ __forceinline__ void ldm(uint32_t r[4], const T* tile, int ld, int lane) {
  const frag::RowCol s = bwd_frag::source(op, lane);
  if constexpr (bwd_frag::needs_trans(op)) ldmatrix_x4_trans(r, tile + s.row * ld + s.col);
  else ldmatrix_x4(r, tile + s.row * ld + s.col);
}

// Does the (Q block at i0 of Br rows, K/V block at j0 of Bc keys) tile need the per-element mask? Only where
// it crosses the causal diagonal or the end of the queries or keys.
__device__ __forceinline__ bool needs_mask(const fa::Problem& p, int i0, int Br, int j0, int Bc) {
  return i0 + Br > p.q_len || j0 + Bc > p.kv_len || (p.causal && j0 + Bc - 1 > i0 + p.causal_shift());
}

}  // namespace bwd
}  // namespace wsq

// Chapter 04, shared by forward step 4 (v04_micro_tile.cu) and the backward (fa2_backward.cu): the
// 16 x 16 thread grid with a 4 x 4 micro-tile of S_ij per thread, the tile sizes, and the small device
// helpers both use (float4 shared-memory loads, 16-lane row reductions, tile loads).
#pragma once
#include <cstddef>

#include "problem.hpp"

namespace fa2 {
namespace tile {

constexpr int kThreads = 256;
constexpr int kTx = 16;                 // threads along a tile's columns (16 consecutive lanes = one tile row group)
constexpr int kTy = kThreads / kTx;     // threads along a tile's rows
constexpr int kPad = 4;                 // shared-memory row padding (floats): keeps float4 accesses conflict-free
constexpr int kFwdBr = 64, kFwdBc = 64; // forward (step 4) and deterministic-dQ tiles
constexpr int kBwdBr = 32, kBwdBc = 64; // main backward tiles (Br smaller: six tiles live in shared memory)
constexpr int kMicro = 4;               // rows (or columns) of S_ij per thread along the 16-thread side
static_assert(kThreads % 32 == 0 && kTx == 16, "row reductions shuffle over 16 consecutive lanes of a warp");
static_assert(kFwdBr == kTy * kMicro && kFwdBc == kTx * kMicro, "forward: 4 x 4 micro-tile of S_ij per thread");
static_assert(kBwdBc == kTy * kMicro && kBwdBr % kTx == 0, "backward: 4 key rows x Br/16 query columns per thread");
static_assert(kBwdBc % 4 == 0, "dQ += dS K_j reads dS_ij four keys at a time");

// The output columns of thread tx in a [rows, D] tile: kN = D/16 columns, in kN/kVec runs of kVec contiguous
// floats (one vector load each): d=16: tx; d=32: 2tx..2tx+1; d=64: 4tx..4tx+3; d=128: 4tx.. and 64+4tx..
template <int D>
struct OutCols {
  static_assert(D % kTx == 0, "head_dim must be a multiple of 16");
  static constexpr int kN = D / kTx;
  static constexpr int kVec = kN < 4 ? kN : 4;
  __device__ __forceinline__ static int col(int tx, int e) { return (e / kVec) * (kTx * kVec) + tx * kVec + e % kVec; }
  __device__ __forceinline__ static void load(const float* row, int tx, float (&x)[kN]) {
#pragma unroll
    for (int g = 0; g < kN / kVec; ++g) {
      const float* src = row + g * kTx * kVec + tx * kVec;
      if constexpr (kVec == 4) {
        const float4 t = *reinterpret_cast<const float4*>(src);
        x[4 * g] = t.x, x[4 * g + 1] = t.y, x[4 * g + 2] = t.z, x[4 * g + 3] = t.w;
      } else if constexpr (kVec == 2) {
        const float2 t = *reinterpret_cast<const float2*>(src);
        x[2 * g] = t.x, x[2 * g + 1] = t.y;
      } else {
        x[g] = src[0];
      }
    }
  }
};

__device__ __forceinline__ float4 lds4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}
__device__ __forceinline__ float at(float4 v, int r) { return r == 0 ? v.x : r == 1 ? v.y : r == 2 ? v.z : v.w; }

// Reductions over the 16 lanes that hold one row of S_ij (lanes 0-15 or 16-31 of a warp).
__device__ __forceinline__ float row_max(float x) {
#pragma unroll
  for (int o = kTx / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int o = kTx / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Rows [row0, row0 + rows) of a [len, D] matrix into shared memory with row stride ld; rows past len are 0.
template <int D>
__device__ inline void load_rows(float* dst, int ld, const float* src, int row0, int rows, int len) {
  static_assert(D % 4 == 0, "rows are copied as float4");
  constexpr int kVecs = D / 4;
  for (int e = threadIdx.x; e < rows * kVecs; e += kThreads) {
    const int r = e / kVecs, c4 = e % kVecs;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row0 + r < len) x = reinterpret_cast<const float4*>(src + size_t(row0 + r) * D)[c4];
    *reinterpret_cast<float4*>(dst + r * ld + 4 * c4) = x;
  }
}


// Does the (Q block at i0, K/V block at j0, bc keys) tile need the mask? Only if its first query row
// misses its last key: then the tile crosses the causal diagonal or the end of the keys.
__device__ __forceinline__ bool needs_mask(const fa::Problem& p, int i0, int j0, int bc) {
  return !p.visible(i0, j0 + bc - 1);
}
// Keys the Q block [i0, i0 + rows) sees at most (its last row sees the most): the K/V loop stops there.
__device__ __forceinline__ int kv_end(const fa::Problem& p, int i0, int rows) {
  return p.visible_keys(min(i0 + rows, p.q_len) - 1);
}

}  // namespace tile
}  // namespace fa2

// Fragment maps of the tensor-core instructions chapters 05 and 06 use, as constexpr functions that the kernels
// call to compute their shared-memory addresses and that test_frag.cpp runs on the CPU.
//
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32: D (16x8) = A (16x16) B (16x8) + C.
// Source: PTX ISA, section 9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with floating point type".
// Every lane of the warp holds a few elements of each matrix; with g = lane / 4 (the "group") and
// t = lane % 4 (the thread in the group):
//   A: 8 elements a0..a7 in 4 registers of two 16-bit values; a_e is at row g (+8 for e = 2,3,6,7),
//      column 2t + (e & 1) (+8 for e >= 4).
//   B: 4 elements b0..b3 in 2 registers; b_e is at row (k) 2t + (e & 1) (+8 for e >= 2), column (n) g.
//   C, D: 4 floats c0..c3; c_e is at row g (+8 for e >= 2), column 2t + (e & 1).
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX ISA 9.7.14.5.15, "ldmatrix"): loads four 8x8
// matrices of 16-bit values. Lane 8m + r supplies the address of row r of matrix m (8 contiguous values,
// 16 bytes); lane L receives in register m the two values at row L / 4, columns 2 (L % 4) and +1 of matrix
// m, or with .trans the two values at rows 2 (L % 4) and +1, column L / 4 (the transposed matrix).
#pragma once
#include "hd.hpp"

namespace fa::frag {

struct RowCol {
  int row, col;
};

FA_HD constexpr int group(int lane) { return lane >> 2; }
FA_HD constexpr int thread_in_group(int lane) { return lane & 3; }

// Element e of the A fragment (16x16) held by `lane`: register e / 2, half e % 2 (low first).
FA_HD constexpr RowCol a_elem(int lane, int e) {
  return {group(lane) + 8 * ((e >> 1) & 1), 2 * thread_in_group(lane) + (e & 1) + 8 * (e >> 2)};
}
// Element e of the B fragment (16x8, rows are k): register e / 2, half e % 2.
FA_HD constexpr RowCol b_elem(int lane, int e) {
  return {2 * thread_in_group(lane) + (e & 1) + 8 * (e >> 1), group(lane)};
}
// Element e of the C/D fragment (16x8 floats).
FA_HD constexpr RowCol c_elem(int lane, int e) { return {group(lane) + 8 * (e >> 1), 2 * thread_in_group(lane) + (e & 1)}; }

// ---- ldmatrix x4 ----
// What `lane` receives in register m, half e (0 low, 1 high), as (row, col) inside 8x8 matrix m.
FA_HD constexpr RowCol ldmatrix_elem(int lane, int e, bool trans) {
  return trans ? RowCol{2 * (lane & 3) + e, lane >> 2} : RowCol{lane >> 2, 2 * (lane & 3) + e};
}
// The row of a 16x16 tile whose address `lane` supplies, so that ldmatrix.x4 delivers:
//  a_tile_*:  the A fragment of a row-major 16x16 tile (matrices: rows 0-7/8-15 x cols 0-7, then cols 8-15),
//             also the B fragments of two n-tiles of a row-major [k][n] tile with .trans (V in P V: the same
//             matrix order gives registers {b01, b23} of n-tile 0, then of n-tile 1);
//  nk_tile_*: the B fragments of two n-tiles of a tile stored [n][k] (K in Q K^T, no .trans): registers
//             {b01, b23} of n-tile 0 (rows 0-7), then of n-tile 1 (rows 8-15); with .trans, the A fragment of the
//             transpose of a row-major tile (V_j^T in chapter 06's flat_gemm, O^T += V_j^T P^T).
FA_HD constexpr int a_tile_row(int lane) { return (lane & 7) + 8 * ((lane >> 3) & 1); }
FA_HD constexpr int a_tile_col(int lane) { return 8 * (lane >> 4); }
FA_HD constexpr int nk_tile_row(int lane) { return (lane & 7) + 8 * (lane >> 4); }
FA_HD constexpr int nk_tile_col(int lane) { return 8 * ((lane >> 3) & 1); }

// ---- S stays in registers (FA2's trick) ----
// The C fragments of S for the n-tiles 2k and 2k+1 (keys 16k .. 16k+15) hold exactly the A fragment of
// P for k-step k: A register r = the two floats (c[2r' ], c[2r'+1]) of n-tile 2k + p_from_s_ntile(r),
// with 2r' = p_from_s_celem(r). Packing them to 16 bits is all it takes (test_frag.cpp proves it).
FA_HD constexpr int p_from_s_ntile(int reg) { return reg >> 1; }       // 0: n-tile 2k, 1: n-tile 2k+1
FA_HD constexpr int p_from_s_celem(int reg) { return 2 * (reg & 1); }  // c0 (row g) or c2 (row g+8)

// ---- the shared-memory swizzle ----
// A tile of rows of `row_chunks` 16-byte chunks (8 values each). Stored plainly, the 8 rows that one
// ldmatrix phase reads at the same chunk column sit a multiple of 128 bytes apart: the same 4 banks, an
// 8-way conflict. XOR-ing the chunk index with (row mod 8) sends those 8 rows to 8 different chunk
// positions mod 8, i.e. all 32 banks. Within a row it permutes the chunks (a bijection), and a row of
// 8 or 16 chunks maps onto itself, so the tile takes no extra space.
FA_HD constexpr int swizzle_chunk(int row, int chunk) { return chunk ^ (row & 7); }
// Offset in elements of (row, col) in a swizzled tile with `cols` 16-bit values per row.
FA_HD constexpr int swizzled(int row, int col, int cols) {
  return row * cols + 8 * swizzle_chunk(row, col >> 3) + (col & 7);
}

}  // namespace fa::frag

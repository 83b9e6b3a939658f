// Where each lane points ldmatrix x4 for the four operand situations of the backward's five GEMMs, as
// constexpr functions the kernels call and test_bwd_frag.cpp simulates on the CPU (frag.hpp holds the mma
// and ldmatrix maps themselves; this file only combines them).
//
// An operand of mma.m16n8k16 is A (16 x 16, m x k, "row") or B (16 x 8, k x n, "col"). In shared memory a
// tile is stored row-major one of two ways; which way decides whether ldmatrix needs .trans:
//   A stored [m][k]  (K_j, V_j as A of S^T, dP^T; P^T, dS^T as A of dV, dK in step v1)   ldmatrix
//   A stored [k][m]  (dS as A of dQ += dS K_j, kept as dS^T [key][query])                 ldmatrix .trans
//   B stored [n][k]  (Q_i, dO_i as B of S^T = K Q^T, dP^T = V dO^T; K_j, V_j in the dQ kernel)  ldmatrix
//   B stored [k][n]  (dO_i, Q_i as B of dV += P^T dO, dK += dS^T Q; K_j as B of dQ += dS K)     ldmatrix .trans
// One ldmatrix x4 loads a whole 16 x 16 tile of the stored matrix: the A fragment, or the B fragments of two
// n-tiles (registers {b01, b23} of n-tile 0, then of n-tile 1).
#pragma once
#include "frag.hpp"

namespace wsq {
namespace frag = fa::frag;  // common/frag.hpp
namespace bwd_frag {

enum class Operand { A_mk, A_km, B_nk, B_kn };

// The rule: ldmatrix hands each lane pairs of values that are neighbours along k (the mma's operand layout),
// so .trans is needed exactly when the stored tile has k as its row index (neighbours along k are then a
// row apart in memory).
FA_HD constexpr bool needs_trans(Operand op) { return op == Operand::A_km || op == Operand::B_kn; }

// (row, col) inside the stored 16 x 16 tile whose address `lane` supplies. The four 8x8 matrices must arrive
// in register order: A: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15);
// B pair: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15). Lane 8q + r addresses row r
// of matrix q. Storing the tile transposed swaps the role of row and column, which is why A_km uses the
// address pattern of B_nk and B_kn the one of A_mk.
FA_HD constexpr frag::RowCol source(Operand op, int lane) {
  return (op == Operand::A_mk || op == Operand::B_kn) ? frag::RowCol{frag::a_tile_row(lane), frag::a_tile_col(lane)}
                                                       : frag::RowCol{frag::nk_tile_row(lane), frag::nk_tile_col(lane)};
}

}  // namespace bwd_frag
}  // namespace wsq

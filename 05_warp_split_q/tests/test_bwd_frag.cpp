// CPU tests (CI): one warp's ldmatrix x4 simulated lane by lane from frag.hpp's maps, for the four ways the
// backward's five GEMMs find their operands in shared memory (bwd_frag.hpp). Each stored 16 x 16 tile holds
// distinct values, so a fragment element that came from the wrong address cannot pass.
#include <doctest/doctest.h>

#include <cstdint>
#include <initializer_list>

#include "backward/bwd_frag.hpp"

using namespace wsq;
using bwd_frag::Operand;

namespace {

constexpr int kN = 16;
int stored(int row, int col) { return 100 * row + col; }  // the value at (row, col) of the stored tile

// What `lane` receives in register m, half e, when every lane points ldmatrix x4 where bwd_frag::source says.
int delivered(Operand op, int lane, int m, int e) {
  const frag::RowCol in = frag::ldmatrix_elem(lane, e, bwd_frag::needs_trans(op));  // inside 8x8 matrix m
  const frag::RowCol row_addr = bwd_frag::source(op, 8 * m + in.row);  // the lane that supplied that row
  return stored(row_addr.row, row_addr.col + in.col);
}

// The operand's element (row, col) as the GEMM needs it: A is m x k, B (n-tile nt) is k x 8.
int wanted(Operand op, int row, int col, int nt) {
  switch (op) {
    case Operand::A_mk: return stored(row, col);
    case Operand::A_km: return stored(col, row);
    case Operand::B_nk: return stored(8 * nt + col, row);
    default: return stored(row, 8 * nt + col);  // B_kn
  }
}

}  // namespace

TEST_CASE("bwd ldmatrix: A operands stored [m][k] (plain) and [k][m] (.trans) arrive as mma A fragments") {
  for (Operand op : {Operand::A_mk, Operand::A_km})
    for (int lane = 0; lane < 32; ++lane)
      for (int m = 0; m < 4; ++m)
        for (int e = 0; e < 2; ++e) {
          const frag::RowCol a = frag::a_elem(lane, 2 * m + e);
          REQUIRE(delivered(op, lane, m, e) == wanted(op, a.row, a.col, 0));
        }
}

TEST_CASE("bwd ldmatrix: B operands stored [n][k] (plain) and [k][n] (.trans) arrive as two n-tiles' B fragments") {
  for (Operand op : {Operand::B_nk, Operand::B_kn})
    for (int lane = 0; lane < 32; ++lane)
      for (int m = 0; m < 4; ++m)
        for (int e = 0; e < 2; ++e) {
          const frag::RowCol bb = frag::b_elem(lane, 2 * (m % 2) + e);  // registers {0,1}: n-tile 0, {2,3}: n-tile 1
          REQUIRE(delivered(op, lane, m, e) == wanted(op, bb.row, bb.col, m / 2));
        }
}

TEST_CASE("bwd ldmatrix: .trans exactly when the stored tile has k as its row index; row addresses 16-byte aligned") {
  CHECK(!bwd_frag::needs_trans(Operand::A_mk));
  CHECK(bwd_frag::needs_trans(Operand::A_km));
  CHECK(!bwd_frag::needs_trans(Operand::B_nk));
  CHECK(bwd_frag::needs_trans(Operand::B_kn));
  for (Operand op : {Operand::A_mk, Operand::A_km, Operand::B_nk, Operand::B_kn})
    for (int lane = 0; lane < 32; ++lane) {
      const frag::RowCol s = bwd_frag::source(op, lane);
      CHECK(s.col % 8 == 0);  // 8 values of 2 bytes: every row address starts a 16-byte chunk
      CHECK(s.row < kN);
    }
}

// The padded tiles of bwd_common.cuh (rows of 64 + 8, 128 + 8, 32 + 8 and 64 + 8 values): the 8 row addresses of
// one ldmatrix phase (8 lanes, same column chunk, 8 consecutive rows) fall into 8 distinct 16-byte bank groups.
TEST_CASE("bwd shared tiles: padding by 8 values makes every ldmatrix phase conflict-free") {
  for (int ld : {64 + 8, 128 + 8, 32 + 8})
    for (int row0 = 0; row0 < 16; row0 += 8)
      for (int chunk = 0; chunk < 4; ++chunk) {
        unsigned seen = 0;
        for (int r = 0; r < 8; ++r) {
          const int byte = ((row0 + r) * ld + 8 * chunk) * 2;
          seen |= 1u << ((byte / 16) % 8);
        }
        CHECK(seen == 0xFFu);
      }
}

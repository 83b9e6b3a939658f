// CPU proof of the emulation's movmatrix (emu_warp.hpp), which chapter 06's emulated flat_gemm step relies on: one
// warp run by the emulator's scheduler, against the PTX ISA's definition written here again (lane L holds row L / 4,
// columns 2 (L % 4) and 2 (L % 4) + 1 of an 8x8 matrix of 16-bit values; .trans gives it the same positions of the
// transposed matrix), and the use the step makes of it: the two 8x8 halves of a C fragment (frag.hpp's c_elem),
// packed to 16 bits and transposed, are the B fragment (b_elem) of the same 16x8 matrix.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>

#include "emu_warp.hpp"
#include "frag.hpp"

namespace {

constexpr int kLanes = 32;
std::array<std::array<uint32_t, 2>, kLanes> given, got;  // per lane: the registers before and after

void transpose_both() {
  const int L = emu::lane();
  for (int h = 0; h < 2; ++h) got[L][h] = fa::tc::movmatrix_trans(given[L][h]);
}

uint16_t half_of(uint32_t reg, int e) { return uint16_t(reg >> (16 * e)); }

}  // namespace

TEST_CASE("emulated movmatrix.trans: each lane gets its positions of the transposed 8x8 matrix") {
  auto X = [](int r, int c) { return uint16_t(0x100 * r + c + 1); };  // distinct values, none 0
  for (int L = 0; L < kLanes; ++L)
    given[L] = {uint32_t(X(L / 4, 2 * (L % 4))) | uint32_t(X(L / 4, 2 * (L % 4) + 1)) << 16, 0u};
  emu::body = transpose_both;
  emu::run_block(kLanes, {0, 0, 0});
  for (int L = 0; L < kLanes; ++L)
    for (int e = 0; e < 2; ++e) {
      INFO("lane ", L, " half ", e);
      CHECK(half_of(got[L][0], e) == X(2 * (L % 4) + e, L / 4));
    }
}

TEST_CASE("flat_gemm's transpose: a C fragment's 8x8 halves, transposed, are the B fragment of the same matrix") {
  // S^T is 16 x 8 (keys x query rows): as a C fragment, lane L holds c_e at c_elem(L, e); registers h = 0, 1 pack
  // c_{2h}, c_{2h+1} (rows g + 8h). As a B fragment (k = key, n = row), lane L must hold b_e at b_elem(L, e).
  auto S = [](int key, int row) { return uint16_t(0x100 * key + row + 1); };
  for (int L = 0; L < kLanes; ++L)
    for (int h = 0; h < 2; ++h) {
      const fa::frag::RowCol lo = fa::frag::c_elem(L, 2 * h), hi = fa::frag::c_elem(L, 2 * h + 1);
      given[L][h] = uint32_t(S(lo.row, lo.col)) | uint32_t(S(hi.row, hi.col)) << 16;
    }
  emu::body = transpose_both;
  emu::run_block(kLanes, {0, 0, 0});
  for (int L = 0; L < kLanes; ++L)
    for (int e = 0; e < 4; ++e) {
      INFO("lane ", L, " b", e);
      const fa::frag::RowCol b = fa::frag::b_elem(L, e);
      CHECK(half_of(got[L][e / 2], e % 2) == S(b.row, b.col));
    }
}

// CPU proof of the fragment maps (frag.hpp) the kernels use: one warp's ldmatrix and mma.sync m16n8k16 are
// simulated lane by lane, with the hardware's rules written here from the PTX ISA text (9.7.14.5.8 and
// 9.7.14.5.15) and the kernels' address functions, and the result is compared with a plain matrix product.
// Also: the swizzle is a bijection and conflict-free for the accesses claimed, with the conflict counts of
// the unswizzled layouts that the README predicts; S's C fragments are P's A fragments.
#include <doctest/doctest.h>

#include <array>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "frag.hpp"

using namespace fa::frag;

namespace {

constexpr int kLanes = 32;
using Regs = std::array<std::array<float, 2>, 4>;  // up to 4 registers of two 16-bit values, per lane

// A [rows][cols] tile in "shared memory": element (r, c) at offset off(r, c).
struct Smem {
  std::vector<float> mem;
  int cols;
  bool swz;
  int off(int r, int c) const { return swz ? swizzled(r, c, cols) : r * cols + c; }
};

// ldmatrix.x4 as the PTX ISA defines it: lane 8m + r gives the address of row r of matrix m (8 consecutive
// values); lane L receives in register m the values (L / 4, 2 (L % 4) + e), or with .trans (2 (L % 4) + e, L / 4).
std::array<Regs, kLanes> ldmatrix_x4(const Smem& s, const std::array<int, kLanes>& addr, bool trans) {
  std::array<Regs, kLanes> out{};
  for (int L = 0; L < kLanes; ++L)
    for (int m = 0; m < 4; ++m)
      for (int e = 0; e < 2; ++e) {
        const int r = trans ? 2 * (L % 4) + e : L / 4, c = trans ? L / 4 : 2 * (L % 4) + e;
        out[L][m][e] = s.mem[addr[8 * m + r] + c];
      }
  return out;
}

// mma.sync m16n8k16 as the PTX ISA defines it, from the lanes' A (4 regs), B (2 regs) and C fragments.
std::array<std::array<float, 4>, kLanes> mma(const std::array<Regs, kLanes>& a, const std::array<Regs, kLanes>& b,
                                             int b_reg0) {
  float A[16][16], B[16][8];
  for (int L = 0; L < kLanes; ++L) {
    for (int e = 0; e < 8; ++e) A[a_elem(L, e).row][a_elem(L, e).col] = a[L][e / 2][e % 2];
    for (int e = 0; e < 4; ++e) B[b_elem(L, e).row][b_elem(L, e).col] = b[L][b_reg0 + e / 2][e % 2];
  }
  std::array<std::array<float, 4>, kLanes> c{};
  for (int L = 0; L < kLanes; ++L)
    for (int e = 0; e < 4; ++e) {
      const RowCol rc = c_elem(L, e);
      for (int x = 0; x < 16; ++x) c[L][e] += A[rc.row][x] * B[x][rc.col];
    }
  return c;
}

std::vector<float> random_matrix(int rows, int cols, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> u(-8, 8);  // small integers: every product and sum is exact in float
  std::vector<float> m(size_t(rows) * cols);
  for (float& x : m) x = float(u(gen));
  return m;
}

Smem to_smem(const std::vector<float>& m, int rows, int cols, bool swz) {
  Smem s{std::vector<float>(m.size()), cols, swz};
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) s.mem[s.off(r, c)] = m[size_t(r) * cols + c];
  return s;
}

}  // namespace

TEST_CASE("fragment maps: A, B, C of m16n8k16 each cover their matrix exactly once") {
  std::set<std::pair<int, int>> a, b, c;
  for (int L = 0; L < kLanes; ++L) {
    for (int e = 0; e < 8; ++e) a.insert({a_elem(L, e).row, a_elem(L, e).col});
    for (int e = 0; e < 4; ++e) b.insert({b_elem(L, e).row, b_elem(L, e).col});
    for (int e = 0; e < 4; ++e) c.insert({c_elem(L, e).row, c_elem(L, e).col});
  }
  CHECK(a.size() == 256);
  CHECK(b.size() == 128);
  CHECK(c.size() == 128);
  // Spot checks against the PTX ISA's figures: lane 5 is group 1, thread 1.
  CHECK(a_elem(5, 0).row == 1);
  CHECK(a_elem(5, 0).col == 2);
  CHECK(a_elem(5, 3).row == 9);
  CHECK(a_elem(5, 7).col == 11);
  CHECK(b_elem(5, 2).row == 10);
  CHECK(b_elem(5, 2).col == 1);
  CHECK(c_elem(31, 3).row == 15);
  CHECK(c_elem(31, 3).col == 7);
}

// S = Q K^T for one warp's 16 rows and 16 keys, then O = P V for 16 columns, with the kernels' ldmatrix
// addresses (steps 2-7), plain and swizzled shared memory, D = 64 and 128: equal to the plain product.
TEST_CASE("one warp: ldmatrix + mma from the kernels' address maps equals the plain product") {
  for (int D : {64, 128})
    for (bool swz : {false, true}) {
      CAPTURE(D);
      CAPTURE(swz);
      const int rows = 16, keys = 16;
      const std::vector<float> Q = random_matrix(rows, D, 1), K = random_matrix(keys, D, 2),
                               V = random_matrix(keys, D, 3);
      const Smem Qs = to_smem(Q, rows, D, swz), Ks = to_smem(K, keys, D, swz), Vs = to_smem(V, keys, D, swz);
      // S (16 x 16 = two n-tiles) = sum over k-steps kk of A(Q, kk) B(K, kk)
      std::array<std::array<float, 4>, kLanes> S[2] = {};
      for (int kk = 0; kk < D / 16; ++kk) {
        std::array<int, kLanes> qa, ka;
        for (int L = 0; L < kLanes; ++L) {
          qa[L] = Qs.off(a_tile_row(L), 16 * kk + a_tile_col(L));
          ka[L] = Ks.off(nk_tile_row(L), 16 * kk + nk_tile_col(L));
        }
        const auto qf = ldmatrix_x4(Qs, qa, false), kf = ldmatrix_x4(Ks, ka, false);
        for (int n = 0; n < 2; ++n) {
          const auto part = mma(qf, kf, 2 * n);
          for (int L = 0; L < kLanes; ++L)
            for (int e = 0; e < 4; ++e) S[n][L][e] += part[L][e];
        }
      }
      std::vector<float> Sref(rows * keys, 0.f);
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < keys; ++j)
          for (int c = 0; c < D; ++c) Sref[i * keys + j] += Q[size_t(i) * D + c] * K[size_t(j) * D + c];
      for (int n = 0; n < 2; ++n)
        for (int L = 0; L < kLanes; ++L)
          for (int e = 0; e < 4; ++e) {
            const RowCol rc = c_elem(L, e);
            REQUIRE(S[n][L][e] == Sref[rc.row * keys + 8 * n + rc.col]);
          }

      // P = S (C fragments repacked as the A fragment, step 5), O = P V with V's B fragments by .trans.
      std::array<Regs, kLanes> pf{};
      for (int L = 0; L < kLanes; ++L)
        for (int r = 0; r < 4; ++r)
          for (int e = 0; e < 2; ++e) pf[L][r][e] = S[p_from_s_ntile(r)][L][p_from_s_celem(r) + e];
      for (int np = 0; np < D / 16; ++np) {
        std::array<int, kLanes> va;
        for (int L = 0; L < kLanes; ++L) va[L] = Vs.off(a_tile_row(L), 16 * np + a_tile_col(L));
        const auto vf = ldmatrix_x4(Vs, va, true);
        for (int n = 0; n < 2; ++n) {
          const auto O = mma(pf, vf, 2 * n);
          for (int L = 0; L < kLanes; ++L)
            for (int e = 0; e < 4; ++e) {
              const RowCol rc = c_elem(L, e);
              float ref = 0.f;
              for (int j = 0; j < keys; ++j) ref += Sref[rc.row * keys + j] * V[size_t(j) * D + 16 * np + 8 * n + rc.col];
              REQUIRE(O[L][e] == ref);
            }
        }
      }
    }
}

TEST_CASE("step 5's register trick: C fragments of n-tiles 2k, 2k+1 are the A fragment of k-step k") {
  for (int L = 0; L < kLanes; ++L)
    for (int r = 0; r < 4; ++r)
      for (int e = 0; e < 2; ++e) {
        const RowCol a = a_elem(L, 2 * r + e);                                     // P's column within 16 keys
        const RowCol c = c_elem(L, p_from_s_celem(r) + e);                         // S's column within an n-tile
        CHECK(a.row == c.row);
        CHECK(a.col == 8 * p_from_s_ntile(r) + c.col);
      }
}

// Plain loads of step 1 and split-K (one 32-bit value per lane, or 16-bit for V) read the same fragments.
TEST_CASE("step 1's plain loads: the kernels' offsets give the A and B fragments") {
  const int D = 64;
  const std::vector<float> Q = random_matrix(16, D, 4), K = random_matrix(8, D, 5);
  for (int L = 0; L < kLanes; ++L)
    for (int r = 0; r < 2; ++r) {
      const RowCol e = b_elem(L, 2 * r);  // kernel: Ks[(8n + e.col) D + 16 kk + e.row], two adjacent values
      CHECK(b_elem(L, 2 * r + 1).row == e.row + 1);
      CHECK(K[size_t(e.col) * D + e.row] == K[size_t(b_elem(L, 2 * r).col) * D + b_elem(L, 2 * r).row]);
      const RowCol a = a_elem(L, 2 * r);
      CHECK(a_elem(L, 2 * r + 1).col == a.col + 1);  // the pair is contiguous: one 32-bit load
      CHECK(a.col % 2 == 0);
    }
}

// ---- shared-memory banks: 32 banks of 4 bytes; a request is served in as many passes as the most distinct
// 4-byte words that fall into one bank (the same word read by several lanes is a broadcast).
namespace {
int conflict_ways(const std::vector<std::pair<int, int>>& byte_ranges) {  // (first byte, bytes) per lane
  std::map<int, std::set<int>> words_in_bank;
  for (auto [start, n] : byte_ranges)
    for (int w = start / 4; w < (start + n + 3) / 4; ++w) words_in_bank[w % 32].insert(w);
  int ways = 0;
  for (auto& [bank, words] : words_in_bank) ways = std::max(ways, int(words.size()));
  return ways;
}
// ldmatrix: each phase serves the 8 row addresses of one matrix (16 bytes each); the worst phase.
int ldmatrix_ways(int D, bool swz, bool nk) {
  const Smem s{{}, D, swz};
  int worst = 0;
  for (int kk = 0; kk < D / 16; ++kk)
    for (int m = 0; m < 4; ++m) {
      std::vector<std::pair<int, int>> req;
      for (int L = 8 * m; L < 8 * m + 8; ++L) {
        const int row = nk ? nk_tile_row(L) : a_tile_row(L), col = 16 * kk + (nk ? nk_tile_col(L) : a_tile_col(L));
        req.push_back({2 * s.off(16 + row, col), 16});  // rows 16.. : any 16-row tile of the block
      }
      worst = std::max(worst, conflict_ways(req));
    }
  return worst;
}
}  // namespace

TEST_CASE("swizzle: a bijection on the tile, and each row maps onto itself") {
  for (int cols : {64, 128}) {
    std::set<int> seen;
    for (int r = 0; r < 128; ++r)
      for (int c = 0; c < cols; ++c) {
        const int o = swizzled(r, c, cols);
        CHECK(o / cols == r);
        seen.insert(o);
      }
    CHECK(seen.size() == size_t(128 * cols));
  }
}

TEST_CASE("bank conflicts: the counts the README predicts") {
  for (int D : {64, 128}) {
    CAPTURE(D);
    // ldmatrix (steps 2+): 8-way unswizzled (8 rows, 128 or 256 bytes apart), conflict-free swizzled.
    CHECK(ldmatrix_ways(D, false, false) == 8);
    CHECK(ldmatrix_ways(D, false, true) == 8);
    CHECK(ldmatrix_ways(D, true, false) == 1);
    CHECK(ldmatrix_ways(D, true, true) == 1);
    // Step 1's 32-bit A and B fragment loads: lanes g = 0..7 read 8 rows at the same column: 8-way.
    std::vector<std::pair<int, int>> a32, v16;
    for (int L = 0; L < kLanes; ++L) {
      a32.push_back({2 * (a_elem(L, 0).row * D + a_elem(L, 0).col), 4});
      v16.push_back({2 * (b_elem(L, 0).row * D + b_elem(L, 0).col), 2});  // V[k][n]: rows 2t, column g
    }
    CHECK(conflict_ways(a32) == 8);
    // Step 1's 16-bit V loads: lanes 2m, 2m+1 share a word, the 4 threads of a group read 4 rows: 4-way.
    CHECK(conflict_ways(v16) == 4);
    // Tile stores (16 bytes per lane, 8 lanes per phase, consecutive chunks of one row): conflict-free
    // both ways, so the swizzle costs the loaders nothing.
    for (bool swz : {false, true}) {
      const Smem s{{}, D, swz};
      for (int first = 0; first < 4 * D / 8; first += 8) {
        std::vector<std::pair<int, int>> st;
        for (int x = first; x < first + 8; ++x) st.push_back({2 * s.off(x / (D / 8), 8 * (x % (D / 8))), 16});
        CHECK(conflict_ways(st) == 1);
      }
    }
  }
}

TEST_CASE("flat_gemm's V_j^T: ldmatrix .trans at nk_tile's addresses gives the A fragment of the transposed tile") {
  // V_j [key][d] row-major (16 x 16, plain: chapter 06 pads its rows instead of swizzling); O^T += V_j^T P^T takes
  // A = V_j^T (m = d, k = key): a_e of lane L at a_elem's (row, col) of V_j^T is V_j[col][row].
  const std::vector<float> V = random_matrix(16, 16, 7);
  const Smem Vs = to_smem(V, 16, 16, false);
  std::array<int, kLanes> addr{};
  for (int L = 0; L < kLanes; ++L) addr[L] = Vs.off(nk_tile_row(L), nk_tile_col(L));
  const auto va = ldmatrix_x4(Vs, addr, true);
  for (int L = 0; L < kLanes; ++L)
    for (int e = 0; e < 8; ++e) {
      const RowCol rc = a_elem(L, e);
      CHECK(va[L][e / 2][e % 2] == V[size_t(rc.col) * 16 + rc.row]);
    }
}

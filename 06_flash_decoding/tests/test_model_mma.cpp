// CPU tests of chapter 06's tensor-core step, split_kv_mma (README §4.3): the tensor-core rounding of the model
// against the chapter's rule, its rows and shared memory, and one warp's chunk simulated lane by lane through the
// kernel's own fragment addressing on the padded K/V rows (with the ldmatrix reads' bank conflicts).
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <set>

#include "frag.hpp"
#include "model_testing.hpp"

using namespace fdec_model;
using namespace fdec_test;

TEST_CASE("06 model: tensor-core products (split_kv_mma) meet the 2x rule: P rounded to the dtype, S scaled after") {
  struct Shape {
    fa::Problem p;
    std::vector<int> lens;
  };
  const std::vector<Shape> shapes = {
      {make(4, 4, 4, 1, 203, 64, false), {203, 0, 1, 97}},  // MHA: 1 row padded to 16
      {make(2, 8, 2, 1, 300, 128, false), {300, 33}},       // GQA 4 rows
      {make(2, 8, 1, 4, 113, 64, true), {113, 5}},          // MQA q_len 4: 32 rows = two row chunks of 16
      {make(3, 4, 2, 3, 64, 64, true), {2, 0, 64}},         // causal rows with no visible key
      {make(2, 4, 2, 1, 500, 64, false, 30.f), {500, 77}},  // large logits (S in the hundreds)
  };
  for (fa::Dtype t : {fa::Dtype::fp16, fa::Dtype::bf16})
    for (const Shape& sh : shapes) {
      const Case c = inputs(t, sh.p, sh.lens);
      for (int splits : {1, 3}) {
        INFO(std::string(fa::dtype_name(t)), " B=", sh.p.batch, " H=", sh.p.heads, "/", sh.p.kv_heads, " q_len=", sh.p.q_len,
             " scale=", sh.p.softmax_scale(), " splits=", splits);
        const Result r = forward(t, c.p, c.lens, c.q, c.k, c.v, true, splits, Softmax{}, Products::tensor_cores);
        expect_matches(t, c, r);
        // What the GPU test asks of split_kv_mma against split_kv_fused: O within the bound, LSE within fp32's.
        const Result cc = forward(t, c.p, c.lens, c.q, c.k, c.v, true, splits, Softmax{});
        std::vector<double> ro, rl;
        reference(c.p, c.lens, c.q, c.k, c.v, ro, rl);
        const double bound =
            fa::lowp_error_bound(t, fa::compare(plain(t, c.p, c.lens, c.q, c.k, c.v), ro, {1e30, 0}).max_abs);
        CHECK(fa::compare(r.o, fa::to_double(cc.o), {bound, 0}).ok());
        CHECK(fa::compare(r.lse, fa::to_double(cc.lse), fa::kTolFp32Forward).ok());
      }
    }
}

TEST_CASE("06 model: split_kv_mma's rows: one 16-row tile for any row count, row chunks of 16 beyond") {
  for (int rows = 1; rows <= fdec::kMaxQLen * 8; ++rows) {  // q_len 1..8 x group 1..8 (GQA 8 at q_len 8: 64 rows)
    CHECK(fdec::row_bucket(rows, true) == 16);
    CHECK(fdec::row_chunks(rows) == (rows + 15) / 16);
    CHECK(fdec::row_bucket(rows) == (rows == 1 ? 1 : rows <= 4 ? 4 : 16));  // the CUDA-core kernels' buckets
    CHECK(fdec::row_chunks(rows) * fdec::row_bucket(rows) >= rows);
    CHECK(fdec::row_bucket(rows, true, true) == 8);  // flat_gemm: the rows are the mma's N
    CHECK(fdec::row_chunks(rows, 8) == (rows + 7) / 8);
    CHECK(fdec::row_chunks(rows, fdec::row_bucket(rows)) == fdec::row_chunks(rows));  // 1 and 4 hold a unit whole
  }
}

TEST_CASE("06 model: flat_gemm's shared memory, and its K/V read once per 8-row chunk") {
  // Smem<D, 8, 2, true>: the two stages and M, L and 4 warps' weights of 8 rows (192): 139,456 bytes at d = 128.
  CHECK(fdec::split_smem_bytes(128, 8, 2, true) == 2 * 69632 + 192);
  CHECK(fdec::split_smem_bytes(64, 8, 2, true) == 73920);
  // MQA 16/1 at q_len 1: one 16-row chunk for split_kv_mma, two 8-row chunks (K/V read twice) for flat_gemm.
  const fa::Problem mqa = make(1, 16, 1, 1, 4096, 128, false);
  const double io = double(mqa.lse_elems()) * (128 * 4 + 4);
  CHECK(fdec_model::model_hbm_bytes(mqa, {4096}, 2, true, 1) == doctest::Approx(kv_bytes(mqa, {4096}, 2) + io));
  CHECK(fdec_model::model_hbm_bytes(mqa, {4096}, 2, true, 1, 8) ==
        doctest::Approx(2 * kv_bytes(mqa, {4096}, 2) + io));
}

TEST_CASE("06 model: shared memory of split_kv_mma (README §4.3): the K/V stages and the merge weights alone") {
  using fdec::split_smem_bytes;
  constexpr int kSm80 = 166912, kSm86 = 101376, kSm90 = 232448, kSm90PerSm = 233472, kReservedPerBlock = 1024;
  // d = 128: two stages of 69,632 bytes + M, L and 4 warps' weights of 16 rows (384): 139,648 bytes.
  CHECK(split_smem_bytes(128, 16, 2, true) == 2 * 69632 + 384);
  CHECK(split_smem_bytes(128, 16, 2, true) == split_smem_bytes(128, 16, 2) - 16 * 128 * 4 - 4 * 16 * 32 * 4);
  CHECK(split_smem_bytes(128, 16, 2, true) <= kSm80);
  CHECK(split_smem_bytes(128, 16, 2, true) <= kSm90);
  CHECK(split_smem_bytes(128, 16, 2, true) > kSm86);  // plan() refuses it on sm_86/sm_89 at d = 128, as pipelined
  CHECK(2 * (split_smem_bytes(128, 16, 2, true) + kReservedPerBlock) > kSm90PerSm);  // one block per SM
  CHECK(split_smem_bytes(64, 16, 2, true) <= kSm86);
  // The warp merge's scratch (m, l, max, O~ of 16 rows per warp) still fits in the first stage it reuses.
  for (int d : {64, 128}) CHECK(fdec::kWarps * 16 * (d + 3) * 4 <= fdec::kWarps * 2 * 32 * (d + fdec::kPadH) * 2);
}

namespace {

// One warp's chunk of split_kv_mma simulated lane by lane. The hardware's rules are written here from the PTX ISA
// (9.7.14.5.8 "Matrix Fragments for mma.m16n8k16", 9.7.14.5.15 "ldmatrix"), independently of frag.hpp; the
// addresses and the fragment bookkeeping are attend_mma's, through frag.hpp as the kernel calls it.
constexpr int kLanes = 32;
using Regs = std::array<std::array<float, 2>, 4>;  // a lane's registers: up to 4 of two 16-bit values

// ldmatrix.x4 (.trans): lane 8m + r gives the element offset of row r of matrix m; lane L receives in register m
// the values (L / 4, 2 (L % 4) + e) of matrix m, or with .trans (2 (L % 4) + e, L / 4).
std::array<Regs, kLanes> ldmatrix_x4(const std::vector<float>& mem, const std::array<int, kLanes>& addr, bool trans) {
  std::array<Regs, kLanes> out{};
  for (int L = 0; L < kLanes; ++L)
    for (int m = 0; m < 4; ++m)
      for (int e = 0; e < 2; ++e)
        out[L][m][e] = trans ? mem[addr[8 * m + 2 * (L % 4) + e] + L / 4] : mem[addr[8 * m + L / 4] + 2 * (L % 4) + e];
  return out;
}
// mma.m16n8k16, D = A B + C, with g = L / 4, t = L % 4: A register r holds (g + 8 (r % 2), 2t + 8 (r / 2) + e);
// B register r holds (k = 2t + 8r + e, n = g); C element i is (g + 8 (i / 2), 2t + i % 2).
void mma(std::array<std::array<float, 4>, kLanes>& c, const std::array<Regs, kLanes>& a,
         const std::array<std::array<std::array<float, 2>, 2>, kLanes>& b) {
  float A[16][16], B[16][8];
  for (int L = 0; L < kLanes; ++L)
    for (int e = 0; e < 2; ++e) {
      for (int r = 0; r < 4; ++r) A[L / 4 + 8 * (r % 2)][2 * (L % 4) + 8 * (r / 2) + e] = a[L][r][e];
      for (int r = 0; r < 2; ++r) B[2 * (L % 4) + 8 * r + e][L / 4] = b[L][r][e];
    }
  for (int L = 0; L < kLanes; ++L)
    for (int i = 0; i < 4; ++i) {
      const int row = L / 4 + 8 * (i / 2), col = 2 * (L % 4) + i % 2;
      for (int k = 0; k < 16; ++k) c[L][i] += A[row][k] * B[k][col];
    }
}
// Registers h, h + 1 of an ldmatrix.x4 result: the B fragment of one n-tile.
std::array<std::array<std::array<float, 2>, 2>, kLanes> half_of(const std::array<Regs, kLanes>& x, int h) {
  std::array<std::array<std::array<float, 2>, 2>, kLanes> b{};
  for (int L = 0; L < kLanes; ++L) b[L] = {x[L][h], x[L][h + 1]};
  return b;
}

}  // namespace

TEST_CASE("06 model: one split_kv_mma chunk lane by lane: S = Q K_j^T and O~ = P V_j on the padded tile") {
  namespace frag = fa::frag;
  for (int D : {64, 128})
    for (int nrows : {1, 4, 9, 16}) {
      INFO("d=", D, " rows=", nrows);
      const int ld = D + fdec::kPadH, keys = fdec::kKeysPerWarp;
      // Small integers, so every product and sum below is exact in float: the comparisons are equalities.
      std::vector<float> Q(16 * D, 0.f), Ks(keys * ld, -99.f), Vs(keys * ld, -99.f);  // -99: the padding, never read
      for (int r = 0; r < nrows; ++r)
        for (int c = 0; c < D; ++c) Q[r * D + c] = float((r * 7 + c * 3) % 5 - 2);
      for (int j = 0; j < keys; ++j)
        for (int c = 0; c < D; ++c) Ks[j * ld + c] = float((j * 5 + c) % 7 - 3), Vs[j * ld + c] = float((j + 2 * c) % 9 - 4);
      // line 1: Q's A fragments, as attend_mma loads them (rows >= nrows: zeros)
      std::vector<std::array<Regs, kLanes>> qf(D / 16);
      for (int ks = 0; ks < D / 16; ++ks)
        for (int L = 0; L < kLanes; ++L)
          for (int reg = 0; reg < 4; ++reg) {
            const frag::RowCol rc = frag::a_elem(L, 2 * reg);
            for (int e = 0; e < 2; ++e) qf[ks][L][reg][e] = rc.row < nrows ? Q[rc.row * D + 16 * ks + rc.col + e] : 0.f;
          }
      // line 5': S, two n-tiles per ldmatrix.x4 of K_j (no .trans)
      std::vector<std::array<std::array<float, 4>, kLanes>> s(keys / 8, std::array<std::array<float, 4>, kLanes>{});
      for (int np = 0; np < keys / 16; ++np)
        for (int ks = 0; ks < D / 16; ++ks) {
          std::array<int, kLanes> addr{};
          for (int L = 0; L < kLanes; ++L) addr[L] = (16 * np + frag::nk_tile_row(L)) * ld + 16 * ks + frag::nk_tile_col(L);
          const auto kb = ldmatrix_x4(Ks, addr, false);
          mma(s[2 * np], qf[ks], half_of(kb, 0));
          mma(s[2 * np + 1], qf[ks], half_of(kb, 2));
        }
      // The kernel reads s[n][e] as (row, key) = c_elem(lane, e) + (0, 8n): check against Q K_j^T.
      std::set<std::pair<int, int>> seen;
      for (int n = 0; n < keys / 8; ++n)
        for (int L = 0; L < kLanes; ++L)
          for (int e = 0; e < 4; ++e) {
            const frag::RowCol rc = frag::c_elem(L, e);
            const int key = 8 * n + rc.col;
            float ref = 0.f;
            for (int c = 0; c < D; ++c) ref += Q[rc.row * D + c] * Ks[key * ld + c];
            CHECK(s[n][L][e] == ref);
            CHECK(rc.row / 8 == e / 2);                      // seen_end[e >> 1]: e < 2 is row g, e >= 2 row g + 8
            CHECK(rc.row % 8 == frag::group(L));             // a quad (same g) shares its rows: quad_max, quad_sum
            seen.insert({rc.row, key});
          }
      CHECK(seen.size() == size_t(16 * keys));  // every (row, key) of the tile once
      // line 9': P = S here (any values do: the map is the point), P's A fragments from S's C fragments, V_j by .trans
      const int tiles_o = D / 8;
      std::vector<std::array<std::array<float, 4>, kLanes>> acc(tiles_o, std::array<std::array<float, 4>, kLanes>{});
      for (int kk = 0; kk < keys / 16; ++kk) {
        std::array<Regs, kLanes> pf{};
        for (int L = 0; L < kLanes; ++L)
          for (int reg = 0; reg < 4; ++reg)
            for (int e = 0; e < 2; ++e)
              pf[L][reg][e] = s[2 * kk + frag::p_from_s_ntile(reg)][L][frag::p_from_s_celem(reg) + e];
        for (int np = 0; np < tiles_o / 2; ++np) {
          std::array<int, kLanes> addr{};
          for (int L = 0; L < kLanes; ++L) addr[L] = (16 * kk + frag::a_tile_row(L)) * ld + 16 * np + frag::a_tile_col(L);
          const auto vb = ldmatrix_x4(Vs, addr, true);
          mma(acc[2 * np], pf, half_of(vb, 0));
          mma(acc[2 * np + 1], pf, half_of(vb, 2));
        }
      }
      // line 10: the kernel writes acc[n][e] to row c_elem(lane, e).row, column 8n + c_elem(lane, e).col
      std::set<std::pair<int, int>> written;
      for (int n = 0; n < tiles_o; ++n)
        for (int L = 0; L < kLanes; ++L)
          for (int e = 0; e < 4; ++e) {
            const frag::RowCol rc = frag::c_elem(L, e);
            const int col = 8 * n + rc.col;
            float ref = 0.f;
            for (int j = 0; j < keys; ++j) {
              float sj = 0.f;
              for (int c = 0; c < D; ++c) sj += Q[rc.row * D + c] * Ks[j * ld + c];
              ref += sj * Vs[j * ld + col];
            }
            CHECK(acc[n][L][e] == ref);
            written.insert({rc.row, col});
          }
      CHECK(written.size() == size_t(16 * D));
    }
}

TEST_CASE("06 model: the padded K/V rows keep split_kv_mma's ldmatrix reads free of bank conflicts") {
  // An ldmatrix.x4 reads 4 matrices, one per phase; in a phase 8 lanes each give a 16-byte row. No conflict iff
  // the 8 rows fall into 8 different groups of 4 banks (16 bytes): (byte offset / 16) mod 8 all distinct.
  namespace frag = fa::frag;
  for (int D : {64, 128}) {
    const int ld_bytes = (D + fdec::kPadH) * 2;
    auto conflict_free = [&](auto row_of, auto col_of, int row0, int col0) {
      for (int m = 0; m < 4; ++m) {
        std::set<int> groups;
        for (int L = 8 * m; L < 8 * m + 8; ++L) groups.insert(((row0 + row_of(L)) * ld_bytes + (col0 + col_of(L)) * 2) / 16 % 8);
        if (groups.size() != 8) return false;
      }
      return true;
    };
    for (int np = 0; np < 2; ++np)
      for (int ks = 0; ks < D / 16; ++ks) {
        INFO("d=", D, " K n-pair ", np, " k-step ", ks);
        CHECK(conflict_free(frag::nk_tile_row, frag::nk_tile_col, 16 * np, 16 * ks));  // K_j, line 5'
        CHECK(conflict_free(frag::a_tile_row, frag::a_tile_col, 16 * np, 16 * ks));    // V_j (.trans), line 9'
      }
    // Without the padding (rows of exactly d values) every phase would hit one group 8 times.
    auto groups_unpadded = [&](int m) {
      std::set<int> g;
      for (int L = 8 * m; L < 8 * m + 8; ++L) g.insert((frag::nk_tile_row(L) * D * 2 + frag::nk_tile_col(L) * 2) / 16 % 8);
      return g.size();
    };
    CHECK(groups_unpadded(0) == 1);
  }
}

// The kernels' own source (gemv, flat, tile, flat_cluster, read_w) run on the CPU through ../tests/emu/emu.hpp
// (every GPU thread a cooperative context; ldmatrix, mma.sync by the PTX ISA's rules; a cp.async destination NaN
// until the wait_group that lets it land; shared memory garbage at every block), each through its own launch
// function, against fp64 with check.hpp's rule.
// Shapes: M = 1, 3, 8, 9, 17 (a group of 8 and its tail; the tile's 64 rows), N and K that are not tile multiples
// (a K long enough for several K tiles), the flat GEMM with 1, 2, 3 and 5 splits
// (its last block of a tile reducing them), its 2, 4, 8 groups a block and slabs of 64 rows (M = 9 to 128) with the
// same bits as one group, flat_cluster with 1 to 4 pieces (its cluster reducing them, emulated with each block's own
// shared memory; the same bits as flat, at every group count), and read_w's checksum (every word of W read once).
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "check.hpp"
#include "gemm.cuh"

using namespace fdec::gemm;

namespace {

// One run of `launch` on h, Y and the workspace NaN-poisoned first: Y.
std::vector<fa::half_t> run_y(const HostGemm& h, void (*launch)(const Args&), int splits) {
  std::vector<fa::half_t> y(size_t(h.m) * h.n, fa::half_t{0x7FFF});  // NaN
  std::vector<float> ws(size_t(splits) * h.m * h.n, NAN);
  Args a;
  a.m = h.m, a.n = h.n, a.k = h.k;
  a.x = reinterpret_cast<const __half*>(h.x.data()), a.w = reinterpret_cast<const __half*>(h.w.data());
  a.y = reinterpret_cast<__half*>(y.data());
  a.splits = splits, a.workspace = splits > 1 ? ws.data() : nullptr;
  launch(a);
  return y;
}
// The same, every entry checked. out: Y's bits, if asked.
GemmError run(const HostGemm& h, void (*launch)(const Args&), int splits = 1, std::vector<fa::half_t>* out = nullptr) {
  const std::vector<fa::half_t> y = run_y(h, launch, splits);
  if (out) *out = y;
  return check_all(h, y);
}

}  // namespace

TEST_CASE("06 gemm emulated: gemv, flat and tile on ragged M, N, K vs fp64") {
  struct Shape {
    int n, k;
  };
  // N: under one flat tile, a tile and a tail, two tiles and a tail; K: one piece, a K tile and a tail, 3+ K tiles
  const std::vector<Shape> shapes = {{5, 8}, {77, 136}, {136, 392}};
  for (int m : {1, 3, 8, 9, 17})
    for (const Shape& s : shapes) {
      const HostGemm h = make_inputs(m, s.n, s.k, 1000 + m);
      for (const Kernel& kernel : kernels()) {
        INFO(kernel.name, ": M ", m, ", N ", s.n, ", K ", s.k);
        const GemmError e = run(h, kernel.launch);
        INFO(e.summary());
        CHECK(e.ok());
      }
    }
}

TEST_CASE("06 gemm emulated: the flat GEMM's split-K (1, 2, 3, 5 pieces) and its reduction in the last block") {
  // 5 K tiles of 128 (the last one 8 wide), cut 1, 2, 3, 5 ways: pieces of 5, 2-3, 1-2, 1 tiles, fewer than the
  // pipeline's stages and more; M = 9: two row groups, each with its own arrival counts.
  const HostGemm h = make_inputs(9, 70, 520, 7);
  for (int splits : {1, 2, 3, 5}) {
    INFO("splits ", splits);
    const GemmError e = run(h, flat::launch, splits);
    INFO(e.summary());
    CHECK(e.ok());
  }
  // A second launch on the same counters: each launch leaves them at zero.
  CHECK(run(h, flat::launch, 3).ok());
  // 16 K tiles, 2 splits: 8 tiles per piece, each stage refilled twice.
  const HostGemm long_k = make_inputs(1, 64, 2048, 8);
  CHECK(run(long_k, flat::launch, 2).ok());
}

TEST_CASE("06 gemm emulated: the flat GEMM's groups (G = 2, 4, 8 a block) and slabs of 64 rows, split-K 1, 2, 4") {
  // M: 2 groups (9, 16), 4 (17, 24), 8 (33, 64: groups past M, rows 33-63 padding), and slabs (65: a slab of one row,
  // 100, 128); N: a tile and a ragged one; K: 4 K tiles, the last 8 wide, so 4 splits have a tile each.
  for (int m : {9, 16, 17, 24, 33, 64, 65, 100, 128}) {
    const HostGemm h = make_inputs(m, 77, 392, 2000 + m);
    for (int splits : {1, 2, 4}) {
      INFO("M ", m, " (", flat_groups(m), " groups a block), splits ", splits);
      const GemmError e = run(h, flat::launch, splits);
      INFO(e.summary());
      CHECK(e.ok());
    }
  }
}

TEST_CASE("06 gemm emulated: every group count gives a row of Y the same bits (G = 1 at M = 8)") {
  // Each sum gets its products in the same order whatever G is (chunk by chunk, k-step 0 then 1), so the first 8
  // rows of Y are the same bits at M = 8 (one group, the kernel's G = 1 code) as at M = 16, 64 and 128, and the first
  // 64 the same in M = 64's one slab as in M = 128's first.
  const HostGemm full = make_inputs(128, 77, 392, 31);
  for (int splits : {1, 3}) {
    std::vector<std::vector<fa::half_t>> y;
    for (int m : {8, 16, 64, 128}) {
      HostGemm h{m, full.n, full.k, std::vector<fa::half_t>(full.x.begin(), full.x.begin() + size_t(m) * full.k),
                 full.w};
      y.emplace_back();
      REQUIRE(run(h, flat::launch, splits, &y.back()).ok());
    }
    const auto same_rows = [&](const std::vector<fa::half_t>& a, const std::vector<fa::half_t>& b, int rows) {
      for (size_t i = 0; i < size_t(rows) * full.n; ++i)
        if (a[i].bits != b[i].bits) return false;
      return true;
    };
    INFO("splits ", splits);
    CHECK(same_rows(y[0], y[1], 8));
    CHECK(same_rows(y[0], y[2], 8));
    CHECK(same_rows(y[0], y[3], 8));
    CHECK(same_rows(y[2], y[3], 64));
  }
}

TEST_CASE("06 gemm emulated: flat_cluster's split-K summed in a cluster (1 to 4 pieces), the same bits as flat") {
  struct Shape {
    int n, k;
  };
  // N: a tile and a tail, two tiles and a tail; K: 5 and 4 K tiles, the last one partial (8 and 56 wide)
  const std::vector<Shape> shapes = {{77, 520}, {136, 440}};
  for (int m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 33, 65})
    for (const Shape& s : shapes) {
      const HostGemm h = make_inputs(m, s.n, s.k, 2000 + m);
      for (int splits : {1, 2, 3, 4}) {
        INFO("M ", m, ", N ", s.n, ", K ", s.k, ", splits ", splits);
        const std::vector<fa::half_t> y = run_y(h, flat_cluster::launch, splits);
        const GemmError e = check_all(h, y);
        INFO(e.summary());
        CHECK(e.ok());
        const std::vector<fa::half_t> flat_y = run_y(h, flat::launch, splits);
        CHECK(std::memcmp(y.data(), flat_y.data(), y.size() * sizeof(fa::half_t)) == 0);  // split order, as flat
      }
    }
  const HostGemm h = make_inputs(3, 64, 256, 9);  // 2 K tiles: 3 pieces are too many; 9 too many for a cluster
  CHECK_THROWS(run(h, flat_cluster::launch, 3));
  const HostGemm long_k = make_inputs(1, 64, 2048, 8);
  CHECK_THROWS(run(long_k, flat_cluster::launch, 9));
}

TEST_CASE("06 gemm emulated: read_w reads every 32-bit word of W once (its XOR)") {
  struct Case {
    int n, k, sms;  // sms: read_w's grid is 8 blocks per SM, so 1 SM makes the grid-stride loop turn over
  };
  for (const Case& c : std::vector<Case>{{5, 8, 1}, {77, 136, 1}, {136, 392, 2}}) {
    const int n = c.n, k = c.k, sms = c.sms;
    const HostGemm h = make_inputs(1, n, k, 5);
    unsigned want = 0;
    for (size_t i = 0; i < h.w.size(); i += 2) want ^= unsigned(h.w[i].bits) | unsigned(h.w[i + 1].bits) << 16;
    unsigned got = 0;
    read_w::launch(reinterpret_cast<const __half*>(h.w.data()), n, k, sms, &got);
    INFO("N ", n, ", K ", k, ", SMs ", sms);
    CHECK(got == want);
    read_w::launch(reinterpret_cast<const __half*>(h.w.data()), n, k, sms, &got);  // XORed in: twice gives 0
    CHECK(got == 0u);
  }
}

TEST_CASE("06 gemm: shapes the kernels refuse") {
  CHECK_THROWS_AS(check_shape(1, 64, 12), fa::UsageError);  // K not a multiple of 8
  CHECK_THROWS_AS(check_shape(0, 64, 64), fa::UsageError);
  CHECK_NOTHROW(check_shape(1, 1, 8));
  const HostGemm h = make_inputs(1, 16, 16, 3);  // 1 K tile: 2 splits are too many
  CHECK_THROWS(run(h, flat::launch, 2));
}

TEST_CASE("06 gemm: flat_groups, the smallest power of two G with 8 G >= min(M, 64)") {
  CHECK(flat_groups(1) == 1);
  CHECK(flat_groups(8) == 1);
  CHECK(flat_groups(9) == 2);
  CHECK(flat_groups(16) == 2);
  CHECK(flat_groups(17) == 4);
  CHECK(flat_groups(33) == 8);
  CHECK(flat_groups(64) == 8);
  CHECK(flat_groups(1000) == 8);
}

TEST_CASE("06 gemm: flat_splits picks 1, 2 or 4 pieces, whichever spreads the blocks over the SMs best") {
  const int sms = 132, slots = 7 * sms;  // an H100: registers hold seven blocks of the flat kernel an SM
  CHECK(flat_splits(1, 4096, 4096, sms, slots) == 4);     // 64 blocks: 0.48 of a round; 128: 0.97; 256: 0.97 (tie)
  CHECK(flat_splits(8, 4096, 4096, sms, slots) == 4);     // M = 8 is still one row group
  CHECK(flat_splits(16, 4096, 4096, sms, slots) == 4);    // M <= 64 is one slab: 64, 128, 256 blocks, as at M = 1
  CHECK(flat_splits(100, 4096, 4096, sms, 3 * sms) == 2); // two slabs: 128, 256 (0.97 both); 512 > 3 blocks an SM
  CHECK(flat_splits(1, 4096, 11008, sms, slots) == 4);
  CHECK(flat_splits(1, 12288, 4096, sms, slots) == 4);    // 192 blocks: 0.73 of two rounds; 384, 768: 0.97 (tie)
  CHECK(flat_splits(1, 11008, 4096, sms, slots) == 4);    // 172: 0.65; 344 and 688: 0.87 (tie)
  CHECK(flat_splits(1, 32768, 4096, sms, slots) == 1);    // 512 blocks (0.97); 1024 > slots
  CHECK(flat_splits(1, 64, 256, sms, slots) == 2);        // no more pieces than K tiles
  CHECK(flat_splits(1, 64, 1 << 20, sms, slots) == kFlatPieces);
  CHECK(flat_splits(1, 12288, 4096, sms, 4 * sms) == 2);  // four blocks an SM: 768 would not all be resident
}

// The three kernels' own source run on the CPU through ../tests/emu/emu.hpp (every GPU thread a cooperative context;
// ldmatrix, mma.sync by the PTX ISA's rules; a cp.async destination NaN until the wait_group that lets it land;
// shared memory garbage at every block), each through its own launch function, against fp64 with check.hpp's rule.
// Shapes: M = 1, 3, 8, 9, 17 (a group of 8 and its tail; the tile's 64 rows), N and K that are not tile multiples
// (a K long enough for several K tiles), the flat GEMM with 1, 2, 3 and 5 splits
// (its last block of a tile reducing them), flat_cluster with 1 to 4 (its cluster reducing them, emulated with each
// block's own shared memory; the same bits as flat), and read_w's checksum (every word of W read once).
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
// The same, every entry checked.
GemmError run(const HostGemm& h, void (*launch)(const Args&), int splits = 1) {
  return check_all(h, run_y(h, launch, splits));
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

TEST_CASE("06 gemm emulated: flat_cluster's split-K summed in a cluster (1 to 4 pieces), the same bits as flat") {
  struct Shape {
    int n, k;
  };
  // N: a tile and a tail, two tiles and a tail; K: 5 and 4 K tiles, the last one partial (8 and 56 wide)
  const std::vector<Shape> shapes = {{77, 520}, {136, 440}};
  for (int m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17})
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

TEST_CASE("06 gemm: flat_splits picks 1, 2 or 4 pieces, whichever spreads the blocks over the SMs best") {
  const int sms = 132, slots = 7 * sms;  // an H100: registers hold seven blocks of the flat kernel an SM
  CHECK(flat_splits(1, 4096, 4096, sms, slots) == 4);     // 64 blocks: 0.48 of a round; 128: 0.97; 256: 0.97 (tie)
  CHECK(flat_splits(8, 4096, 4096, sms, slots) == 4);     // M = 8 is still one row group
  CHECK(flat_splits(16, 4096, 4096, sms, slots) == 4);    // two row groups: 128, 256, 512 blocks, all 0.97
  CHECK(flat_splits(1, 4096, 11008, sms, slots) == 4);
  CHECK(flat_splits(1, 12288, 4096, sms, slots) == 4);    // 192 blocks: 0.73 of two rounds; 384, 768: 0.97 (tie)
  CHECK(flat_splits(1, 11008, 4096, sms, slots) == 4);    // 172: 0.65; 344 and 688: 0.87 (tie)
  CHECK(flat_splits(1, 32768, 4096, sms, slots) == 1);    // 512 blocks (0.97); 1024 > slots
  CHECK(flat_splits(1, 64, 256, sms, slots) == 2);        // no more pieces than K tiles
  CHECK(flat_splits(1, 64, 1 << 20, sms, slots) == kFlatPieces);
  CHECK(flat_splits(1, 12288, 4096, sms, 4 * sms) == 2);  // four blocks an SM: 768 would not all be resident
}

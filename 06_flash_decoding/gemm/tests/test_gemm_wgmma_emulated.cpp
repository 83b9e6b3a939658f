// flat_wgmma.cu's own source on the CPU, under chapter 05's emulation of the Hopper pieces (../../05_warp_split_q/
// tests/emu/emu_sm90.hpp): the producer and the two or three consumer warpgroups as cooperative threads, the
// mbarriers' phases and transaction bytes, TMA boxes landing (swizzled, clipped to the tensor) only when their barrier
// is waited on, wgmma reading both operands through the kernel's descriptors, its product landing only at the wait
// that retires it, and a split K's pieces run together as one cluster, each block with its own shared memory (NaN
// once it has exited). A stage released before the wgmma that reads it is done, or a tile read before its barrier,
// gives a wrong result or stops the test. Every padding of M (16 to 256 rows, and two slabs of 256), tiles of 64,
// 128 and 192 outputs, ragged N and K, 1 to 4 pieces of K, checked against fp64 (check.hpp's rule) and the pieces
// bit for bit against each other, under both of the emulation's schedules.
#include <cuda_fp16.h>  // __half on the host: gemm.cuh's Args

#include "emu_sm90.hpp"

// Chapter 06's cluster PTX (steps/cluster_ptx.cuh), on the emulation's clusters: a peer's shared memory is addressed
// as its block's rank (bits 20 and up) and the offset in the block's array.
#define FDEC_CLUSTER_PTX_CUH
namespace fdec {
inline unsigned cluster_rank() { return emu9::cluster_rank(); }
inline void cluster_arrive() { emu9::cluster_arrive(); }
inline void cluster_wait() { emu9::cluster_wait(); }
inline uint32_t cluster_map(const void* p, unsigned rank) { return rank << 20 | wsq::smem_addr(p); }
inline float cluster_load(uint32_t addr) {
  float v;
  std::memcpy(&v, wsq::smem_of(int(addr >> 20)) + (addr & 0xFFFFF), 4);
  return v;
}
}  // namespace fdec
namespace fa {  // device.cuh's, which the emulation does not include
struct NotOnThisGpu : std::runtime_error {
  using std::runtime_error::runtime_error;
};
}  // namespace fa

#include "flat_wgmma.cu"

#include <doctest/doctest.h>

#include <utility>
#include <vector>

#include "check.hpp"

using namespace fdec::gemm;

namespace {

// One launch on h with `splits` pieces of K, Y NaN-poisoned first, under `schedule`; the grid shape_of's, or the
// tiles and slabs of `forced`.
std::vector<fa::half_t> run_y(const HostGemm& h, int splits, emu9::Schedule schedule,
                              flat_wgmma::Shape forced = {0, 0, 1}) {
  emu9::schedule = schedule;
  std::vector<fa::half_t> y(size_t(h.m) * h.n, fa::half_t{0x7E00});  // NaN
  Args a;
  a.m = h.m, a.n = h.n, a.k = h.k;
  a.x = reinterpret_cast<const __half*>(h.x.data()), a.w = reinterpret_cast<const __half*>(h.w.data());
  a.y = reinterpret_cast<__half*>(y.data());
  a.splits = splits;
  if (forced.tile_n > 0) flat_wgmma::launch_as(a, forced);
  else flat_wgmma::launch(a);
  return y;
}

}  // namespace

TEST_CASE("06 gemm emulated: flat_wgmma on every padding of M, ragged N and K, 1 and 3 pieces of K, vs fp64") {
  for (emu9::Schedule schedule : {emu9::Schedule::round_robin, emu9::Schedule::lowest_first})
    for (int m : {1, 16, 17, 40, 64, 65, 128, 129, 200, 256, 257})
      for (int splits : {1, 3}) {
        // N: tiles of 64, the fourth 8 wide (slabs of 128 rows above 128); K: 3 to 11 K tiles, the last 8 wide
        const HostGemm h = make_inputs(m, 200, 648, 40 + m);
        INFO("M ", m, ", splits ", splits, ", ", emu9::schedule_name(schedule), " schedule");
        const GemmError e = check_all(h, run_y(h, splits, schedule));
        INFO(e.summary());
        CHECK(e.ok());
      }
}

TEST_CASE("06 gemm emulated: flat_wgmma with tiles of 128 and 192 outputs (N of 67 tiles of 128)") {
  // tiles of 128 at M <= 128; tiles of 192, 2 slabs of 128 (2 x 67 tiles of 128 would not all be resident); tiles of
  // 128, a slab of 256 and one of 44 (3 slabs would not)
  for (int m : {40, 128, 200, 300}) {
    const HostGemm h = make_inputs(m, 8520, 72, 90 + m);  // 67 N tiles, the last 72 wide; K: one tile, 8 of it past K
    INFO("M ", m);
    const GemmError e = check_all(h, run_y(h, 1, emu9::Schedule::round_robin));
    INFO(e.summary());
    CHECK(e.ok());
  }
}

TEST_CASE("06 gemm emulated: flat_wgmma with tiles of 192 outputs (three consumer warpgroups), forced, vs fp64") {
  // N = 392: two tiles of 192 and one 8 wide; K: 11 K tiles, the ring of 5 stages wraps twice, the last tile 8 wide.
  // M: every padding up to 128, and slabs of 128 (at 129 and 200 rows, the last 1 and 72); 1 piece of K and 3 (a
  // cluster).
  for (int m : {1, 17, 64, 65, 128, 129, 200})
    for (int splits : {1, 3}) {
      const HostGemm h = make_inputs(m, 392, 648, 60 + m);
      INFO("M ", m, ", splits ", splits);
      const GemmError e = check_all(h, run_y(h, splits, emu9::Schedule::round_robin, {192, 128, splits}));
      INFO(e.summary());
      CHECK(e.ok());
    }
  const HostGemm h = make_inputs(129, 392, 648, 1);
  CHECK_THROWS_AS(run_y(h, 1, emu9::Schedule::round_robin, {192, 256, 1}), std::invalid_argument);
  CHECK_THROWS_AS(run_y(h, 1, emu9::Schedule::round_robin, {96, 128, 1}), std::invalid_argument);
}

TEST_CASE("06 gemm emulated: flat_wgmma's split-K in a cluster, 2 and 4 pieces, the same bits in any order") {
  // N = 136: tiles of 64 (the third 8 wide); N = 8520 at M = 40: tiles of 128. K: 5 to 9 K tiles, the last 8 wide.
  for (const std::pair<int, int>& mn : std::vector<std::pair<int, int>>{{5, 136}, {33, 136}, {130, 136}, {40, 8520}})
    for (int splits : {2, 4}) {
      if (mn.second == 8520 && splits == 4) continue;  // 4 pieces of 67 tiles: long to emulate, the same code as 2
      const HostGemm h = make_inputs(mn.first, mn.second, mn.second == 8520 ? 392 : 1032, 7 + mn.first);
      INFO("M ", mn.first, ", N ", mn.second, ", splits ", splits);
      const std::vector<fa::half_t> y = run_y(h, splits, emu9::Schedule::round_robin);
      const GemmError e = check_all(h, y);
      INFO(e.summary());
      CHECK(e.ok());
      const std::vector<fa::half_t> other = run_y(h, splits, emu9::Schedule::lowest_first);  // blocks run otherwise
      CHECK(std::memcmp(y.data(), other.data(), y.size() * sizeof(fa::half_t)) == 0);      // sums in piece order
    }
  CHECK_THROWS_AS(run_y(make_inputs(1, 64, 512, 1), 5, emu9::Schedule::round_robin), std::invalid_argument);
  CHECK_THROWS_AS(run_y(make_inputs(1, 64, 264, 1), 3, emu9::Schedule::round_robin), std::invalid_argument);
}

TEST_CASE("06 gemm: flat_wgmma's stages (200 KiB, 4 to 8 of them) and panels of k a stage") {
  using namespace flat_wgmma;
  CHECK(panels_of(16, 64) == 4);    // 5 stages of 40 KiB
  CHECK(panels_of(32, 64) == 4);    // 4 of 48 KiB
  CHECK(panels_of(64, 64) == 2);    // 6 of 32 KiB (4 panels: 3 stages)
  CHECK(panels_of(128, 64) == 1);   // X most of a stage: 8 of 24 KiB (2 panels: 4 of 48 KiB, measured slower)
  CHECK(panels_of(16, 128) == 2);   // 5 of 36 KiB
  CHECK(panels_of(64, 128) == 2);   // 4 of 48 KiB
  CHECK(panels_of(128, 128) == 1);  // 6 of 32 KiB (2 panels: 3 stages)
  CHECK(panels_of(256, 128) == 1);  // 4 of 48 KiB
  CHECK(panels_of(128, 192) == 1);  // 5 of 40 KiB
  CHECK(panels_of(16, 192) == 1);   // 7 of 26 KiB (2 panels: 3 stages)
  CHECK(Layout<128, 192>::stages == 5);
  CHECK(Layout<256, 128>::stages == 4);
  CHECK(Layout<16, 128, 1>::stages == 8);  // at most 8
}

TEST_CASE("06 gemm: flat_wgmma's grid on an H100 (132 SMs, one block an SM): pieces, slabs, tiles, in that order") {
  using flat_wgmma::shape_of;
  auto is = [](flat_wgmma::Shape s, int tile_n, int slab, int splits) {
    return s.tile_n == tile_n && s.slab == slab && s.splits == splits;
  };
  CHECK(is(shape_of(128, 4096, 4096, 132), 64, 256, 1));     // 32 tiles of 128; pieces of 2048: tiles of 64
  CHECK(is(shape_of(8, 4096, 8184, 132), 64, 256, 1));      // pieces shorter than 4096
  CHECK(is(shape_of(8, 4096, 8192, 132), 64, 256, 2));       // 2 pieces, then tiles of 64: 128 blocks
  CHECK(is(shape_of(64, 4096, 11008, 132), 64, 256, 2));
  CHECK(is(shape_of(256, 4096, 11008, 132), 128, 128, 2));   // 2 pieces x 2 slabs: 128 blocks
  CHECK(is(shape_of(256, 4096, 4096, 132), 64, 128, 1));     // 2 slabs x tiles of 64: 128 blocks
  CHECK(is(shape_of(300, 4096, 4096, 132), 128, 128, 1));    // 3 slabs of 128: 96 blocks
  CHECK(is(shape_of(8, 8448, 4096, 132), 64, 256, 1));       // 66 tiles of 128: 132 of 64
  CHECK(is(shape_of(8, 8449, 4096, 132), 128, 256, 1));      // 67: 134 of 64 would not all be resident
  CHECK(is(shape_of(64, 12288, 4096, 132), 128, 256, 1));    // 96 tiles
  CHECK(is(shape_of(256, 12288, 4096, 132), 192, 128, 1));   // 2 slabs of 96 tiles: 192 blocks; of 64 tiles: 128
  CHECK(is(shape_of(256, 11008, 4096, 132), 192, 128, 1));   // 2 slabs of 58 tiles of 192: 116 blocks
  CHECK(is(shape_of(129, 8449, 4096, 132), 192, 128, 1));    // 2 x 67 tiles of 128 do not fit, 2 x 45 of 192 do
  CHECK(is(shape_of(129, 8448, 4096, 132), 128, 128, 1));    // 2 x 66 tiles of 128 do
  CHECK(is(shape_of(300, 12288, 4096, 132), 128, 256, 1));   // 3 slabs of 128: 192 blocks even with tiles of 192
  CHECK(is(shape_of(128, 12288, 4096, 132), 128, 256, 1));   // one slab: tiles of 192 only above 128 rows
  CHECK(is(shape_of(64, 11008, 11008, 132), 128, 256, 1));   // 86 tiles: 2 pieces would not fit
  CHECK(is(shape_of(1, 64, 64, 132), 64, 256, 1));
  CHECK(flat_wgmma::splits(64, 4096, 11008, 132) == 2);
  CHECK(flat_wgmma::splits(64, 4096, 4096, 132) == 1);
}

// flat_wgmma.cu's own source on the CPU, under chapter 05's emulation of the Hopper pieces (../../05_warp_split_q/
// emu/emu_sm90.hpp): the producer and the two consumer warpgroups as cooperative threads, the mbarriers' phases and
// transaction bytes, TMA boxes landing (swizzled, clipped to the tensor) only when their barrier is waited on, wgmma
// reading both operands through the kernel's descriptors, its product landing only at the wait that retires it, and
// a split K's pieces run together as one cluster, each block with its own shared memory (NaN once it has exited).
// A stage released before the wgmma that reads it is done, or a tile read before its barrier, gives a wrong result or
// stops the test. Every padding of M (16 to 256 rows, and two slabs of 256), ragged N and K, 1 to 4 pieces of K,
// checked against fp64 (check.hpp's rule) and the pieces bit for bit against each other, under both of the
// emulation's schedules.
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

#include "check.hpp"

using namespace fdec::gemm;

namespace {

// One launch on h with `splits` pieces of K, Y NaN-poisoned first, under `schedule`.
std::vector<fa::half_t> run_y(const HostGemm& h, int splits, emu9::Schedule schedule) {
  emu9::schedule = schedule;
  std::vector<fa::half_t> y(size_t(h.m) * h.n, fa::half_t{0x7E00});  // NaN
  Args a;
  a.m = h.m, a.n = h.n, a.k = h.k;
  a.x = reinterpret_cast<const __half*>(h.x.data()), a.w = reinterpret_cast<const __half*>(h.w.data());
  a.y = reinterpret_cast<__half*>(y.data());
  a.splits = splits;
  flat_wgmma::launch(a);
  return y;
}

}  // namespace

TEST_CASE("06 gemm emulated: flat_wgmma on every padding of M, ragged N and K, 1 and 3 pieces of K, vs fp64") {
  for (emu9::Schedule schedule : {emu9::Schedule::round_robin, emu9::Schedule::lowest_first})
    for (int m : {1, 16, 17, 40, 64, 65, 128, 129, 200, 256, 257})
      for (int splits : {1, 3}) {
        const HostGemm h = make_inputs(m, 200, 648, 40 + m);  // N: tiles of 128 and 72; K: 11 tiles, the last 8 wide
        INFO("M ", m, ", splits ", splits, ", ", emu9::schedule_name(schedule), " schedule");
        const GemmError e = check_all(h, run_y(h, splits, schedule));
        INFO(e.summary());
        CHECK(e.ok());
      }
}

TEST_CASE("06 gemm emulated: flat_wgmma with slabs of 256 rows (N of 67 tiles: two slabs a tile would not fit)") {
  for (int m : {200, 300}) {  // one slab of 256; a slab of 256 and one of 44
    const HostGemm h = make_inputs(m, 8520, 72, 90 + m);  // 67 N tiles, the last 72 wide; two K tiles, the last 8 wide
    INFO("M ", m);
    const GemmError e = check_all(h, run_y(h, 1, emu9::Schedule::round_robin));
    INFO(e.summary());
    CHECK(e.ok());
  }
}

TEST_CASE("06 gemm emulated: flat_wgmma's split-K in a cluster, 2 and 4 pieces, the same bits in any order") {
  for (int m : {5, 33, 130})
    for (int splits : {2, 4}) {
      const HostGemm h = make_inputs(m, 136, 392, 7 + m);  // 7 K tiles
      INFO("M ", m, ", splits ", splits);
      const std::vector<fa::half_t> y = run_y(h, splits, emu9::Schedule::round_robin);
      const GemmError e = check_all(h, y);
      INFO(e.summary());
      CHECK(e.ok());
      const std::vector<fa::half_t> other = run_y(h, splits, emu9::Schedule::lowest_first);  // blocks run otherwise
      CHECK(std::memcmp(y.data(), other.data(), y.size() * sizeof(fa::half_t)) == 0);      // sums in piece order
    }
  CHECK_THROWS_AS(run_y(make_inputs(1, 64, 512, 1), 5, emu9::Schedule::round_robin), std::invalid_argument);
}

TEST_CASE("06 gemm: flat_wgmma's split-K on an H100 (132 SMs, one block an SM): at most 2 pieces") {
  CHECK(flat_wgmma::splits(64, 4096, 4096, 132) == 2);    // 32 N tiles: 0.24 of a round; 64: 0.48
  CHECK(flat_wgmma::splits(64, 4096, 11008, 132) == 2);
  CHECK(flat_wgmma::splits(64, 12288, 4096, 132) == 1);   // 96 tiles; 192 would not all be resident
  CHECK(flat_wgmma::splits(64, 11008, 4096, 132) == 1);   // 86
  CHECK(flat_wgmma::splits(256, 4096, 4096, 132) == 2);   // two slabs of 128 rows: 64 blocks; 128 (0.97)
  CHECK(flat_wgmma::splits(300, 4096, 4096, 132) == 1);   // three slabs: 96 blocks; 192 would not all be resident
  CHECK(flat_wgmma::splits(256, 12288, 4096, 132) == 1);  // 96 tiles: one slab of 256 rows (two would not fit)
  CHECK(flat_wgmma::splits(1, 64, 64, 132) == 1);         // no more pieces than K tiles
}

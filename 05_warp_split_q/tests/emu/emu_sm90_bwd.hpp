// The sm_90 emulation (emu_sm90.hpp) extended to what the backward's Hopper steps 9-14 use besides the forward's
// (hopper/bwd_sm90.cuh, whose guard is defined here): the m64n64k16 wgmma with K-major or MN-major ("transposed")
// shared-memory operands, float2 and its atomicAdd, a launch of any kernel signature,
// the bulk reduce-add, and step 14's dQ counters. Include it before a backward Hopper file.
// The bulk reduce-add is one of emu_sm90.hpp's bulk copies, emulated as late as the PTX ISA allows: its additions to
// global memory happen when a wait_group (.read or not) retires its group. So a kernel that never waits never adds
// (dQ comes out wrong), and a kernel that rewrites the source tile before the wait that lets it (a wait missing or too
// late) is stopped with an error, as a wgmma whose operands change is.
#pragma once
#include "emu_sm90.hpp"
#define WSQ_BWD_SM90_CUH

#include <algorithm>
#include <functional>

struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
struct float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
namespace wsq::sm90 {
namespace {
inline bool block_takes_turns();
}
}  // namespace wsq::sm90
// One block runs at a time: an atomic add is a plain add (the order of the blocks is fixed, as it is not on a GPU).
// So an atomic add in step 14's ordered mode would land in the order of the turns here, and on a GPU in any order: a
// block that takes turns may not make one (emulated: once one of its threads has taken a turn).
inline void atomicAdd(float2* at, float2 x) {
  if (wsq::sm90::block_takes_turns()) {
    std::fprintf(stderr, "emulated atomicAdd: a float2 atomic in a block that adds dQ in turns (it cannot wait for "
                         "one)\n");
    std::abort();
  }
  at->x += x.x, at->y += x.y;
}

namespace wsq::sm90 {

namespace {

template <class T>
inline void wgmma_ss_n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate_d) {
  constexpr bool h = std::is_same_v<T, fa::half_t>;
  issue(d, 32, accumulate_d != 0, [=](const float* in) {
    return product<64>(
        in, [&](int row, int k) { return value16(at_k_major(desc_a, row, k), h); },
        [&](int k, int col) { return value16(at_k_major(desc_b, col, k), h); });
  });
}
// Both operands MN-major: A's element (row m, k) is read as an MN-major tile's (k, m).
template <class T>
inline void wgmma_ss_n64_mn(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate_d) {
  constexpr bool h = std::is_same_v<T, fa::half_t>;
  issue(d, 32, accumulate_d != 0, [=](const float* in) {
    return product<64>(
        in, [&](int row, int k) { return value16(at_mn_major(desc_a, k, row), h); },
        [&](int k, int col) { return value16(at_mn_major(desc_b, k, col), h); });
  });
}

// ---- bulk reduce-add: a bulk copy (emu_sm90.hpp) that adds its source to global memory when it lands ----
struct Turns {
  const int* waited = nullptr;  // step 14: the dQ counter this thread last waited on (nullptr: none since a release)
  bool takes_turns = false;     // step 14: this thread has waited for a turn (the ordered mode)
};
inline std::vector<Turns> turns;  // per thread of the block
inline bool block_takes_turns() {
  return std::any_of(turns.begin(), turns.end(), [](const Turns& t) { return t.takes_turns; });
}

inline void bulk_reduce_add(float* global, const float* shared, uint32_t bytes) {
  if (bytes % 16 || reinterpret_cast<uintptr_t>(global) % 16 || smem_addr(shared) % 16) {
    std::fprintf(stderr, "emulated cp.reduce.async.bulk: address or size not a multiple of 16 bytes\n");
    std::abort();
  }
  // step 14: once a thread takes turns, every add of its must be in one
  if (turns[emu9::current].takes_turns && !turns[emu9::current].waited) {
    std::fprintf(stderr, "emulated cp.reduce.async.bulk (%s schedule): thread %d: a reduce-add outside its turn (no "
                         "dQ counter waited on since its last release)\n", emu9::schedule_name(emu9::schedule),
                 emu9::current);
    std::abort();
  }
  const auto* from = reinterpret_cast<const unsigned char*>(shared);
  auto add = [global, n = bytes / 4](const unsigned char* src) {
    for (uint32_t x = 0; x < n; ++x) {
      float v;
      std::memcpy(&v, src + 4 * x, 4);
      global[x] += v;
    }
  };
  bulk[emu9::current].open.push_back(
      {from, std::vector<unsigned char>(from, from + bytes), add, "cp.reduce.async.bulk"});
}

// ---- step 14's dQ counters. The blocks run one after another in launch order, so a block's turn has come when it
// starts (the earlier blocks have all released): the wait never spins; a turn that is never reached (a wrong turn,
// a release missing) leaves the thread waiting forever, which the scheduler reports as a deadlock. What the
// emulation checks besides: a release only after this thread waited on that counter, with no open copies and no
// group left that a wait_group (not .read) has not waited for; once a thread has taken a turn, no reduce-add of its
// outside one (between a release and its next wait); the values the counters end with (the tests).
// The fences and the acquire/release scopes are not checked: the emulation is sequentially consistent. ----
inline void dq_order_wait(const int* counter, int turn) {
  emu9::wait_until([=] { return *counter == turn; }, "a dQ counter (its turn never comes)");
  turns[emu9::current].waited = counter;
  turns[emu9::current].takes_turns = true;
}
inline void dq_order_release(int* counter) {
  const BulkGroups& b = bulk[emu9::current];
  const char* wrong = turns[emu9::current].waited != counter ? "without waiting for its turn on it first"
                      : !b.open.empty() || b.unfinished ? "before the wait_group (not .read) of its bulk reduce-adds"
                                                        : nullptr;
  if (wrong) {
    std::fprintf(stderr, "emulated dQ counter (%s schedule): thread %d released it %s\n",
                 emu9::schedule_name(emu9::schedule), emu9::current, wrong);
    std::abort();
  }
  turns[emu9::current].waited = nullptr;
  ++*counter;
}

// A launch of any signature (launch_tma's, with step 14's turns cleared for every block too).
template <class... Params, class... Args>
void launch_sm90(void (*kernel)(Params...), dim3 grid, int threads, size_t smem_bytes, Args... args) {
  run_grid(grid, threads, smem_bytes, [=] { kernel(args...); }, [](int n) { turns.assign(n, {}); });
}

}  // namespace
}  // namespace wsq::sm90

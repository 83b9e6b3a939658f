// A CPU emulation of the Hopper pieces steps 9 and 10 use, so that test_sm90_emulated runs those kernels - their
// producer/consumer handshake, barrier phases, descriptors, fragment layouts and masks - on a machine without an
// H100. It replaces ptx.cuh, launch.cuh, wgmma.cuh and tma_host.cuh (their include guards are defined here) and
// must be included before a kernel file.
//   * Every GPU thread is a cooperative context (ucontext) on one OS thread. Unlike emu.hpp's lockstep, a thread
//     that must wait (an mbarrier phase, a named barrier, __syncthreads, a shuffle) hands over to a thread that can
//     go on, and is resumed only once what it waits for has happened: the producer runs ahead of the consumers
//     exactly as far as the "empty" barriers let it. Which thread goes on is emu9::schedule's choice
//     (emu_schedule.hpp): round robin (the next one after the waiting thread) or the lowest-numbered one; the tests
//     run every step under both, because warps run at any relative speed on the GPU. A wait that can never end (no
//     thread can go on) stops the test (abort). A thread also hands over right after an arrive (mbarrier or named
//     barrier) and after issuing a TMA load, which may release waiting threads at once: a shared-memory write moved
//     below the arrive that publishes it lands after its reader ran.
//   * mbarriers count arrivals and transaction bytes and complete phases as the PTX ISA says; try_wait.parity P
//     succeeds once the phase of parity P has completed. A TMA copy lands as late as the rules allow - when a
//     thread waits on its barrier - with the 128-byte swizzle (sm90_layout.hpp's swizzle128) and zeros outside the
//     tensor, and then counts its bytes: a tile read without waiting for its barrier is garbage.
//   * wgmma reads A and B from shared memory through the descriptor the kernel built (start, leading and stride
//     byte offsets decoded, the canonical layouts of the PTX ISA, the swizzle applied to the address), or A from the
//     registers of the 4 lanes that hold its rows (the mma.sync A layout, per warp). The accumulator layout:
//     register 4n + e of lane (g, t) of warp w is row 16w + g + 8 (e / 2), column 8n + 2t + e % 2.
//     Asynchronous as on the GPU: a wgmma's product lands in its accumulator registers only at the wgmma.wait_group
//     that retires its commit group; until then those registers hold NaN, so a kernel that reads them too early
//     (a wait missing or too late) computes garbage. Its shared-memory operands are read at issue and again at that
//     wait: if they changed in between (a buffer released and refilled while the wgmma still reads it), the test
//     stops with an error.
//   * Bulk copies shared -> global (step 18's TMA store of O; the backward's bulk reduce-add) land when a
//     wait_group of the issuing thread retires them, and stop the test if their source changed since the copy was
//     issued (a barrier missing before it, or a wait missing before the source is rewritten) or if a thread ends
//     with one not retired.
//   * Thread block clusters (chapter 06's decode GEMM, gemm/flat_wgmma.cu): a cluster's blocks run together, their
//     threads all in one schedule, each block with its own shared memory (garbage at the start; NaN once every
//     thread of the block has finished, so a peer reading it after it left reads NaN); the cluster barrier counts
//     every thread of the cluster, and a peer's shared memory is read through emu9::cluster_peer (mapa).
//   * Persistent blocks (step 14): sm_count() is 2, so a grid of "one block per SM" has blocks that run several
//     work items; global memory belongs to one emulated thread at a time, so atomicAdd is a plain add. A block that
//     ends with arrivals on a named barrier that nobody waited for stops the test (unmatched ping-pong turns).
// Slow, and it proves nothing about timing or about what the asynchronous hardware might reorder; it does check
// the index arithmetic, the phases and the layouts.
#pragma once
#define FA_PTX_CUH
#define WSQ_LAUNCH_CUH
#define WSQ_WGMMA_CUH
#define WSQ_TMA_HOST_CUH

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "frag.hpp"
#include "hopper/sm90_layout.hpp"
#include "hopper/fp8.hpp"
#include "dtype.hpp"
#include "emu_common.hpp"
#include "emu_schedule.hpp"
#include "problem.hpp"


#ifndef __VECTOR_TYPES_H__  // CUDA's own dim3 (a header included first, e.g. cuda_fp16.h, brought it) will do
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
#endif

namespace emu9 {

// ---- the scheduler ----
// A thread that waits leaves its condition with its fiber (`wait`, called with `arg`: the waiting code's predicate,
// on that fiber's stack); the scheduler resumes only a thread whose condition holds, so a thread never spins.
struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  bool done = false;
  bool (*wait)(void*) = nullptr;  // nullptr: it can go on
  void* arg = nullptr;
  const char* what = "";
};
inline std::vector<Fiber> fibers;
inline ucontext_t main_ctx;
// Fiber f is thread f % block_threads of the cluster's block f / block_threads (a cluster of one block: f is the
// thread); n_threads counts the threads of every block run together.
inline int current = 0, n_threads = 0, alive = 0, block_threads = 0;
inline dim3 thread_idx, block_idx, grid_dim;  // grid_dim: of the running launch
inline dim3 cluster_first;                   // blockIdx of the cluster's block of rank 0 (the cluster runs along y)
inline std::vector<int> block_alive;         // per block of the cluster: its threads not finished yet
inline void (*on_block_exit)(int block) = nullptr;
inline void (*body)() = nullptr;
inline int block_of(int fiber) { return fiber / block_threads; }

inline void go_to(int next, bool save) {
  const int me = current;
  current = next, thread_idx = dim3(unsigned(next % block_threads));
  block_idx = dim3(cluster_first.x, cluster_first.y + unsigned(block_of(next)), cluster_first.z);
  if (save) swapcontext(&fibers[me].ctx, &fibers[next].ctx);
  else setcontext(&fibers[next].ctx);
}
inline bool can_go_on(int t) {
  const Fiber& f = fibers[t];
  return !f.done && (!f.wait || f.wait(f.arg));
}
// The thread to run next, as emu9::schedule says: round robin, the first after `from` that can go on (`from` itself
// last); lowest first, the lowest that can. -1: none can (every thread has finished, or a deadlock).
inline int pick(int from) {
  for (int i = 1; i <= n_threads; ++i) {
    const int t = schedule == Schedule::lowest_first ? i - 1 : (from + i) % n_threads;
    if (can_go_on(t)) return t;
  }
  return -1;
}
[[noreturn]] inline void deadlock() {
  for (int t = 0; t < n_threads; ++t)
    if (!fibers[t].done) {
      std::fprintf(stderr, "emulated deadlock (%s schedule): thread %d waits forever on %s\n", schedule_name(schedule),
                   t, fibers[t].what);
      break;
    }
  std::abort();
}
// Hands over to the thread the schedule picks (perhaps this one, if it can go on).
inline void reschedule() {
  const int next = pick(current);
  if (next < 0) deadlock();
  fibers[next].wait = nullptr;
  if (next != current) go_to(next, true);
}
// Lets the schedule run another thread that can go on (round robin: every other one, once, before this one).
inline void yield() {
  fibers[current].wait = nullptr;
  reschedule();
}
template <class Done>
inline void wait_until(Done done, const char* what) {
  if (done()) return;
  Fiber& f = fibers[current];
  f.wait = [](void* d) { return (*static_cast<Done*>(d))(); };
  f.arg = &done, f.what = what;
  reschedule();  // back here only once done() has held
}
inline void fiber_entry() {
  body();
  fibers[current].done = true;
  --alive;
  if (--block_alive[block_of(current)] == 0 && on_block_exit) on_block_exit(block_of(current));
  const int next = pick(current);
  if (next < 0) {
    if (alive > 0) deadlock();  // the others wait on something only a finished thread could have done
    setcontext(&main_ctx);
  }
  fibers[next].wait = nullptr;
  go_to(next, false);
}
// Runs `blocks` blocks of `threads` threads together (a cluster: blockIdx first, first + (0, 1, 0), ...).
inline void run_blocks(int threads, int blocks, dim3 first) {
  constexpr size_t kStack = 96 * 1024;
  fibers.resize(size_t(threads) * blocks);
  block_threads = threads, n_threads = alive = threads * blocks, cluster_first = first;
  block_alive.assign(blocks, threads);
  for (int t = 0; t < n_threads; ++t) {
    Fiber& f = fibers[t];
    f.stack.resize(kStack);
    f.done = false, f.wait = nullptr;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = &main_ctx;
    makecontext(&f.ctx, fiber_entry, 0);
  }
  current = 0, thread_idx = dim3(0), block_idx = first;
  swapcontext(&main_ctx, &fibers[0].ctx);
}

// ---- barriers with generations: __syncthreads, named barriers, the warp's exchanges ----
struct Barrier {
  int arrived = 0;
  long generation = 0;
};
inline void bar_arrive(Barrier& b, int count) {
  if (++b.arrived == count) b.arrived = 0, ++b.generation;
}
inline void bar_sync(Barrier& b, int count, const char* what) {
  const long g = b.generation;
  bar_arrive(b, count);
  wait_until([&] { return b.generation != g; }, what);
}
inline std::vector<Barrier> block_barriers;             // per block: __syncthreads
inline std::vector<std::array<Barrier, 16>> named;      // per block: the named barriers
inline std::vector<Barrier> warp_barriers;              // per warp of the blocks run together (fiber / 32)
inline std::vector<std::array<uint64_t, 4>> slots;      // per fiber: what a thread puts on its warp's table
inline Barrier cluster_barrier;
inline std::vector<long> cluster_arrived_at;            // per fiber: the cluster barrier's generation at its arrive

inline int lane() { return int(thread_idx.x % 32); }
inline int warp() { return int(thread_idx.x / 32); }  // within the block
inline int warp_base() { return current / 32 * 32; }  // the fiber of this warp's lane 0
inline void warp_sync() { bar_sync(warp_barriers[current / 32], 32, "a warp exchange"); }
// barrier.cluster.arrive and .wait: every thread of every block of the cluster arrives, then waits for the others.
inline void cluster_arrive() {
  cluster_arrived_at[current] = cluster_barrier.generation;
  bar_arrive(cluster_barrier, n_threads);
}
inline void cluster_wait() {
  const long g = cluster_arrived_at[current];
  wait_until([g] { return cluster_barrier.generation != g; }, "the cluster barrier");
}
inline unsigned cluster_rank() { return unsigned(block_of(current)); }

// ---- mbarriers, found by their shared-memory address ----
struct Mbar {
  int expected = 0, pending = 0;
  long tx = 0, phase = 0;  // phase: how many phases have completed
};
inline std::map<const void*, Mbar> mbars;
inline Mbar& mbar(const void* p) {
  auto it = mbars.find(p);
  if (it == mbars.end()) throw std::logic_error("emulated mbarrier used before mbarrier.init");
  return it->second;
}
inline void mbar_check(Mbar& m) {
  if (m.pending == 0 && m.tx == 0) ++m.phase, m.pending = m.expected;
}

}  // namespace emu9

#define threadIdx (emu9::thread_idx)
#define blockIdx (emu9::block_idx)
#define gridDim (emu9::grid_dim)
inline void __syncthreads() {
  emu9::bar_sync(emu9::block_barriers[emu9::block_of(emu9::current)], emu9::block_threads, "__syncthreads");
}
template <class X>
inline X exchange(X x, int src_lane) {
  uint64_t bits = 0;
  std::memcpy(&bits, &x, sizeof(X));
  emu9::slots[emu9::current][0] = bits;
  emu9::warp_sync();
  const uint64_t other = emu9::slots[emu9::warp_base() + src_lane][0];
  emu9::warp_sync();
  X y;
  std::memcpy(&y, &other, sizeof(X));
  return y;
}
inline void __syncwarp(unsigned = 0xffffffffu) { emu9::warp_sync(); }
// Global memory is one thread's at a time here: an atomic is a plain read-modify-write, a fence has nothing to order.
inline int atomicAdd(int* at, int x) {
  const int old = *at;
  *at = old + x;
  return old;
}
inline void __threadfence() {}
inline float __shfl_xor_sync(unsigned, float x, int mask) { return exchange(x, emu9::lane() ^ mask); }
inline int __shfl_sync(unsigned, int x, int src) { return exchange(x, src); }

// CUDA's types and checks, as far as the host code of the steps uses them.
struct CUtensorMap {  // what cuTensorMapEncodeTiled would encode: a [planes][rows][cols] 16-bit tensor, a box
  const void* base = nullptr;
  int cols = 0, rows = 0, planes = 0, box_rows = 0;
};
namespace emu9 {
// TMA copies not landed yet, per barrier: they land when a thread waits on that barrier (the latest moment the
// rules allow), so a kernel that reads a tile without waiting for its barrier reads garbage and fails. The tensor
// map is kept by value: the kernel parameter it came from may be gone (its thread finished) when the copy lands.
struct Copy {
  void* dst;
  CUtensorMap map;
  int c0, c1, c2;
};
inline std::map<const void*, std::vector<Copy>> in_flight;
}  // namespace emu9
#define CUDA_CHECK(x) (x)
#define CHECK_LAUNCH()

namespace wsq {

namespace {
// The kernels' `extern __shared__` array: one per block of a cluster run together (one block at a time otherwise).
// Steps 9-14 name block 0's array `smem_raw` themselves (`extern __shared__`); a cluster's other blocks have theirs.
constexpr size_t kSmemBytes = 232 * 1024;
constexpr int kMaxClusterBlocks = 4;
alignas(1024) unsigned char smem_raw[kSmemBytes];
alignas(1024) unsigned char smem_more[kMaxClusterBlocks - 1][kSmemBytes];
inline unsigned char* smem_of(int block) { return block == 0 ? smem_raw : smem_more[block - 1]; }
inline unsigned char* smem_here() { return smem_of(emu9::block_of(emu9::current)); }  // the running thread's block's
inline uint32_t smem_addr(const void* p) { return uint32_t(static_cast<const unsigned char*>(p) - smem_here()); }
}  // namespace

namespace sm90 {

inline void mbar_init(uint64_t* bar, int count) { emu9::mbars[bar] = {count, count, 0, 0}; }
inline void fence_barrier_init() {}
inline void fence_view_async_shared() {}  // the emulated wgmma reads the stores themselves: nothing to order
// An arrive may complete a phase, and the threads waiting on it may run at once, before this thread's next
// instruction: the emulated arrive lets them (a shared-memory write moved below the arrive that publishes it then
// lands after its reader ran), as named_bar_arrive below and tma_load_3d do.
inline void mbar_arrive(uint64_t* bar) {
  emu9::Mbar& m = emu9::mbar(bar);
  --m.pending;
  emu9::mbar_check(m);
  emu9::yield();
}
inline void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  emu9::Mbar& m = emu9::mbar(bar);
  m.tx += bytes, --m.pending;
  emu9::mbar_check(m);
  emu9::yield();
}
inline void land(uint64_t* bar);
inline void mbar_wait(uint64_t* bar, int parity) {
  emu9::Mbar& m = emu9::mbar(bar);
  emu9::wait_until([&] { return land(bar), (m.phase & 1) != parity; }, "an mbarrier phase");
}
template <int N>
inline void setmaxnreg_dec() {}
template <int N>
inline void setmaxnreg_inc() {}
inline void named_bar_sync(int id, int threads) {
  emu9::bar_sync(emu9::named[emu9::block_of(emu9::current)][id], threads, "a named barrier");
}
// bar.arrive does not wait, but the threads it releases may run at once, before this thread's next instruction: the
// emulated arrive lets them (a store moved below an arrive that should cover it then lands after its reader ran).
inline void named_bar_arrive(int id, int threads) {
  emu9::bar_arrive(emu9::named[emu9::block_of(emu9::current)][id], threads);
  emu9::yield();
}

// The box of kPanelCols columns x box_rows rows at (c0, c1, c2), element by element: f(at, byte) with `at` its index
// in the tensor (-1 outside it) and `byte` its offset in the box as TMA lays it out in shared memory (128-byte swizzle).
template <class F>
inline void for_each_in_box(const CUtensorMap& map, int c0, int c1, int c2, F f) {
  for (int r = 0; r < map.box_rows; ++r)
    for (int c = 0; c < kPanelCols; ++c) {
      const int row = c1 + r, col = c0 + c;
      const bool inside = row >= 0 && row < map.rows && col >= 0 && col < map.cols && c2 >= 0 && c2 < map.planes;
      f(inside ? (long(c2) * map.rows + row) * map.cols + col : -1L, swizzle128(uint32_t(r) * kRowBytes + c * 2));
    }
}

// One box swizzled into shared memory (zeros outside the tensor); its bytes counted.
inline void copy_box(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const uint16_t*>(map->base);
  for_each_in_box(*map, c0, c1, c2, [&](long at, uint32_t byte) {
    const uint16_t x = at >= 0 ? in[at] : 0;
    std::memcpy(out + byte, &x, 2);
  });
  emu9::Mbar& m = emu9::mbar(bar);
  m.tx -= long(map->box_rows) * kRowBytes;
  emu9::mbar_check(m);
}
// From its issue until its barrier completes, a copy's destination holds nothing defined: garbage here, at once, so
// that a wgmma still reading the buffer's previous tile (a buffer released too early) reads it and is caught. The copy
// may also land at once and complete its barrier's phase: the waiting threads (which land it when they test the
// phase) may run before this thread's next instruction.
inline void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  std::memset(dst, 0xA5, size_t(map->box_rows) * kRowBytes);
  emu9::in_flight[bar].push_back({dst, *map, c0, c1, c2});
  emu9::yield();
}
inline void land(uint64_t* bar) {
  auto it = emu9::in_flight.find(bar);
  if (it == emu9::in_flight.end()) return;
  const std::vector<emu9::Copy> copies = std::move(it->second);
  emu9::in_flight.erase(it);
  for (const emu9::Copy& c : copies) copy_box(c.dst, &c.map, bar, c.c0, c.c1, c.c2);
}

inline unsigned char* smem_1024() { return smem_here(); }  // already on a 1024-byte boundary
inline uint64_t desc_k_major(const void* tile) { return k_major_desc(smem_addr(tile)); }
inline uint64_t desc_mn_major(const void* tile, uint32_t panel) { return mn_major_desc(smem_addr(tile), panel); }
inline void wgmma_fence() {}
template <int N>
inline void fence_operands(float (&)[N]) {}

// Everything that reads the shared memory is internal to the translation unit, as smem_raw is: each step's file is
// compiled with its own copy of this header, and one file's wgmma must never read another file's shared memory.
namespace {

// The 16-bit value at a descriptor's element, the canonical layouts of the PTX ISA (128-byte swizzle).
inline uint16_t at_k_major(uint64_t d, int row, int k) {
  const uint32_t start = uint32_t(d & 0x3FFF) << 4, stride = uint32_t((d >> 32) & 0x3FFF) << 4;
  uint16_t x;
  std::memcpy(&x, smem_here() + swizzle128(start + (row % 8) * 128 + (row / 8) * stride + k * 2), 2);
  return x;
}
inline uint16_t at_mn_major(uint64_t d, int k, int n) {
  const uint32_t start = uint32_t(d & 0x3FFF) << 4, leading = uint32_t((d >> 16) & 0x3FFF) << 4,
                 stride = uint32_t((d >> 32) & 0x3FFF) << 4;
  uint16_t x;
  const uint32_t at = start + (n % 64) * 2 + (n / 64) * leading + (k % 8) * 128 + (k / 8) * stride;
  std::memcpy(&x, smem_here() + swizzle128(at), 2);
  return x;
}

// This thread's accumulators of a 64 x N x K product of 16-bit operands (K = 16; exact fp32): register 4n + e at
// row 16 w + g + 8 (e / 2), column 8n + 2t + e % 2. `in`: the accumulators it adds to (nullptr: zero).
template <int N, int K = 16, class A, class B>
inline std::vector<float> product(const float* in, A a_at, B b_at) {
  const int w = emu9::warp() % 4, g = emu9::lane() / 4, t = emu9::lane() % 4;
  std::vector<float> d(N / 2);
  for (int n = 0; n < N / 8; ++n)
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * w + g + 8 * (e / 2), col = 8 * n + 2 * t + e % 2;
      float acc = in ? in[4 * n + e] : 0.f;
      for (int k = 0; k < K; ++k) acc += a_at(row, k) * b_at(k, col);
      d[4 * n + e] = acc;
    }
  return d;
}

// The wgmma of this thread in flight: where its product lands, and how to compute it again from shared memory
// (its register operands as they were at issue).
struct Wgmma {
  float* d;
  std::vector<float> in;      // the accumulators it adds to, as of its issue (empty: it starts from zero)
  std::vector<float> result;  // computed from shared memory at issue
  std::function<std::vector<float>(const float*)> recompute;
};
struct InFlight {
  std::vector<Wgmma> open;                    // issued since the last commit
  std::vector<std::vector<Wgmma>> committed;  // oldest first
  // The newest wgmma in flight on d (its result is what d will hold once it lands), or nullptr.
  const Wgmma* newest_on(const float* d) const {
    for (auto w = open.rbegin(); w != open.rend(); ++w)
      if (w->d == d) return &*w;
    for (auto g = committed.rbegin(); g != committed.rend(); ++g)
      for (auto w = g->rbegin(); w != g->rend(); ++w)
        if (w->d == d) return &*w;
    return nullptr;
  }
};
inline std::vector<InFlight> wgmmas;  // per thread of the block

inline void issue(float* d, int regs, bool accumulate, std::function<std::vector<float>(const float*)> compute) {
  InFlight& f = wgmmas[emu9::current];
  Wgmma w{d, {}, {}, std::move(compute)};
  if (accumulate) {  // adds to what d will hold once the wgmma before it on d have landed (or holds now)
    const Wgmma* before = f.newest_on(d);
    w.in = before ? before->result : std::vector<float>(d, d + regs);
  }
  w.result = w.recompute(accumulate ? w.in.data() : nullptr);
  for (int r = 0; r < regs; ++r) d[r] = NAN;  // undefined until the wait that retires it
  f.open.push_back(std::move(w));
}

inline void wgmma_commit() {
  InFlight& f = wgmmas[emu9::current];
  f.committed.push_back(std::move(f.open));
  f.open.clear();
}

// wgmma.wait_group N: every committed group but the N newest has landed.
template <int N>
inline void wgmma_wait() {
  emu9::yield();  // the wgmma take time: other threads may run meanwhile (round robin: a producer may refill a buffer)
  InFlight& f = wgmmas[emu9::current];
  while (f.committed.size() > size_t(N)) {
    for (Wgmma& w : f.committed.front()) {
      const std::vector<float> again = w.recompute(w.in.empty() ? nullptr : w.in.data());
      if (std::memcmp(again.data(), w.result.data(), again.size() * sizeof(float)) != 0) {
        std::fprintf(stderr, "emulated wgmma (%s schedule): thread %d: shared memory a wgmma reads changed between "
                             "its issue and the wait that retires it (a buffer released or refilled too early)\n",
                     emu9::schedule_name(emu9::schedule), emu9::current);
        std::abort();
      }
      std::copy(w.result.begin(), w.result.end(), w.d);
    }
    f.committed.erase(f.committed.begin());
  }
}

template <class T>
inline void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate_d) {
  constexpr bool h = std::is_same_v<T, fa::half_t>;
  issue(d, 64, accumulate_d != 0, [=](const float* in) {
    return product<128>(
        in, [&](int row, int k) { return value16(at_k_major(desc_a, row, k), h); },
        [&](int k, int col) { return value16(at_k_major(desc_b, col, k), h); });
  });
}

// Chapter 06's decode GEMM: fp16, both operands K-major in shared memory, N = 16 .. 256.
template <int N>
inline void wgmma_ss_f16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate_d) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128 || N == 256, "N: 16, 32, 64, 128 or 256");
  issue(d, N / 2, accumulate_d != 0, [=](const float* in) {
    return product<N>(
        in, [&](int row, int k) { return value16(at_k_major(desc_a, row, k), true); },
        [&](int k, int col) { return value16(at_k_major(desc_b, col, k), true); });
  });
}

// A from registers: the rows this lane needs are held by the 4 lanes of its quad (mma.sync's A layout), read at
// issue (the kernel must not change them before the wait; the emulation takes them as they are then).
template <class T, int N>
inline void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  constexpr bool h = std::is_same_v<T, fa::half_t>;
  for (int x = 0; x < 4; ++x) emu9::slots[emu9::current][x] = a[x];
  emu9::warp_sync();
  std::array<std::array<float, 16>, 16> A;  // rows 16 w .. 16 w + 15 of A, as seen by this warp
  const int base = emu9::warp_base();
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int e = 0; e < 8; ++e) {
      const uint16_t bits = uint16_t(emu9::slots[base + l][e / 2] >> (16 * (e % 2)));
      A[g + 8 * ((e / 2) % 2)][2 * t + e % 2 + 8 * (e >= 4)] = value16(bits, h);
    }
  }
  emu9::warp_sync();
  issue(d, N / 2, true, [=](const float* in) {
    return product<N>(
        in, [&](int row, int k) { return A[row % 16][k]; },
        [&](int k, int col) { return value16(at_mn_major(desc_b, k, col), h); });
  });
}

// ---- bulk copies shared -> global (step 18's TMA store; emu_sm90_bwd.hpp's bulk reduce-add), tracked by the
// issuing thread's bulk groups. Emulated as late as the PTX ISA allows, as a TMA load is: the copy only records its
// source (and a snapshot of it); commit_group closes the recorded copies into a group; a copy reads its source and
// writes (or adds to) global memory when a wait_group (.read or not) retires its group. So a kernel that never waits
// never writes, and one that rewrites the source before the wait that allows it (a wait missing or too late), or
// hands it over before every thread has written it (the snapshot then differs from what is there at the wait), is
// stopped with an error, as a wgmma whose operands change is. ----
struct BulkCopy {
  const unsigned char* shared;                     // the source, in this block's shared memory
  std::vector<unsigned char> source;               // the source as it was at issue
  std::function<void(const unsigned char*)> land;  // what the copy does with the source: write or add it globally
  const char* what;                                // the instruction, for the error
};
struct BulkGroups {
  std::vector<BulkCopy> open;
  std::vector<std::vector<BulkCopy>> committed;  // oldest first
  size_t unfinished = 0;  // committed groups no wait_group without .read has waited for (their writes may be running)
};
inline std::vector<BulkGroups> bulk;  // per thread of the block

inline void bulk_commit() {
  BulkGroups& b = bulk[emu9::current];
  b.committed.push_back(std::move(b.open));
  b.open.clear();
  ++b.unfinished;
}
// Retires every committed group but the N newest: each copy reads its source now (which must still be what it was
// at issue) and lands.
template <int N>
inline void bulk_retire() {
  emu9::yield();  // the copies take time: other threads may run meanwhile (round robin: every other one does)
  BulkGroups& b = bulk[emu9::current];
  while (b.committed.size() > size_t(N)) {
    for (const BulkCopy& c : b.committed.front()) {
      if (std::memcmp(c.shared, c.source.data(), c.source.size()) != 0) {
        std::fprintf(stderr, "emulated %s (%s schedule): thread %d: its shared-memory source changed between the copy "
                             "and the wait_group that retires it (a barrier or a wait missing, or too late)\n",
                     c.what, emu9::schedule_name(emu9::schedule), emu9::current);
        std::abort();
      }
      c.land(c.shared);
    }
    b.committed.erase(b.committed.begin());
  }
}
template <int N>
inline void bulk_wait_read() {
  bulk_retire<N>();
}
template <int N>
inline void bulk_wait() {
  bulk_retire<N>();
  BulkGroups& b = bulk[emu9::current];
  b.unfinished = std::min(b.unfinished, size_t(N));
}
// A block whose thread ends with a bulk copy no wait_group has retired leaves the copy reading shared memory that is
// no longer the block's.
inline void check_bulk_retired() {
  for (size_t t = 0; t < bulk.size(); ++t)
    if (!bulk[t].open.empty() || !bulk[t].committed.empty()) {
      std::fprintf(stderr, "emulated launch: thread %zu ended with a bulk copy (%s) that no wait_group retired\n", t,
                   (bulk[t].open.empty() ? bulk[t].committed.front().front() : bulk[t].open.front()).what);
      std::abort();
    }
}

// A TMA store: the box at (c0, c1, c2) from shared memory laid out as copy_box writes it (128-byte swizzle); nothing
// outside the tensor is written.
inline void tma_store_3d(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
  const auto* from = static_cast<const unsigned char*>(src);
  const CUtensorMap m = *map;
  auto write = [m, c0, c1, c2](const unsigned char* box) {
    auto* out = static_cast<uint16_t*>(const_cast<void*>(m.base));
    for_each_in_box(m, c0, c1, c2, [&](long at, uint32_t byte) {
      if (at >= 0) std::memcpy(&out[at], box + byte, 2);
    });
  };
  const size_t bytes = size_t(m.box_rows) * kRowBytes;
  bulk[emu9::current].open.push_back({from, std::vector<unsigned char>(from, from + bytes), write,
                                      "cp.async.bulk.tensor (a TMA store)"});
}

// Fresh blocks for every launch (or cluster): shared memory garbage (like real shared memory), no barrier, TMA copy or
// wgmma left from the blocks before. Internal, like everything here that touches this file's shared memory.
inline void reset_blocks(int threads, int blocks) {
  for (int b = 0; b < blocks; ++b) std::memset(smem_of(b), 0xA5, kSmemBytes);
  emu9::mbars.clear();
  emu9::in_flight.clear();
  emu9::block_barriers.assign(blocks, {});
  emu9::named.assign(blocks, {});
  emu9::warp_barriers.assign(size_t(threads) * blocks / 32, {});
  emu9::slots.assign(size_t(threads) * blocks, {});
  emu9::cluster_barrier = {};
  emu9::cluster_arrived_at.assign(size_t(threads) * blocks, 0);
  wgmmas.assign(size_t(threads) * blocks, {});
  bulk.assign(size_t(threads) * blocks, {});
}

// A block that ends with arrivals on a named barrier that no thread waited for has an arrive too many (or a wait
// too few): harmless only by luck on the GPU, and a sign that the turns of a ping-pong were not matched.
inline void check_named_barriers_idle() {
  for (const auto& block : emu9::named)
    for (size_t id = 0; id < block.size(); ++id)
      if (block[id].arrived != 0) {
        std::fprintf(stderr, "emulated launch: named barrier %zu left with %d arrivals that no thread waited for\n", id,
                     block[id].arrived);
        std::abort();
      }
}

// The grid, clusters of `cluster_y` blocks along y (1: blocks one after another), each block with `threads` emulated
// threads running `call` (the kernel with its arguments); `reset_more` clears what a header adds to a block's state
// (emu_sm90_bwd.hpp: step 14's turns, one cluster of one block at a time).
inline void run_grid(dim3 grid, int threads, size_t smem_bytes, std::function<void()> call,
                     void (*reset_more)(int threads) = nullptr, int cluster_y = 1) {
  if (smem_bytes > kSmemBytes) throw std::runtime_error("emulated launch: too much shared memory");
  if (cluster_y < 1 || cluster_y > kMaxClusterBlocks || grid.y % unsigned(cluster_y) != 0)
    throw std::runtime_error("emulated launch: a cluster of 1 to 4 blocks along y, dividing grid.y");
  static std::function<void()> run;  // emu9::body is a plain function pointer: the call goes through this
  run = std::move(call);
  emu9::grid_dim = grid;
  emu9::on_block_exit = cluster_y > 1 ? +[](int b) { std::memset(smem_of(b), 0xFF, kSmemBytes); } : nullptr;  // NaN
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; by += unsigned(cluster_y))
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        reset_blocks(threads, cluster_y);
        if (reset_more) reset_more(threads);
        emu9::body = [] { run(); };
        emu9::run_blocks(threads, cluster_y, dim3(bx, by, bz));
        check_named_barriers_idle();
        check_bulk_retired();
      }
}

// A peer block's shared memory (mapa): the same offset in block `rank`'s array as p has in this block's.
inline void* cluster_peer(const void* p, unsigned rank) {
  return smem_of(int(rank)) + (static_cast<const unsigned char*>(p) - smem_here());
}

}  // namespace

template <class T>
CUtensorMap tensor_map(const T* base, int head_dim, int rows, int planes, int box_rows) {
  return {base, head_dim, rows, planes, box_rows};
}

// The launches the steps call (tma_host.cuh's, emulated): the grid block by block, on the CPU.
template <class Tc>
using TmaKernel = void (*)(CUtensorMap, CUtensorMap, CUtensorMap, fa::Problem, Tc*, float*);
template <class Tc>
void launch_tma(TmaKernel<Tc> kernel, dim3 grid, int threads, size_t smem_bytes, const CUtensorMap& q,
                const CUtensorMap& k, const CUtensorMap& v, const fa::Problem& p, Tc* o, float* lse) {
  run_grid(grid, threads, smem_bytes, [=] { kernel(q, k, v, p, o, lse); });
}

template <class... Params, class... Args>
void launch_sm90(void (*kernel)(Params...), dim3 grid, int threads, size_t smem_bytes, const char*, Args... args) {
  run_grid(grid, threads, smem_bytes, [=] { kernel(args...); });
}
template <class... Params, class... Args>
void launch_sm90_cluster(void (*kernel)(Params...), dim3 grid, int cluster_y, int threads, size_t smem_bytes,
                         const char*, Args... args) {
  run_grid(grid, threads, smem_bytes, [=] { kernel(args...); }, nullptr, cluster_y);
}

}  // namespace sm90
}  // namespace wsq

// ---- step 11 (FP8): e4m3 wgmma (k = 32, both shared-memory operands K-major, A also from registers: 4 e4m3 per
// register) and the launch with the scales. The e4m3 values are hopper/fp8.hpp's decoding of the bytes. ----
namespace wsq::sm90 {
namespace {

// The accumulation of an e4m3 wgmma, modelled as the hardware does it approximately (the 16-bit wgmma above adds in
// exact fp32 order; this one does not): each k32 step aligns its 32 products (exact: an e4m3 product fits a float)
// and the accumulator it adds to (C) to the exponent of the largest of them, keeps kE4m3AccBits bits below that
// exponent - the rest truncated toward zero - and adds. A product far smaller than C loses its low bits at every
// step, always toward zero: across hundreds of steps into one accumulator (a running O~ += P V over all K/V tiles)
// the sum comes out too small, by a fraction that grows with the number of steps. With 14 bits the emulation
// reproduces what an H100 shows: O 0.43 instead of 0.50 (error 0.079) after 128 K/V tiles of positive P V.
constexpr int kE4m3AccBits = 14;

inline double trunc_to(double x, int e) {  // x truncated toward zero to a multiple of 2^e (exact in a double)
  return std::ldexp(std::trunc(std::ldexp(x, -e)), e);
}
// One accumulator of a k32 step: c (when there is one) + sum_k a(k) b(k), aligned and truncated as above.
template <class A, class B>
inline float e4m3_dot(bool has_c, float c, A a, B b) {
  double terms[33];
  int n = 0, e_max = INT32_MIN;
  if (has_c) terms[n++] = c;
  for (int k = 0; k < 32; ++k) terms[n++] = double(a(k)) * double(b(k));
  for (int x = 0; x < n; ++x)
    if (terms[x] != 0.0) e_max = std::max(e_max, std::ilogb(terms[x]));
  if (e_max == INT32_MIN) return 0.f;
  double out = 0.0;  // exact: the truncated terms share one grid of 2^(e_max - 14), 33 of them fit 53 bits
  for (int x = 0; x < n; ++x) out += trunc_to(terms[x], e_max - kE4m3AccBits);
  return float(out);
}
template <int N, class A, class B>
inline std::vector<float> product_e4m3(const float* in, A a_at, B b_at) {
  const int w = emu9::warp() % 4, g = emu9::lane() / 4, t = emu9::lane() % 4;
  std::vector<float> d(N / 2);
  for (int n = 0; n < N / 8; ++n)
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * w + g + 8 * (e / 2), col = 8 * n + 2 * t + e % 2;
      d[4 * n + e] = e4m3_dot(in != nullptr, in ? in[4 * n + e] : 0.f, [&](int k) { return a_at(row, k); },
                              [&](int k) { return b_at(k, col); });
    }
  return d;
}

inline float e4m3_at_k_major(uint64_t d, int row, int k) {  // byte k of row `row`: 32 bytes per k32 step
  const uint32_t start = uint32_t(d & 0x3FFF) << 4, stride = uint32_t((d >> 32) & 0x3FFF) << 4;
  return fp8::e4m3_value(smem_here()[swizzle128(start + (row % 8) * 128 + (row / 8) * stride + k)]);
}

inline void wgmma_ss_n128_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate_d) {
  issue(d, 64, accumulate_d != 0, [=](const float* in) {
    return product_e4m3<128>(
        in, [&](int row, int k) { return e4m3_at_k_major(desc_a, row, k); },
        [&](int k, int col) { return e4m3_at_k_major(desc_b, col, k); });
  });
}

// A from registers: register x of lane (g, t) holds row g + 8 (x % 2), k = 16 (x / 2) + 4t + i in byte i.
template <int N>
inline void wgmma_rs_e4m3(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int accumulate_d) {
  for (int x = 0; x < 4; ++x) emu9::slots[emu9::current][x] = a[x];
  emu9::warp_sync();
  std::array<std::array<float, 32>, 16> A;  // rows 16 w .. 16 w + 15 of A, as seen by this warp
  const int base = emu9::warp_base();
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int x = 0; x < 4; ++x)
      for (int i = 0; i < 4; ++i)
        A[g + 8 * (x % 2)][16 * (x / 2) + 4 * t + i] = fp8::e4m3_value(uint8_t(emu9::slots[base + l][x] >> (8 * i)));
  }
  emu9::warp_sync();
  issue(d, N / 2, accumulate_d != 0, [=](const float* in) {
    return product_e4m3<N>(
        in, [&](int row, int k) { return A[row % 16][k]; },
        [&](int k, int col) { return e4m3_at_k_major(desc_b, col, k); });
  });
}

}  // namespace

// The SMs a persistent kernel (step 14) sizes its grid by: an emulated GPU of two, so that a block runs several items.
inline int sm_count() { return 2; }

template <class Tc>
using TmaFp8Kernel = void (*)(CUtensorMap, CUtensorMap, CUtensorMap, fa::Problem, fp8::Scales, Tc*, float*);
template <class Tc>
void launch_tma_fp8(TmaFp8Kernel<Tc> kernel, dim3 grid, int threads, size_t smem_bytes, const CUtensorMap& q,
                    const CUtensorMap& k, const CUtensorMap& v, const fa::Problem& p, const fp8::Scales& scales, Tc* o,
                    float* lse) {
  run_grid(grid, threads, smem_bytes, [=] { kernel(q, k, v, p, scales, o, lse); });
}

}  // namespace wsq::sm90

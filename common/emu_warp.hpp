// The CPU emulation of the part of CUDA that the chapters' sm_80 kernels use, so that a CPU test runs a kernel's own
// source - its index arithmetic, tile loops, masks, barriers and pipelines - on a machine without a GPU (chapter 05's
// tests/emu/emu.hpp and chapter 06's tests/emu/emu.hpp add their launches to it):
//   * every GPU thread of a block is a context of its own (below); __syncthreads is a barrier of the block;
//   * the warp-wide instructions (shuffles, ldmatrix, movmatrix, mma.sync) exchange values through a per-warp table
//     and a barrier of the warp's 32 threads, and compute what the PTX ISA defines (the rules are written out below,
//     independently of frag.hpp);
//   * cp.async copies as late as the wait_group rules allow, and its destination is NaN from the issue on, so a read
//     before the wait (a missing wait) or a copy issued into a buffer that others still read (a missing barrier)
//     gives a wrong result.
// Blocks run one after another, or, for a thread block cluster, the cluster's blocks together (run_blocks: their
// threads in one lockstep ring, block 0's first; the launch gives each block its own shared memory through the
// hooks below).
// The GPU threads are not OS threads but cooperative contexts (ucontext) on one OS thread, run in lockstep: a
// thread that reaches a warp barrier hands over to the next lane of its warp (lane 31 to lane 0, which then finds
// the barrier complete), one that reaches __syncthreads to the next thread of the block, one that reaches a cluster
// barrier to the next thread of the cluster (the last thread of a block to the first of the next block). This is
// exact for kernels whose barriers are reached by every thread of the warp (or block, or cluster) in the same order,
// which the chapters' kernels are written to do (no barrier inside a divergent branch). Slow, and it proves nothing
// about timing, but an out-of-place index, a wrong buffer or a missing mask gives a wrong result here exactly as on
// the GPU.
//
// It replaces common/ptx.cuh (whose include guard it defines): the same functions in the same namespace, fa::tc.
#pragma once
#define FA_PTX_CUH

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <ucontext.h>
#include <vector>

#include "dtype.hpp"
#include "emu_base.hpp"
#include "frag.hpp"  // as ptx.cuh does

struct dim3_ {
  unsigned x = 0, y = 0, z = 0;
};

namespace emu {

struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  dim3_ idx, block;
};
inline std::vector<Fiber> fibers;  // fiber b * block_threads + t: thread t of block b (b = 0 outside a cluster)
inline ucontext_t main_ctx;
inline int current = 0, n_threads = 0, block_threads = 0;  // n_threads: of all the blocks run together
inline dim3_ thread_idx, block_idx;  // of the running GPU thread
inline dim3_ grid_dim;              // of the running grid (the launch sets it)
inline void (*body)() = nullptr;     // what every GPU thread of the block runs
// A cluster launch's hooks (null otherwise): the next thread to run is of block `to` (of the blocks run together),
// the running one of block `from`; the last thread of block `b` has returned (lockstep: its threads return in order).
inline void (*on_block_switch)(int from, int to) = nullptr;
inline void (*on_block_exit)(int b) = nullptr;

inline int block_of(int fiber) { return fiber / block_threads; }
inline void enter(int next) {  // makes fiber `next` the running GPU thread
  if (on_block_switch && block_of(next) != block_of(current)) on_block_switch(block_of(current), block_of(next));
  current = next, thread_idx = fibers[next].idx, block_idx = fibers[next].block;
}
inline void switch_to(int next) {
  const int me = current;
  enter(next);
  swapcontext(&fibers[me].ctx, &fibers[next].ctx);
}
inline void fiber_entry() {
  body();
  if (on_block_exit && int(thread_idx.x) == block_threads - 1) on_block_exit(block_of(current));
  const int next = current + 1;  // lockstep: the next thread is waiting at the last barrier this one passed
  if (next < n_threads) {
    enter(next);
    setcontext(&fibers[next].ctx);
  }
  setcontext(&main_ctx);
}
// Runs body() as `threads` GPU threads of each of `blocks`, all together (one block, or the blocks of a cluster).
inline void run_blocks(int threads, const std::vector<dim3_>& blocks) {
  constexpr size_t kStack = 128 * 1024;
  n_threads = threads * int(blocks.size()), block_threads = threads;
  fibers.resize(n_threads);
  for (int i = 0; i < n_threads; ++i) {
    Fiber& f = fibers[i];
    f.stack.resize(kStack);
    f.idx = {unsigned(i % threads), 0, 0}, f.block = blocks[i / threads];
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = &main_ctx;
    makecontext(&f.ctx, fiber_entry, 0);
  }
  current = 0, thread_idx = fibers[0].idx, block_idx = fibers[0].block;
  swapcontext(&main_ctx, &fibers[0].ctx);
}
inline void run_block(int threads, dim3_ block) { run_blocks(threads, {block}); }

inline int lane() { return int(thread_idx.x % 32); }
inline void warp_barrier() { switch_to(current - lane() + (lane() + 1) % 32); }
inline void block_barrier() { switch_to(current - int(thread_idx.x) + (int(thread_idx.x) + 1) % block_threads); }
inline void cluster_barrier() { switch_to((current + 1) % n_threads); }

constexpr int kMaxWarps = 8;          // of a block
constexpr int kMaxClusterBlocks = 8;  // the portable cluster size
constexpr int kMaxFibers = 32 * kMaxWarps * kMaxClusterBlocks;
inline std::array<std::array<std::array<uint64_t, 8>, 32>, kMaxFibers / 32> slots{};  // each lane's part of the table
inline std::array<std::array<uint64_t, 8>, 32>& my_slots() { return slots[current / 32]; }

struct Copy {  // a pending cp.async
  void* dst;
  const void* src;
  bool valid;
};
inline std::array<std::vector<Copy>, kMaxFibers> open_group;              // per thread (fiber), not yet committed
inline std::array<std::vector<std::vector<Copy>>, kMaxFibers> committed;  // per thread (fiber), oldest first

}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
#define gridDim (emu::grid_dim)
inline void __syncthreads() { emu::block_barrier(); }
inline void __syncwarp() { emu::warp_barrier(); }
namespace emu {
inline std::array<int, kMaxFibers> votes{};  // __syncthreads_or's table: each thread's (fiber's) predicate
}  // namespace emu
inline int __syncthreads_or(int predicate) {
  emu::votes[emu::current] = predicate != 0;
  emu::block_barrier();
  int any = 0;
  const int first = emu::current - int(threadIdx.x);  // this block's thread 0
  for (int t = 0; t < emu::block_threads; ++t) any |= emu::votes[first + t];
  emu::block_barrier();  // every thread has read the table before a next call writes it
  return any;
}

namespace emu {
// Every lane puts x on the warp's table; each then takes the value of lane src(lane).
template <class X, class Src>
inline X exchange(X x, Src src) {
  static_assert(sizeof(X) == 4, "32-bit shuffles");
  auto& slot = my_slots();
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  slot[lane()][0] = bits;
  warp_barrier();
  const uint32_t other = uint32_t(slot[src(lane())][0]);
  warp_barrier();
  X y;
  std::memcpy(&y, &other, 4);
  return y;
}
}  // namespace emu
inline float __shfl_xor_sync(unsigned, float x, int mask) {
  return emu::exchange(x, [mask](int l) { return l ^ mask; });
}
template <class X>
inline X __shfl_sync(unsigned, X x, int src) {
  return emu::exchange(x, [src](int) { return src; });
}
inline float atomicAdd(float* p, float x) {  // one OS thread: nothing runs in between
  const float old = *p;
  *p = old + x;
  return old;
}

namespace fa::tc {

template <class T>
inline uint32_t pack2_bits(const T& lo, const T& hi) {
  return uint32_t(lo.bits) | (uint32_t(hi.bits) << 16);
}
inline uint32_t lds32(const void* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  return x;
}

// ldmatrix.x4 (PTX ISA 9.7.14.5.15): lane 8m + r gives the address of row r of matrix m; lane L receives in
// register m the two 16-bit values at (L / 4, 2 (L % 4) + e) of matrix m, or with .trans at (2 (L % 4) + e, L / 4).
inline void ldmatrix_emu(uint32_t r[4], const void* row, bool trans) {
  auto& slot = emu::my_slots();
  const int L = emu::lane();
  slot[L][0] = reinterpret_cast<uint64_t>(row);
  emu::warp_barrier();
  for (int m = 0; m < 4; ++m) {
    uint16_t v[2];
    for (int e = 0; e < 2; ++e) {
      const int rr = trans ? 2 * (L % 4) + e : L / 4, cc = trans ? L / 4 : 2 * (L % 4) + e;
      const auto* base = reinterpret_cast<const uint16_t*>(slot[8 * m + rr][0]);
      v[e] = base[cc];
    }
    r[m] = uint32_t(v[0]) | (uint32_t(v[1]) << 16);
  }
  emu::warp_barrier();
}
inline void ldmatrix_x4(uint32_t r[4], const void* row) { ldmatrix_emu(r, row, false); }
inline void ldmatrix_x4_trans(uint32_t r[4], const void* row) { ldmatrix_emu(r, row, true); }

// movmatrix.sync.aligned.m8n8.trans.b16 (PTX ISA, movmatrix): lane L holds in half e of its register the element
// (L / 4, 2 (L % 4) + e) of an 8x8 matrix, and receives the same element of the transposed matrix: element
// (2 (L % 4) + e, L / 4) of the source, which lane 4 (2 (L % 4) + e) + (L / 4) / 2 holds in half (L / 4) % 2.
inline uint32_t movmatrix_trans(uint32_t x) {
  auto& slot = emu::my_slots();
  const int L = emu::lane();
  slot[L][0] = x;
  emu::warp_barrier();
  uint16_t v[2];
  for (int e = 0; e < 2; ++e) {
    const int row = 2 * (L % 4) + e, col = L / 4;  // in the source matrix
    v[e] = uint16_t(slot[4 * row + col / 2][0] >> (16 * (col % 2)));
  }
  emu::warp_barrier();
  return uint32_t(v[0]) | (uint32_t(v[1]) << 16);
}

// mma.sync m16n8k16 (PTX ISA 9.7.14.5.8), g = lane / 4, t = lane % 4:
//   A a_e (register e / 2): row g + 8 [e in {2,3,6,7}], col 2t + e % 2 + 8 [e >= 4]
//   B b_e (register e / 2): row 2t + e % 2 + 8 [e >= 2], col g
//   C c_e: row g + 8 [e >= 2], col 2t + e % 2
template <class T>
inline void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  constexpr bool h = emu::IsHalf<T>::value;
  auto& slot = emu::my_slots();
  const int L = emu::lane();
  for (int x = 0; x < 4; ++x) slot[L][x] = a[x];
  for (int x = 0; x < 2; ++x) slot[L][4 + x] = b[x];
  emu::warp_barrier();
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int e = 0; e < 8; ++e) {
      const uint16_t bits = uint16_t(slot[l][e / 2] >> (16 * (e % 2)));
      A[g + 8 * ((e == 2 || e == 3 || e == 6 || e == 7) ? 1 : 0)][2 * t + e % 2 + 8 * (e >= 4)] = emu::value16(bits, h);
    }
    for (int e = 0; e < 4; ++e) {
      const uint16_t bits = uint16_t(slot[l][4 + e / 2] >> (16 * (e % 2)));
      B[2 * t + e % 2 + 8 * (e >= 2)][g] = emu::value16(bits, h);
    }
  }
  emu::warp_barrier();
  const int g = L / 4, t = L % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e >= 2), col = 2 * t + e % 2;
    float acc = d[e];
    for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
    d[e] = acc;
  }
}

// cp.async at its latest legal moment: a copy lands only when a cp.async.wait_group lets its group complete,
// so a kernel that reads a buffer before waiting for it reads the previous tile (or garbage) and fails.
inline void cp_async_16(void* dst, const void* src, bool valid) {
  std::memset(dst, 0xFF, 16);  // the copy may land at any time from now on: until its wait the bytes are undefined
  emu::open_group[emu::current].push_back({dst, src, valid});
}
inline void cp_async_commit() {
  emu::committed[emu::current].push_back(std::move(emu::open_group[emu::current]));
  emu::open_group[emu::current].clear();
}
template <int n>
inline void cp_async_wait() {
  auto& groups = emu::committed[emu::current];
  while (groups.size() > size_t(n)) {
    for (const emu::Copy& c : groups.front()) {
      if (c.valid) std::memcpy(c.dst, c.src, 16);
      else std::memset(c.dst, 0, 16);
    }
    groups.erase(groups.begin());
  }
}

}  // namespace fa::tc

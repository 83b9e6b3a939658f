// A CPU emulation of the little of CUDA the chapter's kernels use, so that test_emulated runs the kernels
// themselves - their index arithmetic, tile loops, masks, barriers and pipelines - on a machine without a GPU:
// every GPU thread of a block is a std::thread; __syncthreads is a barrier of the block's threads; the
// warp-wide instructions (shuffles, ldmatrix, mma.sync) exchange values through a per-warp table and a barrier
// of the warp's 32 threads, and compute what the PTX ISA defines (the rules are written out below,
// independently of frag.hpp); cp.async copies at once (a legal schedule of an asynchronous copy). Blocks run
// one after another. Slow, and it proves nothing about timing, but an out-of-place index, a wrong buffer or a
// missing mask gives a wrong result here exactly as on the GPU.
//
// This header replaces ptx.cuh and launch.cuh (their include guards are defined here) and must be included
// before a kernel file.
#pragma once
#define WSQ_PTX_CUH
#define WSQ_LAUNCH_CUH

#include <algorithm>
#include <array>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "dtype.hpp"
#include "../frag.hpp"
#include "problem.hpp"

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

struct dim3_ {
  unsigned x = 0, y = 0, z = 0;
};
struct alignas(16) uint4 {
  uint32_t x, y, z, w;
};
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }
inline int min(int a, int b) { return a < b ? a : b; }

namespace emu {

class Barrier {  // reusable: n threads wait until all have arrived
 public:
  explicit Barrier(int n = 1) : n_(n) {}
  void reset(int n) { n_ = n, count_ = 0; }
  void wait() {
    std::unique_lock<std::mutex> lk(m_);
    const unsigned long gen = gen_;
    if (++count_ == n_) {
      count_ = 0, ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lk, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  unsigned long gen_ = 0;
};

constexpr int kMaxWarps = 8;
struct Warp {
  Barrier bar{32};
  std::array<std::array<uint64_t, 12>, 32> slot{};  // what each lane puts on the table
};
inline Barrier block_barrier;
inline std::array<Warp, kMaxWarps> warps;
inline std::mutex atomic_mutex;
inline thread_local dim3_ thread_idx, block_idx;

inline int lane() { return int(thread_idx.x % 32); }
inline Warp& my_warp() { return warps[thread_idx.x / 32]; }

}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
inline void __syncthreads() { emu::block_barrier.wait(); }
inline void __syncwarp() { emu::my_warp().bar.wait(); }

inline float __shfl_xor_sync(unsigned, float x, int mask) {
  emu::Warp& w = emu::my_warp();
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  w.slot[emu::lane()][0] = bits;
  w.bar.wait();
  const uint32_t other = uint32_t(w.slot[emu::lane() ^ mask][0]);
  w.bar.wait();
  float y;
  std::memcpy(&y, &other, 4);
  return y;
}
inline float atomicAdd(float* p, float x) {
  std::lock_guard<std::mutex> lk(emu::atomic_mutex);
  const float old = *p;
  *p = old + x;
  return old;
}

namespace fa {  // the kernels' 16-bit type is the host's own here
template <class T>
struct CudaType {
  using type = T;
};
template <class T>
T* cuda_ptr(T* p) {
  return p;
}
}  // namespace fa

namespace wsq {

inline uint16_t bits16(float x, bool half) {
  return half ? fa::from_float<fa::half_t>(x).bits : fa::from_float<fa::bfloat16_t>(x).bits;
}
inline float value16(uint16_t b, bool half) { return half ? fa::to_float(fa::half_t{b}) : fa::to_float(fa::bfloat16_t{b}); }

template <class T>
inline uint32_t pack2(float lo, float hi) {
  constexpr bool h = std::is_same_v<T, fa::half_t>;
  return uint32_t(bits16(lo, h)) | (uint32_t(bits16(hi, h)) << 16);
}
template <class T>
inline uint32_t pack2_bits(const T& lo, const T& hi) {
  return uint32_t(lo.bits) | (uint32_t(hi.bits) << 16);
}
inline uint32_t lds32(const void* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  return x;
}
inline float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ldmatrix.x4 (PTX ISA 9.7.14.5.15): lane 8m + r gives the address of row r of matrix m; lane L receives in
// register m the two 16-bit values at (L / 4, 2 (L % 4) + e) of matrix m, or with .trans at (2 (L % 4) + e, L / 4).
inline void ldmatrix_emu(uint32_t r[4], const void* row, bool trans) {
  emu::Warp& w = emu::my_warp();
  const int L = emu::lane();
  w.slot[L][0] = reinterpret_cast<uint64_t>(row);
  w.bar.wait();
  for (int m = 0; m < 4; ++m) {
    uint16_t v[2];
    for (int e = 0; e < 2; ++e) {
      const int rr = trans ? 2 * (L % 4) + e : L / 4, cc = trans ? L / 4 : 2 * (L % 4) + e;
      const auto* base = reinterpret_cast<const uint16_t*>(w.slot[8 * m + rr][0]);
      v[e] = base[cc];
    }
    r[m] = uint32_t(v[0]) | (uint32_t(v[1]) << 16);
  }
  w.bar.wait();
}
inline void ldmatrix_x4(uint32_t r[4], const void* row) { ldmatrix_emu(r, row, false); }
inline void ldmatrix_x4_trans(uint32_t r[4], const void* row) { ldmatrix_emu(r, row, true); }

// mma.sync m16n8k16 (PTX ISA 9.7.14.5.8), g = lane / 4, t = lane % 4:
//   A a_e (register e / 2): row g + 8 [e in {2,3,6,7}], col 2t + e % 2 + 8 [e >= 4]
//   B b_e (register e / 2): row 2t + e % 2 + 8 [e >= 2], col g
//   C c_e: row g + 8 [e >= 2], col 2t + e % 2
template <class T>
inline void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  constexpr bool h = std::is_same_v<T, fa::half_t>;
  emu::Warp& w = emu::my_warp();
  const int L = emu::lane();
  for (int x = 0; x < 4; ++x) w.slot[L][x] = a[x];
  for (int x = 0; x < 2; ++x) w.slot[L][4 + x] = b[x];
  w.bar.wait();
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int e = 0; e < 8; ++e) {
      const uint16_t bits = uint16_t(w.slot[l][e / 2] >> (16 * (e % 2)));
      A[g + 8 * ((e == 2 || e == 3 || e == 6 || e == 7) ? 1 : 0)][2 * t + e % 2 + 8 * (e >= 4)] = value16(bits, h);
    }
    for (int e = 0; e < 4; ++e) {
      const uint16_t bits = uint16_t(w.slot[l][4 + e / 2] >> (16 * (e % 2)));
      B[2 * t + e % 2 + 8 * (e >= 2)][g] = value16(bits, h);
    }
  }
  w.bar.wait();
  const int g = L / 4, t = L % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e >= 2), col = 2 * t + e % 2;
    float acc = d[e];
    for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
    d[e] = acc;
  }
}

inline void cp_async_16(void* dst, const void* src, bool valid) {
  if (valid) std::memcpy(dst, src, 16);
  else std::memset(dst, 0, 16);
}
inline void cp_async_commit() {}
template <int n>
inline void cp_async_wait() {}

// The kernels' `extern __shared__ unsigned char smem[]` is this array (each kernel file is compiled in its own
// translation unit, with its own copy); blocks run one after another, so one buffer serves them all.
namespace {
alignas(16) unsigned char smem[232 * 1024];

template <class Tc>
using Kernel = void (*)(fa::Problem, const Tc*, const Tc*, const Tc*, Tc*, float*);

// Runs the grid: blocks one after another, each with `threads` std::threads.
template <class T>
void launch(Kernel<T> kernel, int Br, int threads, size_t smem_bytes, const fa::Problem& p, const T* q, const T* k,
            const T* v, T* o, float* lse) {
  if (smem_bytes > sizeof(smem) || threads > 32 * emu::kMaxWarps || threads % 32)
    throw std::runtime_error("emulated launch: too much shared memory or bad block size");
  const int gx = (p.q_len + Br - 1) / Br;
  for (int bz = 0; bz < p.batch; ++bz)
    for (int by = 0; by < p.heads; ++by)
      for (int bx = 0; bx < gx; ++bx) {
        std::memset(smem, 0xA5, smem_bytes);  // garbage, like real shared memory
        emu::block_barrier.reset(threads);
        std::vector<std::thread> ts;
        for (int tid = 0; tid < threads; ++tid)
          ts.emplace_back([&, tid] {
            emu::thread_idx = {unsigned(tid), 0, 0};
            emu::block_idx = {unsigned(bx), unsigned(by), unsigned(bz)};
            kernel(p, q, k, v, o, lse);
          });
        for (auto& t : ts) t.join();
      }
}

}  // namespace

}  // namespace wsq

#define WSQ_INSTANTIATE(fn)                                                                                      \
  template void fn<fa::half_t>(const fa::Problem&, const fa::half_t*, const fa::half_t*, const fa::half_t*,       \
                               fa::half_t*, float*);                                                             \
  template void fn<fa::bfloat16_t>(const fa::Problem&, const fa::bfloat16_t*, const fa::bfloat16_t*,              \
                                   const fa::bfloat16_t*, fa::bfloat16_t*, float*);

// read_w: the ceiling of every kernel of this folder (README.md §2): W's 2 N K bytes read once, and nothing else: no
// X, no Y, no arithmetic. A flat GEMM at M <= 8 is a stream of W, so its time over read_w's is how far it is from
// the bandwidth this GPU gives that stream (chapter 06's read_kv plays the same part for the K/V cache).
// Grid: min(8 x SMs, what W fills) blocks of 128 threads, grid-stride over W's 16-byte vectors; each thread keeps
// kUnroll loads in flight (8 blocks x 128 threads x 4 x 16 bytes = 64 KiB per SM), each load asking L2 for the
// whole 256-byte block around it, as the flat GEMM's copies do.
// The XOR of every 32-bit word read goes into *checksum (one atomic per block after a shared-memory reduction), so
// the loads cannot be optimised away and a test can check that every byte was read.
// Shared memory: 128 x 4 bytes (the block's XORs). K must be a multiple of 8 (gemm.cuh check_shape): whole vectors.
#include <algorithm>

#include "gemm.cuh"
#include "steps/ready.cuh"

namespace fdec::gemm::read_w {
namespace {

constexpr int kUnroll = 4;        // 16-byte loads in flight per thread
constexpr int kBlocksPerSm = 8;   // resident threads x loads in flight to cover HBM's latency

// 16 bytes of W, read-only, with L2 asked for the 256-byte block around them.
__device__ __forceinline__ uint4 load16(const uint4* p) {
#ifdef __CUDA_ARCH__
  uint4 r;
  asm volatile("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
#else
  return *p;  // the CPU emulation (../tests/emu/emu.hpp)
#endif
}

__global__ void __launch_bounds__(kThreads) read_kernel(const uint4* __restrict__ w, size_t vectors,
                                                        unsigned* checksum) {
  const size_t stride = size_t(gridDim.x) * kThreads;
  unsigned x = 0;
  for (size_t e0 = size_t(blockIdx.x) * kThreads + threadIdx.x; e0 < vectors; e0 += stride * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // all kUnroll loads issued before the first is used
      const size_t e = e0 + u * stride;
      v[u] = e < vectors ? load16(w + e) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  static __shared__ unsigned block_x[kThreads];
  block_x[threadIdx.x] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned s = 0;
    for (int i = 0; i < kThreads; ++i) s ^= block_x[i];
    atomicXor(checksum, s);
  }
}

}  // namespace

void launch(const __half* w, int n, int k, int sms, unsigned* checksum) {
  check_shape(1, n, k);
  const size_t vectors = size_t(n) * k / 8;
  const size_t useful = (vectors + kThreads - 1) / kThreads;  // blocks with at least one vector each
  const int blocks = int(std::min<size_t>(useful, size_t(kBlocksPerSm) * std::max(1, sms)));
  launch_kernel(read_kernel, dim3(blocks), 0, reinterpret_cast<const uint4*>(w), vectors, checksum);
}

}  // namespace fdec::gemm::read_w

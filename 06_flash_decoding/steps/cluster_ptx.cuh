// The PTX of thread block clusters (sm_90; gemm/flat_cluster.cu uses them): the cluster barrier in its two halves,
// the block's rank in its cluster, and distributed shared memory: a block's shared variable as seen from the
// cluster (mapa), and a load through that address. sm_80 has no clusters: there these functions trap, and the host
// never launches a cluster kernel on such a GPU (cluster_launch_supported in ready.cuh). The CPU emulation
// (tests/emu/emu.hpp) provides the same functions, so it defines this guard instead of #pragma once.
#ifndef FDEC_CLUSTER_PTX_CUH
#define FDEC_CLUSTER_PTX_CUH
#include <cstdint>

namespace fdec {

// This block's rank in its cluster: 0 .. cluster size - 1 (x fastest, then y, then z).
__device__ __forceinline__ unsigned cluster_rank() {
#if __CUDA_ARCH__ >= 900
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
#else
  __trap();
#endif
}

// The cluster barrier, split in its arrive and its wait. Arrive with release semantics at cluster scope: this
// thread's memory operations before it (shared-memory stores, and loads from the peers' shared memory) are
// performed before any thread of the cluster passes the wait. Wait with acquire: this thread's memory operations
// after it see what every thread of the cluster did before arriving. All threads of every block take part
// (.aligned: every thread of a warp executes the same barrier instruction).
__device__ __forceinline__ void cluster_arrive() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

// The address of this block's shared variable *p in the shared memory of the cluster's block `rank` (the same
// variable there), in the cluster's shared window (.shared::cluster): a 32-bit address for cluster_load.
__device__ __forceinline__ uint32_t cluster_map(const void* p, unsigned rank) {
#if __CUDA_ARCH__ >= 900
  const uint32_t own = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint32_t peer;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(peer) : "r"(own), "r"(rank));
  return peer;
#else
  __trap();
#endif
}
// A float from the cluster's shared window: an SM-to-SM read of a peer block's shared memory (or this block's own).
__device__ __forceinline__ float cluster_load(uint32_t addr) {
#if __CUDA_ARCH__ >= 900
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
#else
  __trap();
#endif
}

}  // namespace fdec
#endif  // FDEC_CLUSTER_PTX_CUH

// A step's kernel made ready and launched: its shared-memory limit raised once per device, the occupancy query for
// plan(), and the launch with its error check. The CPU emulation (tests/emu/emu.hpp) runs the same kernels through its own
// versions of these three, so it defines this guard instead of #pragma once.
#ifndef FDEC_READY_CUH
#define FDEC_READY_CUH
#include <set>

#include "cuda_check.cuh"
#include "device.cuh"
#include "plan.hpp"

namespace fdec {

// The kernel function Kernel, with its dynamic shared-memory limit raised to Bytes the first time it is asked for
// on the current device (above 48 KB a kernel must opt in, on every device it runs on). One host thread.
template <auto Kernel, int Bytes>
auto ready() {
  static std::set<int> raised;  // the devices where the limit is raised
  if (raised.insert(fa::current_device()).second)
    CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Bytes));
  return Kernel;
}
// How many blocks of Kernel (kThreads threads, Bytes of shared memory) one SM holds: plan() prints it.
template <auto Kernel, int Bytes>
int occupancy() {
  int n = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ready<Kernel, Bytes>(), kThreads, Bytes));
  return n;
}

// kernel<<<grid, kThreads, smem_bytes>>>(args...), checked.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, int smem_bytes, Args... args) {
  kernel<<<grid, kThreads, smem_bytes>>>(args...);
  CHECK_LAUNCH();
}

}  // namespace fdec
#endif  // FDEC_READY_CUH

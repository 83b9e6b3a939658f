// A step's kernel made ready and launched: its shared-memory limit raised once per device, the occupancy query for
// plan(), and the launch with its error check; the same for a kernel launched in thread block clusters (sm_90), and
// whether the GPU has them. The CPU emulation (tests/emu/emu.hpp) runs the same kernels through its own versions of
// these functions, so it defines this guard instead of #pragma once.
#ifndef FDEC_READY_CUH
#define FDEC_READY_CUH
#include <set>
#include <string>

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

// Whether the current GPU launches thread block clusters (sm_90 and later).
inline bool cluster_launch_supported() {
  int yes = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&yes, cudaDevAttrClusterLaunch, fa::current_device()));
  return yes != 0;
}
// fa::NotOnThisGpu where the current GPU has no clusters: `what` names the kernel that needs them.
inline void require_cluster_launch(const std::string& what) {
  if (!cluster_launch_supported())
    throw fa::NotOnThisGpu(what + " needs thread block clusters (compute capability 9.0 or later); this GPU has none");
}
// How many clusters of `cluster_blocks` blocks of Kernel (kThreads threads, Bytes of shared memory each), stacked
// along y, the whole GPU holds at once: a cluster's blocks must all be resident together, in one GPC.
template <auto Kernel, int Bytes>
int cluster_occupancy(int cluster_blocks) {
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 1, cluster.val.clusterDim.y = unsigned(cluster_blocks), cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1, unsigned(cluster_blocks), 1), config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = Bytes, config.attrs = &cluster, config.numAttrs = 1;
  int n = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, ready<Kernel, Bytes>(), &config));
  return n;
}
// kernel<<<grid, kThreads, smem_bytes>>>(args...) with the blocks grouped in clusters of (1, cluster_y, 1): blocks
// (x, y, z) with the same x, z and y / cluster_y form one cluster (grid.y a multiple of cluster_y). Checked.
template <class... Params, class... Args>
void launch_cluster_kernel(void (*kernel)(Params...), dim3 grid, int cluster_y, int smem_bytes, Args... args) {
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 1, cluster.val.clusterDim.y = unsigned(cluster_y), cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid, config.blockDim = dim3(kThreads), config.dynamicSmemBytes = size_t(smem_bytes);
  config.attrs = &cluster, config.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
  CHECK_LAUNCH();
}

}  // namespace fdec
#endif  // FDEC_READY_CUH

// Which GPU is this, and is there one at all. Without a driver cudaGetDeviceCount returns an error
// (cudaErrorInsufficientDriver on a machine with the toolkit but no GPU), not just a count of 0:
// both mean "no device".
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda_check.cuh"

namespace fa {

inline bool has_cuda_device() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) cudaGetLastError();
  return e == cudaSuccess && n > 0;
}

// The device this host thread launches on (cudaSetDevice's), for state that belongs to one device.
inline int current_device() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

inline cudaDeviceProp device_props() {
  const int dev = current_device();
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return prop;
}

inline std::string device_name() { return device_props().name; }

inline size_t device_free_bytes() {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return free_b;
}

// A kernel that cannot run on this GPU at all (it needs more shared memory per block than the GPU gives one):
// not a failure of the kernel. Programs and tests report it as skipped, naming the need.
struct NotOnThisGpu : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The per-kernel opt-in for more than 48 KB of dynamic shared memory, checked against what this GPU allows a
// block first (sm_80: 163 KB, sm_86 and sm_89: 99 KB, sm_90: 227 KB): NotOnThisGpu names both numbers.
inline void opt_in_shared_memory(const void* kernel, size_t bytes, const std::string& what) {
  constexpr size_t kDefault = 48 * 1024;  // every GPU since sm_50 gives a block this much without asking
  if (bytes <= kDefault) return;
  int limit = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, current_device()));
  if (bytes > size_t(limit))
    throw NotOnThisGpu(what + " needs " + std::to_string(bytes) + " bytes of shared memory per block; this GPU allows " +
                       std::to_string(limit) + " (an A100 or H100 allows enough)");
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace fa

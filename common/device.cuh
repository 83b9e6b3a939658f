// Which GPU is this, and is there one at all. Without a driver cudaGetDeviceCount returns an error
// (cudaErrorInsufficientDriver on a machine with the toolkit but no GPU), not just a count of 0:
// both mean "no device".
#pragma once
#include <cuda_runtime.h>

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

}  // namespace fa

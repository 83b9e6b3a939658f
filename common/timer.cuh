// The one timer: CUDA events around each repetition, warm-up first, median reported.
// Before each timed repetition the L2 cache is flushed (a memset of a buffer twice its size), so a
// small problem is timed from HBM, as it would run inside a model, not from a warm 50 MB L2.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda_check.cuh"
#include "device.cuh"
#include "device_buffer.cuh"

namespace fa {

// The median time of `run` in milliseconds (0 when iters is 0).
template <class Fn>
double time_ms(Fn&& run, int warmup, int iters) {
  if (iters <= 0) return 0;
  for (int i = 0; i < warmup; ++i) run();
  CUDA_CHECK(cudaDeviceSynchronize());

  DeviceBuffer<char> flush(size_t(std::max(device_props().l2CacheSize, 1 << 20)) * 2);
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms(iters);
  for (int i = 0; i < iters; ++i) {
    CUDA_CHECK(cudaMemsetAsync(flush.get(), i & 0xFF, flush.bytes()));
    CUDA_CHECK(cudaEventRecord(start));
    run();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float e = 0;
    CUDA_CHECK(cudaEventElapsedTime(&e, start, stop));
    ms[i] = e;
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace fa

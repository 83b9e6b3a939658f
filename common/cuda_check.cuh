// The one way to check CUDA: CUDA_CHECK(call) throws fa::CudaError naming the call, file and line;
// CHECK_LAUNCH() after every <<<...>>> catches bad launch configurations (too much shared memory,
// too many threads) at the launch that caused them instead of at a later, unrelated call.
// Throwing (not exit()) lets a test report the failure and a program print it and exit 1.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace fa {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void cuda_check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess)
    throw CudaError(std::string(file) + ":" + std::to_string(line) + ": " + what + " failed: " +
                    cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

}  // namespace fa

#define CUDA_CHECK(call) ::fa::cuda_check((call), #call, __FILE__, __LINE__)
#define CHECK_LAUNCH() ::fa::cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

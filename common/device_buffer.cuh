// RAII device memory. Allocation failure says how much was asked and how much is free.
// poison() fills the buffer with 0xFF bytes, a NaN in fp32, fp16 and bf16 alike: an element a kernel
// forgets to write stays NaN and fails every comparison.
#pragma once
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "bytes.hpp"
#include "cuda_check.cuh"

namespace fa {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n == 0) return;
    const cudaError_t e = cudaMalloc(&p_, n * sizeof(T));
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so later calls work
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw CudaError("cudaMalloc of " + human_bytes(double(n * sizeof(T))) + " failed (" +
                      cudaGetErrorString(e) + "); the device has " + human_bytes(double(free_b)) +
                      " free of " + human_bytes(double(total_b)));
    }
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

  void upload(const std::vector<T>& host) {
    if (host.size() != n_) throw std::runtime_error("DeviceBuffer::upload: size mismatch");
    CUDA_CHECK(cudaMemcpy(p_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    CUDA_CHECK(cudaMemcpy(host.data(), p_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  void poison() { CUDA_CHECK(cudaMemset(p_, 0xFF, bytes())); }
  void zero() { CUDA_CHECK(cudaMemset(p_, 0, bytes())); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace fa

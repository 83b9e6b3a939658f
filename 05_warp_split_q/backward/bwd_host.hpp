// The host-side pieces every backward file shares, free of CUDA headers: a step's pair of K/V-block kernels, the
// driver run_backward (backward.cu), the deterministic dQ kernel's run_dq (bwd_dq.cu), and the instantiation macro.
// Include after fa::CudaType is declared (lowp.cuh, or tests/emu/emu.hpp for the CPU emulation): bwd_launch.cuh does.
#pragma once
#include <cstddef>

#include "backward.cuh"

namespace wsq {
namespace bwd {

// A step's K/V-block kernel: grid (Tc, Hkv, B). kAtomicDq selects whether it also adds dS K_j into dq.
template <class Tc>
using KvKernel = void (*)(fa::Problem, const Tc* q, const Tc* k, const Tc* v, const float* lse, const Tc* dout,
                          const float* Dv, float* dq, float* dk, float* dv);
template <class Tc>
struct KvKernels {
  KvKernel<Tc> atomic_dq, no_dq;
  int Bc, threads;
  size_t smem_bytes;
};

// D = rowsum(dO o O) -> workspace; then the K/V kernel (zeroed dq + atomics, or no dQ and then the dQ kernel).
template <class T>
void run_backward(const fa::Problem& p, const KvKernels<typename fa::CudaType<T>::type>& kv, const T* q, const T* k,
                  const T* v, const T* o, const float* lse, const T* dout, float* dq, float* dk, float* dv, DqMode mode,
                  void* workspace);

// What every step runs before its K/V-block kernel: D = rowsum(dO o O) into Dv, and dq zeroed in the atomic mode.
template <class T>
void prepare(const fa::Problem& p, const T* o, const T* dout, float* Dv, float* dq, DqMode mode);

// The deterministic dQ kernel (bwd_dq.cu), the same for every step: grid (Tr, H, B), DqTile.
template <class T>
void run_dq(const fa::Problem& p, const T* q, const T* k, const T* v, const float* lse, const T* dout, const float* Dv,
            float* dq);

}  // namespace bwd
}  // namespace wsq

// Explicit instantiations of a backward step's host function for both dtypes.
#define WSQ_BWD_INSTANTIATE(fn)                                                                                     \
  template void fn<fa::half_t>(const fa::Problem&, const fa::half_t*, const fa::half_t*, const fa::half_t*,          \
                               const fa::half_t*, const float*, const fa::half_t*, float*, float*, float*, DqMode,    \
                               void*);                                                                              \
  template void fn<fa::bfloat16_t>(const fa::Problem&, const fa::bfloat16_t*, const fa::bfloat16_t*,                 \
                                   const fa::bfloat16_t*, const fa::bfloat16_t*, const float*, const fa::bfloat16_t*, \
                                   float*, float*, float*, DqMode, void*);

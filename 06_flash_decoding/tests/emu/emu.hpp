// The CPU emulation of chapter 06's kernels: common/emu_warp.hpp (every GPU thread a cooperative context, barriers,
// shuffles, ldmatrix, mma.sync and cp.async by the PTX ISA's rules) with CUDA's own 16-bit types (their host
// halves: the conversions the kernels call work on the CPU too), and what the steps write out in PTX or launch
// (steps/async_ptx.cuh, steps/ready.cuh, whose include guards are defined here): the K/V copies become emulated
// cp.async (the L2 policy is a hint and changes no value), the arrival count a plain add (blocks run one after
// another; atomicXor likewise), a launch runs the grid's blocks one after another in the order x, then y, then z.
// "Device memory" is host memory: the test passes host pointers where the GPU program passes device ones.
//
// Include it first; then, in each translation unit that compiles a step file, FDEC_EMU_SHARED_MEMORY(namespace) before
// the step file: it defines the step's `extern __shared__` array (each step file in its own translation unit).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "emu_warp.hpp"
#include "plan.hpp"
#define FDEC_ASYNC_PTX_CUH
#define FDEC_READY_CUH

template <>
struct emu::IsHalf<__half> : std::true_type {};

inline float __ldcg(const float* p) { return *p; }
inline int atomicAdd(int* p, int x) {  // one OS thread: nothing runs in between
  const int old = *p;
  *p = old + x;
  return old;
}
inline unsigned atomicXor(unsigned* p, unsigned x) {
  const unsigned old = *p;
  *p = old ^ x;
  return old;
}

namespace fdec {

// steps/async_ptx.cuh
struct KvPolicy {
  bool evict_first;
  uint64_t first;
};
inline KvPolicy kv_policy(bool evict_first) { return {evict_first, 0}; }
inline void cp_async16(void* dst, const void* src, bool valid, KvPolicy) { fa::tc::cp_async_16(dst, src, valid); }
inline void cp_async_commit() { fa::tc::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
  fa::tc::cp_async_wait<N>();
}
inline int atomic_add_acq_rel(int* p, int x) { return atomicAdd(p, x); }

// merge.cuh's counters: zeroed once, left at zero by every launch, as on the GPU.
inline int* merge_counters(size_t n) {
  static std::vector<int> counters;
  if (counters.size() < n) counters.assign(n, 0);
  return counters.data();
}

constexpr size_t kEmuSharedBytes = 232 * 1024;  // sm_90's most per block

namespace {  // each translation unit (one step file) has its own

unsigned char* step_shared = nullptr;  // the step's `extern __shared__` array (FDEC_EMU_SHARED_MEMORY)

// steps/ready.cuh
template <auto Kernel, int Bytes>
auto ready() {
  static_assert(size_t(Bytes) <= kEmuSharedBytes, "more shared memory than any GPU gives a block");
  return Kernel;
}
template <auto Kernel, int Bytes>
int occupancy() {
  return 1;
}
// The grid's blocks one after another, each with kThreads GPU threads and its shared memory filled with garbage, as
// real shared memory is, and no cp.async left over from the block before.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, int smem_bytes, Args... args) {
  if (smem_bytes > 0 && !step_shared) throw std::logic_error("emulated launch: FDEC_EMU_SHARED_MEMORY missing");
  static void (*k)(Params...);
  static std::tuple<Args...> arguments;
  k = kernel, arguments = std::tuple<Args...>(args...);
  emu::body = [] { std::apply(k, arguments); };
  emu::grid_dim = {grid.x, grid.y, grid.z};
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        if (smem_bytes > 0) std::memset(step_shared, 0xA5, size_t(smem_bytes));
        for (auto& g : emu::committed) g.clear();
        for (auto& g : emu::open_group) g.clear();
        emu::run_block(kThreads, {x, y, z});
      }
}

}  // namespace
}  // namespace fdec

#define FDEC_EMU_SHARED_MEMORY(step)                                                                  \
  namespace fdec::step {                                                                              \
  namespace {                                                                                         \
  alignas(16) float4 smem4[kEmuSharedBytes / sizeof(float4)];                                         \
  const bool smem4_bound = (step_shared = reinterpret_cast<unsigned char*>(smem4), true);             \
  }                                                                                                   \
  }

// The PTX the ladder's kernels write out themselves (besides common/ptx.cuh's tensor-core wrappers): the K/V stream's
// copies (cp.async with an L2 policy) and the fused merge's arrival count (an acquire-release atomic). The CPU
// emulation (tests/emu/emu.hpp) provides the same functions, so it defines this guard instead of #pragma once.
#ifndef FDEC_ASYNC_PTX_CUH
#define FDEC_ASYNC_PTX_CUH
#include <cstdint>

namespace fdec {

// The L2 policy of the K/V stream (README §4.6). Evict-first: the keys and values of a step replace each other in L2
// instead of what was there before them (a dirty line replaced costs a write to HBM first); the loads then carry
// createpolicy's evict-first policy. Otherwise no policy at all: L2's default (an explicit evict-normal policy was
// measured slower, §4.6).
struct KvPolicy {
  bool evict_first;
  uint64_t first;  // the evict-first policy (plain arithmetic: computed once per thread)
};
__device__ __forceinline__ KvPolicy kv_policy(bool evict_first) {
  KvPolicy k{evict_first, 0};
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(k.first));
  return k;
}

// 16 bytes global -> shared without passing through registers (sm_80+), under the K/V policy, with L2 asked to
// fetch the whole 256-byte block around it (a warp's 32 copies cover 512 contiguous bytes; README §4.6). bytes = 0
// zero-fills the destination and reads nothing (src must still be a valid address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid, KvPolicy pol) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if (pol.evict_first)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(s), "l"(src),
                 "r"(valid ? 16 : 0), "l"(pol.first));
  else
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// The fused merge's arrival count (README §4.2): atomicAdd with release and acquire semantics at device scope (PTX
// memory model): the stores this thread made or observed before it (for thread 0 after a __syncthreads: the whole
// block's) are visible to whoever reads the new count, and the loads after it see what the blocks counted before
// it published.
__device__ __forceinline__ int atomic_add_acq_rel(int* p, int x) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(x) : "memory");
  return old;
}

}  // namespace fdec
#endif  // FDEC_ASYNC_PTX_CUH

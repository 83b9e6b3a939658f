// The Hopper (sm_90a) PTX the backward's steps 9-11 use besides the forward's (wgmma.cuh, tma_host.cuh):
//   * two more wgmma shapes, m64n64k16 with both operands in shared memory: K-major x K-major (S^T = K_j Q_i^T,
//     dP^T = V_j dO_i^T) and MN-major x MN-major ("transposed" A and B: dQ_i = dS_ij K_j read from dS^T and K_j as
//     they are stored, [key][query] and [key][d]);
//   * (the proxy fence that makes the threads' own shared-memory stores, dS^T and the dQ tile, visible to wgmma and
//     to the bulk copies, which read shared memory through the "async proxy", is wgmma.cuh's fence_view_async_shared);
//   * the bulk reduce-add cp.reduce.async.bulk .add.f32 (step 10): one thread hands the copy engine a contiguous run
//     of fp32 values in shared memory, and the engine adds them to global memory - an atomic add of the whole run,
//     done by the memory system, without a per-element atomic instruction - with its bulk-group commit and waits;
//   * the launch of a kernel of any signature (the backward's kernels take five tensor maps);
//   * step 14's turn-taking on a counter in global memory: an acquire load in a loop, a release add.
// PTX ISA sections: "wgmma.mma_async" (imm-trans-a, imm-trans-b), "cp.reduce.async.bulk", "cp.async.bulk.wait_group",
// "fence.proxy.async", "ld" (.acquire), "red" (.release), "Memory Consistency Model". tests/emu/emu_sm90_bwd.hpp provides
// the same names for the CPU emulation (hence the guard).
#ifndef WSQ_BWD_SM90_CUH
#define WSQ_BWD_SM90_CUH
#include "hopper/wgmma.cuh"

#include "cuda_check.cuh"
#include "device.cuh"

namespace wsq::sm90 {

// D (64 x 64, fp32) (+)= A (64 x 16) * B (16 x 64), both from shared memory. TRANS = "0, 0": A and B K-major (their
// k runs along a stored row: K_j and Q_i for S^T = K_j Q_i^T, stored [key][d] and [query][d]). TRANS = "1, 1": both
// MN-major (k runs down the stored rows: A = dS from dS^T stored [key][query], B = K_j stored [key][d]).
#define WSQ_WGMMA_SS_N64(TYPE, TRANS)                                                                            \
  asm volatile(                                                                                                  \
      "{\n.reg .pred acc;\nsetp.ne.b32 acc, %34, 0;\n"                                                          \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " WSQ_D32_REGS ", %32, %33, acc, 1, 1, " TRANS \
      ";\n}\n"                                                                                                   \
      : WSQ_D32_OPERANDS                                                                                         \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))
template <class T>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  if constexpr (std::is_same_v<T, __half>) WSQ_WGMMA_SS_N64("f16", "0, 0");
  else WSQ_WGMMA_SS_N64("bf16", "0, 0");
}
template <class T>
__device__ __forceinline__ void wgmma_ss_n64_mn(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  if constexpr (std::is_same_v<T, __half>) WSQ_WGMMA_SS_N64("f16", "1, 1");
  else WSQ_WGMMA_SS_N64("bf16", "1, 1");
}

// ---- bulk reduce-add: global[0 .. bytes) += shared[0 .. bytes) (fp32), both 16-byte aligned, bytes a multiple of
// 16. Asynchronous like a TMA copy, but tracked by the issuing thread's bulk groups instead of an mbarrier, as a TMA
// store is (wgmma.cuh: bulk_commit, bulk_wait_read, bulk_wait; bulk_wait: the additions done). ----
__device__ __forceinline__ void bulk_reduce_add(float* global, const float* shared, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(global),
               "r"(smem_addr(shared)), "r"(bytes)
               : "memory");
}

// ---- step 14's ordered dQ: a counter in global memory per dQ tile says how many K/V blocks have added their share
// to it. One thread waits for its turn with an acquire load (gpu scope: the counter is moved by other SMs) and
// releases the next block with a release add. The proxy fences: the bulk reduce-adds write global memory through
// the async proxy, the counter is read and written by the generic proxy, so each side fences between them. ----
// Spins until *counter == turn (the blocks before this one have added their shares), then orders this thread's
// later bulk copies (async proxy) after what the acquire saw.
__device__ __forceinline__ void dq_order_wait(const int* counter, int turn) {
  int seen;
  do asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
  while (seen != turn);
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
// After bulk_wait<0> (the additions complete, not only their source read): orders them (async proxy) before the
// release add (generic proxy), which publishes them to whoever acquires the new value.
__device__ __forceinline__ void dq_order_release(int* counter) {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

// Launch with more than 48 KiB of dynamic shared memory (the per-kernel opt-in), any kernel signature.
template <class... Params, class... Args>
void launch_sm90(void (*kernel)(Params...), dim3 grid, int threads, size_t smem_bytes, Args... args) {
  fa::opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem_bytes, "this Hopper backward step");
  kernel<<<grid, threads, smem_bytes>>>(args...);
  CHECK_LAUNCH();
}

}  // namespace wsq::sm90
#endif  // WSQ_BWD_SM90_CUH

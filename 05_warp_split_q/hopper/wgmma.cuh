// The Hopper (sm_90a) PTX of steps 9 and 10, wrapped once: mbarriers (a barrier in shared memory that counts
// arrivals and bytes), the tensor memory accelerator's tiled copy global -> shared (cp.async.bulk.tensor, TMA), and
// the warpgroup MMA (wgmma.mma_async: 4 warps = 128 threads issue one 64 x N x 16 product together; B, and A for
// S = Q K^T, are read by the tensor cores straight from shared memory through a 64-bit "matrix descriptor").
// PTX ISA sections: "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" (wgmma, descriptors, canonical
// layouts), "cp.async.bulk.tensor", "mbarrier". Builds only for sm_90a (the "a" = architecture-specific features).
#ifndef WSQ_WGMMA_CUH
#define WSQ_WGMMA_CUH
#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "forward/tc.cuh"  // smem_addr
#include "sm90_layout.hpp"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma.cuh needs sm_90a: compile with -arch=sm_90a (CMake: CUDA_ARCHITECTURES 90a)"
#endif

namespace wsq::sm90 {

// ---- mbarrier: one 8-byte word in shared memory. A phase completes when `count` threads have arrived AND
// every byte announced with expect_tx has landed; waiters test the parity (0, 1, 0, ...) of the phase. ----
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the TMA unit before any copy uses them. (PTX calls the path the TMA
// unit and wgmma take to memory the "async proxy", as opposed to the threads' own loads and stores; a fence is
// what orders the two.)
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// Orders this thread's earlier ordinary stores to shared memory before later reads of the async proxy (a wgmma
// operand, a bulk copy's source). Every writer fences, then the writers and the readers meet at a barrier.
__device__ __forceinline__ void fence_view_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arrive, and announce `bytes` more that copies will deliver to this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// Spin until the phase of the given parity has completed. A fresh barrier is in phase 0, so waiting for parity 1
// returns at once: "the phase before the first one" counts as complete (the producer's first pass uses this).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// The block's dynamic shared memory from its first 1024-byte boundary, where every TMA box and wgmma operand of a
// 128-byte-swizzled tile must start (the swizzle's atom): a kernel asks for kAtomBytes more than it uses. Steps 9-13
// round their own pointer the same way; chapter 06's decode GEMM uses this.
__device__ __forceinline__ unsigned char* smem_1024() {
  extern __shared__ unsigned char dynamic_smem[];
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(dynamic_smem) + kAtomBytes - 1) / kAtomBytes *
                                          kAtomBytes);
}

// ---- register reallocation: a warpgroup gives up registers (dec) or takes them (inc) so that the producer's
// share can go to the consumers. Every thread of the warpgroup executes it; N is a multiple of 8 in [24, 256]. ----
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---- named barriers: bar.sync waits until `threads` threads (a multiple of 32) have reached barrier `id`
// (1-15; 0 is __syncthreads'), counting those that only passed it with bar.arrive, which does not wait. ----
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- TMA: copy the box at coordinates (c0 innermost, c1, c2) of the tensor `map` describes into shared memory at
// dst; the bytes are counted on `bar`. Elements outside the tensor are written as zeros (a tail tile). The
// ".shared::cluster" form is the one PTX offers for tensor copies; a block launched without clusters is a
// cluster of one, so its own shared-memory address is a valid destination. `map` must live in kernel parameter
// (or constant/global) memory: the kernels take it as a `const __grid_constant__ CUtensorMap`. ----
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::
          "r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// ---- TMA store: the box at (c0, c1, c2) of the tensor `map` describes, from shared memory at src (laid out as a
// load with the same map writes it: 128-byte swizzle); elements outside the tensor are not written. Tracked by the
// issuing thread's bulk groups instead of an mbarrier: bulk_commit closes the copies issued since the last commit into
// a group; bulk_wait_read<N> returns once at most the N newest groups may still be READING their shared-memory source
// (it may then be rewritten), bulk_wait<N> once at most N are still running at all (their writes done). The source
// must have been written before the copy with fence_view_async_shared (the copy reads it through the async proxy). ----
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- wgmma matrix descriptors for tiles stored as TMA writes them with 128-byte swizzle: "panels" of 64 16-bit
// columns (128 bytes a row), rows 128 bytes apart, 8-row atoms of 1024 bytes (16-byte chunk c of row r sits at
// chunk c XOR (r % 8)). The tensor cores apply that XOR to the address bits themselves (bits 4-6 XOR bits 7-9), so
// a descriptor may start anywhere inside a row - 32 bytes further for the next 16 columns - as long as the atom
// pattern starts on a 1024-byte boundary: every panel does, so the descriptor's base offset (bits 49-51) stays 0.
// "K-major": the reduction index k runs along a 128-byte row (Q, K); "MN-major": k runs down the rows (V, whose
// row j is key j): the same distinction as ldmatrix with or without .trans in step 2.
// The bit fields and the step offsets: sm90_layout.hpp, checked on the CPU by test_sm90_layout.cpp. ----
// K-major operand (the reduction index k runs along a row: Q for S = Q K^T as A, K as B): rows (M or N) in groups of
// 8 are kAtomBytes apart (stride byte offset); the 16 k-values of one instruction lie inside one 128-byte row, so
// the leading byte offset is unused. Step k16 of a panel starts 32 bytes further (sm90_layout.hpp: k_major_step).
__device__ __forceinline__ uint64_t desc_k_major(const void* tile) { return k_major_desc(smem_addr(tile)); }
// MN-major operand (k runs down the rows, N along them: V as B of O += P V, row j = key j): 8 rows (k) per atom,
// atoms kAtomBytes apart along k (stride byte offset), panels of 64 N-columns `panel` bytes apart (leading byte
// offset). Step k16 starts 2 atoms (16 rows) further (mn_major_step).
__device__ __forceinline__ uint64_t desc_mn_major(const void* tile, uint32_t panel) {
  return mn_major_desc(smem_addr(tile), panel);
}

// ---- wgmma: issue, commit, wait. wgmma.mma_async only issues a product; commit_group closes the products issued
// since the last commit into one group, and wait_group N returns once at most the N newest groups are still
// running (groups finish in order, so wait_group 1 means "all but the last group are done"). wgmma.fence must
// come before the first wgmma that reads registers (A = P, or accumulators) written by ordinary instructions.
// The accumulators are written asynchronously: between the mma and the wait the compiler must neither read nor
// move them, which fence_operands() (an empty asm that "changes" them) enforces. ----
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
  #pragma unroll
  for (int x = 0; x < N; ++x) asm volatile("" : "+f"(d[x])::"memory");
}

// The accumulator register lists of the m64n64 and m64n128 shapes (32 and 64 fp32 registers per thread); those of
// m64n16, m64n32 and m64n256 (8, 16, 128) follow.
#define WSQ_D32_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WSQ_D32_OPERANDS "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define WSQ_D64_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WSQ_D64_OPERANDS "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

#define WSQ_D8_REGS "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define WSQ_D8_OPERANDS "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define WSQ_D16_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define WSQ_D16_OPERANDS "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
  "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define WSQ_D128_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define WSQ_D128_OPERANDS "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
  "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), \
  "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
  "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), \
  "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), \
  "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
  "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
  "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), \
  "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), \
  "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), \
  "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), \
  "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), \
  "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), \
  "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), \
  "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), \
  "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// m64n72 and m64n136 (36 and 68): P V with 8 more columns than head_dim (step 16's row sums).
#define WSQ_D36_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}"
#define WSQ_D36_OPERANDS "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
#define WSQ_D68_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67}"
#define WSQ_D68_OPERANDS "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67])

// D (64 x N, fp32) (+)= A (64 x 16, K-major in shared memory) * B (16 x N, K-major in shared memory), fp16, for N =
// 16, 32, 64, 128 or 256 (PTX allows every multiple of 8; these are the ones used): chapter 06's decode GEMM
// (gemm/flat_wgmma.cu), whose N is the number of rows of X, padded. accumulate = 0 overwrites D: the first product
// needs no zeroed accumulators (zeroing them with ordinary instructions would make ptxas serialise the wgmma).
#define WSQ_WGMMA_SS_F16(N, A, B, C, REGS, OPERANDS)                                                      \
  asm volatile("{\n.reg .pred acc;\nsetp.ne.b32 acc, %" C ", 0;\n"                                         \
               "wgmma.mma_async.sync.aligned.m64n" N "k16.f32.f16.f16 " REGS ", %" A ", %" B ", acc, 1, 1, 0, 0;\n}\n" \
               : OPERANDS                                                                                   \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate))
template <int N>
__device__ __forceinline__ void wgmma_ss_f16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128 || N == 256, "N: 16, 32, 64, 128 or 256");
  if constexpr (N == 16) WSQ_WGMMA_SS_F16("16", "8", "9", "10", WSQ_D8_REGS, WSQ_D8_OPERANDS);
  else if constexpr (N == 32) WSQ_WGMMA_SS_F16("32", "16", "17", "18", WSQ_D16_REGS, WSQ_D16_OPERANDS);
  else if constexpr (N == 64) WSQ_WGMMA_SS_F16("64", "32", "33", "34", WSQ_D32_REGS, WSQ_D32_OPERANDS);
  else if constexpr (N == 128) WSQ_WGMMA_SS_F16("128", "64", "65", "66", WSQ_D64_REGS, WSQ_D64_OPERANDS);
  else WSQ_WGMMA_SS_F16("256", "128", "129", "130", WSQ_D128_REGS, WSQ_D128_OPERANDS);
}

// D (64 x 128, fp32) (+)= A (64 x 16, K-major in shared memory) * B (16 x 128, K-major in shared memory): one
// k16 step of S = Q K^T for a warpgroup (64 query rows x Bc = 128 keys). accumulate = 0 overwrites D.
#define WSQ_WGMMA_SS_N128(TYPE)                                                                              \
  asm volatile(                                                                                              \
      "{\n.reg .pred acc;\nsetp.ne.b32 acc, %66, 0;\n"                                                      \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " WSQ_D64_REGS ", %64, %65, acc, 1, 1, 0, 0;\n}\n" \
      : WSQ_D64_OPERANDS                                                                                     \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))
template <class T>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  if constexpr (std::is_same_v<T, __half>) WSQ_WGMMA_SS_N128("f16");
  else WSQ_WGMMA_SS_N128("bf16");
}

// D (64 x N, fp32) += A (64 x 16, in registers: the C layout of S rounded to the dtype) * B (16 x N, MN-major in
// shared memory, "transposed": imm-trans-b = 1): one k16 step of O~ += P V, N = head_dim.
#define WSQ_WGMMA_RS_N128(TYPE)                                                                                \
  asm volatile("{\n.reg .pred acc;\nsetp.ne.b32 acc, %69, 0;\n"                                               \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " WSQ_D64_REGS                  \
               ", {%64, %65, %66, %67}, %68, acc, 1, 1, 1;\n}\n"                                               \
               : WSQ_D64_OPERANDS                                                                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1))
#define WSQ_WGMMA_RS_N64(TYPE)                                                                                 \
  asm volatile("{\n.reg .pred acc;\nsetp.ne.b32 acc, %37, 0;\n"                                               \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " WSQ_D32_REGS                   \
               ", {%32, %33, %34, %35}, %36, acc, 1, 1, 1;\n}\n"                                               \
               : WSQ_D32_OPERANDS                                                                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1))
template <class T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(N == 64 || N == 128, "head_dim 64 or 128");
  if constexpr (N == 128) {
    if constexpr (std::is_same_v<T, __half>) WSQ_WGMMA_RS_N128("f16");
    else WSQ_WGMMA_RS_N128("bf16");
  } else {
    if constexpr (std::is_same_v<T, __half>) WSQ_WGMMA_RS_N64("f16");
    else WSQ_WGMMA_RS_N64("bf16");
  }
}

// ---- step 11 (FP8): wgmma with e4m3 operands, k = 32 per instruction. 8-bit wgmma takes no transpose flags: both
// shared-memory operands are K-major (Q, K, and V transposed). A K-major row of 32 e4m3 is 32 bytes, as a row of 16
// 16-bit values is: the descriptors and k_major_step are step 10's. A in registers: 4 x 4 e4m3 per thread, register
// x of lane (g, t) = row g + 8 (x % 2), k = 16 (x / 2) + 4t .. + 3 (lowest byte first). ----
// D (64 x 128, fp32) (+)= A (64 x 32, K-major in shared memory) * B (32 x 128, K-major): one k32 step of S = Q K^T.
__device__ __forceinline__ void wgmma_ss_n128_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred acc;\nsetp.ne.b32 acc, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " WSQ_D64_REGS ", %64, %65, acc, 1, 1;\n}\n"
      : WSQ_D64_OPERANDS
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
// D (64 x N, fp32) (+)= A (64 x 32 e4m3 in registers: P8) * B (32 x N, K-major in shared memory: Vt8): one k32
// step of P V, N = head_dim (+ 8 in step 16, whose last 8 rows of B are ones). accumulate = 0 (scale-d) overwrites
// D: a tile's first k-step starts a fresh sum. A0 .. C: the operand numbers after the N / 2 accumulators.
#define WSQ_WGMMA_RS_E4M3(N, A0, A1, A2, A3, B, C, REGS, OPERANDS)                                     \
  asm volatile("{\n.reg .pred acc;\nsetp.ne.b32 acc, %" C ", 0;\n"                                     \
               "wgmma.mma_async.sync.aligned.m64n" N "k32.f32.e4m3.e4m3 " REGS                          \
               ", {%" A0 ", %" A1 ", %" A2 ", %" A3 "}, %" B ", acc, 1, 1;\n}\n"                       \
               : OPERANDS                                                                                 \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
template <int N>
__device__ __forceinline__ void wgmma_rs_e4m3(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                              int accumulate) {
  static_assert(N == 64 || N == 128 || N == 72 || N == 136, "head_dim 64 or 128 (+ 8: step 16's column of ones)");
  if constexpr (N == 136) WSQ_WGMMA_RS_E4M3("136", "68", "69", "70", "71", "72", "73", WSQ_D68_REGS, WSQ_D68_OPERANDS);
  else if constexpr (N == 72) WSQ_WGMMA_RS_E4M3("72", "36", "37", "38", "39", "40", "41", WSQ_D36_REGS, WSQ_D36_OPERANDS);
  else if constexpr (N == 128) WSQ_WGMMA_RS_E4M3("128", "64", "65", "66", "67", "68", "69", WSQ_D64_REGS, WSQ_D64_OPERANDS);
  else WSQ_WGMMA_RS_E4M3("64", "32", "33", "34", "35", "36", "37", WSQ_D32_REGS, WSQ_D32_OPERANDS);
}

}  // namespace wsq::sm90
#endif  // WSQ_WGMMA_CUH

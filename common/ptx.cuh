// The tensor-core PTX that chapters 05 and 06 use, wrapped once: the tensor-core product (mma.sync m16n8k16), the
// warp-wide shared-memory matrix load (ldmatrix x4, plain and .trans), the warp-wide 8x8 transpose in registers
// (movmatrix), the asynchronous copy global -> shared (cp.async, with zero fill), and two small helpers (packing
// two floats into one 32-bit register of the dtype, reductions over the 4 lanes that share a row of a C fragment).
// Fragment maps: frag.hpp.
// Requires sm_80 or newer (mma m16n8k16 with bf16, cp.async). The shared-memory instructions carry a "memory"
// clobber: the compiler may not move them across the plain C++ stores and loads of the same tiles.
#ifndef FA_PTX_CUH  // a guard, not #pragma once: chapter 05's CPU emulation (tests/emu/) provides its own version
#define FA_PTX_CUH
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "frag.hpp"

namespace fa::tc {

// D = A B + D for one 16x8x16 tile: a[4] and b[2] hold the fragments of frag.hpp, d[4] the fp32 C/D fragment.
template <class T>
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "mma_16816: T must be __half or __nv_bfloat16");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices; `row` is this lane's row address (frag.hpp says which row each lane supplies).
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row))
               : "memory");
}

// The transpose of an 8x8 matrix of 16-bit values that the warp holds in registers (movmatrix, sm_75+): lane L holds
// row L / 4, columns 2 (L % 4) and 2 (L % 4) + 1 (low half first) - the layout of one 8x8 half of a C fragment,
// packed to 16 bits - and receives the same positions of the transposed matrix, i.e. elements (2 (L % 4), L / 4) and
// (2 (L % 4) + 1, L / 4) of the one it gave. No shared memory: the lanes exchange their halves like a shuffle.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// 16 bytes global -> shared without passing through registers. With valid == false nothing is read and the
// 16 bytes are zero-filled (src-size 0): the tail rows of a tile. `src` must still be a valid address.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most n committed groups are still in flight.
template <int n>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n) : "memory");
}

// Two floats rounded to the dtype (nearest even) in one register, `lo` in the low half: an mma operand.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}
// Two 16-bit values from two addresses in one register (an operand gathered without ldmatrix).
template <class T>
__device__ __forceinline__ uint32_t pack2_bits(const T& lo, const T& hi) {
  return uint32_t(*reinterpret_cast<const uint16_t*>(&lo)) | (uint32_t(*reinterpret_cast<const uint16_t*>(&hi)) << 16);
}
__device__ __forceinline__ uint32_t lds32(const void* p) { return *reinterpret_cast<const uint32_t*>(p); }

// The 4 lanes of a group (same g = lane / 4) hold the same rows of a C fragment.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace fa::tc
#endif  // FA_PTX_CUH

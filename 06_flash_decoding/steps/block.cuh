// What every split block of the ladder shares and none of them teaches: the kernel's arguments (Args), the
// shared-memory layout (Smem, held to plan.hpp's CPU-tested count), the address of a key row in the contiguous
// cache, the 16-bit loads widened to fp32, and the warp reductions. Each step file (v01 .. v09) includes this.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "plan.hpp"
#include "problem.hpp"

namespace fdec {

constexpr int kVec = 8;  // 16-bit elements per 16-byte copy
static_assert(kKeysPerWarp == 32, "one key per lane");
static_assert(kMaxRows == 16, "row buckets are 1, 4, 16 (plan.hpp)");

__device__ __forceinline__ float2 to_float2(__half2 x) { return __half22float2(x); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 x) { return __bfloat1622float2(x); }
template <class T>
using Pair = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;

// n consecutive 16-bit values (n even) at p, widened to float.
template <class T, int N>
__device__ __forceinline__ void load_floats(const T* p, float (&f)[N]) {
  static_assert(N % 2 == 0, "pairs");
#pragma unroll
  for (int e = 0; e < N; e += 2) {
    const float2 x = to_float2(*reinterpret_cast<const Pair<T>*>(p + e));
    f[e] = x.x, f[e + 1] = x.y;
  }
}

// 8 consecutive 16-bit values at p (16-byte aligned) in one 16-byte shared-memory load, widened to float. One wide
// load per lane keeps the S loop free of bank conflicts: with the 16-byte row padding the 8 lanes of each
// quarter-warp hit 8 distinct groups of 4 banks.
template <class T>
__device__ __forceinline__ void load_floats8(const T* p, float (&f)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    Pair<T> pair;
    memcpy(&pair, &w[e], 4);
    const float2 x = to_float2(pair);
    f[2 * e] = x.x, f[2 * e + 1] = x.y;
  }
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Everything a split block needs besides the problem. One struct for every step, so that a step's kernel differs
// from its neighbour's in code, not in its parameters (a step ignores the fields it does not use).
template <class T>
struct Args {
  fa::Problem p;  // kv_len = cache capacity
  Rows rows;
  int splits;
  float phi;
  const T* q;
  const T* k;
  const T* v;
  const int* kv_lens;
  const int* block_table;
  int pages_per_seq, log2_page;
  T* o;
  float* lse;
  float* ws_o;   // [splits, B*H*q_len, d]
  float* ws_lse; // [splits, B*H*q_len]
  int* fallbacks;
  size_t q_rows; // B*H*q_len: the query rows of the whole problem (a row of the workspace per split)
  int* done;     // fused merge: per (row chunk, batch entry x unit), how many of its splits have written their partial
  bool evict_first;  // the K/V stream's L2 policy (README §4.6)
};

// Where key row `key` of kv head hk of batch entry b starts in the contiguous cache [B, Hkv, N, d]: an element offset
// into a.k and a.v. copy_chunk takes the key-row map as a type; the paged step (v09) brings its own.
struct ContiguousRows {
  template <class T>
  static __device__ __forceinline__ size_t offset(const Args<T>& a, int b, int hk, int key) {
    return a.p.kv_offset(b, hk) + size_t(key) * a.p.head_dim;
  }
};

// Shared-memory layout of a split block (bytes), for D, R rows and Stages K/V chunk buffers per warp. Mma: Q and P
// are registers (the tensor-core steps v06, v07), so kQ = kP = 0.
template <int D, int R, int Stages, bool Mma>
struct Smem {
  static constexpr int kLdKV = D + kPadH;                                       // 16-bit elements per K/V row
  static constexpr int kKVWarp = 2 * kKeysPerWarp * kLdKV * 2;                   // one warp's K and V chunk
  static constexpr int kStage = kWarps * kKVWarp;                                // every warp's chunk, one stage
  static constexpr int kKV = Stages * kStage;
  static constexpr int kScratchWarp = R * (D + 3) * 4;                           // m, l, max, O~ per row
  static constexpr int kQ = Mma ? 0 : R * D * 4, kP = Mma ? 0 : kWarps * R * kKeysPerWarp * 4;
  static constexpr int kFin = 2 * R * 4 + kWarps * R * 4;
  static constexpr int kBytes = kKV + kQ + kP + kFin;
  static_assert(kBytes == split_smem_bytes(D, R, Stages, Mma), "plan.hpp's count (CPU-tested) is this layout's");
  static_assert(Stages == 1 || Stages == 2, "one buffer per warp, or two (double buffering)");
  static_assert(kWarps * kScratchWarp <= kStage, "the merge scratch reuses the first stage's K/V chunk buffers");
  static_assert((kLdKV * 2) % 16 == 0 && kKVWarp % 16 == 0, "cp.async needs 16-byte aligned rows");
};

}  // namespace fdec

// Algorithm 1 line 4, shared by every step: a warp's 32-key chunk of K and V copied global -> shared with cp.async
// (sm_80+), 16 bytes a lane, under the K/V stream's L2 policy (README §4.6). The steps differ in *when* they call
// copy_chunk (v04 one chunk ahead) and in where a key row lives (v09: through the block table), not in the copy.
#pragma once
#include <cstdint>

#include "block.cuh"

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

// Algorithm 1 line 4 for one warp: K_j and V_j of the 32-key chunk at c0 -> Ks, Vs by cp.async, as two commit
// groups (K first, so the S loop can start while V is still in flight). Rows past the split are zero-filled, not
// read. KeyRows::offset(a, b, hk, key): where key row `key` of kv head hk of entry b starts in a.k and a.v
// (ContiguousRows, or v09's block table).
template <class T, int D, class KeyRows>
__device__ __forceinline__ void copy_chunk(const Args<T>& a, int b, int hk, int c0, int end, T* Ks, T* Vs) {
  constexpr int kLd = D + kPadH;
  constexpr int kPieces = D / kVec;                     // 16-byte pieces per K/V row
  constexpr int kCopies = kKeysPerWarp * kPieces / 32;  // 16-byte copies per lane per chunk and matrix
  const int lane = threadIdx.x % 32;
  const KvPolicy pol = kv_policy(a.evict_first);
#pragma unroll
  for (int t = 0; t < kCopies; ++t) {
    const int e = lane + 32 * t, row = e / kPieces, col = (e % kPieces) * kVec, key = c0 + row;
    const bool ok = key < end;
    const size_t off = ok ? KeyRows::offset(a, b, hk, key) + col : 0;
    cp_async16(Ks + row * kLd + col, a.k + off, ok, pol);
  }
  cp_async_commit();
#pragma unroll
  for (int t = 0; t < kCopies; ++t) {
    const int e = lane + 32 * t, row = e / kPieces, col = (e % kPieces) * kVec, key = c0 + row;
    const bool ok = key < end;
    const size_t off = ok ? KeyRows::offset(a, b, hk, key) + col : 0;
    cp_async16(Vs + row * kLd + col, a.v + off, ok, pol);
  }
  cp_async_commit();
}

}  // namespace fdec

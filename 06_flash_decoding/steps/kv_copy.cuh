// Listing 1 line 4, shared by every step: a warp's 32-key chunk of K and V copied global -> shared with cp.async
// (sm_80+), 16 bytes a lane, under the K/V stream's L2 policy (README §4.6). The steps differ in *when* they call
// copy_chunk (v04 one chunk ahead) and in where a key row lives (v09: through the block table), not in the copy.
#pragma once
#include <cstdint>

#include "async_ptx.cuh"
#include "block.cuh"

namespace fdec {

// Listing 1 line 4 for one warp: K_j and V_j of the 32-key chunk at c0 -> Ks, Vs by cp.async, as two commit
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

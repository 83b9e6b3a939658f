// Listing 2, the LSE merge of the splits' partials (README §2, §4.4), as every step with splits uses it: the merge
// kernel launched after the split kernel (v02, v03, v04, v08, v09: merge_partials, in merge.cu), or merge_row run by
// the last block of a row chunk (the fused merge of v05, v06, v07, with its arrival count and the counters).
#pragma once
#include <cstddef>

#include "async_ptx.cuh"
#include "block.cuh"

namespace fdec {

// Listing 2 for one query row g, by one warp (lane owns d/32 columns). In the fused kernels this runs after every
// other block of its row chunk has finished (with one wave of blocks, at the end of the step), so its latency is
// added to the step whole (README §4.4): no load may wait for another. Every LSE_s is loaded at once (lane i
// holds splits i, i + 32, ...), and with them the first kMergeBatch partial rows O_s, which need no L_max; then
// L_max (line 1), each lane's weights w_s = e^(LSE_s - L_max) (0 for an empty split, LSE_s = -inf), and the
// weighted sums W and O in split order (lines 2-3), so the sums are those of a one-split-at-a-time loop, bit for
// bit. Up to 16 splits that is one round trip to L2 instead of two per split; beyond, one more per kMergeBatch
// splits (the next batch of O_s, loaded when the sums reach it). An empty split's O_s is loaded but never added. The workspace is read with ld.global.cg (L2,
// not L1): in the fused kernel other blocks wrote it during this launch, and L1 is not coherent between SMs.
// MaxSplits bounds `splits` (kMaxSplits; split_kv_even's pieces per tile: kMaxEvenBlocks).
constexpr int kMergeBatch = 16;  // partial rows in flight per lane: 16 x d/32 floats
template <class T, int D, int MaxSplits = kMaxSplits>
__device__ __forceinline__ void merge_row(size_t g, size_t rows, int splits, const float* ws_o, const float* ws_lse,
                                          T* o, float* lse) {
  constexpr int kCols = D / 32;
  constexpr int kLseRounds = MaxSplits / 32;  // LSE_s values per lane
  static_assert(MaxSplits % 32 == 0 && 32 % kMergeBatch == 0, "whole rounds of 32 splits, whole batches in each");
  const int lane = threadIdx.x % 32;
  float x[kMergeBatch][kCols];  // partial rows of splits s0 .. s0 + kMergeBatch - 1, this lane's columns
  auto load_batch = [&](int s0) {
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i)
#pragma unroll
      for (int c = 0; c < kCols; ++c)
        x[i][c] = s0 + i < splits ? __ldcg(ws_o + (size_t(s0 + i) * rows + g) * D + lane * kCols + c) : 0.f;
  };
  float ls[kLseRounds];
#pragma unroll
  for (int k = 0; k < kLseRounds; ++k)
    ls[k] = lane + 32 * k < splits ? __ldcg(ws_lse + size_t(lane + 32 * k) * rows + g) : -INFINITY;
  load_batch(0);
  float L_max = -INFINITY;  // line 1
#pragma unroll
  for (int k = 0; k < kLseRounds; ++k) L_max = fmaxf(L_max, ls[k]);
  L_max = warp_max(L_max);
  float acc[kCols] = {}, W = 0.f;
  if (L_max != -INFINITY)
#pragma unroll
    for (int k = 0; k < kLseRounds; ++k) {  // lines 2-3
      if (32 * k >= splits) break;
      const float w_lane = ls[k] == -INFINITY ? 0.f : expf(ls[k] - L_max);  // split 32k + lane's weight
#pragma unroll
      for (int i0 = 0; i0 < 32; i0 += kMergeBatch) {
        const int s0 = 32 * k + i0;
        if (s0 >= splits) break;
        if (s0 > 0) load_batch(s0);
#pragma unroll
        for (int i = 0; i < kMergeBatch; ++i) {
          const float w = __shfl_sync(0xffffffffu, w_lane, i0 + i);  // the same in every lane: no divergence
          if (w == 0.f) continue;  // an empty split, or past the last
          W += w;
#pragma unroll
          for (int c = 0; c < kCols; ++c) acc[c] = fmaf(w, x[i][c], acc[c]);
        }
      }
    }
#pragma unroll
  for (int c = 0; c < kCols; ++c) o[g * D + lane * kCols + c] = T(W > 0.f ? acc[c] / W : 0.f);  // line 4
  if (lane == 0) lse[g] = W > 0.f ? L_max + logf(W) : -INFINITY;
}

// Listing 2 as a kernel of its own (merge.cu), one warp per query row, launched after the split kernel on the same
// stream: O and LSE of `rows` query rows from the `splits` partials in ws_o, ws_lse.
template <class T, int D>
void merge_partials(int rows, int splits, const float* ws_o, const float* ws_lse, T* o, float* lse);

// The fused merge's counters, at least n of them on the current device (flash_decoding.cu): zeroed once when
// allocated and left at zero by every launch (the last block of a row chunk resets its own), so no memset runs per
// decode step. One stream per device at a time: two fused launches in flight on different streams would share them.
int* merge_counters(size_t n);

}  // namespace fdec

// Listing 2 as a kernel of its own (the steps whose last split block does not merge: v02, v03, v04, v08, v09).
// merge.cuh has merge_row, which the fused merge of v05, v06, v07 runs too.
#include "merge.cuh"

#include "ready.cuh"

namespace fdec {
namespace {

constexpr int kMergeRows = kWarps;  // one warp per query row

template <class T, int D>
__global__ void __launch_bounds__(kThreads) merge_kernel(int rows, int splits, const float* __restrict__ ws_o,
                                                         const float* __restrict__ ws_lse, T* __restrict__ o,
                                                         float* __restrict__ lse) {
  const int g = blockIdx.x * kMergeRows + threadIdx.x / 32;
  if (g >= rows) return;
  merge_row<T, D>(g, rows, splits, ws_o, ws_lse, o, lse);
}

}  // namespace

template <class T, int D>
void merge_partials(int rows, int splits, const float* ws_o, const float* ws_lse, T* o, float* lse) {
  launch_kernel(merge_kernel<T, D>, dim3((rows + kMergeRows - 1) / kMergeRows), 0, rows, splits, ws_o, ws_lse, o, lse);
}
template void merge_partials<__half, 64>(int, int, const float*, const float*, __half*, float*);
template void merge_partials<__half, 128>(int, int, const float*, const float*, __half*, float*);
template void merge_partials<__nv_bfloat16, 64>(int, int, const float*, const float*, __nv_bfloat16*, float*);
template void merge_partials<__nv_bfloat16, 128>(int, int, const float*, const float*, __nv_bfloat16*, float*);

}  // namespace fdec

// Algorithm 2 as a kernel of its own (the steps whose last split block does not merge: v02, v03, v04, v08, v09), and
// the counters of the fused merge (v05, v06, v07). merge.cuh has merge_row, which both run.
#include "merge.cuh"

#include <map>

#include "cuda_check.cuh"
#include "device.cuh"
#include "device_buffer.cuh"

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
  merge_kernel<T, D><<<(rows + kMergeRows - 1) / kMergeRows, kThreads>>>(rows, splits, ws_o, ws_lse, o, lse);
  CHECK_LAUNCH();
}
template void merge_partials<__half, 64>(int, int, const float*, const float*, __half*, float*);
template void merge_partials<__half, 128>(int, int, const float*, const float*, __half*, float*);
template void merge_partials<__nv_bfloat16, 64>(int, int, const float*, const float*, __nv_bfloat16*, float*);
template void merge_partials<__nv_bfloat16, 128>(int, int, const float*, const float*, __nv_bfloat16*, float*);

int* merge_counters(size_t n) {
  static std::map<int, fa::DeviceBuffer<int>> per_device;  // each device's own, in its own memory
  fa::DeviceBuffer<int>& counters = per_device[fa::current_device()];
  if (counters.size() < n) {
    counters = fa::DeviceBuffer<int>(n);
    counters.zero();
  }
  return counters.get();
}

}  // namespace fdec

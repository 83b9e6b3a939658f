// The wgmma half of the tensor-core peak benchmark (tc_peak.cu), sm_90a only: one warpgroup per block, 2 blocks per
// SM; every round issues 4 m64n128k16 products that accumulate into the same registers (as the k-loop of a GEMM
// does) from one K-major tile in shared memory, committed as a group, with at most one group left running.
#include "cuda_check.cuh"
#include "tc_peak.cuh"
#include "wgmma.cuh"

namespace wsq::peak {
namespace {

using namespace sm90;
constexpr int kSteps = 4;  // products per commit group
constexpr double kFlopsPerWgmma = 2.0 * 64 * 128 * 16;
constexpr uint32_t kTileBytes = 128 * kRowBytes;  // 128 rows of 64 columns: B (N = 128); A uses its first 64 rows

template <class T>
__global__ void __launch_bounds__(128, 1) wgmma_kernel(int reps, float* sink) {
  __shared__ __align__(1024) uint16_t tile[kTileBytes / 2];
  for (uint32_t i = threadIdx.x; i < kTileBytes / 2; i += 128) tile[i] = (i & 1) ? 0x3c00 : 0xbc00;  // +1, -1
  __syncthreads();
  float d[64] = {};
  const uint64_t desc = k_major_desc(smem_addr(tile));
  for (int r = 0; r < reps; ++r) {
    wgmma_fence();
    #pragma unroll
    for (int s = 0; s < kSteps; ++s) wgmma_ss_n128<T>(d, desc, desc, 1);
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  fence_operands(d);
  float s = 0.f;
  #pragma unroll
  for (int x = 0; x < 64; ++x) s += d[x];
  if (s == 12345.f) sink[0] = s;  // keeps the products alive
}

}  // namespace

double wgmma(Type t, int blocks, int reps, float* sink) {
  if (t == Type::fp16) wgmma_kernel<__half><<<blocks, 128>>>(reps, sink);
  else wgmma_kernel<__nv_bfloat16><<<blocks, 128>>>(reps, sink);
  CHECK_LAUNCH();
  return kFlopsPerWgmma * kSteps * reps * double(blocks);
}

}  // namespace wsq::peak

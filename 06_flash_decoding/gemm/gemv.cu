// gemv: Y[M, N] = X[M, K] W^T on CUDA cores, for the few rows of a decode step (README.md §2). The one idea: W is
// read exactly once, in 16-byte loads, and every weight loaded is used for all (up to 8) rows of X before it is
// dropped, so a step with M = 8 reads the same bytes as one with M = 1.
// Grid: ceil(N / 4) blocks of 128 threads = 4 warps; warp w of block b owns output column n = 4 b + w (one row of W).
// Lane l reads 16-byte pieces c = l, l + 32, ... of that row (8 weights each; coalesced: a warp reads 512 contiguous
// bytes per step), and the same pieces of the 8 rows of X (from L1/L2: X is a few KB shared by every warp). It keeps
// 8 fp32 sums, one per row of X, in registers; a warp's shuffle tree adds the 32 lanes' sums at the end.
// M > 8: the rows are taken in groups of 8, one pass over W's row each (the second pass mostly hits L1/L2).
// No shared memory: nothing is reused across warps except X, which the caches keep.
// K must be a multiple of 8 (gemm.cuh check_shape): a row is a whole number of 16-byte pieces.
#include "gemm.cuh"
#include "steps/ready.cuh"

namespace fdec::gemm::gemv {
namespace {

constexpr int kRows = kGroupRows;  // sums each thread keeps: one per row of X in the group
constexpr int kUnroll = 4;         // 16-byte loads of W in flight per lane before the first is used

// The 8 fp16 values of a 16-byte piece, widened to fp32.
__device__ __forceinline__ void widen8(const uint4& v, float f[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __half22float2(h[i]);
    f[2 * i] = p.x, f[2 * i + 1] = p.y;
  }
}

__global__ void __launch_bounds__(kThreads) gemv_kernel(Args a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * kWarps + warp;
  if (n >= a.n) return;  // the whole warp: the shuffles below run in full warps only
  const int pieces = a.k / 8;
  const uint4* w_row = reinterpret_cast<const uint4*>(a.w + size_t(n) * a.k);
  for (int m0 = 0; m0 < a.m; m0 += kRows) {
    const int rows = min(kRows, a.m - m0);
    const uint4* x_rows = reinterpret_cast<const uint4*>(a.x + size_t(m0) * a.k);
    float acc[kRows] = {};
#pragma unroll kUnroll
    for (int c = lane; c < pieces; c += 32) {
      float wf[8];
      widen8(w_row[c], wf);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= rows) break;
        float xf[8];
        widen8(x_rows[size_t(r) * pieces + c], xf);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r] += wf[j] * xf[j];
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float s = acc[r];
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
      if (lane == 0 && r < rows) a.y[size_t(m0 + r) * a.n + n] = __float2half_rn(s);
    }
  }
}

}  // namespace

void launch(const Args& a) {
  check_shape(a.m, a.n, a.k);
  launch_kernel(gemv_kernel, dim3((a.n + kWarps - 1) / kWarps), 0, a);
}

}  // namespace fdec::gemm::gemv

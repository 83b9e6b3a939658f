// flat: Y[M, N] = X[M, K] W^T on tensor cores for a flat GEMM, M <= 8 (README.md §4). The one idea (FlashDecoding++'s
// flat GEMM): swap the operands, Y^T = W X^T, so that the tiny M is the n = 8 side of mma.m16n8k16 and the large N
// the m = 16 side: 16 rows of W (16 outputs n) are the A operand, the 8 rows of X (padded to 8 with zeros) the B
// operand. Padded to 8, 0-7 of every 8 products are wasted at M = 1..8; padded to a usual 64-row tile, 56-63 of 64.
// Grid: (ceil(N / 64), splits, ceil(M / 8)); 128 threads = 4 warps; warp w computes the 16 x 8 tile of Y^T for
// outputs n0 + 16 w .. + 15 and the block's 8 rows of X (one C fragment: 4 fp32 per lane). M > 8: blockIdx.z is the
// group of 8 rows (the groups re-read W's tile, mostly from L2).
// Pipeline: K is cut into tiles of 128; a stage holds the block's W tile [64][128] and X tile [8][128] (rows padded by
// 16 bytes: the 8 rows an ldmatrix phase reads fall in 8 different bank groups), copied by cp.async. Two stages
// (double buffering): the copy of tile t + 1 is in flight while the warps multiply tile t.
// Shared memory: 2 stages x (64 + 8) rows x 136 halves x 2 bytes = 39,168 bytes (under 48 KB: no opt-in).
// Split-K: when ceil(N / 64) blocks leave SMs idle, blockIdx.y takes a contiguous range of K tiles (flat_splits in
// gemm.cuh) and writes fp32 partial sums to workspace [splits, M, N]; a second small kernel (reduce_kernel) adds the
// splits in a fixed order, so the result is deterministic (no atomics), and rounds to fp16.
// K must be a multiple of 8 (gemm.cuh check_shape); the last K tile, rows n >= N and rows m >= M are zero-filled.
#include <stdexcept>

#include "frag.hpp"
#include "gemm.cuh"
#include "ptx.cuh"
#include "steps/ready.cuh"

namespace fdec::gemm::flat {
namespace {

namespace frag = fa::frag;
constexpr int kTileN = kFlatTileN;                      // outputs n per block: 16 per warp
constexpr int kTileK = kFlatTileK;                      // k per stage
constexpr int kStride = kTileK + 8;                     // halves per shared row: 16 bytes of padding
constexpr int kPieces = kTileK / 8;                     // 16-byte pieces per row of a tile
constexpr int kStageRows = kTileN + kGroupRows;         // W's 64 rows, then X's 8
constexpr int kStageHalves = kStageRows * kStride;
constexpr int kStages = 2;
constexpr int kSmemBytes = kStages * kStageHalves * 2;  // 39,168
static_assert(kTileN == 16 * kWarps, "each warp owns 16 outputs: the m = 16 side of one mma");
static_assert(kTileK % 16 == 0, "a stage is a whole number of mma k-steps");
static_assert(kSmemBytes <= 48 * 1024, "no shared-memory opt-in needed");

// Copies K tile [k0, k0 + 128) of W's rows n0 .. n0 + 63 and X's rows m0 .. m0 + 7 into `stage` (cp.async, one
// group: the caller commits). Pieces outside W, X or K are zero-filled, so they add nothing to the products.
__device__ __forceinline__ void copy_tile(const Args& a, int n0, int m0, int k0, __half* stage) {
  for (int i = threadIdx.x; i < kStageRows * kPieces; i += kThreads) {
    const int r = i / kPieces, c = i % kPieces, k = k0 + 8 * c;
    const bool of_w = r < kTileN;
    const int row = of_w ? n0 + r : m0 + r - kTileN;
    const __half* base = of_w ? a.w : a.x;
    const bool valid = k < a.k && row < (of_w ? a.n : a.m);
    fa::tc::cp_async_16(stage + r * kStride + 8 * c, valid ? base + size_t(row) * a.k + k : base, valid);
  }
}

__global__ void __launch_bounds__(kThreads) flat_kernel(Args a) {
  extern __shared__ float4 smem4[];
  __half* smem = reinterpret_cast<__half*>(smem4);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = frag::group(lane), t = frag::thread_in_group(lane);
  const int n0 = blockIdx.x * kTileN, split = blockIdx.y, m0 = blockIdx.z * kGroupRows;
  const int k_tiles = (a.k + kTileK - 1) / kTileK;
  const int kt_begin = split * k_tiles / a.splits, kt_end = (split + 1) * k_tiles / a.splits;

  float acc[4] = {};  // C fragment of Y^T: rows (n) g and g + 8 of the warp's 16, columns (m) 2t and 2t + 1
  copy_tile(a, n0, m0, kt_begin * kTileK, smem);
  fa::tc::cp_async_commit();
  for (int kt = kt_begin; kt < kt_end; ++kt) {
    const int stage = (kt - kt_begin) % kStages;
    if (kt + 1 < kt_end) copy_tile(a, n0, m0, (kt + 1) * kTileK, smem + (stage ^ 1) * kStageHalves);
    fa::tc::cp_async_commit();    // a group per tile, empty after the last: wait<1> = "all but the next tile"
    fa::tc::cp_async_wait<1>();   // this thread's copies of tile kt have landed ...
    __syncthreads();              // ... and everyone else's
    const __half* Ws = smem + stage * kStageHalves + warp * 16 * kStride;  // A: the warp's 16 rows of W
    const __half* Xs = smem + stage * kStageHalves + kTileN * kStride;     // B: the 8 rows of X, stored [n][k]
#pragma unroll
    for (int ks = 0; ks < kTileK / 16; ++ks) {
      uint32_t af[4], bf[2];
      fa::tc::ldmatrix_x4(af, Ws + frag::a_tile_row(lane) * kStride + 16 * ks + frag::a_tile_col(lane));
      // B's b0, b1 are (k 2t, 2t + 1; n g): two neighbouring halves of row g of X; b2, b3 the same 8 columns on
      const __half* x_row = Xs + g * kStride + 16 * ks + 2 * t;
      bf[0] = fa::tc::lds32(x_row), bf[1] = fa::tc::lds32(x_row + 8);
      fa::tc::mma_16816<__half>(acc, af, bf);
    }
    __syncthreads();  // every warp is done with this stage before the next iteration's copy refills it
  }

#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const frag::RowCol rc = frag::c_elem(lane, e);
    const int n = n0 + warp * 16 + rc.row, m = m0 + rc.col;
    if (n >= a.n || m >= a.m) continue;
    if (a.splits == 1) a.y[size_t(m) * a.n + n] = __float2half_rn(acc[e]);
    else a.workspace[(size_t(split) * a.m + m) * a.n + n] = acc[e];
  }
}

// Y = the sum of the splits' partials, in split order (deterministic), one element per thread.
__global__ void __launch_bounds__(kThreads) reduce_kernel(Args a) {
  const size_t i = size_t(blockIdx.x) * kThreads + threadIdx.x, elems = size_t(a.m) * a.n;
  if (i >= elems) return;
  float s = 0.f;
  for (int split = 0; split < a.splits; ++split) s += a.workspace[split * elems + i];
  a.y[i] = __float2half_rn(s);
}

}  // namespace

void launch(const Args& a) {
  check_shape(a.m, a.n, a.k);
  const int k_tiles = (a.k + kTileK - 1) / kTileK;
  if (a.splits < 1 || a.splits > kMaxSplits || a.splits > k_tiles || (a.splits > 1 && !a.workspace))
    throw std::invalid_argument("flat GEMM: splits " + std::to_string(a.splits) + " must be in 1 .. min(" +
                                std::to_string(kMaxSplits) + ", K tiles " + std::to_string(k_tiles) +
                                "), with a workspace when above 1");
  const dim3 grid((a.n + kTileN - 1) / kTileN, a.splits, (a.m + kGroupRows - 1) / kGroupRows);
  launch_kernel(ready<flat_kernel, kSmemBytes>(), grid, kSmemBytes, a);
  if (a.splits > 1) launch_kernel(reduce_kernel, dim3(unsigned((size_t(a.m) * a.n + kThreads - 1) / kThreads)), 0, a);
}

}  // namespace fdec::gemm::flat

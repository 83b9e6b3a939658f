// tile: Y[M, N] = X[M, K] W^T on tensor cores with a conventional block tile, for large M (README.md §2, §8): the GEMM
// a library runs for a prefill or a large batch, here what the dispatcher moves to once M stops being flat on a GPU
// without wgmma (on sm_90 the tile path runs flat_wgmma.cu, README §7).
// Block tile: 64 rows of Y (m) x 64 columns (n); 128 threads = 4 warps in a 2 x 2 grid, warp (wm, wn) = (w / 2, w % 2)
// computing the 32 x 32 sub-tile rows 32 wm .., columns 32 wn ..: 2 m-tiles x 4 n-tiles of mma.m16n8k16, 32 fp32
// accumulators per lane. A (16 x 16 of X, [m][k]) by ldmatrix.x4; B (16 x 8 of W^T, stored [n][k] as W is) by
// ldmatrix.x4 without .trans, two n-tiles per load (frag.hpp's nk_tile map).
// Pipeline: K tiles of 64; a stage holds X's tile [64][64] and W's [64][64], rows padded by 16 bytes (conflict-free
// ldmatrix), copied by cp.async; two stages, tile t + 1 in flight while tile t is multiplied.
// Shared memory: 2 stages x 128 rows x 72 halves x 2 bytes = 36,864 bytes (under 48 KB: no opt-in).
// At M <= 8 a 64-row tile is 56/64 zeros: the flat GEMM's case. Grid: (ceil(N / 64), ceil(M / 64)).
// K must be a multiple of 8 (gemm.cuh check_shape); rows and K pieces outside X, W are zero-filled.
#include "frag.hpp"
#include "gemm.cuh"
#include "ptx.cuh"
#include "steps/ready.cuh"

namespace fdec::gemm::tile {
namespace {

namespace frag = fa::frag;
constexpr int kTileM = 64, kTileN = 64, kTileK = 64;
constexpr int kWarpM = 32, kWarpN = 32;             // a warp's sub-tile
constexpr int kMTiles = kWarpM / 16, kNTiles = kWarpN / 8;
constexpr int kStride = kTileK + 8;                 // halves per shared row: 16 bytes of padding
constexpr int kPieces = kTileK / 8;                 // 16-byte pieces per row of a tile
constexpr int kStageRows = kTileM + kTileN;         // X's 64 rows, then W's 64
constexpr int kStageHalves = kStageRows * kStride;
constexpr int kStages = 2;
constexpr int kSmemBytes = kStages * kStageHalves * 2;  // 36,864
static_assert((kTileM / kWarpM) * (kTileN / kWarpN) == kWarps, "one sub-tile per warp");
static_assert(kNTiles % 2 == 0, "ldmatrix.x4 gives the B fragments of two n-tiles");
static_assert(kSmemBytes <= 48 * 1024, "no shared-memory opt-in needed");

// Copies K tile [k0, k0 + 64) of X's rows m0 .. m0 + 63 and W's rows n0 .. n0 + 63 into `stage` (one cp.async group:
// the caller commits); pieces outside X, W or K are zero-filled.
__device__ __forceinline__ void copy_tile(const Args& a, int m0, int n0, int k0, __half* stage) {
  for (int i = threadIdx.x; i < kStageRows * kPieces; i += kThreads) {
    const int r = i / kPieces, c = i % kPieces, k = k0 + 8 * c;
    const bool of_x = r < kTileM;
    const int row = of_x ? m0 + r : n0 + r - kTileM;
    const __half* base = of_x ? a.x : a.w;
    const bool valid = k < a.k && row < (of_x ? a.m : a.n);
    fa::tc::cp_async_16(stage + r * kStride + 8 * c, valid ? base + size_t(row) * a.k + k : base, valid);
  }
}

__global__ void __launch_bounds__(kThreads) tile_kernel(Args a) {
  extern __shared__ float4 smem4[];
  __half* smem = reinterpret_cast<__half*>(smem4);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / 2, wn = warp % 2;
  const int n0 = blockIdx.x * kTileN, m0 = blockIdx.y * kTileM;
  const int k_tiles = (a.k + kTileK - 1) / kTileK;

  float acc[kMTiles][kNTiles][4] = {};
  copy_tile(a, m0, n0, 0, smem);
  fa::tc::cp_async_commit();
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int stage = kt % kStages;
    if (kt + 1 < k_tiles) copy_tile(a, m0, n0, (kt + 1) * kTileK, smem + (stage ^ 1) * kStageHalves);
    fa::tc::cp_async_commit();   // a group per tile, empty after the last: wait<1> = "all but the next tile"
    fa::tc::cp_async_wait<1>();
    __syncthreads();
    const __half* Xs = smem + stage * kStageHalves + wm * kWarpM * kStride;
    const __half* Ws = smem + stage * kStageHalves + (kTileM + wn * kWarpN) * kStride;
#pragma unroll
    for (int ks = 0; ks < kTileK / 16; ++ks) {
      uint32_t af[kMTiles][4], bf[kNTiles][2];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
        fa::tc::ldmatrix_x4(af[mt],
                            Xs + (16 * mt + frag::a_tile_row(lane)) * kStride + 16 * ks + frag::a_tile_col(lane));
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t r[4];
        fa::tc::ldmatrix_x4(r, Ws + (16 * np + frag::nk_tile_row(lane)) * kStride + 16 * ks + frag::nk_tile_col(lane));
        bf[2 * np][0] = r[0], bf[2 * np][1] = r[1], bf[2 * np + 1][0] = r[2], bf[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) fa::tc::mma_16816<__half>(acc[mt][nt], af[mt], bf[nt]);
    }
    __syncthreads();  // every warp is done with this stage before the next iteration's copy refills it
  }

#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const frag::RowCol rc = frag::c_elem(lane, e);
        const int m = m0 + wm * kWarpM + 16 * mt + rc.row, n = n0 + wn * kWarpN + 8 * nt + rc.col;
        if (m < a.m && n < a.n) a.y[size_t(m) * a.n + n] = __float2half_rn(acc[mt][nt][e]);
      }
}

}  // namespace

void launch(const Args& a) {
  check_shape(a.m, a.n, a.k);
  const dim3 grid((a.n + kTileN - 1) / kTileN, (a.m + kTileM - 1) / kTileM);
  launch_kernel(ready<tile_kernel, kSmemBytes>(), grid, kSmemBytes, a);
}

}  // namespace fdec::gemm::tile

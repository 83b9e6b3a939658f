// flat: Y[M, N] = X[M, K] W^T on tensor cores for a flat GEMM, M <= 8 (README.md §3-§5). The one idea (FlashDecoding++'s
// flat GEMM): swap the operands, Y^T = W X^T, so that the tiny M is the n = 8 side of mma.m16n8k16 and the large N
// the m = 16 side: 16 rows of W (16 outputs n) are the A operand, the 8 rows of X (padded to 8 with zeros) the B
// operand. Padded to 8, 0-7 of every 8 products are wasted at M = 1..8; padded to a usual 64-row tile, 56-63 of 64.
// Grid: (ceil(N / 64), splits, ceil(M / 8)); 256 threads = 8 warps: warp w computes the 16 x 8 tile of Y^T for
// outputs n0 + 16 (w % 4) .. + 15 and the block's 8 rows of X (one C fragment: 4 fp32 per lane) over half of each K
// tile's k-steps (w / 4: the even or the odd ones); the two halves are added once, at the end, by warps 0-3. Eight
// warps, not four: each issues half the ldmatrix and mma of a tile, and twice the threads issue the copies (README §4).
// M > 8: blockIdx.z is the group of 8 rows (the groups re-read W's tile, mostly from L2).
// Pipeline: K is cut into tiles of 128; a stage holds the block's W tile [64][128] (16 KiB) and X tile [8][128]
// (rows padded by 16 bytes: the 8 rows an ldmatrix phase reads fall in 8 different bank groups), copied by cp.async
// with L2 asked for whole 256-byte blocks. Three stages: while the warps multiply tile t, tiles t + 1 and t + 2 are in
// flight, 32 KiB of W per block, and three blocks fit an H100's SM: 96 KiB per SM (README §4).
// Shared memory: 3 stages x (64 + 8) rows x 136 halves x 2 bytes = 58,752 bytes (opt-in above 48 KB, ready.cuh), and
// 2 KiB where the k-halves meet: three blocks per SM on an H100 (228 KB), two on an A100 (164 KB).
// Split-K: blockIdx.y takes a contiguous range of K tiles (flat_splits in gemm.cuh: as many pieces as keep every
// block resident at once, so the SMs share the stream evenly) and writes fp32 partial sums to workspace
// [splits, M, N]; the last block of an output tile to finish (an acquire-release count, as chapter 06's fused merge)
// adds the splits in split order, so the result is deterministic without a second launch.
// K must be a multiple of 8 (gemm.cuh check_shape); the last K tile, rows n >= N and rows m >= M are zero-filled.
#include <stdexcept>

#include "async_ptx.cuh"
#include "frag.hpp"
#include "gemm.cuh"
#include "merge.cuh"  // merge_counters: the arrival counts, left at zero by every launch
#include "ptx.cuh"
#include "steps/ready.cuh"

namespace fdec::gemm::flat {
namespace {

namespace frag = fa::frag;
constexpr int kTileN = kFlatTileN;               // outputs n per block: 16 per warp of a k-half
constexpr int kTileK = kFlatTileK;               // k per stage
constexpr int kStride = kFlatStride;             // halves per shared row: 16 bytes of padding
constexpr int kPieces = kTileK / 8;              // 16-byte pieces per row of a tile
constexpr int kStageRows = kTileN + kGroupRows;  // W's 64 rows, then X's 8
constexpr int kStageHalves = kStageRows * kStride;
constexpr int kStages = kFlatStages;             // tiles in flight while one is multiplied: kStages - 1
constexpr int kSmemBytes = kFlatSmemBytes;       // 58,752
constexpr int kWarpsN = kTileN / 16, kWarpsK = 2;  // 4 warps along n, 2 along the k-steps of a tile
constexpr int kFlatThreads = 32 * kWarpsN * kWarpsK;
static_assert(kSmemBytes == kStages * kStageHalves * 2, "gemm.cuh's budget is this layout's");
static_assert(kTileK % (16 * kWarpsK) == 0, "a stage is a whole number of mma k-steps for each k-half");
static_assert(2 * kSmemBytes <= 164 * 1024, "two blocks per SM, on an A100 too");

// Copies K tile [k0, k0 + 128) of W's rows n0 .. n0 + 63 and X's rows m0 .. m0 + 7 into `stage` (cp.async, one
// group: the caller commits). Pieces outside W, X or K are zero-filled, so they add nothing to the products. Every
// copy asks L2 for the 256-byte block around it (a row's K tile is 256 bytes: one request to HBM for it, not two of
// 128); no eviction policy: L2's default (KvPolicy is chapter 06's K/V stream's, here without evict-first).
__device__ __forceinline__ void copy_tile(const Args& a, int n0, int m0, int k0, __half* stage, KvPolicy pol) {
  for (int i = threadIdx.x; i < kStageRows * kPieces; i += kFlatThreads) {
    const int r = i / kPieces, c = i % kPieces, k = k0 + 8 * c;
    const bool of_w = r < kTileN;
    const int row = of_w ? n0 + r : m0 + r - kTileN;
    const __half* base = of_w ? a.w : a.x;
    const bool valid = k < a.k && row < (of_w ? a.n : a.m);
    cp_async16(stage + r * kStride + 8 * c, valid ? base + size_t(row) * a.k + k : base, valid, pol);
  }
}

__global__ void __launch_bounds__(kFlatThreads) flat_kernel(Args a, int* done) {
  extern __shared__ float4 smem4[];
  __half* smem = reinterpret_cast<__half*>(smem4);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wn = warp % kWarpsN, wk = warp / kWarpsN;  // the warp's 16 outputs, its k-half
  const int g = frag::group(lane), t = frag::thread_in_group(lane);
  const int n0 = blockIdx.x * kTileN, split = blockIdx.y, m0 = blockIdx.z * kGroupRows;
  const int k_tiles = (a.k + kTileK - 1) / kTileK;
  const int kt_begin = split * k_tiles / a.splits, tiles = (split + 1) * k_tiles / a.splits - kt_begin;
  const KvPolicy pol = kv_policy(false);

  float acc[4] = {};  // C fragment of Y^T: rows (n) g and g + 8 of the warp's 16, columns (m) 2t and 2t + 1; k-half wk
  // Prologue: tiles 0 .. kStages - 2 in flight, one commit group each (empty past the last tile, so that group i is
  // always tile i and the wait below needs no case for the end).
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) copy_tile(a, n0, m0, (kt_begin + s) * kTileK, smem + s * kStageHalves, pol);
    cp_async_commit();
  }
  for (int i = 0; i < tiles; ++i) {
    cp_async_wait<kStages - 2>();  // all but the newest kStages - 2 groups: this thread's copies of tile i landed
    __syncthreads();  // ... and everyone's; and every warp is done with tile i - 1, whose stage is refilled next
    const int next = i + kStages - 1;
    if (next < tiles) copy_tile(a, n0, m0, (kt_begin + next) * kTileK, smem + (next % kStages) * kStageHalves, pol);
    cp_async_commit();
    const __half* Ws = smem + (i % kStages) * kStageHalves + wn * 16 * kStride;  // A: the warp's 16 rows of W
    const __half* Xs = smem + (i % kStages) * kStageHalves + kTileN * kStride;   // B: the 8 rows of X, [n][k]
#pragma unroll
    for (int ks = wk; ks < kTileK / 16; ks += kWarpsK) {  // this warp's k-half: every other k-step
      uint32_t af[4], bf[2];
      fa::tc::ldmatrix_x4(af, Ws + frag::a_tile_row(lane) * kStride + 16 * ks + frag::a_tile_col(lane));
      // B's b0, b1 are (k 2t, 2t + 1; n g): two neighbouring halves of row g of X; b2, b3 the same 8 columns on
      const __half* x_row = Xs + g * kStride + 16 * ks + 2 * t;
      bf[0] = fa::tc::lds32(x_row), bf[1] = fa::tc::lds32(x_row + 8);
      fa::tc::mma_16816<__half>(acc, af, bf);
    }
  }

  // The two k-halves' sums added through shared memory of their own (not a stage: no wait for the other warps' last
  // reads of it): warps 4-7 (odd k-steps) hand theirs to warps 0-3, which finish the block, in one order, so the
  // same bits every run.
  static __shared__ float halves[kWarpsN][4][32];  // the odd k-steps' C fragments (static: one per block)
  if (wk == 1)
#pragma unroll
    for (int e = 0; e < 4; ++e) halves[wn][e][lane] = acc[e];
  __syncthreads();
  if (wk == 0)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] += halves[wn][e][lane];

  if (a.splits == 1) {
    if (wk == 1) return;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const frag::RowCol rc = frag::c_elem(lane, e);
      const int n = n0 + wn * 16 + rc.row, m = m0 + rc.col;
      if (n < a.n && m < a.m) a.y[size_t(m) * a.n + n] = __float2half_rn(acc[e]);
    }
    return;
  }
  // Split-K: this split's partials out, then the count of the output tile's splits that are done. The barrier puts
  // every thread's stores before thread 0's release; its acquire, and the second barrier, put the last block's loads
  // after every other split's stores.
  const size_t elems = size_t(a.m) * a.n;
  if (wk == 0)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const frag::RowCol rc = frag::c_elem(lane, e);
      const int n = n0 + wn * 16 + rc.row, m = m0 + rc.col;
      if (n < a.n && m < a.m) a.workspace[split * elems + size_t(m) * a.n + n] = acc[e];
    }
  static __shared__ int last;  // one for the block
  __syncthreads();
  if (threadIdx.x == 0) {
    int* count = done + blockIdx.z * gridDim.x + blockIdx.x;
    last = atomic_add_acq_rel(count, 1) == a.splits - 1;
    if (last) *count = 0;  // every split of this tile has counted: ready for the next launch
  }
  __syncthreads();
  if (!last || wk == 1) return;
#pragma unroll
  for (int e = 0; e < 4; ++e) {  // Y = the splits' partials added in split order, whichever block came last
    const frag::RowCol rc = frag::c_elem(lane, e);
    const int n = n0 + wn * 16 + rc.row, m = m0 + rc.col;
    if (n >= a.n || m >= a.m) continue;
    float s = 0.f;
    for (int p = 0; p < a.splits; ++p)  // L2 loads (ld.cg): L1 is not coherent with the other SMs' stores
      s += p == split ? acc[e] : __ldcg(a.workspace + p * elems + size_t(m) * a.n + n);
    a.y[size_t(m) * a.n + n] = __float2half_rn(s);
  }
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
  int* done = a.splits > 1 ? merge_counters(size_t(grid.x) * grid.z) : nullptr;
  launch_kernel<kFlatThreads>(ready<flat_kernel, kSmemBytes>(), grid, kSmemBytes, a, done);
}

}  // namespace fdec::gemm::flat

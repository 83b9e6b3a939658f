// flat: Y[M, N] = X[M, K] W^T on tensor cores for a flat GEMM, M up to 64 (README.md §3-§5). The one idea
// (FlashDecoding++'s flat GEMM): swap the operands, Y^T = W X^T, so that the tiny M is the n = 8 side of
// mma.m16n8k16 and the large N the m = 16 side: 16 rows of W (16 outputs n) are the A operand, a group of 8 rows of X
// (padded to 8) the B operand. Padded to 8, 0-7 of every 8 products are wasted at M = 1..8; padded to a usual 64-row
// tile, 56-63 of 64.
// Groups: a block takes G = 1, 2, 4 or 8 groups of 8 rows of X (flat_groups in gemm.cuh: the smallest power of two
// with 8 G >= min(M, 64)) and feeds every W fragment to G mma, one per group, each with its own X fragment and its
// own sums. The W fragment is the expensive operand (HBM, read by this warp alone); X's rows are few, read by every
// block, and mostly hit L1. So at M <= 64 W is read once; M > 64: blockIdx.z takes slabs of 64 rows, and each slab
// re-reads W (mostly from L2).
// Grid: (ceil(N / 64), splits, ceil(M / 8 G)); 128 threads = 4 warps; warp w computes the 16 x 8 G tile of Y^T for
// outputs n0 + 16 w .. + 15 and the block's 8 G rows of X (G C fragments: 4 G fp32 per lane).
// W through registers, not shared memory (README §4): no weight is used by two warps, so nothing needs sharing. Per K
// tile of 128, lane (g, t) loads 16 bytes of W's rows g and g + 8 and of X's row g of each group from each of the
// tile's four chunks of 32 k (k 32 c + 8 t .. + 7). G = 1: 12 loads of 16 bytes in flight before the first mma, 4 KiB
// of W a warp; 72 registers a thread, so registers allow 7 blocks an SM (flat::blocks_per_sm asks the GPU). More
// groups hold more registers: kRound below. No shared memory and no barrier in the loop. The 8 halves of a piece feed
// both k-steps of the chunk: k 32 c + 8 t + 4 s + {0, 1} play the parts of k 2t, 2t + 1 of k-step s, and + {2, 3}
// those of 2t + 8, 2t + 9 (frag.hpp's A and B maps), for W and X alike, so every product pairs the same weight with
// the same x as the fragment maps would; only the order of the fp32 sums changes.
// Split-K: blockIdx.y takes a contiguous range of K tiles (flat_splits in gemm.cuh: 1, 2 or 4 pieces, whichever
// spreads the blocks over the SMs best) and writes fp32 partial sums to workspace [splits, M, N]; the last block of
// an output tile to finish (an acquire-release count, as chapter 06's fused merge) adds the splits in split order, so
// the result is deterministic without a second launch.
// K must be a multiple of 8 (gemm.cuh check_shape): a 16-byte piece lies wholly inside K or wholly past it, and
// pieces past K load zeros. Rows n >= N load row N - 1 and rows m >= M row M - 1 (their products are not stored).
#include <stdexcept>

#include "async_ptx.cuh"  // atomic_add_acq_rel
#include "frag.hpp"
#include "gemm.cuh"
#include "merge.cuh"  // merge_counters: the arrival counts, left at zero by every launch
#include "ptx.cuh"
#include "steps/ready.cuh"

namespace fdec::gemm::flat {
namespace {

namespace frag = fa::frag;
constexpr int kTileN = kFlatTileN;           // outputs n per block: 16 per warp
constexpr int kTileK = kFlatTileK;           // k per round of loads
constexpr int kChunk = 32;                   // k per chunk: 8 halves for each of a quad's 4 lanes
constexpr int kChunks = kTileK / kChunk;     // chunks per K tile: 16-byte loads of a row in flight per lane
static_assert(kTileN == 16 * kWarps, "each warp owns 16 outputs: the m = 16 side of one mma");
static_assert(kTileK % kChunk == 0, "a K tile is a whole number of chunks");

// 16 bytes of W: read once by one lane, so not kept in L1; L2 asked for the whole 256-byte block around them (the
// quad's four lanes read 64 bytes of a row per chunk, the K tile's four chunks 256).
__device__ __forceinline__ uint4 load_w(const __half* p) {
#ifdef __CUDA_ARCH__
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
#else
  return *reinterpret_cast<const uint4*>(p);  // the CPU emulation (../tests/emu/emu.hpp)
#endif
}
// 16 bytes of X: every block reads the same rows of X, so they stay in L1 and L2 (the default caching). Like load_w
// an asm volatile, so that the compiler keeps the tile's twelve loads ahead of its first mma (a plain load could sink
// to its use, and each mma would wait for its own load).
__device__ __forceinline__ uint4 load_x(const __half* p) {
#ifdef __CUDA_ARCH__
  uint4 r;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
#else
  return *reinterpret_cast<const uint4*>(p);
#endif
}

// Chunks whose loads are in flight at once (a round of loads), for G groups. Per chunk a lane holds 16 bytes of
// each of W's two rows and of X's row in each group (8 + 4 G registers); the sums take 4 G. G <= 2: the K tile's 4
// chunks, as at G = 1 (ptxas, CUDA 13, sm_90: 72 registers at G = 1, 7 blocks an SM; 88 at G = 2, 5 blocks).
// G >= 4: 2 chunks (96 at G = 4, 5 blocks; 134 at G = 8, 3 blocks). 4 chunks would take 128 at G = 4 (4 blocks) and
// 214 at G = 8 (2 blocks); capping G = 8 at 128 spills. A round of 2 chunks halves a warp's bytes of W in flight
// (2 KiB); the other warps of the SM keep theirs in flight meanwhile.
template <int G>
constexpr int kRound = G <= 2 ? kChunks : kChunks / 2;

// G = 1, 2, 4, 8 groups of 8 rows of X per block (flat_groups in gemm.cuh), all multiplied by the same W fragments.
template <int G>
__global__ void __launch_bounds__(kThreads) flat_kernel(Args a, int* done) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = frag::group(lane), t = frag::thread_in_group(lane);
  const int n0 = blockIdx.x * kTileN, split = blockIdx.y, m0 = blockIdx.z * G * kGroupRows;
  const int k_tiles = (a.k + kTileK - 1) / kTileK;
  const int kt_begin = split * k_tiles / a.splits, kt_end = (split + 1) * k_tiles / a.splits;
  // This lane's rows: W's g and g + 8 of the warp's 16 (A's rows), X's g of each group j (B's column n = g).
  const int w_row0 = min(n0 + warp * 16 + g, a.n - 1), w_row1 = min(n0 + warp * 16 + g + 8, a.n - 1);
  const __half* w0 = a.w + size_t(w_row0) * a.k + 8 * t;
  const __half* w1 = a.w + size_t(w_row1) * a.k + 8 * t;
  const __half* x[G];
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const int x_row = m0 + j * kGroupRows + min(g, a.m - m0 - j * kGroupRows - 1);  // rows past M: row M - 1
    x[j] = a.x + size_t(x_row) * a.k + 8 * t;
  }

  // C fragments of Y^T, one per group j: rows (n) g and g + 8 of the warp's 16, columns (m) 8 j + 2t and 8 j + 2t + 1
  float acc[G][4] = {};
  for (int kt = kt_begin; kt < kt_end; ++kt) {
#pragma unroll
    for (int c0 = 0; c0 < kChunks; c0 += kRound<G>) {
      uint4 wa[kRound<G>], wb[kRound<G>], xb[kRound<G>][G];
#pragma unroll
      for (int c = 0; c < kRound<G>; ++c) {  // every load of the round issued before the first is used
        const int k = kt * kTileK + (c0 + c) * kChunk;  // + 8 t: this lane's piece
        if (k + 8 * t < a.k) {
          wa[c] = load_w(w0 + k), wb[c] = load_w(w1 + k);
#pragma unroll
          for (int j = 0; j < G; ++j) xb[c][j] = load_x(x[j] + k);
        } else {
          wa[c] = wb[c] = make_uint4(0, 0, 0, 0);
#pragma unroll
          for (int j = 0; j < G; ++j) xb[c][j] = make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int c = 0; c < kRound<G>; ++c) {
        // k-step 0 of the chunk: halves 0-1 (a0, b0) and 2-3 (a2, b1) of each lane's piece; k-step 1: halves 4-7.
        // One W fragment, loaded once, feeds the G groups' mma.
        const uint32_t a_s0[4] = {wa[c].x, wb[c].x, wa[c].y, wb[c].y};
        const uint32_t a_s1[4] = {wa[c].z, wb[c].z, wa[c].w, wb[c].w};
#pragma unroll
        for (int j = 0; j < G; ++j) {
          const uint32_t b_s0[2] = {xb[c][j].x, xb[c][j].y}, b_s1[2] = {xb[c][j].z, xb[c][j].w};
          fa::tc::mma_16816<__half>(acc[j], a_s0, b_s0);
          fa::tc::mma_16816<__half>(acc[j], a_s1, b_s1);
        }
      }
    }
  }

  if (a.splits == 1) {
#pragma unroll
    for (int j = 0; j < G; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const frag::RowCol rc = frag::c_elem(lane, e);
        const int n = n0 + warp * 16 + rc.row, m = m0 + j * kGroupRows + rc.col;
        if (n < a.n && m < a.m) a.y[size_t(m) * a.n + n] = __float2half_rn(acc[j][e]);
      }
    return;
  }
  // Split-K: this split's partials out, then the count of the output tile's splits that are done. The barrier puts
  // every thread's stores before thread 0's release; its acquire, and the second barrier, put the last block's loads
  // after every other split's stores.
  const size_t elems = size_t(a.m) * a.n;
#pragma unroll
  for (int j = 0; j < G; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const frag::RowCol rc = frag::c_elem(lane, e);
      const int n = n0 + warp * 16 + rc.row, m = m0 + j * kGroupRows + rc.col;
      if (n < a.n && m < a.m) a.workspace[split * elems + size_t(m) * a.n + n] = acc[j][e];
    }
  static __shared__ int last;  // one for the block
  __syncthreads();
  if (threadIdx.x == 0) {
    int* count = done + blockIdx.z * gridDim.x + blockIdx.x;
    last = atomic_add_acq_rel(count, 1) == a.splits - 1;
    if (last) *count = 0;  // every split of this tile has counted: ready for the next launch
  }
  __syncthreads();
  if (!last) return;
#pragma unroll
  for (int j = 0; j < G; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // Y = the splits' partials added in split order, whichever block came last
      const frag::RowCol rc = frag::c_elem(lane, e);
      const int n = n0 + warp * 16 + rc.row, m = m0 + j * kGroupRows + rc.col;
      if (n >= a.n || m >= a.m) continue;
      float s = 0.f;
      for (int p = 0; p < a.splits; ++p)  // L2 loads (ld.cg): L1 is not coherent with the other SMs' stores
        s += p == split ? acc[j][e] : __ldcg(a.workspace + p * elems + size_t(m) * a.n + n);
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
  // blockIdx.z: slabs of G groups (one slab for M <= 64)
  const int groups = flat_groups(a.m), slab_rows = groups * kGroupRows;
  const dim3 grid((a.n + kTileN - 1) / kTileN, a.splits, (a.m + slab_rows - 1) / slab_rows);
  int* done = a.splits > 1 ? merge_counters(size_t(grid.x) * grid.z) : nullptr;
  switch (groups) {
    case 1: return launch_kernel(flat_kernel<1>, grid, 0, a, done);
    case 2: return launch_kernel(flat_kernel<2>, grid, 0, a, done);
    case 4: return launch_kernel(flat_kernel<4>, grid, 0, a, done);
    default: return launch_kernel(flat_kernel<8>, grid, 0, a, done);
  }
}

int blocks_per_sm(int m) {
  switch (flat_groups(m)) {
    case 1: return occupancy<flat_kernel<1>, 0>();
    case 2: return occupancy<flat_kernel<2>, 0>();
    case 4: return occupancy<flat_kernel<4>, 0>();
    default: return occupancy<flat_kernel<8>, 0>();
  }
}

}  // namespace fdec::gemm::flat

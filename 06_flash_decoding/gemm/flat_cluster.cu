// flat_cluster: the flat GEMM of flat_gemm.cu (Y[M, N] = X[M, K] W^T, M up to 64 in one pass, README.md §3-§5: the
// operands swapped, Y^T = W X^T, so that the tiny M is the n = 8 side of mma.m16n8k16: FlashDecoding++'s flat GEMM,
// Hong et al., MLSys 2024), with one change, this folder's own: the split-K sum goes through distributed shared
// memory instead of a global workspace (README §6). sm_90 only.
// Grid: (ceil(N / 64), splits, ceil(M / 8 G)); 128 threads = 4 warps; warp w computes the 16 x 8 G tile of Y^T for
// outputs n0 + 16 w .. + 15 and the block's G groups of 8 rows of X (G C fragments: 4 G fp32 per lane); lane (g, t)
// loads 16 bytes of W's rows g and g + 8 and of X's row g of each group from each chunk of 32 k, straight into
// registers (flat_gemm.cu's header has the permutation of k that makes the loads 16 bytes wide, and the groups).
// Split-K: the `splits` blocks of one output tile (blockIdx.y = 0 .. splits - 1, each a contiguous range of K tiles)
// are launched as one thread block cluster of (1, splits, 1), which the GPU places on SMs of one GPC, all resident
// together. The sum of their partials:
//   1. each block stores its C fragments (4 warps x 32 lanes x 4 G fp32) as the tile [8 G m][64 n] in its own shared
//      memory: 2 KiB a group, the kernel's only shared memory;
//   2. cluster barrier (arrive.release, wait.acquire): every split's partial tile is stored and visible;
//   3. the block of rank r adds its 1/splits of the tile's entries (the rows m < M of its groups; one entry per
//      thread at splits = 4 and M = 8), reading each split's tile through the cluster's shared window (mapa,
//      ld.shared::cluster) in split order 0 .. splits - 1, so the result is deterministic and has the same bits as
//      flat_gemm.cu's sum, and writes Y in fp16, consecutive threads consecutive n;
//   4. cluster barrier again before the block exits: its shared memory must outlive the peers' reads of it.
// Why a cluster: flat_gemm.cu's sum is a chain of latencies after all the work (partials stored to L2, an atomic
// round trip, a barrier, the last block's loads from L2, its stores). Here the cluster barrier is a hardware barrier
// among the cluster's SMs and the partials go SM to SM: no workspace, no counters, no L2 round trip on the way.
// splits = 1: no cluster, Y stored from the registers as flat_gemm.cu does. A cluster has at most 8 blocks (the
// portable size), so splits <= 8; flat_cluster::slots gives flat_splits the blocks resident at once in clusters.
// K must be a multiple of 8 (gemm.cuh check_shape): a 16-byte piece lies wholly inside K or wholly past it, and
// pieces past K load zeros. Rows n >= N load row N - 1 and rows m >= M row M - 1 (their products are not stored).
#include <stdexcept>

#include "cluster_ptx.cuh"  // cluster_rank, cluster_arrive, cluster_wait, cluster_map, cluster_load
#include "frag.hpp"
#include "gemm.cuh"
#include "ptx.cuh"
#include "steps/ready.cuh"

namespace fdec::gemm::flat_cluster {
namespace {

namespace frag = fa::frag;
constexpr int kTileN = kFlatTileN;           // outputs n per block: 16 per warp
constexpr int kTileK = kFlatTileK;           // k per round of loads
constexpr int kChunk = 32;                   // k per chunk: 8 halves for each of a quad's 4 lanes
constexpr int kChunks = kTileK / kChunk;     // chunks per K tile: 16-byte loads of a row in flight per lane
static_assert(kTileN == 16 * kWarps, "each warp owns 16 outputs: the m = 16 side of one mma");
static_assert(kTileK % kChunk == 0, "a K tile is a whole number of chunks");
constexpr int kMaxClusterSplits = 8;  // the portable cluster size
// A split's partial tile [8 G m][64 n] of fp32 in shared memory: 2 KiB a group.
template <int G>
constexpr int kSharedBytes = G * kGroupRows * kTileN * int(sizeof(float));
// flat_gemm.cu's blocks an SM (ptxas, CUDA 13, sm_90: 7, 5, 5, 3 at G = 1, 2, 4, 8): left to itself, ptxas gives
// this kernel a few more registers (the sum's loads) and one block an SM fewer at G = 1; asked for flat's count, it
// fits without a spill.
template <int G>
constexpr int kMinBlocksPerSm = G == 1 ? 7 : G == 8 ? 3 : 5;

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
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm<G>) flat_cluster_kernel(Args a) {
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
  // Split-K through the cluster: this split's partial tile into its own shared memory, [m][n] so that step 3's
  // threads read and write consecutive n (the price: the 4 lanes of a quad store to one bank, 4 stores a thread).
  extern __shared__ float4 smem4[];
  float* part = reinterpret_cast<float*>(smem4);
#pragma unroll
  for (int j = 0; j < G; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const frag::RowCol rc = frag::c_elem(lane, e);
      part[(j * kGroupRows + rc.col) * kTileN + warp * 16 + rc.row] = acc[j][e];
    }
  cluster_arrive();
  cluster_wait();  // every split's tile stored: the peers' shared memory may be read
  // This block's share of the tile's entries: rows m < M only (at M = 1 the four blocks take 16 entries each).
  const int entries = min(G * kGroupRows, a.m - m0) * kTileN;
  const int rank = int(cluster_rank());  // = split: the cluster is the tile's blockIdx.y = 0 .. splits - 1
  const int begin = rank * entries / a.splits, end = (rank + 1) * entries / a.splits;
  for (int i = begin + int(threadIdx.x); i < end; i += kThreads) {
    const int m = m0 + i / kTileN, n = n0 + i % kTileN;
    float s = 0.f;
    for (int p = 0; p < a.splits; ++p) s += cluster_load(cluster_map(part + i, unsigned(p)));  // split order
    if (n < a.n) a.y[size_t(m) * a.n + n] = __float2half_rn(s);
  }
  cluster_arrive();
  cluster_wait();  // no block leaves (its shared memory with it) while a peer may still read it
}

}  // namespace

template <int G>
void launch_groups(const Args& a, dim3 grid) {
  if (a.splits == 1) launch_kernel(flat_cluster_kernel<G>, grid, 0, a);
  else launch_cluster_kernel(flat_cluster_kernel<G>, grid, a.splits, kSharedBytes<G>, a);
}
// The blocks resident at once in clusters of kFlatPieces (flat_splits' largest), 0 without clusters.
template <int G>
int slots_groups() {
  if (!cluster_launch_supported()) return 0;
  return cluster_occupancy<flat_cluster_kernel<G>, kSharedBytes<G>>(kFlatPieces) * kFlatPieces;
}

void launch(const Args& a) {
  check_shape(a.m, a.n, a.k);
  const int k_tiles = (a.k + kTileK - 1) / kTileK;
  if (a.splits < 1 || a.splits > kMaxClusterSplits || a.splits > k_tiles)
    throw std::invalid_argument("flat_cluster GEMM: splits " + std::to_string(a.splits) + " must be in 1 .. min(" +
                                std::to_string(kMaxClusterSplits) + ", K tiles " + std::to_string(k_tiles) + ")");
  require_cluster_launch("flat_cluster");
  // blockIdx.z: slabs of G groups (one slab for M <= 64)
  const int groups = flat_groups(a.m), slab_rows = groups * kGroupRows;
  const dim3 grid((a.n + kTileN - 1) / kTileN, a.splits, (a.m + slab_rows - 1) / slab_rows);
  switch (groups) {
    case 1: return launch_groups<1>(a, grid);
    case 2: return launch_groups<2>(a, grid);
    case 4: return launch_groups<4>(a, grid);
    default: return launch_groups<8>(a, grid);
  }
}

bool supported() { return cluster_launch_supported(); }

// flat_splits' slots for M rows (the kernel of M's groups).
int slots(int m, int) {
  switch (flat_groups(m)) {
    case 1: return slots_groups<1>();
    case 2: return slots_groups<2>();
    case 4: return slots_groups<4>();
    default: return slots_groups<8>();
  }
}

}  // namespace fdec::gemm::flat_cluster

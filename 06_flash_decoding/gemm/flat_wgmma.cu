// flat_wgmma: Y[M, N] = X[M, K] W^T on Hopper's warpgroup tensor cores (sm_90a), for the M that outgrow the flat
// kernel's registers: 17 to 256 rows (README.md §7). The flat GEMM's operand swap, Y^T = W X^T, kept: 64 rows of W
// (64 outputs n) are the A operand, the M rows of X (padded to Mp = 16, 32, 64, 128 or 256) the B operand, so that
// one wgmma.m64nMpk16 multiplies them all and each weight is read from HBM once. What changes is the machinery around
// the product (chapter 05's steps 9-10, hopper/): a producer copies tiles of W and X into a ring of shared-memory
// stages with TMA, the consumers' wgmma read both operands from there, and mbarriers pass each stage between them.
// The bytes in flight are the stages' (up to 200 KiB of W and X an SM), not registers, and the tensor cores read X
// from shared memory once per warpgroup, where the flat kernel's warps each load their own copy.
// Block: 384 threads, or 512 with tiles of 192. Consumer warpgroups 0 .. C - 1 (C = 2, or 3); producer warpgroup C
// (thread 128 C issues) fills the stages. A block owns TileN outputs: 128 or 192, warpgroup wg the outputs
// n0 + 64 wg .. + 63 with every k16 step of a stage; or 64 ("halves"), both warpgroups the same 64 outputs,
// warpgroup wg half of each stage's k16 steps, their two partial tiles added in the epilogue. As in chapter 05's
// step 10, with two consumers the producer gives its registers to them (setmaxnreg: 40 and 232 a thread), which at
// Mp = 256 hold 128 accumulators each. Three consumers keep the 128 registers a thread of 512 starts with (ptxas
// compiles the whole kernel into the launch bound's 128), enough for their 64 accumulators: tiles of 192 take slabs
// of at most 128 rows.
// A stage: Panels (1, 2 or 4: panels_of) 128-byte panels of k, 64 k each, of W's TileN rows and X's Mp rows, each
// panel as TMA writes it (128-byte swizzle).
// Accumulators: Y^T's 64 x Mp tile of a warpgroup, Mp / 2 fp32 a thread (128 at Mp = 256): register 4j + e of lane
// (g, t) of warp w holds n = 16 w + g + 8 (e / 2), m = 8 j + 2 t + e % 2.
// Shared memory: as many stages as fit 200 KiB, 4 to 8 (stages_of): e.g. 5 x 40 KiB at Mp = 16 with tiles of 64, 4 x
// 48 KiB at Mp = 256, 5 x 40 KiB at Mp = 128 with tiles of 192; + 2 mbarriers a stage + 1 KiB to align. One block
// an SM. After the loop the same space holds the block's fp32 tile (or the two partial tiles) for the epilogue, at
// most 132 KiB.
// The accumulators are not zeroed: each warpgroup's first wgmma overwrites them (scale-d = 0), because zeroing them
// with ordinary instructions makes ptxas serialise every wgmma of the loop (its warning C7515).
// Grid (shape_of): (ceil(N / TileN), splits, slabs). blockIdx.y takes a contiguous range of K tiles (split-K, 1 to 4
// pieces; the heuristic takes 1 or 2), summed as flat_cluster.cu does: the pieces of an output tile are one thread
// block cluster, each keeps its partial tile in its shared memory, and each adds 1 / pieces of the tile's rows from
// all of them, in piece order, through distributed shared memory. blockIdx.z is a slab of rows of X (256, or 128:
// each slab reads W again, mostly from L2 when the slabs run at the same time). Tiles of 192 outputs, where N leaves
// no room for twice its tiles of 128: slabs of 128 rows, 3/4 of a 128 x 256 block's tensor work on 4/3 the SMs.
// Rows past N or M and k past K arrive as zeros from TMA (the box is clipped to the tensor); they are not stored.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "cluster_ptx.cuh"  // the cluster barrier and distributed shared memory
#include "gemm.cuh"
#include "hopper/tma_host.cuh"
#include "hopper/wgmma.cuh"

namespace fdec::gemm::flat_wgmma {
namespace {

using namespace wsq::sm90;
constexpr int kTileN = 128;                          // outputs n per block: two warpgroups, each its own 64 ...
constexpr int kNarrowTileN = 64;                     // ... or both the same 64, each half of every stage's k ...
constexpr int kWideTileN = 192;                      // ... or three warpgroups, each its own 64 (slabs <= 128 rows)
constexpr int kMaxRows = 256;                        // rows of X per block at most: wgmma's largest N
constexpr int kSlabRows = 128;                       // the smaller slab; tiles of 64 and 192 take at most this
// Consumer warpgroups (wgmma's M = 64 outputs n each) and threads of a block with tiles of tile_n outputs.
constexpr int consumers_of(int tile_n) { return tile_n == kNarrowTileN ? 2 : tile_n / 64; }
constexpr int consumer_threads_of(int tile_n) { return 128 * consumers_of(tile_n); }
constexpr int threads_of(int tile_n) { return consumer_threads_of(tile_n) + 128; }  // + the producer warpgroup
// With two consumers, setmaxnreg's registers a thread: 128 x 40 + 256 x 232 = the 384 x 168 the block starts with.
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
constexpr int kStageBudget = 200 * 1024, kMaxStages = 8, kMinStages = 4;
constexpr int kMinPieceK = 4096;                     // split-K only into pieces of at least this many k
constexpr int kEpilogueBarrier = 1;                  // a named barrier of the consumers
constexpr int kMaxPieces = 4;                        // split-K pieces, one cluster: at most 4 blocks of 200 KiB

// Stages of `panels` 128-byte panels of k (64 k each) of TileN rows of W and Mp rows of X, as many as fit the budget.
constexpr int stages_of(int mp, int tile_n, int panels) {
  const int fit = kStageBudget / (panels * (tile_n + mp) * kRowBytes);
  return fit < kMaxStages ? fit : kMaxStages;
}
// Panels a stage: the most of 4, 2, 1 that leave at least kMinStages stages, and 1 where X is most of a stage
// (Mp > TileN). Larger stages read each row of W in runs of 256 or 512 bytes instead of 128 and pass fewer
// barriers; the exception is measured, not derived (../NOTEBOOK.md §14: 7% slower with 2 at Mp = 128, TileN = 64).
constexpr int panels_of(int mp, int tile_n) {
  if (mp > tile_n) return 1;
  return stages_of(mp, tile_n, 4) >= kMinStages ? 4 : stages_of(mp, tile_n, 2) >= kMinStages ? 2 : 1;
}

template <int Mp, int TileN, int Panels = panels_of(Mp, TileN)>
struct Layout {
  static constexpr int tile_k = Panels * kPanelCols, steps_k = tile_k / 16;  // k, and wgmma k16 steps, a stage
  static constexpr bool halves = TileN == kNarrowTileN;  // the warpgroups split each stage's k: two partial tiles
  static constexpr int tile_stride = TileN + 4;          // floats per row of the epilogue's tile in shared memory
  static constexpr size_t part_floats = size_t(Mp) * tile_stride;  // one warpgroup's partial tile (halves)
  static constexpr uint32_t w_panel = TileN * kRowBytes, x_panel = Mp * kRowBytes;
  static constexpr uint32_t w_bytes = Panels * w_panel, x_bytes = Panels * x_panel;
  static constexpr uint32_t stage_bytes = w_bytes + x_bytes;  // a multiple of 1024: every tile starts on an atom
  static constexpr int stages = stages_of(Mp, TileN, Panels);
  static constexpr size_t bytes = size_t(stages) * stage_bytes + 2 * stages * sizeof(uint64_t);
  static constexpr size_t alloc = bytes + kAtomBytes;  // slack to round the dynamic base up to 1024 bytes
  static_assert(part_floats * (halves ? 2 : 1) * 4 <= size_t(stages) * stage_bytes, "the epilogue's tile fits");
};

// Outputs n .. n + 3 of row m of Y, in fp16: one 8-byte store where N is a multiple of 4 (every piece then lies
// inside a row, aligned), else one by one; outputs past N are not stored.
__device__ __forceinline__ void store_y(const Args& a, int m, int n, float4 v) {
  const __half h[4] = {__float2half_rn(v.x), __float2half_rn(v.y), __float2half_rn(v.z), __float2half_rn(v.w)};
  __half* y = a.y + size_t(m) * a.n + n;
  if (a.n % 4 == 0 && n < a.n) *reinterpret_cast<uint2*>(y) = *reinterpret_cast<const uint2*>(h);
  else
    for (int q = 0; q < 4; ++q)
      if (n + q < a.n) y[q] = h[q];
}
template <int Mp, int TileN, int Panels>
__global__ void __launch_bounds__(threads_of(TileN), 1)
    flat_wgmma_kernel(const __grid_constant__ CUtensorMap tm_w, const __grid_constant__ CUtensorMap tm_x, Args a) {
  using L = Layout<Mp, TileN, Panels>;
  constexpr int kConsumers = consumers_of(TileN), kConsumerThreads = consumer_threads_of(TileN);
  unsigned char* smem = smem_1024();
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::stages * L::stage_bytes);  // [stages]: a stage's bytes landed
  uint64_t* empty = full + L::stages;  // [stages]: the consumers are done with a stage
  const int n0 = blockIdx.x * TileN, split = blockIdx.y, m0 = blockIdx.z * Mp;  // several slabs: Mp rows each
  const int k_tiles = (a.k + L::tile_k - 1) / L::tile_k;
  const int kt_begin = split * k_tiles / a.splits, kt_end = (split + 1) * k_tiles / a.splits;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < L::stages; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], kConsumerThreads);
    fence_barrier_init();
  }
  __syncthreads();  // the only block-wide barrier: afterwards producer and consumers meet only at mbarriers

  if (wg == kConsumers) {  // the producer warpgroup
    if constexpr (kConsumers == 2) setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == kConsumerThreads)
      for (int kt = kt_begin; kt < kt_end; ++kt) {
        const int i = kt - kt_begin, s = i % L::stages, round = i / L::stages;
        mbar_wait(&empty[s], (round & 1) ^ 1);  // round r reuses stage s after the consumers' release r - 1
        unsigned char* stage = smem + s * L::stage_bytes;
        mbar_arrive_expect_tx(&full[s], L::stage_bytes);
        for (int p = 0; p < Panels; ++p) {
          const int k0 = kt * L::tile_k + p * kPanelCols;
          tma_load_3d(stage + p * L::w_panel, &tm_w, &full[s], k0, n0, 0);
          tma_load_3d(stage + L::w_bytes + p * L::x_panel, &tm_x, &full[s], k0, m0, 0);
        }
      }
    if (a.splits > 1) {  // the cluster barriers count every thread of the cluster: the producers take part
      __syncwarp();
      cluster_arrive(), cluster_wait();
      cluster_arrive(), cluster_wait();
    }
    return;
  }

  if constexpr (kConsumers == 2) setmaxnreg_inc<kConsumerRegs>();
  const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float acc[Mp / 2];
  for (int kt = kt_begin; kt < kt_end; ++kt) {
    const int i = kt - kt_begin, s = i % L::stages;
    mbar_wait(&full[s], (i / L::stages) & 1);
    // This warpgroup's 64 rows of W and its k16 steps: rows 64 wg .. and every step of the stage, or (halves) the
    // block's 64 rows and its half of the steps, kSteps wg .. kSteps (wg + 1) - 1.
    const unsigned char* w_s = smem + s * L::stage_bytes + (L::halves ? 0 : wg * 64 * kRowBytes);
    const unsigned char* x_s = smem + s * L::stage_bytes + L::w_bytes;
    constexpr int kSteps = L::halves ? L::steps_k / kConsumers : L::steps_k;
    const int kk0 = L::halves ? wg * kSteps : 0;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
      wgmma_ss_f16<Mp>(acc, desc_k_major(w_s + k_major_step(kk0 + kk, TileN)),
                       desc_k_major(x_s + k_major_step(kk0 + kk, Mp)), i > 0 || kk > 0);
    wgmma_commit();
    wgmma_wait<1>();  // the previous stage's products are done (this one's may still run): release that stage
    fence_operands(acc);
    if (i > 0) mbar_arrive(&empty[(i - 1) % L::stages]);
  }
  wgmma_wait<0>();
  fence_operands(acc);

  // The epilogue goes through shared memory, so that Y is written in whole rows, 8 bytes a thread, instead of the
  // accumulators' scattered 2-byte elements (a warp's store would touch 4 rows of 16 bytes), and so that the pieces
  // of a split K can add each other's tiles. The tile (Mp rows m x TileN outputs n, fp32; rows padded to
  // tile_stride, so that the accumulators' stores fall into 32 different banks) takes the place of the stages once
  // both warpgroups' products are done. With halves, each warpgroup stores its own partial tile, and a row of the
  // block's tile is the sum of the two.
  float* tile = reinterpret_cast<float*>(smem);
  named_bar_sync(kEpilogueBarrier, kConsumerThreads);  // the other warpgroup's last wgmma no longer reads the stages
  float* part = tile + (L::halves ? wg * L::part_floats : 0);
  const int col = (L::halves ? 0 : 64 * wg) + 16 * warp + g;
#pragma unroll
  for (int j = 0; j < Mp / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) part[(8 * j + 2 * t + e % 2) * L::tile_stride + col + 8 * (e / 2)] = acc[4 * j + e];
  named_bar_sync(kEpilogueBarrier, kConsumerThreads);
  // Thread i takes outputs n0 + 4 (i % lanes) .. + 3 of rows i / lanes, + row_step, ... of the tile (lanes: the
  // threads of a row, TileN / 4).
  constexpr int kLanes = TileN / 4, kRowStep = kConsumerThreads / kLanes;
  const int rows = min(Mp, a.m - m0), c = 4 * (threadIdx.x % kLanes), n = n0 + c, r0 = threadIdx.x / kLanes;
  auto add = [](float4& s, float4 v) { s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w; };
  if (a.splits == 1) {
    for (int r = r0; r < rows; r += kRowStep) {
      float4 v = *reinterpret_cast<const float4*>(tile + r * L::tile_stride + c);
      if (L::halves) add(v, *reinterpret_cast<const float4*>(tile + L::part_floats + r * L::tile_stride + c));
      store_y(a, m0 + r, n, v);
    }
    return;
  }
  // Split-K through the cluster (flat_cluster.cu's sum): the pieces' tiles are stored; the block of rank p adds rows
  // p rows / splits .. of all of them, reading each peer's shared memory in piece order (the same sum, the same bits,
  // whichever block does it), and stores them to Y.
  cluster_arrive();
  cluster_wait();  // every piece's tile stored: the peers' shared memory may be read
  const int rank = int(cluster_rank());  // = split: the cluster is the tile's blockIdx.y = 0 .. splits - 1
  const int r_end = (rank + 1) * rows / a.splits;
  for (int r = rank * rows / a.splits + r0; r < r_end; r += kRowStep) {
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    const float* mine = tile + r * L::tile_stride + c;
    for (int p = 0; p < a.splits; ++p)
      for (int h = 0; h < (L::halves ? 2 : 1); ++h) {
        const uint32_t at = cluster_map(mine + h * L::part_floats, unsigned(p));
        add(sum, make_float4(cluster_load(at), cluster_load(at + 4), cluster_load(at + 8), cluster_load(at + 12)));
      }
    store_y(a, m0 + r, n, sum);
  }
  cluster_arrive();
  cluster_wait();  // no block leaves (its shared memory with it) while a peer may still read it
}

int tiles(int n, int tile_n) { return (n + tile_n - 1) / tile_n; }
// The grid's shape: outputs n a block (tile_n), rows of X a block (slab) and pieces of K (splits).
struct Shape {
  int tile_n = kTileN, slab = kMaxRows, splits = 1;
};
// One block an SM (its stages fill most of the shared memory), and a grid of tiles of 128 outputs x slabs of 256
// rows can leave most SMs idle (32 tiles at N = 4096). Starting from it, the blocks are doubled while they still fit
// the SMs, in this order: K in 2 pieces, where each keeps at least kMinPieceK (a cluster's sum costs about as much
// as streaming a shorter piece saves); slabs of 128 rows, above 128 rows (X is not read again, W mostly from L2);
// tiles of 64 outputs, with at most 128 rows a block (each block reads all of its slab of X: the last resort).
// Where slabs of 128 rows do not fit with tiles of 128 (above 128 rows, N > 8448 on 132 SMs), they may with tiles of
// 192 (three consumer warpgroups; up to N = 12672): 4/3 the blocks of slabs of 256, each with 3/4 of the tensor work.
// More pieces do not pay: a cluster of 4 blocks of 200 KiB needs 4 free SMs in one GPC, and on the H100 32 such
// clusters did not all fit at once (README §7, ../NOTEBOOK.md §14).
Shape shape_of(int m, int n, int k, int sms) {
  Shape s;
  long long blocks = (long long)tiles(n, kTileN) * ((m + kMaxRows - 1) / kMaxRows);
  if (k >= 2 * kMinPieceK && 2 * blocks <= sms) s.splits = 2, blocks *= 2;
  const long long slabs = (m + kSlabRows - 1) / kSlabRows * s.splits;  // of 128 rows, times the pieces
  if (m > kSlabRows && tiles(n, kTileN) * slabs <= sms) s.slab = kSlabRows, blocks = tiles(n, kTileN) * slabs;
  else if (m > kSlabRows && tiles(n, kWideTileN) * slabs <= sms)
    s.slab = kSlabRows, s.tile_n = kWideTileN, blocks = tiles(n, kWideTileN) * slabs;
  if (std::min(m, s.slab) <= kSlabRows && s.tile_n == kTileN && 2 * blocks <= sms) s.tile_n = kNarrowTileN;
  return s;
}
// A slab's rows padded to the next of 16, 32, 64, 128, 256: wgmma's N.
int padded_rows(int m) {
  int mp = 16;
  while (mp < kMaxRows && mp < m) mp *= 2;
  return mp;
}

template <int Mp, int TileN, int Panels>
void launch_tile(const Args& a, dim3 grid) {
  const int k_tiles = (a.k + Layout<Mp, TileN, Panels>::tile_k - 1) / Layout<Mp, TileN, Panels>::tile_k;
  if (a.splits < 1 || a.splits > kMaxPieces || a.splits > k_tiles)  // an empty piece would store nothing
    throw std::invalid_argument("flat_wgmma: splits " + std::to_string(a.splits) + " must be in 1 .. min(" +
                                std::to_string(kMaxPieces) + ", K tiles " + std::to_string(k_tiles) + ")");
  const auto* w = reinterpret_cast<const fa::half_t*>(a.w);
  const auto* x = reinterpret_cast<const fa::half_t*>(a.x);
  const CUtensorMap tm_w = tensor_map(w, a.k, a.n, 1, TileN);  // [N][K]: boxes of TileN rows x 64 k
  const CUtensorMap tm_x = tensor_map(x, a.k, a.m, 1, Mp);     // [M][K]: boxes of Mp rows x 64 k
  constexpr size_t kBytes = Layout<Mp, TileN, Panels>::alloc;
  const auto kernel = flat_wgmma_kernel<Mp, TileN, Panels>;
  constexpr int kThreads = threads_of(TileN);
  if (a.splits == 1) launch_sm90(kernel, grid, kThreads, kBytes, "flat_wgmma", tm_w, tm_x, a);
  else launch_sm90_cluster(kernel, grid, a.splits, kThreads, kBytes, "flat_wgmma", tm_w, tm_x, a);
}
template <int Mp>
void launch_rows(const Args& a, const Shape& s) {
  const dim3 grid(tiles(a.n, s.tile_n), a.splits, (a.m + s.slab - 1) / s.slab);
  if constexpr (Mp <= kSlabRows) {  // at Mp = 256 the two partial tiles' epilogue spills, and three warpgroups'
                                    // 128 accumulators do not fit a thread's 128 registers: shape_of asks neither
    if (s.tile_n == kNarrowTileN) return launch_tile<Mp, kNarrowTileN, panels_of(Mp, kNarrowTileN)>(a, grid);
    if (s.tile_n == kWideTileN) return launch_tile<Mp, kWideTileN, panels_of(Mp, kWideTileN)>(a, grid);
  }
  launch_tile<Mp, kTileN, panels_of(Mp, kTileN)>(a, grid);
}
// One launch as s says: tile_n outputs n (64, 128 or 192; 64 and 192 with slabs of at most 128 rows), slabs of
// `slab` rows a block.
void launch_as(const Args& a, const Shape& s) {
  const int rows = std::min(a.m, s.slab);
  if ((s.tile_n != kTileN && s.tile_n != kNarrowTileN && s.tile_n != kWideTileN) || s.slab < 1 ||
      s.slab > kMaxRows || (s.tile_n != kTileN && rows > kSlabRows))
    throw std::invalid_argument("flat_wgmma: tiles of " + std::to_string(s.tile_n) + " outputs with slabs of " +
                                std::to_string(s.slab) +
                                " rows (64, 128 or 192 outputs; 64 and 192 with at most 128 rows)");
  switch (padded_rows(rows)) {
    case 16: return launch_rows<16>(a, s);
    case 32: return launch_rows<32>(a, s);
    case 64: return launch_rows<64>(a, s);
    case 128: return launch_rows<128>(a, s);
    default: return launch_rows<256>(a, s);
  }
}

}  // namespace

#ifdef __CUDACC__
int sm_count() { return wsq::sm90::sm_count(); }  // one attribute query, not the whole device properties
bool supported() {  // sm_90a code runs on compute capability 9.0 alone
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, fa::current_device()));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, fa::current_device()));
  return major == 9 && minor == 0;
}
#else
int sm_count() { return 132; }     // the CPU emulation (tests/test_gemm_wgmma_emulated.cpp): an H100's
bool supported() { return true; }
#endif

void launch(const Args& a) {
  check_shape(a.m, a.n, a.k);
  if (!supported()) throw fa::NotOnThisGpu("flat_wgmma needs an sm_90 GPU (wgmma, TMA): this one is not");
  launch_as(a, shape_of(a.m, a.n, a.k, sm_count()));
}

int splits(int m, int n, int k, int sms) { return shape_of(m, n, k, sms).splits; }

}  // namespace fdec::gemm::flat_wgmma

// The host API of the decode step's linear layers (README.md): Y[M, N] = X[M, K] W^T, with X [M, K], W [N, K] (a
// linear layer's weight) and Y [M, N] fp16, row-major, accumulated in fp32. Four kernels, one file each, listed once
// in kernels() below, which decode_gemm, the tests and the tuner loop over:
//   gemv.cu          CUDA cores, W streamed once, each thread all (up to 8) rows of X
//   flat_gemm.cu     tensor cores with the operands swapped (Y^T = W X^T): M padded to 8, not 64; split-K
//   tile_gemm.cu     tensor cores, a conventional 64 x 64 block tile, for large M
//   flat_cluster.cu  flat_gemm.cu with its split-K summed in a thread block cluster, through distributed shared
//                    memory (sm_90)
// and, next to them, read_w.cu: the ceiling, a kernel that only reads W (no Y), timed as the kernels are.
// Plain C++ besides the pointers' type (CUDA's __half, which the CPU emulation has too), so the CPU tests include it.
#pragma once
#include <cuda_fp16.h>

#include <cstddef>
#include <string>
#include <vector>

#include "dataflow.hpp"  // Path
#include "problem.hpp"   // fa::UsageError

namespace fdec::gemm {

constexpr int kGroupRows = 8;  // rows of X in a group: the n = 8 side of mma.m16n8k16, the GEMV's registers
constexpr int kAlignK = 8;     // K must be a multiple of 8: a row of X or W is read in 16-byte pieces
constexpr int kMaxSplits = 16;  // the flat GEMM's split-K never cuts K into more pieces than this

// One launch's arguments (passed by value to the kernels). Device pointers on the GPU, host ones in the emulation.
struct Args {
  int m = 0, n = 0, k = 0;
  const __half* x = nullptr;  // [m, k]
  const __half* w = nullptr;  // [n, k]
  __half* y = nullptr;        // [m, n]
  int splits = 1;             // flat GEMM only: pieces of K (flat_splits); the others ignore it
  float* workspace = nullptr;  // flat GEMM with splits > 1: [splits, m, n] fp32 partial sums
};

// The shapes every kernel accepts: M, N >= 1 and K a positive multiple of 8 (16-byte rows); UsageError otherwise.
inline void check_shape(int m, int n, int k) {
  if (m < 1 || n < 1 || k < 1)
    throw fa::UsageError("GEMM shape M " + std::to_string(m) + ", N " + std::to_string(n) + ", K " + std::to_string(k) +
                         ": each must be at least 1");
  if (k % kAlignK != 0)
    throw fa::UsageError("GEMM K = " + std::to_string(k) + " is not a multiple of " + std::to_string(kAlignK) +
                         ": the kernels read rows of X and W in 16-byte pieces (pad K to a multiple of 8)");
}

// The flat GEMM's split-K (flat_gemm.cu, flat_cluster.cu): 1, 2 or 4 pieces of K, whichever spreads the blocks over
// the SMs most evenly (the last round of blocks the fullest; on a tie the more pieces, more loads in flight), among
// those that keep every block resident at once (`slots` = blocks one SM holds x SMs: flat::blocks_per_sm, for M's
// number of groups: registers set it; for flat_cluster the blocks its clusters hold at once: flat_cluster::slots),
// at least one K tile a piece. A round of blocks that leaves SMs idle streams W with fewer loads in flight than the
// GPU could keep.
constexpr int kFlatTileN = 64;   // outputs n per block (4 warps x 16)
constexpr int kFlatTileK = 128;  // k per K tile (4 chunks of 32): the unit of split-K
constexpr int kFlatPieces = 4;   // flat_splits' most pieces (a launch accepts up to kMaxSplits)
constexpr int kFlatMaxGroups = 8;  // groups of 8 rows of X that one flat block multiplies by its W fragments
constexpr int kFlatSlabRows = kFlatMaxGroups * kGroupRows;  // rows of X per blockIdx.z of the flat grid: 64
// The flat kernel's groups per block: the smallest power of two G with 8 G >= min(M, 64). M > 64: slabs of 64 rows.
inline int flat_groups(int m) {
  int g = 1;
  while (g < kFlatMaxGroups && g * kGroupRows < m) g *= 2;
  return g;
}
inline int flat_splits(int m, int n, int k, int sms, int slots) {
  // the grid before split-K: N tiles x slabs of up to 64 rows (M <= 64: one slab, W read once)
  const long long blocks = (long long)((n + kFlatTileN - 1) / kFlatTileN) * ((m + kFlatSlabRows - 1) / kFlatSlabRows);
  const int k_tiles = (k + kFlatTileK - 1) / kFlatTileK;
  int best = 1;
  long long best_blocks = 0, best_room = 1;  // the best fill so far: best_blocks / best_room
  for (int s = 1; s <= kFlatPieces && s <= k_tiles; s *= 2) {
    const long long b = blocks * s, room = (b + sms - 1) / sms * sms;  // room: whole rounds of one block per SM
    if (s > 1 && b > slots) break;
    if (b * best_room >= best_blocks * room) best = s, best_blocks = b, best_room = room;
  }
  return best;
}

// The kernels' host functions (one per file; each launches through steps/ready.cuh's launch_kernel, so that the
// emulation of 06's tests/emu/emu.hpp runs the same source on the CPU; flat_wgmma through chapter 05's
// hopper/tma_host.cuh, emulated by 05's tests/emu/emu_sm90.hpp).
namespace gemv { void launch(const Args& a); }
namespace flat {
void launch(const Args& a);
int blocks_per_sm(int m);  // how many blocks of the flat kernel for M rows (flat_groups) one SM of this GPU holds
}  // namespace flat
namespace tile { void launch(const Args& a); }
namespace flat_cluster {
void launch(const Args& a);  // fa::NotOnThisGpu on a GPU without thread block clusters
int slots(int m, int sms);   // blocks for M rows resident at once over the GPU in clusters of kFlatPieces (0: none)
bool supported();            // this GPU launches thread block clusters (sm_90)
}  // namespace flat_cluster
namespace flat_wgmma {  // built with chapter 05's Hopper steps (FA_HOPPER: sm_90a), FDEC_GEMM_HOPPER says so
void launch(const Args& a);             // fa::NotOnThisGpu on a GPU other than sm_90
int splits(int m, int n, int k, int sms);  // its split-K: one block an SM
bool supported();                       // this GPU runs sm_90a code
}  // namespace flat_wgmma

// The split-K each split-K kernel picks on a GPU of `sms` SMs (1 for the others).
inline int flat_gemm_splits(int m, int n, int k, int sms) {
  return flat_splits(m, n, k, sms, flat::blocks_per_sm(m) * sms);
}
inline int flat_cluster_splits(int m, int n, int k, int sms) {
  return flat_splits(m, n, k, sms, flat_cluster::slots(m, sms));
}

// The ceiling (read_w.cu): W's 2 N K bytes read in 16-byte loads and nothing else, with every SM busy. It XORs
// each 32-bit word of W into *checksum (XORed in: a zeroed word receives the XOR of W), so that no load is dropped
// and a test can see that every byte was read.
namespace read_w { void launch(const __half* w, int n, int k, int sms, unsigned* checksum); }

// The registry: name (--kernel), the one idea, the launch, and for the split-K kernels their number of pieces.
struct Kernel {
  const char* name;
  const char* idea;
  Path path;  // what dataflow.hpp's choose_gemm returns for it (kernel_of picks the kernel of a path)
  void (*launch)(const Args&);
  int (*splits)(int m, int n, int k, int sms);  // nullptr: no split-K (Args::splits ignored)
};
inline const std::vector<Kernel>& kernels() {
  static const std::vector<Kernel> list = {
      {"gemv", "CUDA cores: W streamed once in 16-byte loads, each thread accumulates all 8 rows", Path::gemv,
       gemv::launch, nullptr},
      {"flat", "tensor cores, Y^T = W X^T: M padded to 8 (not 64), W through registers, split-K in one launch",
       Path::flat, flat::launch, flat_gemm_splits},
      {"tile", "tensor cores, a 64 x 64 block tile of Y, cp.async double buffering: the large-M GEMM", Path::tile,
       tile::launch, nullptr},
      {"flat_cluster", "flat, its split-K summed in a thread block cluster through distributed shared memory (sm_90)",
       Path::flat, flat_cluster::launch, flat_cluster_splits},
#ifdef FDEC_GEMM_HOPPER
      {"flat_wgmma",
       "Y^T = W X^T with M up to 256 as wgmma's N, W and X through a TMA ring of stages, split-K in a cluster (sm_90a)",
       Path::tile, flat_wgmma::launch, flat_wgmma::splits},
#endif
  };
  return list;
}
// Whether the kernel runs on this GPU (flat_cluster and flat_wgmma need an sm_90 GPU).
inline bool runs_here(const Kernel& k) {
  const std::string name = k.name;
  if (name == "flat_cluster") return flat_cluster::supported();
#ifdef FDEC_GEMM_HOPPER
  if (name == "flat_wgmma") return flat_wgmma::supported();
#endif
  return true;
}
// The kernel that runs path c: the registry's first three in Path's order, except on an sm_90 GPU, where the flat
// path runs flat_cluster (the same kernel, its split-K summed in a cluster: README §6) and the tile path flat_wgmma
// (README §7).
inline const Kernel& kernel_of(Path c) {
  const std::vector<Kernel>& list = kernels();
  if (c == Path::flat && flat_cluster::supported()) return list[3];
  if (c == Path::tile && list.size() > 4 && runs_here(list[4])) return list[4];
  return list[int(c)];
}

}  // namespace fdec::gemm

// The host API of the decode step's linear layers (README.md): Y[M, N] = X[M, K] W^T, with X [M, K], W [N, K] (a
// linear layer's weight) and Y [M, N] fp16, row-major, accumulated in fp32. Three kernels, one file each, listed once
// in kernels() below, which decode_gemm, the tests and the tuner loop over:
//   gemv.cu       CUDA cores, W streamed once, each thread all (up to 8) rows of X
//   flat_gemm.cu  tensor cores with the operands swapped (Y^T = W X^T): M padded to 8, not 64; split-K
// and, next to them, read_w.cu: the ceiling, a kernel that only reads W (no Y), timed as the kernels are.
//   tile_gemm.cu  tensor cores, a conventional 64 x 64 block tile, for large M
// Plain C++ besides the pointers' type (CUDA's __half, which the CPU emulation has too), so the CPU tests include it.
#pragma once
#include <cuda_fp16.h>

#include <cstddef>
#include <string>
#include <vector>

#include "dataflow.hpp"  // Path
#include "problem.hpp"   // fa::UsageError

namespace fdec::gemm {

constexpr int kGroupRows = 8;  // rows of X one pass handles: the n = 8 side of mma.m16n8k16, the GEMV's registers
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

// The flat GEMM's tile and shared memory (flat_gemm.cu), and its split-K: as many pieces of K as keep every block
// resident at once (`slots` = blocks one SM holds x SMs, flat_blocks_per_sm): one wave, no block waiting for
// another, and the stream of W shared by every SM as evenly as the grid allows; but at most kFlatPieces (each piece
// is one more partial that the last block of a tile reads and adds after everyone's work: README §5) and at least
// one K tile per piece. When the N tiles alone fill the slots, one piece.
constexpr int kFlatTileN = 64;   // outputs n per block (4 warps x 16, twice: two k-halves)
constexpr int kFlatTileK = 128;  // k per pipeline stage
constexpr int kFlatStride = kFlatTileK + 8;  // halves per shared row (16 bytes of padding)
constexpr int kFlatStages = 3;
constexpr int kFlatPieces = 4;  // flat_splits' most pieces (a launch accepts up to kMaxSplits)
constexpr int kFlatSmemBytes = kFlatStages * (kFlatTileN + kGroupRows) * kFlatStride * 2;  // 58,752, dynamic
// Blocks of the flat kernel one SM holds, from its shared memory (sharedMemPerMultiprocessor): the stages, 2 KiB
// more where its two k-halves meet, and 1 KB the driver keeps per block: 3 on an H100 (228 KB), 2 on an A100
// (164 KB). Its 256 threads never limit it first.
inline int flat_blocks_per_sm(size_t smem_per_sm) {
  const int n = int(smem_per_sm / (kFlatSmemBytes + 2048 + 1024));
  return n < 1 ? 1 : n;
}
inline int flat_splits(int m, int n, int k, int slots) {
  const long long blocks = (long long)((n + kFlatTileN - 1) / kFlatTileN) * ((m + kGroupRows - 1) / kGroupRows);
  const int k_tiles = (k + kFlatTileK - 1) / kFlatTileK;
  long long s = slots / blocks;  // floor: blocks x s <= slots
  if (s > kFlatPieces) s = kFlatPieces;
  if (s > k_tiles) s = k_tiles;
  return s < 1 ? 1 : int(s);
}
inline size_t workspace_floats(const Args& a) { return a.splits > 1 ? size_t(a.splits) * a.m * a.n : 0; }

// The kernels' host functions (one per file; each launches through steps/ready.cuh's launch_kernel, so that the
// emulation of 06's tests/emu/emu.hpp runs the same source on the CPU).
namespace gemv { void launch(const Args& a); }
namespace flat { void launch(const Args& a); }
namespace tile { void launch(const Args& a); }

// The ceiling (read_w.cu): W's 2 N K bytes read in 16-byte loads and nothing else, with every SM busy. It XORs
// each 32-bit word of W into *checksum (XORed in: a zeroed word receives the XOR of W), so that no load is dropped
// and a test can see that every byte was read.
namespace read_w { void launch(const __half* w, int n, int k, int sms, unsigned* checksum); }

// The registry: name (--kernel), the one idea, the launch.
struct Kernel {
  const char* name;
  const char* idea;
  Path path;  // what dataflow.hpp's choose_gemm returns for it
  void (*launch)(const Args&);
};
inline const std::vector<Kernel>& kernels() {
  static const std::vector<Kernel> list = {
      {"gemv", "CUDA cores: W streamed once in 16-byte loads, each thread accumulates all 8 rows", Path::gemv,
       gemv::launch},
      {"flat", "tensor cores, Y^T = W X^T: M padded to 8 (not 64), 3 cp.async stages, 8 warps, split-K in one launch",
       Path::flat, flat::launch},
      {"tile", "tensor cores, a 64 x 64 block tile of Y, cp.async double buffering: the large-M GEMM", Path::tile,
       tile::launch},
  };
  return list;
}
inline const Kernel& kernel_of(Path c) { return kernels()[int(c)]; }

}  // namespace fdec::gemm

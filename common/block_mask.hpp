// Block-sparse attention (FA1 paper, section 3.3): a block mask of Tr x Tc bits says which (query block,
// key block) pairs attend at all; the element mask is (block bit) AND (causal test, if p.causal). One
// pattern is shared by every batch and head, as in the paper's block-sparse experiments.
//
// The granularity is fixed, kMaskRows query rows x kMaskCols keys, so that every kernel tile lies inside
// one mask block (chapter 04's tiles are 64 x 64 and 32 x 64, chapter 05's 128 x 64 and 128 x 32): a
// kernel reads one bit per tile and skips the tile without loading it. Block (r, c) covers query rows
// [r kMaskRows, (r + 1) kMaskRows) and keys [c kMaskCols, (c + 1) kMaskCols), clipped to the lengths.
//
// Generators (SPEC of the programs' --block-mask):
//   local:W           sliding window: block (r, c) is kept iff it holds a pair (i, j) with
//                     |j - (i + kv_len - q_len)| <= W (the diagonal bottom-right aligned, like causal)
//   strided:S         every S-th key block (c % S == 0) plus the blocks on the diagonal (local:0): the
//                     block form of the strided pattern of Child et al.'s Sparse Transformer
//   random:DENSITY[:SEED]  each block kept independently with probability DENSITY (seed 0 if omitted).
//                     The diagonal is NOT forced on: the density is what it says, and rows that see no
//                     key (O = 0, LSE = -inf) are a case the kernels must get right anyway.
//   FILE.npy          a uint8 or bool array of shape [Tr, Tc] (nonzero = kept)
// causal_block_mask (for tests): the blocks the causal mask touches at all, so that with p.causal the
// element mask is exactly the causal one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hd.hpp"
#include "problem.hpp"

namespace fa {

constexpr int kMaskRows = 128;  // query rows per mask block
constexpr int kMaskCols = 64;   // keys per mask block

FA_HD int mask_rows_of(int q_len) { return (q_len + kMaskRows - 1) / kMaskRows; }  // Tr
FA_HD int mask_cols_of(int kv_len) { return (kv_len + kMaskCols - 1) / kMaskCols; }  // Tc

// Does query i see key j as far as the block mask goes? `mask` holds Tr x Tc bytes (row-major; on the
// device, a copy of BlockMask::bits); nullptr means dense. A kernel passes its tile's first row and key.
FA_HD bool block_visible(const uint8_t* mask, int Tc, int i, int j) {
  return mask == nullptr || mask[(i / kMaskRows) * Tc + j / kMaskCols] != 0;
}

// Tr, Tc count mask blocks (128 x 64), which need not be a kernel's tiles (chapter 04's forward has 64-row ones).
struct BlockMask {
  int Tr = 0, Tc = 0;
  std::vector<uint8_t> bits;  // [Tr][Tc], 1 = attend

  bool get(int r, int c) const { return bits[size_t(r) * Tc + c] != 0; }
  // Element (i, j), without the causal test: the reference's and the models' predicate.
  bool visible(int i, int j) const { return block_visible(bits.data(), Tc, i, j); }
  double density() const;  // fraction of ones
};

BlockMask dense_block_mask(const Problem& p);
BlockMask causal_block_mask(const Problem& p);
BlockMask local_block_mask(const Problem& p, int window);
BlockMask strided_block_mask(const Problem& p, int stride);
BlockMask random_block_mask(const Problem& p, double density, uint64_t seed);
// A .npy of uint8/bool [Tr, Tc]; a shape other than this problem's is a UsageError naming both.
BlockMask load_block_mask(const std::string& path, const Problem& p);
void save_block_mask(const std::string& path, const BlockMask& m);

// SPEC as above (local:W, strided:S, random:DENSITY[:SEED] or a .npy path) for problem p; a malformed SPEC
// or a bad file is a UsageError (exit 2), raised before any GPU work.
BlockMask block_mask_from_spec(const std::string& spec, const Problem& p);

}  // namespace fa

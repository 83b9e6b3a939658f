// The indexing every 06 kernel and the CPU model (model.hpp) share, host and device: which query rows a block
// owns, which keys a split covers, the problem a batch entry sees. One definition, so the model mirrors the kernels.
//
// Decoding problem: Q [B, H, q_len, d] (q_len 1..8), a K/V cache [B, Hkv, N, d] with N = p.kv_len the cache
// *capacity*, and a per-batch context length n_b = kv_lens[b] (0 <= n_b <= N): batch entry b attends to keys
// 0 .. n_b - 1 only, causal bottom-right relative to its own n_b when asked.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "hd.hpp"
#include "problem.hpp"

namespace fdec {

constexpr int kWarps = 4;          // warps per block; they split the keys of a split between them
constexpr int kThreads = 32 * kWarps;
constexpr int kKeysPerWarp = 32;   // one key per lane per step: a warp's chunk of keys
constexpr int kMaxRows = 16;       // query rows one block keeps (the largest row bucket below)
constexpr int kMaxQLen = 8;        // decoding: 1 token, or a few for speculative decoding
constexpr int kMaxSplits = 128;    // upper bound of the split count (and of --splits)
constexpr int kMaxEvenBlocks = 256;  // split_kv_even: upper bound of its blocks, and so of a tile's pieces
constexpr int kMinSplitKeys = 256; // the heuristic gives each split at least this many keys (see README)

// The K/V stream's L2 policy (README §4.6). A step that reads no more than kEvictFirstL2s times the L2's size of K and
// V streams them evict-first: they then replace each other in L2 and leave what the L2 held before the step alone,
// dirty lines included, which would otherwise be written back to HBM while the step reads. Measured on an H100
// (50 MB L2): faster at 17 and 134 MB per step, slower at 537 MB and beyond, so the line is drawn between.
constexpr double kEvictFirstL2s = 4;
inline double kv_step_bytes(const fa::Problem& p, int max_len) {  // K and V of every kv head at max_len, 16-bit
  return 2.0 * 2 * p.batch * p.kv_heads * double(max_len) * p.head_dim;
}
inline bool kv_evict_first(double kv_bytes, double l2_bytes) { return kv_bytes <= kEvictFirstL2s * l2_bytes; }

// The problem batch entry b sees: the same shape with kv_len = n_b, so Problem's own causal test
// (visible, visible_keys) applies relative to b's length. Offsets must still come from the full problem
// (the cache is laid out with the capacity N).
FA_HD fa::Problem seen_by(const fa::Problem& p, int n_b) {
  fa::Problem pb = p;
  pb.kv_len = n_b;
  return pb;
}

// The query rows of a block. A "unit" is the set of query heads that share one read of K/V:
//   packed (GQA done right): the group() heads of kv head u, rows = group * q_len;
//   unpacked (one head per unit, as FA2's grid):      head u,  rows = q_len.
// Row r of a unit is query i = r % q_len of head h = u * heads_per_unit + r / q_len.
struct Rows {
  int heads_per_unit;  // group() when packed, else 1
  int q_len;
  FA_HD int per_unit() const { return heads_per_unit * q_len; }
  FA_HD int head(int u, int r) const { return u * heads_per_unit + r / q_len; }
  FA_HD int query(int r) const { return r % q_len; }
};
FA_HD Rows rows_of(const fa::Problem& p, bool packed) { return Rows{packed ? p.group() : 1, p.q_len}; }
FA_HD int units_of(const fa::Problem& p, bool packed) { return packed ? p.kv_heads : p.heads; }

// The keys of split s (of `splits`) of a sequence of n keys: [begin, end), possibly empty. Splits are a whole
// number of warp chunks long, so a chunk never straddles two splits.
struct KeyRange {
  int begin, end;
  FA_HD bool empty() const { return begin >= end; }
};
FA_HD int split_len(int n, int splits) {
  const int per = (n + splits - 1) / splits;
  return (per + kKeysPerWarp - 1) / kKeysPerWarp * kKeysPerWarp;
}
FA_HD KeyRange split_range(int n, int splits, int s) {
  const int len = split_len(n, splits);
  const long long b = (long long)s * len, e = b + len;
  return KeyRange{int(b < n ? b : n), int(e < n ? e : n)};
}

// ---- the even decomposition (split_kv_even, README §4.5) ----
// A tile is one block of the unsplit grid: (batch entry b, unit u, row chunk c), numbered t = u * row_chunks + c
// inside its entry. Number the 32-key chunks of every tile end to end, entry by entry and tile by tile: T chunks in
// all. Block k of C takes chunks [k T / C, (k + 1) T / C), so the shares differ by at most one chunk, whatever the
// lengths. A share that crosses a tile's end goes on into the next tile: each (block, tile) overlap is a *piece*,
// and a tile's pieces are merged like the splits' partials. A tile of an empty entry (n_b = 0) still counts one
// chunk, so that a block writes its O = 0 and LSE = -inf.
FA_HD int tile_chunks(int n) { return n > 0 ? (n + kKeysPerWarp - 1) / kKeysPerWarp : 1; }
FA_HD long long even_total(const int* lens, int batch, int tiles_per_entry) {
  long long T = 0;
  for (int b = 0; b < batch; ++b) T += (long long)tiles_per_entry * tile_chunks(lens[b]);
  return T;
}
// Block k's first chunk; the block that takes chunk x is the last block whose share begins at or before x. With
// T >= C (the kernel uses C = min(blocks launched, T)) no share is empty.
FA_HD long long even_begin(int k, long long T, int C) { return (long long)k * T / C; }
FA_HD int even_block_of(long long x, long long T, int C) { return int(((x + 1) * C - 1) / T); }

struct Piece {
  int b, tile;      // batch entry, and tile inside it
  KeyRange keys;    // the piece's keys (begin a multiple of 32: a whole number of warp chunks precedes it)
  int part, parts;  // this piece's index among its tile's pieces, and how many the tile has
  long long next;   // the chunk after the piece
};
// Walks one block's share piece by piece, keeping the entry it is in (the entries before it are never re-read).
// Made by even_walk below, which derives T and C.
struct EvenWalk {
  const int* lens;
  int batch, tiles_per_entry, C;
  long long T;
  int b = 0;
  long long entry_begin = 0;  // first chunk of entry b
  // The piece of block k that starts at chunk x (x < k's share end, x1).
  FA_HD Piece piece(int k, long long x, long long x1) {
    while (x >= entry_begin + (long long)tiles_per_entry * tile_chunks(lens[b])) {
      entry_begin += (long long)tiles_per_entry * tile_chunks(lens[b]);
      ++b;
    }
    const int n = lens[b], per_tile = tile_chunks(n);
    const int tile = int((x - entry_begin) / per_tile);
    const long long tile_begin = entry_begin + (long long)tile * per_tile, tile_end = tile_begin + per_tile;
    const long long end = x1 < tile_end ? x1 : tile_end;
    const int first = even_block_of(tile_begin, T, C);
    Piece pc;
    pc.b = b, pc.tile = tile;
    const long long kb = (x - tile_begin) * kKeysPerWarp, ke = (end - tile_begin) * kKeysPerWarp;
    pc.keys = KeyRange{int(kb < n ? kb : n), int(ke < n ? ke : n)};
    pc.part = k - first;
    pc.parts = even_block_of(tile_end - 1, T, C) - first + 1;
    pc.next = end;
    return pc;
  }
};
// The walk of `blocks` blocks over these lengths; C = min(blocks, T), so that no share is empty (blocks C .. are
// left with nothing to do).
FA_HD EvenWalk even_walk(const int* lens, int batch, int tiles_per_entry, int blocks) {
  EvenWalk w;
  w.lens = lens, w.batch = batch, w.tiles_per_entry = tiles_per_entry;
  w.T = even_total(lens, batch, tiles_per_entry);
  w.C = int(w.T < blocks ? w.T : blocks);
  return w;
}

// FlashDecoding++'s unified max: a split computes exp(s - phi) with a fixed phi instead of its running max. Safe
// while every score of the split lies within [phi - kUnderflow, phi + kOverflow] *at its maximum* (README §5):
//   overflow:  exp(60) = 1.1e26; times up to 2^21 keys and |v| <= 65504 stays below fp32's 3.4e38;
//   underflow: the split's largest term is >= exp(-60) = 8.8e-27, a normal fp32 number, and a term that
//              flushes to 0 (< exp(-87.3)) is < exp(-27) = 1.9e-12 of it: invisible in an fp16/bf16 output.
// A split whose maximum m falls outside trips the check and is recomputed with the running max.
constexpr float kOverflow = 60.f, kUnderflow = 60.f;
FA_HD bool unified_max_trips(float m, float phi) {
  return m != -INFINITY && (m - phi > kOverflow || m - phi < -kUnderflow);  // an empty split (m = -inf) is fine
}

// The chapter's random inputs, a pure function of (seed, tensor, element) so that a kernel can fill a 16 GB cache on
// the device and the host can recompute any slice it checks: uniform on [-1.5, 2.5) (mean 0.5, standard deviation
// 1.15; offset from zero on purpose, as everywhere in this project), before rounding to the dtype. Every step is
// exact in fp32 (24-bit u, a power-of-two scale), so host and device agree bit for bit, fused multiply-add or not.
enum class Tensor { q = 1, k = 2, v = 3 };
FA_HD float input_value(uint64_t seed, Tensor t, size_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + uint64_t(t) * 0xD1B54A32D192ED03ull + index;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;  // splitmix64's finaliser
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = float(z >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
  return 0.5f + (u - 0.5f) * 4.0f;
}

// Shared memory of one split block (README §7, §4.1, §4.3), in bytes: per stage every warp's K and V chunk (rows
// padded by kPadH 16-bit elements: 16 bytes keep the lane-per-key reads and the ldmatrix reads conflict-free), the
// block's Q rows (fp32), each warp's P (fp32), and the warp merge's M, L and weights. stages = 2 is the
// double-buffered kernel. mma (the tensor-core kernel): Q and P live in registers, so neither takes shared memory.
constexpr int kPadH = 8;
constexpr int split_smem_bytes(int head_dim, int rows, int stages, bool mma = false) {
  return stages * kWarps * 2 * kKeysPerWarp * (head_dim + kPadH) * 2 +
         (mma ? 0 : rows * head_dim * 4 + kWarps * rows * kKeysPerWarp * 4) + 2 * rows * 4 + kWarps * rows * 4;
}

// The rows a block is compiled for. The CUDA-core kernels: the smallest of 1, 4, 16 that holds the unit's rows. The
// tensor-core kernel (mma): always 16, the M of mma.m16n8k16, so 1 or 4 rows are padded to a 16-row tile. The flat
// GEMM kernel (flat, README §5): always 8, the N of mma.m16n8k16, the keys being its M. A unit with more rows than
// its bucket is cut into row chunks of the bucket, each a block that reads K/V again (1 and 4 hold a unit whole).
constexpr int kFlatRows = 8;
inline int row_bucket(int rows, bool mma = false, bool flat = false) {
  return flat ? kFlatRows : mma || rows > 4 ? kMaxRows : rows <= 1 ? 1 : 4;
}
inline int row_chunks(int rows, int bucket = kMaxRows) { return (rows + bucket - 1) / bucket; }

}  // namespace fdec

// The shared-memory layout that steps 9 and 10 rely on, in plain C++ (host and device): where TMA's 128-byte
// swizzle puts each element of a tile, and where each k16 step of a wgmma operand starts. The kernels compute
// their operand addresses with these functions; test_sm90_layout.cpp checks them on the CPU against the
// canonical layouts of the PTX ISA ("Asynchronous Warpgroup Level Matrix Multiply-Accumulate", shared memory
// matrix layout), the way test_frag.cpp checks the mma.sync fragment maps.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define WSQ_SM90_HD __host__ __device__
#else
#define WSQ_SM90_HD
#endif

namespace wsq::sm90 {

constexpr int kPanelCols = 64;         // 16-bit columns per 128-byte swizzled row: TMA's box width, one panel
constexpr uint32_t kRowBytes = 128;    // one row of a panel
constexpr uint32_t kAtomBytes = 1024;  // 8 rows: the period of the swizzle pattern

// TMA's 128-byte swizzle of a byte offset counted from a 1024-byte boundary: 16-byte chunk c of row r is stored
// at chunk c XOR (r % 8) of the same row.
WSQ_SM90_HD constexpr uint32_t swizzle128(uint32_t offset) { return offset ^ (((offset >> 7) & 7u) << 4); }

// Byte offset of 16-bit element (row, col) in a tile of `rows` rows as TMA writes it: panels of 64 columns one
// after the other, each `rows` rows of 128 bytes, swizzled.
WSQ_SM90_HD constexpr uint32_t tile_byte(int row, int col, int rows) {
  return uint32_t(col / kPanelCols) * rows * kRowBytes + swizzle128(uint32_t(row) * kRowBytes + (col % kPanelCols) * 2);
}
WSQ_SM90_HD constexpr uint32_t panel_bytes(int rows) { return uint32_t(rows) * kRowBytes; }

// Where k16 step kk of a K-major operand (Q, K: k runs along a row) starts, from the tile's start: panel kk / 4,
// then 32 bytes (16 columns) further per step inside the 128-byte row.
WSQ_SM90_HD constexpr uint32_t k_major_step(int kk, int rows) { return (kk / 4) * panel_bytes(rows) + 32u * (kk % 4); }
// Where k16 step kk of an MN-major operand (V: row j = key j) starts: 16 rows (two atoms) further per step.
WSQ_SM90_HD constexpr uint32_t mn_major_step(int kk) { return 16u * kk * kRowBytes; }

// A wgmma matrix descriptor: bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte
// offset >> 4, 49-51 base offset (0: every pattern starts on a 1024-byte boundary), 62-63 swizzle (1 = 128 B).
WSQ_SM90_HD constexpr uint64_t desc_encode(uint32_t x) { return (x & 0x3FFFF) >> 4; }
WSQ_SM90_HD constexpr uint64_t desc_bits(uint32_t start, uint32_t leading, uint32_t stride) {
  return desc_encode(start) | (desc_encode(leading) << 16) | (desc_encode(stride) << 32) | (uint64_t(1) << 62);
}
// K-major operand: 8-row groups kAtomBytes apart (stride); the leading offset is unused (16 bytes: "1").
WSQ_SM90_HD constexpr uint64_t k_major_desc(uint32_t start) { return desc_bits(start, 16, kAtomBytes); }
// MN-major operand: panels of 64 N-columns `panel` bytes apart (leading), 8-row groups (k) kAtomBytes apart.
WSQ_SM90_HD constexpr uint64_t mn_major_desc(uint32_t start, uint32_t panel) { return desc_bits(start, panel, kAtomBytes); }

}  // namespace wsq::sm90

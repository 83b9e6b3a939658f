// CPU proof of the layout contract of steps 9 and 10 (sm90_layout.hpp): TMA writes each tile with the 128-byte
// swizzle, and the wgmma descriptors the kernels build make the tensor cores read exactly the elements each k16 step
// needs. The reads are emulated from the PTX ISA's canonical layouts ("Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate", shared memory layout; T = 8 16-bit elements per 16 bytes):
//   K-major,  128-byte swizzle: ((8, m), (T, 2k)) : ((8T, SBO), (1, T))        element (row, k)
//   MN-major, 128-byte swizzle: ((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO))  element (k, n)
// with the swizzle applied to the byte address (bits 4-6 XOR bits 7-9), the strides in elements of 2 bytes except
// LBO and SBO, which are bytes, decoded from the descriptor itself.
#include <doctest/doctest.h>

#include <cstddef>
#include <set>

#include "hopper/sm90_layout.hpp"

using namespace wsq::sm90;

namespace {

constexpr uint32_t kBase = 64 * 1024;  // a tile's (1024-byte aligned) shared-memory address

struct Fields {
  uint32_t start, leading, stride, swizzle;
};
Fields decode(uint64_t d) {
  return {uint32_t(d & 0x3FFF) << 4, uint32_t((d >> 16) & 0x3FFF) << 4, uint32_t((d >> 32) & 0x3FFF) << 4,
          uint32_t(d >> 62)};
}

// The byte address the tensor cores read for element (row, k) of a K-major operand, or (k, n) of an MN-major one.
uint32_t read_k_major(uint64_t desc, int row, int k) {
  const Fields f = decode(desc);
  return swizzle128(f.start + (row % 8) * 128 + (row / 8) * f.stride + k * 2);
}
uint32_t read_mn_major(uint64_t desc, int k, int n) {
  const Fields f = decode(desc);
  return swizzle128(f.start + (n % 64) * 2 + (n / 64) * f.leading + (k % 8) * 128 + (k / 8) * f.stride);
}

}  // namespace

TEST_CASE("TMA's 128-byte swizzle permutes the 16-byte chunks of each row, and every tile is a bijection") {
  for (int rows : {64, 128})
    for (int cols : {64, 128}) {
      std::set<uint32_t> seen;
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          const uint32_t b = tile_byte(r, c, rows);
          CHECK(b % 2 == 0);
          CHECK(b % 16 == (c % 8) * 2);                       // inside a chunk nothing moves
          CHECK((b % panel_bytes(rows)) / kRowBytes == uint32_t(r));  // the row stays the row
          seen.insert(b);
        }
      CHECK(seen.size() == size_t(rows) * cols);
      CHECK(*seen.rbegin() < uint32_t(rows) * cols * 2);
    }
  CHECK(swizzle128(1 * 128 + 0 * 16) == 1 * 128 + 1 * 16);  // row 1, chunk 0 -> chunk 1
  CHECK(swizzle128(7 * 128 + 5 * 16) == 7 * 128 + 2 * 16);  // row 7, chunk 5 -> chunk 5 ^ 7 = 2
  CHECK(swizzle128(8 * 128 + 3 * 16) == 8 * 128 + 3 * 16);  // row 8 starts the next atom: unchanged
}

TEST_CASE("S = Q K^T: every k16 step's descriptors read rows of Q and K at columns 16 kk .. 16 kk + 15") {
  constexpr int Br = 128, Bc = 128, kRowsPerConsumer = 64;
  for (int d : {64, 128})
    for (int kk = 0; kk < d / 16; ++kk) {
      for (int wg = 0; wg < 2; ++wg) {  // A = Q: the consumer's 64 rows, as the kernels address them
        const uint32_t q_wg = kBase + uint32_t(kRowsPerConsumer * wg) * kRowBytes;
        const uint64_t desc = k_major_desc(q_wg + k_major_step(kk, Br));
        for (int m = 0; m < kRowsPerConsumer; ++m)
          for (int k = 0; k < 16; ++k)
            REQUIRE(read_k_major(desc, m, k) == kBase + tile_byte(kRowsPerConsumer * wg + m, 16 * kk + k, Br));
      }
      const uint64_t desc = k_major_desc(kBase + k_major_step(kk, Bc));  // B = K: all Bc keys (N = 128)
      for (int n = 0; n < Bc; ++n)
        for (int k = 0; k < 16; ++k) REQUIRE(read_k_major(desc, n, k) == kBase + tile_byte(n, 16 * kk + k, Bc));
    }
}

TEST_CASE("O += P V: every k16 step's descriptor reads keys 16 kk .. 16 kk + 15 of V, all d columns") {
  constexpr int Bc = 128;
  for (int d : {64, 128})
    for (int kk = 0; kk < Bc / 16; ++kk) {
      const uint64_t desc = mn_major_desc(kBase + mn_major_step(kk), panel_bytes(Bc));
      for (int k = 0; k < 16; ++k)
        for (int n = 0; n < d; ++n) REQUIRE(read_mn_major(desc, k, n) == kBase + tile_byte(16 * kk + k, n, Bc));
    }
}

TEST_CASE("descriptor fields: 128-byte swizzle, base offset 0, strides as the kernels intend") {
  const Fields k = decode(k_major_desc(kBase + 96));
  CHECK(k.start == kBase + 96);
  CHECK(k.leading == 16);  // unused for K-major swizzled layouts: "1" by convention
  CHECK(k.stride == kAtomBytes);
  CHECK(k.swizzle == 1);
  const Fields v = decode(mn_major_desc(kBase + 2048, panel_bytes(128)));
  CHECK(v.leading == 128 * kRowBytes);  // the second panel of 64 columns
  CHECK(v.stride == kAtomBytes);
  CHECK(((k_major_desc(kBase) >> 49) & 7) == 0);  // base offset
  // A start that is not on a 16-byte boundary cannot be encoded: every step offset is a multiple of 32.
  for (int kk = 0; kk < 8; ++kk) CHECK(k_major_step(kk, 128) % 32 == 0);
}

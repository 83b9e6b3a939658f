// CPU proof of the layout contract of the backward's Hopper steps 9-13: for each of the five products, the wgmma
// descriptors the kernels build (sm90_layout.hpp's functions, with the offsets the kernels add) make the tensor cores
// read exactly the tile elements the product needs, from tiles as TMA writes them (128-byte swizzle, 64-column
// panels) or as the kernels store dS^T. The reads follow the PTX ISA's canonical layouts, as test_sm90_layout.cpp
// does for the forward:
//   K-major,  128-byte swizzle: element (row, k) at
//             swizzle(start + (row % 8) 128 + (row / 8) SBO + 2k)
//   MN-major, 128-byte swizzle: element (k, n) at
//             swizzle(start + 2 (n % 64) + (n / 64) LBO + (k % 8) 128 + (k / 8) SBO)
// and the swizzle applied to the byte address (bits 4-6 XOR bits 7-9).
#include <doctest/doctest.h>

#include <cstdint>
#include <initializer_list>

#include "hopper/sm90_layout.hpp"

using namespace wsq::sm90;

namespace {

constexpr uint32_t kBase = 32 * 1024;  // a tile's (1024-byte aligned) shared-memory address
constexpr int Br = 64, Bc = 128;       // the steps' tiles: Q_i, dO_i Br x d; K_j, V_j Bc x d; dS^T Bc x Br

uint32_t field(uint64_t d, int shift) { return uint32_t((d >> shift) & 0x3FFF) << 4; }
uint32_t read_k_major(uint64_t d, int row, int k) {
  return swizzle128(field(d, 0) + (row % 8) * 128 + (row / 8) * field(d, 32) + k * 2);
}
uint32_t read_mn_major(uint64_t d, int k, int n) {
  return swizzle128(field(d, 0) + (n % 64) * 2 + (n / 64) * field(d, 16) + (k % 8) * 128 + (k / 8) * field(d, 32));
}

}  // namespace

TEST_CASE("S^T = K_j Q_i^T and dP^T = V_j dO_i^T: A = warpgroup w's 64 keys, B = the Br queries, both K-major") {
  for (int d : {64, 128})
    for (int w : {0, 1})
      for (int kk = 0; kk < d / 16; ++kk) {
        // the kernel: desc_k_major(Ks + 64 w rows + k_major_step(kk, Bc)), desc_k_major(Qs + k_major_step(kk, Br))
        const uint64_t a = k_major_desc(kBase + 64 * w * kRowBytes + k_major_step(kk, Bc));
        const uint64_t b = k_major_desc(kBase + k_major_step(kk, Br));
        for (int m = 0; m < 64; ++m)
          for (int k = 0; k < 16; ++k) REQUIRE(read_k_major(a, m, k) == kBase + tile_byte(64 * w + m, 16 * kk + k, Bc));
        for (int n = 0; n < Br; ++n)
          for (int k = 0; k < 16; ++k) REQUIRE(read_k_major(b, n, k) == kBase + tile_byte(n, 16 * kk + k, Br));
      }
}

TEST_CASE("dV_j += P^T dO_i, dK_j += dS^T Q_i: B = dO_i, Q_i MN-major (k = query down the rows, n = all d columns)") {
  for (int d : {64, 128})
    for (int kk = 0; kk < Br / 16; ++kk) {
      const uint64_t b = mn_major_desc(kBase + mn_major_step(kk), panel_bytes(Br));
      for (int k = 0; k < 16; ++k)
        for (int n = 0; n < d; ++n) REQUIRE(read_mn_major(b, k, n) == kBase + tile_byte(16 * kk + k, n, Br));
    }
}

TEST_CASE("dQ_i = dS K_j: A = dS read from dS^T [key][query], B = K_j [key][d] panel p, both MN-major") {
  for (int d : {64, 128}) {
    const int panels = d / 64, keys = Bc * panels / 2;  // per warpgroup: all keys at d = 128, its own 64 at d = 64
    for (int w : {0, 1}) {
      const int panel = w % panels, key0 = panels == 2 ? 0 : 64 * w;
      for (int kk = 0; kk < keys / 16; ++kk) {
        const uint64_t a = mn_major_desc(kBase + (key0 + 16 * kk) * kRowBytes, panel_bytes(Bc));
        const uint64_t b =
            mn_major_desc(kBase + panel * panel_bytes(Bc) + (key0 + 16 * kk) * kRowBytes, panel_bytes(Bc));
        for (int k = 0; k < 16; ++k)
          for (int x = 0; x < 64; ++x) {
            // A's element (query x, key k) is dS^T's (key, query x); B's (key k, column x) is K_j's (key, 64 p + x)
            REQUIRE(read_mn_major(a, k, x) == kBase + tile_byte(key0 + 16 * kk + k, x, Bc));
            REQUIRE(read_mn_major(b, k, x) == kBase + tile_byte(key0 + 16 * kk + k, 64 * panel + x, Bc));
          }
      }
    }
  }
}

TEST_CASE("step 13 (d = 64, Br = 128): S^T's B = 128 queries, dV/dK's B 8 k-steps, dQ's A = dS^T panel w (its rows)") {
  constexpr int Br13 = 128, d = 64;
  for (int kk = 0; kk < d / 16; ++kk) {  // S^T = K_j Q_i^T: B = Q_i, 128 rows (N = 128), K-major
    const uint64_t b = k_major_desc(kBase + k_major_step(kk, Br13));
    for (int n = 0; n < Br13; ++n)
      for (int k = 0; k < 16; ++k) REQUIRE(read_k_major(b, n, k) == kBase + tile_byte(n, 16 * kk + k, Br13));
  }
  for (int kk = 0; kk < Br13 / 16; ++kk) {  // dV_j += P^T dO_i, dK_j += dS^T Q_i: k = 128 queries, MN-major
    const uint64_t b = mn_major_desc(kBase + mn_major_step(kk), panel_bytes(Br13));
    for (int k = 0; k < 16; ++k)
      for (int n = 0; n < d; ++n) REQUIRE(read_mn_major(b, k, n) == kBase + tile_byte(16 * kk + k, n, Br13));
  }
  for (int w : {0, 1})  // dQ rows 64 w .. = dS K_j: A from dS^T (Bc keys x 128 queries, two panels), k = all keys
    for (int kk = 0; kk < Bc / 16; ++kk) {
      const uint64_t a = mn_major_desc(kBase + w * panel_bytes(Bc) + 16 * kk * kRowBytes, panel_bytes(Bc));
      const uint64_t b = mn_major_desc(kBase + 16 * kk * kRowBytes, panel_bytes(Bc));
      for (int k = 0; k < 16; ++k)
        for (int x = 0; x < 64; ++x) {
          REQUIRE(read_mn_major(a, k, x) == kBase + tile_byte(16 * kk + k, 64 * w + x, Bc));  // dS^T (key, query)
          REQUIRE(read_mn_major(b, k, x) == kBase + tile_byte(16 * kk + k, x, Bc));           // K_j (key, column)
        }
    }
  for (int key = 0; key < Bc; ++key)  // dS^T's stores of 128 queries: aligned words in both panels
    for (int q = 0; q < Br13; q += 2) {
      REQUIRE(tile_byte(key, q, Bc) % 4 == 0);
      REQUIRE(tile_byte(key, q + 1, Bc) == tile_byte(key, q, Bc) + 2);
    }
}

TEST_CASE("dS^T's fragment stores: a pair of queries (2t, 2t + 1) is one aligned 4-byte word under the swizzle") {
  for (int key = 0; key < Bc; ++key)
    for (int q = 0; q < Br; q += 2) {
      REQUIRE(tile_byte(key, q, Bc) % 4 == 0);
      REQUIRE(tile_byte(key, q + 1, Bc) == tile_byte(key, q, Bc) + 2);
    }
}

TEST_CASE("the dQ tile (steps 10, 11): every row a 16-byte aligned run of 64 floats, the bulk reduce-add's unit") {
  constexpr int kDqLd = kPanelCols + 8;  // the kernels' padded row
  static_assert(kDqLd * sizeof(float) % 16 == 0 && kPanelCols * sizeof(float) % 16 == 0,
                "cp.reduce.async.bulk: address and size multiples of 16 bytes");
  // the fragment stores of a half-warp (float2: g = 0..3, t = 0..3) hit 32 different banks
  for (int half = 0; half < 2; ++half) {
    bool bank[32] = {};
    for (int l = 16 * half; l < 16 * half + 16; ++l) {
      const int g = l / 4, t = l % 4, word = g * kDqLd + 2 * t;
      for (int x = 0; x < 2; ++x) {
        REQUIRE(!bank[(word + x) % 32]);
        bank[(word + x) % 32] = true;
      }
    }
  }
}

// What step 11 (FP8) shares between the GPU and the CPU, in plain C++ that host, device and the emulation all
// compile: the e4m3 format, the quantised tensors' layouts, the block scales, the Hadamard rotation (incoherent
// processing) and the key permutation that lets P's accumulator registers be wgmma's A operand as they are.
// One definition of each, so the CPU model (fp8_model.hpp) and the quantisation kernel (forward/fp8_quant.cu)
// produce the same bytes, and test_fp8.cpp checks them.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "hd.hpp"
#include "problem.hpp"

#if defined(__CUDA_ARCH__)
#include <cuda_fp8.h>
#endif

namespace wsq::fp8 {

// ---- e4m3 ("fn" variant: 1 sign, 4 exponent bits with bias 7, 3 mantissa bits, no infinity; the largest finite
// value is 1.75 x 2^8 = 448, the smallest normal 2^-6, subnormals m/8 x 2^-6 down to 2^-9). ----
constexpr float kE4m3Max = 448.f;
// P = exp(S - m) lies in [0, 1]; multiplied by 2^8 before the conversion its values above 2^-14 stay out of
// e4m3's subnormals (which start below 2^-6) and the largest, 1, becomes 256 < 448. A power of two: the scale
// itself adds no rounding, and 1 / kPScale is folded into the final O~ / l.
constexpr float kPScale = 256.f;

// Float -> e4m3 bits, rounding to nearest even and saturating to +-448 (the hardware's cvt.rn.satfinite).
FA_HD uint8_t e4m3_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  float a = x < 0.f ? -x : x;
  if (!(a == a)) return uint8_t(sign | 0x7Fu);  // NaN
  if (a >= kE4m3Max) return uint8_t(sign | 0x7Eu);
  // The quantum of a's binade: 2^(e - 3) for a in [2^e, 2^(e+1)), e >= -6 (below, the subnormals' 2^-9).
  uint32_t ua;
  memcpy(&ua, &a, 4);
  int e = int((ua >> 23) & 0xFFu) - 127;
  if (e < -6) e = -6;
  const float quantum = ldexpf(1.f, e - 3);
  const float q = rintf(a / quantum);  // round to nearest even: a / quantum is exact (a power-of-two divisor)
  const float r = q * quantum;
  if (r >= kE4m3Max) return uint8_t(sign | 0x7Eu);
  if (r == 0.f) return sign;
  uint32_t ur;
  memcpy(&ur, &r, 4);
  const int re = int((ur >> 23) & 0xFFu) - 127;
  if (re < -6) return uint8_t(sign | uint8_t(q));  // subnormal: mantissa = r / 2^-9
  return uint8_t(sign | uint8_t((re + 7) << 3) | uint8_t((ur >> 20) & 7u));
}
FA_HD float e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  float a;
  if ((b & 0x7F) == 0x7F) {
    const uint32_t nan = 0x7FC00000u;
    memcpy(&a, &nan, 4);
  } else if (e == 0) a = ldexpf(float(m), -9);
  else a = ldexpf(1.f + float(m) / 8.f, e - 7);
  return (b & 0x80) ? -a : a;
}
FA_HD float e4m3_round(float x) { return e4m3_value(e4m3_bits(x)); }

// Four floats -> four e4m3 in one 32-bit register, x0 in the lowest byte (the order wgmma reads k in).
FA_HD uint32_t pack4_e4m3(float x0, float x1, float x2, float x3) {
#if defined(__CUDA_ARCH__)
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(x0, x1), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(x2, x3), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
#else
  return uint32_t(e4m3_bits(x0)) | uint32_t(e4m3_bits(x1)) << 8 | uint32_t(e4m3_bits(x2)) << 16 |
         uint32_t(e4m3_bits(x3)) << 24;
#endif
}

// ---- the quantised tensors ----
// One scale per block of kBlockRows rows (a Br x d tile of Q, a Bc x d tile of K and of V: the kernel's tiles),
// or one per tensor. Scale s = amax / 448 maps the block's largest |x| onto e4m3's largest value.
constexpr int kBlockRows = 128;
enum class Scaling { tensor, block };
struct Options {
  Scaling scaling = Scaling::block;
  bool hadamard = false;   // incoherent processing: Q and K multiplied by M = D H / sqrt(d) first
  uint64_t seed = 0x5EED;  // of the random signs D
};

// Layouts, all e4m3 bytes. Q8 [B*H][Nq][kRowBytes] and K8 [B*Hkv][Nk][kRowBytes]: rows padded to 128 bytes (one
// 128-byte swizzle row, the same TMA box and wgmma descriptors for d = 64 and 128; the pad is zero and never
// multiplied). Vt8 [B*Hkv][d][Nk_pad]: V transposed, keys along a row (K-major for O += P V), Nk padded to a
// multiple of 128 with zeros, and the keys of every 16-key group stored in the order key_at() says.
constexpr int kRowBytes = 128;
FA_HD int tiles(int len) { return (len + kBlockRows - 1) / kBlockRows; }
FA_HD int padded_keys(int kv_len) { return tiles(kv_len) * kBlockRows; }

// The permutation. S's accumulator gives lane (g, t) the keys 8n + 2t, 8n + 2t + 1 of n-tile n; e4m3 wgmma's A
// operand wants from it the keys 4t .. 4t + 3 (and 16 + 4t .. 16 + 4t + 3) of each 32-key step. Instead of moving
// bytes between lanes, step 11 packs its own four values - n-tiles 2h and 2h + 1 of each 16-key half h - into
// A position 4t + i, and stores V's keys in the same order: position p = 4t + i of a 16-key group holds key
// 8 (i / 2) + 2t + i % 2. A sum over keys does not care about their order, only that P and V agree on it.
FA_HD int key_at(int p) {
  const int t = (p % 16) / 4, i = p % 4;
  return (p / 16) * 16 + 8 * (i / 2) + 2 * t + i % 2;
}

// The accumulator of S that becomes byte i of A register x in k32 step kk (keys 32 kk .. 32 kk + 31). A register
// x of lane (g, t) holds row g + 8 (x % 2) at A positions 16 (x / 2) + 4t + i, i = 0..3 (the PTX ISA's A fragment
// of an 8-bit wgmma); the lane takes them from its own n-tiles 4 kk + 2 (x / 2) + i / 2, element 2 (x % 2) + i % 2:
// row g + 8 (x % 2), key 32 kk + 16 (x / 2) + 8 (i / 2) + 2t + i % 2 = 32 kk + key_at(16 (x / 2) + 4t + i).
//
//   A positions (one 16-key half) 0  1  2  3 | 4  5  6  7 | 8  9 10 11 | 12 13 14 15
//   lane t of the quad            t=0        | t=1        | t=2        | t=3
//   key stored there (key_at)     0  1  8  9 | 2  3 10 11 | 4  5 12 13 |  6  7 14 15
//   from S's n-tile (e % 2)       a  a  b  b | a  a  b  b | a  a  b  b |  a  a  b  b     (a = 2h, b = 2h + 1)
FA_HD constexpr int a_from_c(int kk, int x, int i) { return 4 * (4 * kk + 2 * (x / 2) + i / 2) + 2 * (x % 2) + i % 2; }

// Where the quantised tensors are (the layouts above; scales [plane][tile]): what step 11 reads.
struct View {
  const uint8_t *q, *k, *vt;
  const float *sq, *sk, *sv;
};
struct Scales {  // the kernel's view of the scales
  const float *q, *k, *v;
};

// ---- incoherent processing: x -> x D H / sqrt(d) on each row of Q and K ----
FA_HD bool sign_flip(uint64_t seed, int c) {  // D's diagonal entry c is -1 when this is true (splitmix64)
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * uint64_t(c + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return ((z ^ (z >> 31)) & 1u) != 0;
}
// In place on one row of D floats: signs, the fast Walsh-Hadamard transform (log2 D butterfly passes: O(D log D)
// additions instead of the D^2 of a matrix product), then 1 / sqrt(D), which makes M orthogonal: M M^T = I.
// flip(c) says whether D's entry c is -1: sign_flip itself (rotate_row), or the quantisation kernel's bits of it,
// computed once per block (a splitmix64 per column and row cost more than the transform).
template <int D, class Flip>
FA_HD void rotate_row_with(float (&x)[D], const Flip& flip) {
  static_assert((D & (D - 1)) == 0, "the Walsh-Hadamard transform needs a power of two");
  #pragma unroll
  for (int c = 0; c < D; ++c)
    if (flip(c)) x[c] = -x[c];
  #pragma unroll
  for (int h = 1; h < D; h *= 2)
    #pragma unroll
    for (int c = 0; c < D; ++c)
      if ((c & h) == 0) {
        const float a = x[c], b = x[c + h];
        x[c] = a + b, x[c + h] = a - b;
      }
  const float norm = 1.f / sqrtf(float(D));
  #pragma unroll
  for (int c = 0; c < D; ++c) x[c] *= norm;
}
struct SeedSigns {
  uint64_t seed;
  FA_HD bool operator()(int c) const { return sign_flip(seed, c); }
};
template <int D>
FA_HD void rotate_row(float (&x)[D], uint64_t seed) { rotate_row_with<D>(x, SeedSigns{seed}); }

// The scale of a block whose largest |x| is amax (an all-zero block keeps scale 1: any scale represents it).
FA_HD float scale_of(float amax) { return amax > 0.f ? amax / kE4m3Max : 1.f; }

}  // namespace wsq::fp8

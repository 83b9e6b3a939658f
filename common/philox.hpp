// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a counter-based
// RNG. Its output is a pure function of (counter, key), so any thread of any kernel - and the CPU
// reference - can draw the random number for element (b, h, i, j) directly, without shared state.
// That is what lets the backward pass regenerate the forward's dropout mask from (seed, offset) alone.
#pragma once
#include <cstdint>

#include "hd.hpp"

namespace fa {

struct Philox4 {
  uint32_t x, y, z, w;
};

FA_HD uint32_t mulhi32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return uint32_t((uint64_t(a) * b) >> 32);
#endif
}

// The constants are the published ones (multipliers and the Weyl key increments).
FA_HD Philox4 philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = mulhi32(kM0, ctr.x), lo0 = kM0 * ctr.x;
    const uint32_t hi1 = mulhi32(kM1, ctr.z), lo1 = kM1 * ctr.z;
    ctr = {hi1 ^ ctr.y ^ k0, lo1, hi0 ^ ctr.w ^ k1, lo0};
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// Dropout keep-mask for element (row i, column j) of head (b, h). One Philox call yields 4 numbers,
// used for the 4 columns 4*(j/4) .. 4*(j/4)+3 of the row. Counter = (j/4, i, b<<16 | h, offset),
// key = seed: distinct for every element as long as heads < 65536 and batch < 65536.
// Keep iff the 32-bit draw u satisfies u >= p * 2^32, i.e. with probability 1 - p.
FA_HD uint32_t dropout_threshold(float p) {
  const double t = double(p) * 4294967296.0;
  return t >= 4294967295.0 ? 0xFFFFFFFFu : uint32_t(t);
}
FA_HD bool dropout_keep(uint64_t seed, uint64_t offset, int b, int h, int i, int j, uint32_t threshold) {
  const Philox4 r = philox4x32_10({uint32_t(j) >> 2, uint32_t(i), (uint32_t(b) << 16) | uint32_t(h),
                                   uint32_t(offset)},
                                  uint32_t(seed), uint32_t(seed >> 32));
  const uint32_t lane = uint32_t(j) & 3u;
  const uint32_t u = lane == 0 ? r.x : lane == 1 ? r.y : lane == 2 ? r.z : r.w;
  return u >= threshold;
}

}  // namespace fa

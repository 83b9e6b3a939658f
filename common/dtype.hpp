// Host-side 16-bit float types, bit-compatible with CUDA's __half and __nv_bfloat16, so host code
// (random inputs, .npy files, error metrics) handles fp16/bf16 without including CUDA headers.
// Conversions round to nearest even, as the hardware does.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace fa {

struct half_t {
  uint16_t bits;
};
struct bfloat16_t {
  uint16_t bits;
};

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float to_float(float x) { return x; }
inline float to_float(bfloat16_t x) { return bits_to_float(uint32_t(x.bits) << 16); }
inline float to_float(half_t x) {
  const uint32_t sign = uint32_t(x.bits & 0x8000u) << 16;
  const uint32_t exp = (x.bits >> 10) & 0x1Fu, man = x.bits & 0x3FFu;
  if (exp == 0x1F) return bits_to_float(sign | 0x7F800000u | (man << 13));  // inf / nan
  if (exp == 0) {                                                           // zero / subnormal
    const float mag = float(man) * (1.0f / 16777216.0f);                    // man * 2^-24
    return sign ? -mag : mag;
  }
  return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
}

template <class T> T from_float(float f);
template <> inline float from_float<float>(float f) { return f; }
template <> inline bfloat16_t from_float<bfloat16_t>(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return {uint16_t((u >> 16) | 0x40u)};  // quiet nan
  return {uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}
template <> inline half_t from_float<half_t>(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return {uint16_t(sign | 0x7E00u)};  // nan
  if (a >= 0x477FF000u) return {uint16_t(sign | 0x7C00u)};  // rounds to inf (>= 65520)
  if (a < 0x38800000u) {                                     // subnormal half: round |f| * 2^24
    const float mag = bits_to_float(a) * 16777216.0f;
    const float r = mag + 12582912.0f - 12582912.0f;  // round to nearest even integer (1.5 * 2^23)
    return {uint16_t(sign | uint16_t(r))};
  }
  const uint32_t rounded = a + 0xFFFu + ((a >> 13) & 1u);
  return {uint16_t(sign | uint16_t((rounded - (112u << 23)) >> 13))};
}

template <class T> const char* dtype_name();
template <> inline const char* dtype_name<float>() { return "fp32"; }
template <> inline const char* dtype_name<half_t>() { return "fp16"; }
template <> inline const char* dtype_name<bfloat16_t>() { return "bf16"; }

}  // namespace fa

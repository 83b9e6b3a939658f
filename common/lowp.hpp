// Low precision (chapters 05 and 06): the fp16/bf16 dtype of a run, rounding inputs to it, and the rule that
// judges a low-precision kernel.
//
// Conventions: `--dtype fp16|bf16` (default fp16). Inputs are rounded to the dtype once, on load (a float16
// .npy is already fp16 and stays as it is; bf16 has no NumPy dtype, so bf16 inputs come as float32 and are
// rounded). The fp64 reference and the fp32 chapters are then fed the *rounded* values, widened exactly, so
// every error measured is the kernel's own and not the inputs' rounding.
//
// The rule (FlashAttention's): a kernel's max error vs the fp64 reference may be at most
//   2 x (the max error of a plain attention in the same dtype) + a floor.
// "Plain" rounds where a straightforward fp16/bf16 implementation rounds (PyTorch's math path, one kernel
// per step): S = scale Q K^T is stored in the dtype, P = softmax(S) is computed in fp32 and stored in the
// dtype, O = P V is accumulated in fp32 and stored in the dtype. A fused kernel keeps S in fp32 and rounds
// only P (for the P V product) and O, so it should do better than plain; 2x leaves room for a different
// summation order. The floor is one unit in the last place at magnitude 1 (2^-10 fp16, 2^-7 bf16): the
// output itself is stored in the dtype, so no kernel can beat half of that on an O of magnitude ~1, and a
// plain error that happens to be tiny on a small problem must not make the rule impossible.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "block_mask.hpp"
#include "dtype.hpp"
#include "inputs.hpp"
#include "problem.hpp"

namespace fa {

enum class Dtype { fp16, bf16 };

inline const char* dtype_name(Dtype t) { return t == Dtype::fp16 ? "fp16" : "bf16"; }
inline Dtype parse_dtype(const std::string& s) {
  if (s == "fp16") return Dtype::fp16;
  if (s == "bf16") return Dtype::bf16;
  throw UsageError("--dtype must be fp16 or bf16 (got '" + s + "')");
}

// x rounded to the dtype (nearest even) and widened back to float: exactly the values a kernel reads.
inline float round_to(Dtype t, float x) {
  return t == Dtype::fp16 ? to_float(from_float<half_t>(x)) : to_float(from_float<bfloat16_t>(x));
}
inline std::vector<float> rounded(Dtype t, std::vector<float> x) {
  for (float& e : x) e = round_to(t, e);
  return x;
}
// x rounded to the dtype, as rounded() does, for a tensor a program read: a UsageError names the tensor and the
// element where a finite fp32 value becomes inf in the dtype (beyond fp16's 65504, say), before any GPU work.
inline std::vector<float> rounded_input(Dtype t, std::vector<float> x, const std::string& name) {
  x = rounded(t, std::move(x));
  for (size_t e = 0; e < x.size(); ++e)
    if (!std::isfinite(x[e]))
      throw UsageError(name + " element " + std::to_string(e) + " is beyond the range of " + dtype_name(t) +
                       " (its largest finite value: " + (t == Dtype::fp16 ? "65504" : "3.4e38") + ")");
  return x;
}
// A program's inputs rounded to the dtype on load, each checked as rounded_input does: q, k, v, and dO if loaded.
inline void round_inputs(Dtype t, HostTensors& in) {
  in.q = rounded_input(t, std::move(in.q), "q.npy");
  in.k = rounded_input(t, std::move(in.k), "k.npy");
  in.v = rounded_input(t, std::move(in.v), "v.npy");
  if (!in.dout.empty()) in.dout = rounded_input(t, std::move(in.dout), "do.npy");
}

// The 16-bit values themselves, for upload (T = half_t or bfloat16_t).
template <class T>
std::vector<T> to_dtype(const std::vector<float>& x) {
  std::vector<T> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = from_float<T>(x[i]);
  return y;
}

// Unit in the last place at magnitude 1: the floor of the error rule (see above).
inline double lowp_floor(Dtype t) { return t == Dtype::fp16 ? 0x1p-10 : 0x1p-7; }
// The most a kernel's max abs error may be, given the plain same-dtype attention's on the same inputs.
inline double lowp_error_bound(Dtype t, double plain_max_abs_err) { return 2.0 * plain_max_abs_err + lowp_floor(t); }

// Plain same-dtype attention for query rows [i0, i1) of head (b, h), rounding as described above.
// q, k, v hold dtype values (already rounded, widened to float). o: [i1 - i0, head_dim], widened from the
// dtype. Masked keys are left out; a row that sees no key gives O = 0. No dropout (chapters 05/06 have none).
// mask: a block mask (block_mask.hpp) whose masked keys are left out too; nullptr = none.
inline void plain_lowp_forward_rows(Dtype t, const Problem& p, int b, int h, int i0, int i1, const float* q,
                                    const float* k, const float* v, float* o, const BlockMask* mask = nullptr) {
  const int d = p.head_dim, Nk = p.kv_len;
  const float scale = p.softmax_scale();
  const float* Q = q + p.q_offset(b, h);
  const float* K = k + p.kv_offset(b, p.kv_head_of(h));
  const float* V = v + p.kv_offset(b, p.kv_head_of(h));
  std::vector<float> S(Nk), P(Nk);
  for (int i = i0; i < i1; ++i) {
    const int n = p.visible_keys(i);
    auto on = [&](int j) { return mask == nullptr || mask->visible(i, j); };
    float m = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < n; ++j) {
      float s = 0.f;  // fp32 accumulation, as tensor cores do
      for (int c = 0; c < d; ++c) s += Q[size_t(i) * d + c] * K[size_t(j) * d + c];
      S[j] = on(j) ? round_to(t, s * scale) : -std::numeric_limits<float>::infinity();  // S stored in the dtype
      m = std::max(m, S[j]);
    }
    if (m == -std::numeric_limits<float>::infinity()) {  // no key seen: O = 0
      std::fill(o + size_t(i - i0) * d, o + size_t(i - i0 + 1) * d, 0.f);
      continue;
    }
    float l = 0.f;
    for (int j = 0; j < n; ++j) l += (P[j] = on(j) ? std::exp(S[j] - m) : 0.f);
    for (int j = 0; j < n; ++j) P[j] = round_to(t, P[j] / l);  // P stored in the dtype
    for (int c = 0; c < d; ++c) {
      float acc = 0.f;
      for (int j = 0; j < n; ++j) acc += P[j] * V[size_t(j) * d + c];
      o[size_t(i - i0) * d + c] = round_to(t, acc);  // O stored in the dtype
    }
  }
}

}  // namespace fa

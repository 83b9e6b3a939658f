// Step 11 (FP8) in plain C++: the quantisation pass (block or tensor scales, the optional Hadamard rotation of Q
// and K, V transposed and its keys permuted) producing the same bytes as forward/fp8_quant.cu, and a plain fp8
// attention on those bytes - e4m3 products accumulated in fp32, the descales folded into S and O, P rounded to
// e4m3 with the fixed scale kPScale - that the error rule compares step 11 with (FP8.md). Plus the
// check the program and the tests apply: O and LSE against the fp64 reference of the unquantised inputs, at most
// 2x the plain fp8 attention's error plus a floor.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "forward/check.hpp"
#include "hopper/fp8.hpp"
#include "metrics.hpp"
#include "problem.hpp"
#include "random.hpp"
#include "reference.hpp"

namespace wsq::fp8 {

// What the quantisation pass writes (fp8.hpp's layouts) and the scales: s[plane * tiles(len) + tile].
struct Quantised {
  std::vector<uint8_t> q, k, vt;
  std::vector<float> sq, sk, sv;
};

namespace model {
// Rows [planes][len][d] of x (rotated first if asked), their scales per 128-row block or for the whole tensor,
// and the e4m3 bytes: put(plane, row, col, byte) stores each.
template <class Put>
void quantise_tensor(const float* x, int planes, int len, int d, const Options& o, bool rotate, std::vector<float>& s,
                     Put put) {
  std::vector<float> y(x, x + size_t(planes) * len * d);
  if (rotate)
    for (size_t r = 0; r < size_t(planes) * len; ++r) {
      float* row = y.data() + r * d;
      if (d == 64) rotate_row<64>(*reinterpret_cast<float(*)[64]>(row), o.seed);
      else rotate_row<128>(*reinterpret_cast<float(*)[128]>(row), o.seed);
    }
  const int T = tiles(len);
  s.assign(size_t(planes) * T, 0.f);
  for (int pl = 0; pl < planes; ++pl)
    for (int r = 0; r < len; ++r)
      for (int c = 0; c < d; ++c) {
        float& a = s[size_t(pl) * T + r / kBlockRows];
        a = std::max(a, std::fabs(y[(size_t(pl) * len + r) * d + c]));
      }
  if (o.scaling == Scaling::tensor) {
    const float amax = s.empty() ? 0.f : *std::max_element(s.begin(), s.end());
    std::fill(s.begin(), s.end(), amax);
  }
  for (float& a : s) a = scale_of(a);
  for (int pl = 0; pl < planes; ++pl)
    for (int r = 0; r < len; ++r) {
      const float inv = 1.f / s[size_t(pl) * T + r / kBlockRows];
      for (int c = 0; c < d; ++c) put(pl, r, c, e4m3_bits(y[(size_t(pl) * len + r) * d + c] * inv));
    }
}
}  // namespace model

// The quantisation pass on the CPU. q, k, v: the inputs as floats ([B,H,Nq,d], [B,Hkv,Nk,d]).
inline Quantised quantise(const fa::Problem& p, const Options& o, const float* q, const float* k, const float* v) {
  const int d = p.head_dim, Nk = p.kv_len, Nkp = padded_keys(Nk);
  const int pq = p.batch * p.heads, pk = p.batch * p.kv_heads;
  Quantised z;
  z.q.assign(size_t(pq) * p.q_len * kRowBytes, 0);
  z.k.assign(size_t(pk) * Nk * kRowBytes, 0);
  z.vt.assign(size_t(pk) * d * Nkp, 0);
  model::quantise_tensor(q, pq, p.q_len, d, o, o.hadamard, z.sq, [&](int pl, int r, int c, uint8_t b) {
    z.q[(size_t(pl) * p.q_len + r) * kRowBytes + c] = b;
  });
  model::quantise_tensor(k, pk, Nk, d, o, o.hadamard, z.sk, [&](int pl, int r, int c, uint8_t b) {
    z.k[(size_t(pl) * Nk + r) * kRowBytes + c] = b;
  });
  // V: key r goes to the position p whose key_at(p) is r (within its 16-key group).
  std::vector<int> pos_of(16);
  for (int x = 0; x < 16; ++x) pos_of[key_at(x)] = x;
  model::quantise_tensor(v, pk, Nk, d, o, false, z.sv, [&](int pl, int r, int c, uint8_t b) {
    z.vt[(size_t(pl) * d + c) * Nkp + (r / 16) * 16 + pos_of[r % 16]] = b;
  });
  return z;
}

// Plain fp8 attention on the quantised bytes for query rows [i0, i1) of head (b, h): S = e4m3 products summed in
// fp32, times the two descales and the softmax scale; P = exp(S - rowmax) in fp32, l = sum P; P rounded to e4m3
// after the fixed scale kPScale; O = sum (P8 / kPScale) V8 sv / l rounded to bf16 (the kernel's output dtype).
// o: [i1 - i0][d]; lse: [i1 - i0] (natural log; -inf for a row that sees no key, O = 0).
inline void attention_rows(const fa::Problem& p, const Quantised& z, int b, int h, int i0, int i1, float* o,
                           float* lse) {
  const int d = p.head_dim, Nk = p.kv_len, Nkp = padded_keys(Nk), Tq = tiles(p.q_len), Tk = tiles(Nk);
  const int pq = b * p.heads + h, pk = b * p.kv_heads + p.kv_head_of(h);
  std::vector<int> pos_of(16);
  for (int x = 0; x < 16; ++x) pos_of[key_at(x)] = x;
  std::vector<float> S(Nk), P(Nk);
  for (int i = i0; i < i1; ++i) {
    const int n = p.visible_keys(i);
    const uint8_t* Q = z.q.data() + (size_t(pq) * p.q_len + i) * kRowBytes;
    float m = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < n; ++j) {
      const uint8_t* K = z.k.data() + (size_t(pk) * Nk + j) * kRowBytes;
      float s = 0.f;
      for (int c = 0; c < d; ++c) s += e4m3_value(Q[c]) * e4m3_value(K[c]);
      S[j] = s * z.sq[size_t(pq) * Tq + i / kBlockRows] * z.sk[size_t(pk) * Tk + j / kBlockRows] * p.softmax_scale();
      m = std::max(m, S[j]);
    }
    float* O = o + size_t(i - i0) * d;
    if (n == 0) {
      std::fill(O, O + d, 0.f);
      lse[i - i0] = -std::numeric_limits<float>::infinity();
      continue;
    }
    float l = 0.f;
    for (int j = 0; j < n; ++j) l += (P[j] = std::exp(S[j] - m));
    for (int j = 0; j < n; ++j) P[j] = e4m3_round(P[j] * kPScale);
    for (int c = 0; c < d; ++c) {
      float acc = 0.f;
      for (int j = 0; j < n; ++j) {
        const uint8_t vb = z.vt[(size_t(pk) * d + c) * Nkp + (j / 16) * 16 + pos_of[j % 16]];
        acc += P[j] * e4m3_value(vb) * z.sv[size_t(pk) * Tk + j / kBlockRows];
      }
      O[c] = fa::to_float(fa::from_float<fa::bfloat16_t>(acc / (kPScale * l)));
    }
    lse[i - i0] = m + std::log(l);
  }
}

// The accuracy lab's inputs (the FA3 paper's setting): N(0, 1), with each entry drawn from N(0, 10^2) instead with
// probability `outliers` (0.001: 0.1%), rounded to bf16 (the quantisation pass reads bf16).
inline std::vector<float> lab_inputs(size_t n, uint64_t seed, double outliers) {
  fa::Rng rng(seed);
  std::vector<float> x(n);
  for (float& e : x) {
    const double z = rng.normal();
    e = fa::to_float(fa::from_float<fa::bfloat16_t>(float(rng.uniform() < outliers ? 10.0 * z : z)));
  }
  return x;
}

// The rule's floor: O is written in bf16, whose rounding alone moves an O of magnitude ~1 by up to 2^-8; 2^-7 as
// for every bf16 output of the chapter. LSE: its own floor (the rounding of fp32 exp/log on logits of ~10).
constexpr double kFloorO = 0x1p-7, kFloorLse = 1e-4;

// The fp64 reference (on the unquantised inputs) and the plain fp8 attention on the rows to check - all of them
// when cheap, else bands of rows as lowp_reference picks them - and the bounds the rule gives.
struct Reference {
  LowpReference ref;  // pieces, fp64 O and LSE
  double plain_err_lse = 0, bound_lse = 0;
};
inline Reference reference(const fa::Problem& p, const Options& o, const std::vector<float>& q,
                           const std::vector<float>& k, const std::vector<float>& v, double budget = 2e9) {
  Reference r;
  r.ref = lowp_reference(fa::Dtype::bf16, p, q, k, v, budget);  // pieces and fp64 rows (its plain error: replaced)
  const Quantised z = quantise(p, o, q.data(), k.data(), v.data());
  r.ref.plain_err = 0;
  for (size_t x = 0; x < r.ref.pieces.size(); ++x) {
    const auto& c = r.ref.pieces[x];
    const int rows = c.i1 - c.i0;
    std::vector<float> po(size_t(rows) * p.head_dim), pl(rows);
    attention_rows(p, z, c.b, c.h, c.i0, c.i1, po.data(), pl.data());
    for (size_t e = 0; e < po.size(); ++e) r.ref.plain_err = std::max(r.ref.plain_err, std::fabs(po[e] - r.ref.o[x][e]));
    for (int e = 0; e < rows; ++e)
      if (std::isfinite(r.ref.lse[x][e])) r.plain_err_lse = std::max(r.plain_err_lse, std::fabs(pl[e] - r.ref.lse[x][e]));
  }
  r.ref.bound = 2.0 * r.ref.plain_err + kFloorO;
  r.bound_lse = 2.0 * r.plain_err_lse + kFloorLse;
  r.ref.what += std::string(", fp8 ") + (o.scaling == Scaling::block ? "block" : "tensor") + " scales" +
                (o.hadamard ? " + Hadamard" : "");
  return r;
}

// A kernel's O (bf16 widened to float) and LSE against the reference: both at most 2x the plain fp8 attention's
// error plus the floors.
inline LowpCheck check_forward(const fa::Problem& p, const Reference& r, const std::vector<float>& o,
                               const std::vector<float>& lse) {
  LowpCheck c;
  c.plain_err = r.ref.plain_err, c.bound = r.ref.bound, c.what = r.ref.what;
  for (size_t x = 0; x < r.ref.pieces.size(); ++x) {
    const auto& pc = r.ref.pieces[x];
    c.o += fa::compare(o.data() + p.q_offset(pc.b, pc.h) + size_t(pc.i0) * p.head_dim, r.ref.o[x].data(),
                       r.ref.o[x].size(), fa::Tolerance{r.ref.bound, 0});
    c.lse += fa::compare(lse.data() + p.lse_offset(pc.b, pc.h) + pc.i0, r.ref.lse[x].data(), r.ref.lse[x].size(),
                         fa::Tolerance{r.bound_lse, 0});
  }
  return c;
}

}  // namespace wsq::fp8

// Step 11's CPU side (hopper/fp8.hpp, hopper/fp8_model.hpp): the e4m3 format, the permutation that makes S's
// accumulator registers the A operand of an 8-bit wgmma, the Hadamard rotation (orthogonal, Q K^T unchanged), and
// the model quantise -> attention -> dequantise against the fp64 reference: the error rule's plain fp8 attention
// must itself be close to fp64, block scales and the rotation must help where FP8.md says they do.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "hopper/fp8_model.hpp"
#include "reference.hpp"

using namespace wsq::fp8;

TEST_CASE("e4m3: exact values, round to nearest even, saturation at 448, subnormals, every byte round-trips") {
  CHECK(e4m3_round(1.f) == 1.f);
  CHECK(e4m3_round(448.f) == 448.f);
  CHECK(e4m3_round(1e6f) == 448.f);
  CHECK(e4m3_round(-500.f) == -448.f);
  CHECK(e4m3_round(1.0625f) == 1.f);     // halfway between 1 and 1.125: to even (mantissa 0)
  CHECK(e4m3_round(1.1875f) == 1.25f);   // halfway between 1.125 and 1.25: to even (mantissa 2)
  CHECK(e4m3_round(0x1p-9f) == 0x1p-9f); // the smallest subnormal
  CHECK(e4m3_round(0x1p-11f) == 0.f);    // below half of it
  CHECK(e4m3_round(0x1.8p-9f) == 0x1p-8f);  // 1.5 quanta: to even (2 quanta)
  CHECK(e4m3_round(15.5f) == 16.f);     // the quantum of [8, 16) is 1: 15.5 -> 16 (even), the next binade
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;  // NaN
    const float x = e4m3_value(uint8_t(b));
    CHECK(e4m3_bits(x) == (x == 0.f ? uint8_t(b & 0x80) : uint8_t(b)));
  }
  CHECK(pack4_e4m3(1.f, 2.f, -1.f, 0.f) == (uint32_t(e4m3_bits(1.f)) | uint32_t(e4m3_bits(2.f)) << 8 |
                                            uint32_t(e4m3_bits(-1.f)) << 16));
}

TEST_CASE("the permutation: every A position of an 8-bit wgmma gets, from its own lane's accumulators, the key Vt stores there") {
  // The accumulator layout (S, fp32): register 4n + e of lane (g, t) = row g + 8 (e / 2), key 8n + 2t + e % 2.
  // The A layout (e4m3, k32): register x byte i of lane (g, t) = row g + 8 (x % 2), position 16 (x / 2) + 4t + i.
  for (int kk = 0; kk < 4; ++kk)
    for (int t = 0; t < 4; ++t) {
      std::set<int> keys;
      for (int x = 0; x < 4; ++x)
        for (int i = 0; i < 4; ++i) {
          const int c = a_from_c(kk, x, i), n = c / 4, e = c % 4;
          const int row_c = 8 * (e / 2), key_c = 8 * n + 2 * t + e % 2;
          const int row_a = 8 * (x % 2), pos_a = 32 * kk + 16 * (x / 2) + 4 * t + i;
          CHECK(row_c == row_a);
          CHECK(key_c == (pos_a / 16) * 16 + key_at(pos_a % 16));
          CHECK(key_at(pos_a) == key_c);
          keys.insert(key_c + 100 * (x % 2));
        }
      CHECK(keys.size() == 16);  // 8 keys per row, 2 rows: no accumulator used twice
    }
  std::set<int> image;  // key_at is a permutation of every 16-key group
  for (int p = 0; p < 32; ++p) image.insert(key_at(p));
  CHECK(image.size() == 32);
  CHECK(*image.rbegin() == 31);
}

TEST_CASE("Hadamard: M = D H / sqrt(d) is orthogonal, and Q K^T is unchanged to fp32 rounding") {
  for (int d : {64, 128}) {
    INFO("d = ", d);
    // Row c of M is e_c M: rotate the unit vectors; M M^T = I.
    std::vector<std::vector<float>> M(d, std::vector<float>(d));
    for (int c = 0; c < d; ++c) {
      float e[128] = {};
      e[c] = 1.f;
      if (d == 64) rotate_row<64>(*reinterpret_cast<float(*)[64]>(e), 7);
      else rotate_row<128>(*reinterpret_cast<float(*)[128]>(e), 7);
      for (int x = 0; x < d; ++x) M[c][x] = e[x];
    }
    double worst = 0;
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b) {
        double dot = 0;
        for (int x = 0; x < d; ++x) dot += double(M[a][x]) * M[b][x];
        worst = std::max(worst, std::fabs(dot - (a == b)));
      }
    CHECK(worst < 1e-6);
    // Every entry of M has magnitude 1/sqrt(d): a spike e_c becomes flat (the outlier spread over all d features).
    for (int x = 0; x < d; ++x) CHECK(std::fabs(std::fabs(M[3][x]) - 1.f / std::sqrt(float(d))) < 1e-7f);
    // S = q k^T before and after the rotation of both, on vectors with an outlier.
    std::vector<float> q = lab_inputs(d, 1, 0.05), k = lab_inputs(d, 2, 0.05);
    q[5] = 40.f;
    double s = 0, s_rot = 0, norm = 0;
    for (int x = 0; x < d; ++x) s += double(q[x]) * k[x], norm += std::fabs(double(q[x]) * k[x]);
    float qr[128], kr[128];
    std::copy(q.begin(), q.end(), qr), std::copy(k.begin(), k.end(), kr);
    if (d == 64) {
      rotate_row<64>(*reinterpret_cast<float(*)[64]>(qr), 7), rotate_row<64>(*reinterpret_cast<float(*)[64]>(kr), 7);
    } else {
      rotate_row<128>(*reinterpret_cast<float(*)[128]>(qr), 7), rotate_row<128>(*reinterpret_cast<float(*)[128]>(kr), 7);
    }
    for (int x = 0; x < d; ++x) s_rot += double(qr[x]) * kr[x];
    CHECK(std::fabs(s - s_rot) <= 8 * 0x1p-23 * std::log2(double(d)) * norm);
    float amax = 0, amax_rot = 0;
    for (int x = 0; x < d; ++x) amax = std::max(amax, std::fabs(q[x])), amax_rot = std::max(amax_rot, std::fabs(qr[x]));
    CHECK(amax_rot < amax / 2);  // the outlier spread out: the block's scale, and its quantum, shrink
  }
}

namespace {
fa::Problem make(int H, int Hkv, int nq, int nk, int d, bool causal) {
  fa::Problem p;
  p.batch = 1, p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  return p;
}
// Max |O - O_fp64| of the model on the given inputs and options.
double model_err(const fa::Problem& p, const Options& o, const std::vector<float>& q, const std::vector<float>& k,
                 const std::vector<float>& v) {
  return reference(p, o, q, k, v, 1e30).ref.plain_err;
}
}  // namespace

TEST_CASE("model: quantise -> attention -> dequantise against fp64: close, and each idea where FP8.md says") {
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      const fa::Problem p = make(2, 1, 97, 203, d, causal);
      INFO("d = ", d, " causal = ", causal);
      const auto q = lab_inputs(p.q_elems(), 1, 0), k = lab_inputs(p.kv_elems(), 2, 0), v = lab_inputs(p.kv_elems(), 3, 0);
      for (Scaling s : {Scaling::tensor, Scaling::block})
        for (bool had : {false, true}) {
          Options o;
          o.scaling = s, o.hadamard = had;
          const Reference r = reference(p, o, q, k, v, 1e30);
          CHECK(r.ref.plain_err < 0.08);     // e4m3 has 3 mantissa bits: ~3% per value, averaged down in O
          CHECK(r.ref.plain_err > 1e-3);     // and it is not bf16
          CHECK(r.plain_err_lse < 0.1);
        }
    }
  // With outliers (0.1% of entries from N(0, 10^2)): per-block beats per-tensor, and the rotation beats both.
  const fa::Problem p = make(4, 4, 256, 512, 128, false);
  const auto q = lab_inputs(p.q_elems(), 11, 0.001), k = lab_inputs(p.kv_elems(), 12, 0.001),
             v = lab_inputs(p.kv_elems(), 13, 0.001);
  Options tensor, block, rotated;
  tensor.scaling = Scaling::tensor, rotated.hadamard = true;
  const double e_tensor = model_err(p, tensor, q, k, v), e_block = model_err(p, block, q, k, v),
               e_rot = model_err(p, rotated, q, k, v);
  CHECK(e_block < e_tensor);
  CHECK(e_rot < e_block);
}

TEST_CASE("model layouts: Vt holds V transposed with each 16-key group permuted, pads zero, scales per 128-row block") {
  const fa::Problem p = make(1, 1, 5, 150, 64, false);
  std::vector<float> q(p.q_elems(), 1.f), k(p.kv_elems(), 1.f), v(p.kv_elems());
  for (int j = 0; j < p.kv_len; ++j)
    for (int c = 0; c < 64; ++c) v[size_t(j) * 64 + c] = float(j < 128 ? 1 + (j + c) % 7 : 2 * (1 + (j + c) % 7));
  const Quantised z = quantise(p, Options{}, q.data(), k.data(), v.data());
  REQUIRE(z.sv.size() == 2);
  CHECK(z.sv[0] == 7.f / kE4m3Max);
  CHECK(z.sv[1] == 14.f / kE4m3Max);
  const int Nkp = padded_keys(p.kv_len);
  CHECK(Nkp == 256);
  for (int c = 0; c < 64; ++c)
    for (int pos = 0; pos < Nkp; ++pos) {
      const int j = key_at(pos);
      const float want = j < p.kv_len ? v[size_t(j) * 64 + c] : 0.f;
      CHECK(e4m3_value(z.vt[size_t(c) * Nkp + pos]) * z.sv[j / kBlockRows] == doctest::Approx(want).epsilon(0.07));
    }
  for (int r = 0; r < p.q_len; ++r)
    for (int c = 64; c < kRowBytes; ++c) CHECK(z.q[size_t(r) * kRowBytes + c] == 0);
}

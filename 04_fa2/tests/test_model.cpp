// CPU tests (CI): the chapter's plain C++ FA2 model equals the fp64 reference, forward and backward.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "block_mask.hpp"
#include "formulas.hpp"
#include "model.hpp"
#include "program.hpp"
#include "reference.hpp"
#include "testing.hpp"

using namespace fa;

namespace {
// Large logits: scale = 25/sqrt(d) instead of 1/sqrt(d) makes S reach ~200 (inputs N(0.5, 1)), past
// log(FLT_MAX) = 88.7, so exp(S) without the running max would overflow fp32. The fp32 rounding of S grows
// with |S| (about u * sum |scale q_x k_x|, a few u |S|): at |S| ~ 200 that is ~5e-5 in S and so, relatively,
// in P, O and L; observed up to 1e-4 on O, 1e-3 on the 25x larger gradients. Hence 5x that.
constexpr Tolerance kTolLargeLogitsForward{5e-4, 1e-4};
constexpr Tolerance kTolLargeLogitsBackward{2e-3, 5e-4};
float large_logit_scale(int d) { return 25.f / std::sqrt(float(d)); }

void check_model(const Problem& p, const BlockMask* mask = nullptr) {
  INFO(describe(p), mask ? " block-sparse, density " + std::to_string(mask->density()) : std::string());
  const bool large = p.scale > 1.f / std::sqrt(float(p.head_dim));
  const Tolerance tol_f = large ? kTolLargeLogitsForward : kTolFp32Forward;
  const Tolerance tol_b = large ? kTolLargeLogitsBackward : kTolFp32Backward;
  const HostTensors in = random_inputs(p, true);
  std::vector<float> o, lse, dq, dk, dv;
  fa2_model::forward(p, in.q.data(), in.k.data(), in.v.data(), o, lse, mask);
  fa2_model::backward(p, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), in.dout.data(), dq, dk, dv, mask);
  std::vector<double> ro, rl, rq, rk, rv;
  reference_forward(p, in.q.data(), in.k.data(), in.v.data(), ro, rl, mask);
  reference_backward(p, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), rq, rk, rv, mask);
  const auto eo = compare(o, ro, tol_f), el = compare(lse, rl, tol_f);
  const auto eq = compare(dq, rq, tol_b), ek = compare(dk, rk, tol_b), ev = compare(dv, rv, tol_b);
  CHECK_MESSAGE(eo.ok(), eo.summary("O"));
  CHECK_MESSAGE(el.ok(), el.summary("LSE"));
  CHECK_MESSAGE(eq.ok(), eq.summary("dQ"));
  CHECK_MESSAGE(ek.ok(), ek.summary("dK"));
  CHECK_MESSAGE(ev.ok(), ev.summary("dV"));
}
Problem make(int B, int H, int Hkv, int nq, int nk, int d, bool causal, float dropout = 0.f) {
  Problem p;
  p.batch = B, p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  p.dropout_p = dropout, p.seed = 7 + nq + nk, p.offset = 1;
  return p;
}
}  // namespace

TEST_CASE("04 model equals the fp64 reference: ragged lengths across block edges, causal on/off") {
  // 130 and 70 cross the 64-row tiles; 203 x 113 gives empty causal rows, 113 x 203 skipped K/V blocks.
  for (auto [nq, nk] : std::vector<std::pair<int, int>>{{1, 1}, {17, 17}, {130, 70}, {70, 130}, {113, 203}, {203, 113}})
    for (bool causal : {false, true}) check_model(make(1, 2, 2, nq, nk, 16, causal));
}

TEST_CASE("04 model: GQA (8 heads / 2 kv heads), MQA (kv heads 1), custom scale") {
  check_model(make(1, 8, 2, 70, 97, 8, true));
  check_model(make(2, 4, 1, 97, 70, 8, false));
  Problem p = make(1, 2, 1, 65, 129, 16, true);
  p.scale = 0.3f;
  check_model(p);
}

TEST_CASE("04 model: dropout (same Philox mask as the reference), causal with q_len != kv_len") {
  for (float drop : {0.1f, 0.5f}) check_model(make(1, 4, 2, 97, 150, 8, true, drop));
  check_model(make(2, 2, 1, 150, 97, 8, true, 0.2f));
}

TEST_CASE("04 model: large logits (S ~ 200: exp(S) alone would overflow fp32), causal, GQA 3, tile multiples") {
  for (int d : {16, 64}) {
    Problem p = make(1, 3, 1, 130, 97, d, true);  // GQA ratio 3; q_len > kv_len: empty rows and a partial block
    p.scale = large_logit_scale(d);
    const HostTensors in = random_inputs(p, false);
    std::vector<double> ro, rl;
    reference_forward(p, in.q.data(), in.k.data(), in.v.data(), ro, rl);
    double max_lse = -INFINITY;
    for (double L : rl) max_lse = std::max(max_lse, L);
    INFO("largest LSE ", max_lse);
    CHECK(std::exp(float(max_lse)) == INFINITY);  // the inputs are large enough that the running max matters
    check_model(p);
    p.q_len = p.kv_len = 128;  // exact tile multiples: no ragged block
    check_model(p);
  }
}

TEST_CASE("04 model: q_len 1 with kv_len > 1 and the reverse; a whole Q block that sees no key") {
  for (bool causal : {false, true}) {
    check_model(make(1, 2, 1, 1, 130, 16, causal));
    check_model(make(1, 2, 1, 130, 1, 16, causal));
  }
  check_model(make(1, 2, 2, 64 + 64 + 17, 17, 16, true));  // rows 0..127 see no key: two whole Q blocks
}

TEST_CASE("04 HBM counts: every Q block streams the K/V rows it sees; causal blocks skipped") {
  Problem p = make(1, 1, 1, 1024, 1024, 64, false);
  const double N = 1024, d = 64, T = 16;  // 64-row blocks
  CHECK(fa2_model::hbm_bytes_forward(p, 64) == 4 * (2 * N * d + N + 2 * T * N * d));
  // Backward, K/V tiles of 64 keys and 32 query rows, deterministic dQ with 64-row Q blocks.
  const double d_kernel = 4 * N * (2 * d + 1), kv_kernel = 4 * (4 * N * d + T * N * (2 * d + 2));
  CHECK(fa2_model::hbm_bytes_backward(p, true, 32, 64, 64) == d_kernel + kv_kernel + 4 * T * N * 2 * d);
  CHECK(fa2_model::hbm_bytes_backward(p, false, 32, 64, 64) ==
        d_kernel + kv_kernel + 4 * (N * (3 * d + 2) + 2 * T * N * d));
  // Causal, Nq = Nk: Q block i sees 64 (i + 1) keys, 64 (1 + ... + 16) = 8704 in all; K/V block j is read
  // by the N - 64 j query rows at and below the diagonal, 8704 as well.
  p.causal = true;
  CHECK(fa2_model::hbm_bytes_forward(p, 64) == 4 * (2 * N * d + N + 2 * 8704 * d));
  CHECK(fa2_model::hbm_bytes_backward(p, true, 32, 64, 64) ==
        4 * N * (2 * d + 1) + 4 * (4 * N * d + 8704 * (2 * d + 2)) + 4 * 8704 * 2 * d);
  // Bottom-right alignment: Nq = 192, Nk = 64 leaves query rows 0..127 with no key, so only the last
  // Q block reads K/V; Nq = 64, Nk = 192 lets every row see keys up to i + 128, i.e. all 192.
  p = make(1, 1, 1, 192, 64, 64, true);
  CHECK(fa2_model::hbm_bytes_forward(p, 64) == 4 * (2 * 192 * d + 192 + 2 * 64 * d));
  p = make(1, 1, 1, 64, 192, 64, true);
  CHECK(fa2_model::hbm_bytes_forward(p, 64) == 4 * (2 * 64 * d + 64 + 2 * 192 * d));
}

TEST_CASE("04 model, block-sparse: equals the fp64 reference with the same block mask (masked tiles skipped)") {
  // Ragged lengths across the 128 x 64 mask blocks and the 64 x 64 tiles; causal on/off; GQA; masks with
  // rows of blocks that see nothing (random 0.3) and the three generators.
  for (auto [nq, nk] : std::vector<std::pair<int, int>>{{1, 1}, {17, 17}, {97, 97}, {113, 203}, {203, 113}, {300, 260}})
    for (bool causal : {false, true}) {
      const Problem p = make(1, 4, 2, nq, nk, 8, causal);
      for (const BlockMask& m : {local_block_mask(p, 64), strided_block_mask(p, 2), random_block_mask(p, 0.3, 9),
                                 dense_block_mask(p)})
        check_model(p, &m);
    }
}

TEST_CASE("04 model, block-sparse: a fully masked row block (O = 0, LSE = -inf) and an unseen key block") {
  const Problem p = make(1, 2, 1, 300, 200, 16, false);
  BlockMask m = dense_block_mask(p);
  for (int c = 0; c < m.Tc; ++c) m.bits[size_t(1) * m.Tc + c] = 0;
  for (int r = 0; r < m.Tr; ++r) m.bits[size_t(r) * m.Tc + 1] = 0;
  check_model(p, &m);
  const HostTensors in = random_inputs(p, false);
  std::vector<float> o, lse;
  fa2_model::forward(p, in.q.data(), in.k.data(), in.v.data(), o, lse, &m);
  CHECK(lse[130] == -INFINITY);
  CHECK(o[130 * 16] == 0.f);
}

TEST_CASE("04 counts, block-sparse: HBM bytes and FLOPs of the visible tiles") {
  const double d = 64;
  Problem p = make(1, 1, 1, 1024, 1024, 64, false);  // 8 x 16 mask blocks; 16 forward Q tiles, 16 K/V tiles
  const BlockMask dense = dense_block_mask(p);
  CHECK(fa2_model::hbm_bytes_forward(p, 64, &dense) == fa2_model::hbm_bytes_forward(p, 64));
  CHECK(fa2_model::hbm_bytes_backward(p, true, 32, 64, 64, &dense) == fa2_model::hbm_bytes_backward(p, true, 32, 64, 64));
  CHECK(fa2_model::hbm_bytes_backward(p, false, 32, 64, 64, &dense) ==
        fa2_model::hbm_bytes_backward(p, false, 32, 64, 64));
  CHECK(fa::flops_forward(p, &dense) == flops_forward(p));
  CHECK(fa::flops_forward(p, nullptr) == flops_forward(p));
  // local:0 keeps the 2 diagonal key blocks of each row block: every Q tile streams 128 K/V rows, every K/V tile
  // is read by 128 query rows; 1024 x 128 pairs.
  const BlockMask diag = local_block_mask(p, 0);
  CHECK(diag.density() == 2.0 / 16);
  const double N = 1024, streamed = 16 * 128.0;
  CHECK(fa2_model::hbm_bytes_forward(p, 64, &diag) == 4 * (2 * N * d + N + 2 * streamed * d));
  CHECK(fa2_model::hbm_bytes_backward(p, true, 32, 64, 64, &diag) ==
        4 * N * (2 * d + 1) + 4 * (4 * N * d + streamed * (2 * d + 2)) + 4 * streamed * 2 * d);
  CHECK(fa2_model::hbm_bytes_backward(p, false, 32, 64, 64, &diag) ==
        4 * N * (2 * d + 1) + 4 * (4 * N * d + streamed * (2 * d + 2)) + 4 * (N * (3 * d + 2) + 2 * streamed * d));
  CHECK(fa::flops_forward(p, &diag) == 4 * d * N * 128);
  CHECK(fa::flops_backward(p, &diag) == 2.5 * 4 * d * N * 128);
  // Causal with the causal-equivalent mask: the causal counts (the mask removes nothing the causal test keeps).
  p.causal = true;
  const BlockMask cm = causal_block_mask(p);
  CHECK(fa2_model::hbm_bytes_forward(p, 64, &cm) == fa2_model::hbm_bytes_forward(p, 64));
  CHECK(fa::flops_forward(p, &cm) == flops_forward(p));
  // Density s: the K/V part of the forward's traffic and the FLOPs scale with s (exactly, on tile multiples).
  p.causal = false;
  const BlockMask r = random_block_mask(p, 0.25, 3);
  const double kv_dense = fa2_model::hbm_bytes_forward(p, 64) - 4 * (2 * N * d + N);
  CHECK(fa2_model::hbm_bytes_forward(p, 64, &r) - 4 * (2 * N * d + N) == doctest::Approx(r.density() * kv_dense));
  CHECK(fa::flops_forward(p, &r) == doctest::Approx(r.density() * flops_forward(p)));
}

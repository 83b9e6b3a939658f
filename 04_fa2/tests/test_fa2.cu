// GPU tests: every step of the 04 forward ladder (fa2::forward_steps()) and the backward in both dQ modes,
// against the fp64 reference AND against chapters 02 (forward: O, LSE) and 03 (backward: dQ, dK, dV) on the
// same inputs, outputs NaN-poisoned before every run. Shapes: the edge lengths (ragged against the tiles),
// exact tile multiples (64, 128, 1024), q_len 1 with kv_len > 1 and the reverse, causal on/off, head_dim
// 16/32/64/128, GQA (8/2, ratio 3), MQA, whole Q blocks that see no key, large logits, dropout.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "device_tensors.cuh"
#include "fa1_backward.cuh"
#include "fa2.cuh"
#include "reference.hpp"
#include "testing.hpp"

using namespace fa;

namespace {

Problem make(int B, int H, int Hkv, int nq, int nk, int d, bool causal, float dropout = 0.f) {
  Problem p;
  p.batch = B, p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  p.dropout_p = dropout, p.seed = 4321 + nq * 3 + nk + d, p.offset = 3;
  return p;
}

void expect(const ErrorReport& e, const std::string& what) { CHECK_MESSAGE(e.ok(), e.summary(what.c_str())); }

// Large logits: scale = 25/sqrt(d) makes S reach ~200, past log(FLT_MAX) = 88.7, so a kernel without the
// running max overflows. fp32 rounding of S grows with |S| (a few u |S| ~ 5e-5 at |S| ~ 200), relatively the
// same in P, O and L; the CPU model shows up to 1e-4 on O and 1e-3 on the (25x larger) gradients: 5x that.
constexpr Tolerance kTolLargeLogitsForward{5e-4, 1e-4};
constexpr Tolerance kTolLargeLogitsBackward{2e-3, 5e-4};
float large_logit_scale(int d) { return 25.f / std::sqrt(float(d)); }
bool large_logits(const Problem& p) { return p.scale > 1.f / std::sqrt(float(p.head_dim)); }

// Runs every 04 forward step, the 04 backward (both dQ modes, from fa2::forward's O and L), 02 and 03 on the
// same inputs and compares everything with the fp64 reference and 04 with 02/03.
void check_fa2(const Problem& p) {
  INFO(describe(p));
  const Tolerance tol_f = large_logits(p) ? kTolLargeLogitsForward : kTolFp32Forward;
  const Tolerance tol_b = large_logits(p) ? kTolLargeLogitsBackward : kTolFp32Backward;
  const HostTensors in = random_inputs(p, true);
  DeviceTensors t(p, in);
  DeviceBuffer<float> ws(fa2::backward_workspace_bytes(p) / sizeof(float));
  std::vector<double> ro, rl, rq, rk, rv;
  reference_forward(p, in.q.data(), in.k.data(), in.v.data(), ro, rl);
  reference_backward(p, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), rq, rk, rv);

  // The equivalence chain: 02 forward, 03 backward on the same inputs (same Philox dropout mask).
  DeviceBuffer<float> o1(p.q_elems()), l1(p.lse_elems()), m1(p.lse_elems()), lse1(p.lse_elems());
  DeviceBuffer<float> dq1(p.q_elems()), dk1(p.kv_elems()), dv1(p.kv_elems());
  o1.poison(), l1.poison(), m1.poison(), lse1.poison(), dq1.poison(), dk1.poison(), dv1.poison();
  const fa1::RngState rng = fa1::forward(p, t.q.get(), t.k.get(), t.v.get(), o1.get(), l1.get(), m1.get(), lse1.get());
  fa1::backward(p, rng, t.q.get(), t.k.get(), t.v.get(), o1.get(), l1.get(), m1.get(), t.dout.get(), dq1.get(),
                dk1.get(), dv1.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> o_02 = to_double(o1.download()), lse_02 = to_double(lse1.download());

  // The ladder: each step on poisoned outputs, against fp64 and 02; the last one's O and L feed the backward.
  std::vector<float> o, lse;
  for (const fa2::ForwardStep& step : fa2::forward_steps()) {
    INFO("forward step ", std::string(step.name));
    t.poison_outputs();
    step.launch(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    o = t.o.download(), lse = t.lse.download();
    expect(compare(o, ro, tol_f), std::string("04 ") + step.name + " O vs fp64");
    expect(compare(lse, rl, tol_f), std::string("04 ") + step.name + " LSE vs fp64");
    expect(compare(o, o_02, tol_f), std::string("04 ") + step.name + " O vs 02 O");
    expect(compare(lse, lse_02, tol_f), std::string("04 ") + step.name + " LSE vs 02 LSE");
  }

  std::vector<float> dq[2], dk[2], dv[2];
  const fa2::DqMode modes[] = {fa2::DqMode::Atomic, fa2::DqMode::Deterministic};
  for (int mi = 0; mi < 2; ++mi) {
    INFO(std::string(mi == 0 ? "dQ mode: Atomic" : "dQ mode: Deterministic"));
    t.dq.poison(), t.dk.poison(), t.dv.poison(), ws.poison();
    fa2::backward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), t.dout.get(), t.dq.get(), t.dk.get(),
                  t.dv.get(), modes[mi], ws.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    dq[mi] = t.dq.download(), dk[mi] = t.dk.download(), dv[mi] = t.dv.download();
    expect(compare(dq[mi], rq, tol_b), "04 dQ vs fp64");
    expect(compare(dk[mi], rk, tol_b), "04 dK vs fp64");
    expect(compare(dv[mi], rv, tol_b), "04 dV vs fp64");
  }

  for (int mi = 0; mi < 2; ++mi) {
    INFO(std::string(mi == 0 ? "dQ mode: Atomic" : "dQ mode: Deterministic"));
    expect(compare(dq[mi], to_double(dq1.download()), tol_b), "04 dQ vs 03 dQ");
    expect(compare(dk[mi], to_double(dk1.download()), tol_b), "04 dK vs 03 dK");
    expect(compare(dv[mi], to_double(dv1.download()), tol_b), "04 dV vs 03 dV");
  }
}

}  // namespace

TEST_CASE("04 vs fp64 reference and 02/03: edge lengths, causal on/off, d = 64, batch*heads > 1") {
  for (auto [nq, nk] : edge_lengths())
    for (bool causal : {false, true}) {
      const bool big = nq > 512;
      check_fa2(make(big ? 1 : 2, big ? 2 : 3, big ? 2 : 3, nq, nk, 64, causal));
    }
}

TEST_CASE("04 vs fp64 reference and 02/03: head_dim 16, 32, 128 on ragged rectangles both ways") {
  for (int d : {16, 32, 128})
    for (auto [nq, nk] : std::vector<std::pair<int, int>>{{113, 203}, {203, 113}})
      for (bool causal : {false, true}) check_fa2(make(2, 2, 2, nq, nk, d, causal));
}

TEST_CASE("04 vs fp64 reference and 02/03: GQA 8/2, MQA 8/1, causal with q_len != kv_len, custom scale") {
  for (int hkv : {2, 1})
    for (bool causal : {false, true}) {
      check_fa2(make(1, 8, hkv, 97, 203, 64, causal));
      check_fa2(make(2, 8, hkv, 203, 97, 32, causal));
    }
  Problem p = make(2, 4, 2, 130, 70, 64, true);
  p.scale = 0.05f;
  check_fa2(p);
}

TEST_CASE("04 vs fp64 reference and 02/03: exact tile multiples (the unmasked path), GQA ratio 3") {
  for (int n : {64, 128})
    for (bool causal : {false, true}) check_fa2(make(2, 3, 1, n, n, 64, causal));
  check_fa2(make(1, 2, 2, 1024, 1024, 64, false));
  check_fa2(make(1, 2, 2, 1024, 1024, 128, true));
  check_fa2(make(1, 6, 2, 97, 203, 32, true));  // GQA ratio 3, ragged
}

TEST_CASE("04 vs fp64 reference and 02/03: q_len 1 with kv_len > 1 and the reverse") {
  for (bool causal : {false, true}) {
    check_fa2(make(2, 4, 2, 1, 203, 64, causal));
    check_fa2(make(2, 4, 2, 203, 1, 64, causal));
  }
}

TEST_CASE("04 vs fp64 reference and 02/03: large logits (S ~ 200; exp(S) alone overflows fp32)") {
  for (int d : {32, 64, 128}) {
    Problem p = make(1, 4, 2, 203, 113, d, true);  // q_len - kv_len = 90 >= 64: a whole Q block sees no key
    p.scale = large_logit_scale(d);
    check_fa2(p);
    p.q_len = p.kv_len = 128;
    p.causal = false;
    check_fa2(p);
  }
}

TEST_CASE("04 vs fp64 reference and 02/03: dropout draws the same mask as 02/03 and the reference") {
  for (float drop : {0.1f, 0.5f}) {
    check_fa2(make(2, 4, 2, 113, 203, 64, true, drop));
    check_fa2(make(1, 2, 1, 203, 113, 128, false, drop));
  }
}

TEST_CASE("04: a fully masked row gives O = 0 and LSE = -inf; empty rows give dQ = 0") {
  const Problem p = make(1, 2, 2, 203, 113, 64, true);  // rows 0..89 see no key
  const HostTensors in = random_inputs(p, true);
  DeviceTensors t(p, in);
  DeviceBuffer<float> ws(fa2::backward_workspace_bytes(p) / sizeof(float));
  t.poison_outputs();
  fa2::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get());
  fa2::backward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), t.dout.get(), t.dq.get(), t.dk.get(),
                t.dv.get(), fa2::DqMode::Deterministic, ws.get());
  const auto o = t.o.download(), lse = t.lse.download(), dq = t.dq.download();
  for (int h = 0; h < p.heads; ++h)
    for (int i = 0; i < p.q_len - p.kv_len; ++i) {
      const float L = lse[p.lse_offset(0, h) + i];
      CHECK((std::isinf(L) && L < 0));
      for (int c = 0; c < p.head_dim; ++c) {
        CHECK(o[p.q_offset(0, h) + size_t(i) * p.head_dim + c] == 0.f);
        CHECK(dq[p.q_offset(0, h) + size_t(i) * p.head_dim + c] == 0.f);
      }
    }
}

TEST_CASE("04: the deterministic dQ is bit-identical run to run") {
  const Problem p = make(1, 8, 2, 1023, 1023, 64, true);
  const HostTensors in = random_inputs(p, true);
  DeviceTensors t(p, in);
  DeviceBuffer<float> ws(fa2::backward_workspace_bytes(p) / sizeof(float));
  fa2::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get());
  std::vector<float> first;
  for (int run = 0; run < 3; ++run) {
    t.dq.poison();
    fa2::backward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), t.dout.get(), t.dq.get(), t.dk.get(),
                  t.dv.get(), fa2::DqMode::Deterministic, ws.get());
    const std::vector<float> dq = t.dq.download();
    if (run == 0) first = dq;
    else CHECK(std::memcmp(first.data(), dq.data(), dq.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("04: unsupported head_dim is a UsageError naming the supported values") {
  Problem p = make(1, 1, 1, 8, 8, 48, false);
  CHECK_THROWS_WITH_AS(fa2::forward(p, nullptr, nullptr, nullptr, nullptr, nullptr),
                       doctest::Contains("16, 32, 64 or 128"), UsageError);
}

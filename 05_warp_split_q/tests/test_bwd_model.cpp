// CPU tests (CI): the backward's plain C++ model (the kernels' algorithm and rounding points) against the fp64
// reference with the error rule, and the plain same-dtype backward that the rule is measured by.
#include <doctest/doctest.h>

#include "program.hpp"

#include "bwd_testing.hpp"

using namespace fa;
using wsq_bwd_testing::Case;
using wsq_bwd_testing::make;

namespace {

void check_model(Dtype t, const Problem& p, double stddev = 1.0) {
  INFO(describe(p), " dtype=", std::string(dtype_name(t)), " stddev=", stddev);
  const Case c = wsq_bwd_testing::make_case(t, p, stddev);
  std::vector<float> dq, dk, dv;
  wsq_bwd_model::backward(t, p, c.q.data(), c.k.data(), c.v.data(), c.o.data(), c.lse.data(), c.dout.data(), dq, dk,
                          dv);
  const ErrorReport eq = wsq_bwd_testing::check(dq, c.rdq, c.bound_dq);
  const ErrorReport ek = wsq_bwd_testing::check(dk, c.rdk, c.bound_dk);
  const ErrorReport ev = wsq_bwd_testing::check(dv, c.rdv, c.bound_dv);
  CHECK_MESSAGE(eq.ok(), eq.summary("model dQ vs fp64"), " bound ", c.bound_dq);
  CHECK_MESSAGE(ek.ok(), ek.summary("model dK vs fp64"), " bound ", c.bound_dk);
  CHECK_MESSAGE(ev.ok(), ev.summary("model dV vs fp64"), " bound ", c.bound_dv);
}

}  // namespace

TEST_CASE("05 backward model: ragged lengths across the 64-key and 32/64-query tiles, causal on/off, fp16 and bf16") {
  for (Dtype t : {Dtype::fp16, Dtype::bf16})
    for (auto [nq, nk] : std::vector<std::pair<int, int>>{{1, 1}, {17, 17}, {97, 97}, {113, 203}, {203, 113}})
      for (bool causal : {false, true}) check_model(t, make(1, 2, 2, nq, nk, 64, causal));
}

TEST_CASE("05 backward model: head_dim 128 (Br = 32), GQA 8/2 and MQA 8/1, custom scale") {
  check_model(Dtype::fp16, make(1, 2, 1, 97, 70, 128, true));
  check_model(Dtype::bf16, make(1, 8, 2, 70, 97, 64, true));
  check_model(Dtype::fp16, make(2, 8, 1, 65, 129, 64, false));
  Problem p = make(1, 2, 1, 65, 129, 64, true);
  p.scale = 0.3f;
  check_model(Dtype::bf16, p);
}

TEST_CASE("05 backward model: large logits (one key dominates each row)") {
  for (Dtype t : {Dtype::fp16, Dtype::bf16}) check_model(t, make(1, 2, 1, 97, 113, 64, true), 6.0);
}

TEST_CASE("05 backward model: query rows that see no key (causal, q_len > kv_len) get dQ = 0") {
  const Problem p = make(1, 2, 2, 150, 70, 64, true);  // query rows 0..79 see no key
  const Case c = wsq_bwd_testing::make_case(Dtype::fp16, p);
  std::vector<float> dq, dk, dv;
  wsq_bwd_model::backward(Dtype::fp16, p, c.q.data(), c.k.data(), c.v.data(), c.o.data(), c.lse.data(),
                          c.dout.data(), dq, dk, dv);
  for (int h = 0; h < p.heads; ++h)
    for (int i = 0; i < p.q_len - p.kv_len; ++i)
      for (int e = 0; e < p.head_dim; ++e) CHECK(dq[p.q_offset(0, h) + size_t(i) * p.head_dim + e] == 0.f);
}

// The yardstick itself: its error must be of the dtype's order (neither 0 nor O(1)), larger for bf16.
TEST_CASE("05 plain same-dtype backward: error of the dtype's order, bf16 above fp16") {
  const Problem p = make(1, 2, 1, 97, 113, 64, true);
  double err[2];
  for (Dtype t : {Dtype::fp16, Dtype::bf16}) {
    const Case c = wsq_bwd_testing::make_case(t, p);
    err[int(t)] = (c.bound_dq - lowp_floor(t)) / 2;
    for (double b : {c.bound_dq, c.bound_dk, c.bound_dv}) {
      CHECK(b > 1.2 * lowp_floor(t));   // the plain error is visible above the floor ...
      CHECK(b < 100 * lowp_floor(t));   // ... and far from O(1)
    }
  }
  CHECK(err[1] > err[0]);
}

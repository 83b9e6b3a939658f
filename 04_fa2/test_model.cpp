// CPU tests (CI): the chapter's plain C++ FA2 model equals the fp64 reference, forward and backward.
#include <doctest/doctest.h>

#include "model.hpp"
#include "program.hpp"
#include "reference.hpp"
#include "testing.hpp"

using namespace fa;

namespace {
void check_model(const Problem& p) {
  INFO(describe(p));
  const HostTensors in = random_inputs(p, true);
  std::vector<float> o, lse, dq, dk, dv;
  fa2_model::forward(p, in.q.data(), in.k.data(), in.v.data(), o, lse);
  fa2_model::backward(p, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), in.dout.data(), dq, dk, dv);
  std::vector<double> ro, rl, rq, rk, rv;
  reference_forward(p, in.q.data(), in.k.data(), in.v.data(), ro, rl);
  reference_backward(p, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), rq, rk, rv);
  const auto eo = compare(o, ro, kTolFp32Forward), el = compare(lse, rl, kTolFp32Forward);
  const auto eq = compare(dq, rq, kTolFp32Backward), ek = compare(dk, rk, kTolFp32Backward),
             ev = compare(dv, rv, kTolFp32Backward);
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

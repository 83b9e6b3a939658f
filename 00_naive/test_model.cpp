// CPU tests (CI): the chapter's plain C++ model equals the fp64 reference.
#include <doctest/doctest.h>

#include "model.hpp"
#include "program.hpp"
#include "reference.hpp"
#include "testing.hpp"

using namespace fa;

namespace {
void check_model(const Problem& p) {
  const HostTensors in = random_inputs(p, true);
  std::vector<float> o, lse, dq, dk, dv;
  naive_model::attention(p, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), o, lse, dq, dk, dv);
  std::vector<double> ro, rl, rq, rk, rv;
  reference_forward(p, in.q.data(), in.k.data(), in.v.data(), ro, rl);
  reference_backward(p, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), rq, rk, rv);
  INFO(describe(p));
  const auto eo = compare(o, ro, kTolFp32Forward), el = compare(lse, rl, kTolFp32Forward);
  const auto eq = compare(dq, rq, kTolFp32Backward), ek = compare(dk, rk, kTolFp32Backward),
             ev = compare(dv, rv, kTolFp32Backward);
  CHECK_MESSAGE(eo.ok(), eo.summary("O"));
  CHECK_MESSAGE(el.ok(), el.summary("LSE"));
  CHECK_MESSAGE(eq.ok(), eq.summary("dQ"));
  CHECK_MESSAGE(ek.ok(), ek.summary("dK"));
  CHECK_MESSAGE(ev.ok(), ev.summary("dV"));
}
}  // namespace

TEST_CASE("00 model equals the fp64 reference (forward and backward)") {
  for (auto [nq, nk] : std::vector<std::pair<int, int>>{{1, 1}, {17, 17}, {33, 20}, {20, 33}})
    for (bool causal : {false, true}) {
      Problem p;
      p.batch = 2, p.heads = 2, p.kv_heads = 2, p.q_len = nq, p.kv_len = nk, p.head_dim = 16, p.causal = causal;
      p.seed = 3;
      check_model(p);
    }
}

TEST_CASE("00 model: GQA, custom scale and dropout") {
  Problem p;
  p.batch = 1, p.heads = 4, p.kv_heads = 2, p.q_len = 29, p.kv_len = 41, p.head_dim = 8;
  p.causal = true, p.scale = 0.3f, p.dropout_p = 0.25f, p.seed = 11, p.offset = 5;
  check_model(p);
}

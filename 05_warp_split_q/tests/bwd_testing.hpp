// What the backward's CPU and GPU tests share: one test case = rounded inputs, the forward's O (in the dtype) and
// LSE from the fp64 reference, the fp64 gradients, and the error rule's bound for each gradient.
//   bound = 2 x (max error of the plain same-dtype backward, bwd_model.hpp) + the dtype's floor (common/lowp.hpp)
// The backward is fed the reference forward's O and LSE, not a kernel's, so that its tests stand on their own.
#pragma once
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "lowp.hpp"
#include "metrics.hpp"
#include "random.hpp"
#include "reference.hpp"

#include "backward/bwd_model.hpp"

namespace wsq_bwd_testing {

// A test problem: shape and causal; scale 1/sqrt(d), no dropout (the chapter has none), seed 0.
inline fa::Problem make(int B, int H, int Hkv, int nq, int nk, int d, bool causal) {
  fa::Problem p;
  p.batch = B, p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  return p;
}

struct Case {
  fa::Problem p;
  fa::Dtype t;
  std::vector<float> q, k, v, dout, o, lse;  // dtype values widened to float (lse: fp32)
  std::vector<double> rdq, rdk, rdv;         // fp64 gradients of the rounded inputs
  double bound_dq, bound_dk, bound_dv;       // the error rule, per gradient
};

// Inputs N(0.5, stddev) rounded to the dtype; stddev 1 gives logits of a few units, a large stddev (e.g. 8)
// logits in the hundreds (the softmax then picks one key per row, the large-logit test).
inline Case make_case(fa::Dtype t, const fa::Problem& p, double stddev = 1.0) {
  Case c{p, t, {}, {}, {}, {}, {}, {}, {}, {}, {}, 0, 0, 0};
  const uint64_t s = 1000 + 17 * p.q_len + p.kv_len + p.head_dim + p.heads;
  c.q = fa::rounded(t, fa::random_normal<float>(p.q_elems(), s, 0.5, stddev));
  c.k = fa::rounded(t, fa::random_normal<float>(p.kv_elems(), s + 1, 0.5, stddev));
  c.v = fa::rounded(t, fa::random_normal<float>(p.kv_elems(), s + 2));
  c.dout = fa::rounded(t, fa::random_normal<float>(p.q_elems(), s + 3));
  std::vector<double> ro, rl;
  fa::reference_forward(p, c.q.data(), c.k.data(), c.v.data(), ro, rl);
  c.o.resize(ro.size()), c.lse.resize(rl.size());
  for (size_t e = 0; e < ro.size(); ++e) c.o[e] = fa::round_to(t, float(ro[e]));
  for (size_t e = 0; e < rl.size(); ++e) c.lse[e] = float(rl[e]);
  fa::reference_backward(p, c.q.data(), c.k.data(), c.v.data(), c.dout.data(), c.rdq, c.rdk, c.rdv);
  std::vector<float> pq, pk, pv;
  wsq_bwd_model::plain_lowp_backward(t, p, c.q.data(), c.k.data(), c.v.data(), c.dout.data(), pq, pk, pv);
  const fa::Tolerance any{1e30, 0};  // only the max error is wanted here
  c.bound_dq = fa::lowp_error_bound(t, fa::compare(pq, c.rdq, any).max_abs);
  c.bound_dk = fa::lowp_error_bound(t, fa::compare(pk, c.rdk, any).max_abs);
  c.bound_dv = fa::lowp_error_bound(t, fa::compare(pv, c.rdv, any).max_abs);
  return c;
}

// Max-error check of one gradient against its bound (rtol 0: the rule is on the max abs error).
inline fa::ErrorReport check(const std::vector<float>& got, const std::vector<double>& ref, double bound) {
  return fa::compare(got, ref, fa::Tolerance{bound, 0.0});
}

// dQ, dK, dV of one run against the fp64 reference with the error rule; rows that see no key (causal, q_len >
// kv_len) get no K/V block's share, so their dQ must be 0 exactly, in every batch and head.
inline void check_grads(const Case& c, const std::vector<float>& dq, const std::vector<float>& dk,
                        const std::vector<float>& dv) {
  const fa::Problem& p = c.p;
  const fa::ErrorReport eq = check(dq, c.rdq, c.bound_dq);
  const fa::ErrorReport ek = check(dk, c.rdk, c.bound_dk);
  const fa::ErrorReport ev = check(dv, c.rdv, c.bound_dv);
  CHECK_MESSAGE(eq.ok(), eq.summary("dQ vs fp64"), " (bound ", c.bound_dq, ")");
  CHECK_MESSAGE(ek.ok(), ek.summary("dK vs fp64"), " (bound ", c.bound_dk, ")");
  CHECK_MESSAGE(ev.ok(), ev.summary("dV vs fp64"), " (bound ", c.bound_dv, ")");
  if (p.causal && p.q_len > p.kv_len)
    for (int b = 0; b < p.batch; ++b)
      for (int h = 0; h < p.heads; ++h)
        for (int i = 0; i < p.q_len - p.kv_len; ++i)
          for (int e = 0; e < p.head_dim; ++e) REQUIRE(dq[p.q_offset(b, h) + size_t(i) * p.head_dim + e] == 0.f);
}

}  // namespace wsq_bwd_testing

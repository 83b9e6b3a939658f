// The helpers chapter 06's CPU tests share (test_model.cpp, test_model_mma.cpp, test_emulated.cpp): a problem, rounded random inputs,
// and the model held to the fp64 reference by the chapter's rule.
#pragma once
#include <doctest/doctest.h>

#include <utility>
#include <vector>

#include "model.hpp"
#include "random.hpp"
#include "testing.hpp"

namespace fdec_test {

using fdec_model::Result;

inline fa::Problem make(int B, int H, int Hkv, int q_len, int N, int d, bool causal, float scale = 0.f) {
  fa::Problem p;
  p.batch = B, p.heads = H, p.kv_heads = Hkv, p.q_len = q_len, p.kv_len = N, p.head_dim = d, p.causal = causal;
  p.scale = scale, p.seed = 11 + N + 7 * H;
  return p;
}

struct Case {
  fa::Problem p;
  std::vector<int> lens;
  std::vector<float> q, k, v;
};
inline Case inputs(fa::Dtype t, const fa::Problem& p, std::vector<int> lens, double stddev = 1.0) {
  Case c{p, std::move(lens), {}, {}, {}};
  c.q = fa::rounded(t, fa::random_normal<float>(p.q_elems(), p.seed * 3 + 1, 0.5, stddev));
  c.k = fa::rounded(t, fa::random_normal<float>(p.kv_elems(), p.seed * 3 + 2, 0.5, stddev));
  c.v = fa::rounded(t, fa::random_normal<float>(p.kv_elems(), p.seed * 3 + 3));
  return c;
}

// The model vs the fp64 reference by the chapter's rule: O within 2 x plain + floor, LSE within the fp32 tolerance.
inline void expect_matches(fa::Dtype t, const Case& c, const Result& r) {
  std::vector<double> ro, rl;
  fdec_model::reference(c.p, c.lens, c.q, c.k, c.v, ro, rl);
  const std::vector<float> plain_o = fdec_model::plain(t, c.p, c.lens, c.q, c.k, c.v);
  const double bound = fa::lowp_error_bound(t, fa::compare(plain_o, ro, {1e30, 0}).max_abs);
  const fa::ErrorReport eo = fa::compare(r.o, ro, {bound, 0}), el = fa::compare(r.lse, rl, fa::kTolFp32Forward);
  CHECK_MESSAGE(eo.ok(), eo.summary("O vs fp64"));
  CHECK_MESSAGE(el.ok(), el.summary("LSE vs fp64"));
}

}  // namespace fdec_test

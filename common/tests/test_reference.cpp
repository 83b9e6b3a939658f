// The fp64 reference is the ground truth of the whole project, so it is tested on its own:
// softmax rows sum to 1, LSE is the log-sum-exp, GQA equals replicated K/V, an empty causal row gives
// zeros and -inf, dropout keeps about 1-p of P, and the backward equals central finite differences.
#include <doctest/doctest.h>

#include <cmath>
#include <initializer_list>

#include "philox.hpp"
#include "random.hpp"
#include "reference.hpp"

using namespace fa;

namespace {

Problem tiny(int Nq, int Nk, int d, bool causal, int H = 1, int Hkv = 1, float dropout = 0.f) {
  Problem p;
  p.batch = 2, p.heads = H, p.kv_heads = Hkv, p.q_len = Nq, p.kv_len = Nk, p.head_dim = d;
  p.causal = causal, p.dropout_p = dropout, p.seed = 7, p.offset = 3;
  return p;
}

// L = sum(dO o O): dL/dX is what reference_backward returns for X in {Q, K, V}.
double loss(const Problem& p, const std::vector<float>& q, const std::vector<float>& k,
            const std::vector<float>& v, const std::vector<float>& dout) {
  std::vector<double> o, lse;
  reference_forward(p, q.data(), k.data(), v.data(), o, lse);
  double l = 0;
  for (size_t i = 0; i < o.size(); ++i) l += o[i] * dout[i];
  return l;
}

// Central differences with the perturbation actually representable in float.
void check_gradient(const Problem& p) {
  auto q = random_normal<float>(p.q_elems(), 1), k = random_normal<float>(p.kv_elems(), 2);
  auto v = random_normal<float>(p.kv_elems(), 3), dout = random_normal<float>(p.q_elems(), 4, 0.0);
  std::vector<double> dq, dk, dv;
  reference_backward(p, q.data(), k.data(), v.data(), dout.data(), dq, dk, dv);
  struct T { std::vector<float>* x; const std::vector<double>* g; const char* name; };
  for (T t : {T{&q, &dq, "dQ"}, T{&k, &dk, "dK"}, T{&v, &dv, "dV"}}) {
    std::vector<float>& x = *t.x;
    for (size_t e = 0; e < x.size(); ++e) {
      const float x0 = x[e];
      x[e] = x0 + 1e-2f;
      const double up = double(x[e]) - x0, l_up = loss(p, q, k, v, dout);
      x[e] = x0 - 1e-2f;
      const double dn = double(x0) - x[e], l_dn = loss(p, q, k, v, dout);
      x[e] = x0;
      const double fd = (l_up - l_dn) / (up + dn);
      INFO(t.name, "[", e, "]: analytic ", (*t.g)[e], ", finite difference ", fd);
      // central difference error is O(h^2 * third derivative): ~1e-4 at h = 1e-2 on these inputs
      CHECK(std::fabs((*t.g)[e] - fd) <= 1e-3 + 1e-3 * std::fabs(fd));
    }
  }
}

}  // namespace

TEST_CASE("reference: rows of P sum to 1 and LSE is the log-sum-exp of the scaled scores") {
  for (bool causal : {false, true}) {
    Problem p = tiny(13, 29, 8, causal);
    auto q = random_normal<float>(p.q_elems(), 1), k = random_normal<float>(p.kv_elems(), 2);
    auto v = random_normal<float>(p.kv_elems(), 3);
    std::vector<double> o(size_t(p.q_len) * p.head_dim), lse(p.q_len), P(size_t(p.q_len) * p.kv_len);
    reference_forward_rows(p, 1, 0, 0, p.q_len, q.data(), k.data(), v.data(), o.data(), lse.data(), P.data());
    for (int i = 0; i < p.q_len; ++i) {
      double sum = 0, direct = 0;
      for (int j = 0; j < p.kv_len; ++j) {
        sum += P[size_t(i) * p.kv_len + j];
        if (j < p.visible_keys(i)) {
          double s = 0;
          for (int c = 0; c < p.head_dim; ++c)
            s += double(q[p.q_offset(1, 0) + i * p.head_dim + c]) * k[p.kv_offset(1, 0) + j * p.head_dim + c];
          direct += std::exp(s * p.softmax_scale());
        } else {
          CHECK(P[size_t(i) * p.kv_len + j] == 0.0);  // masked
        }
      }
      CHECK(sum == doctest::Approx(1.0).epsilon(1e-12));
      CHECK(lse[i] == doctest::Approx(std::log(direct)).epsilon(1e-12));
    }
  }
}

TEST_CASE("reference: causal is bottom-right aligned and an empty row gives O = 0, LSE = -inf") {
  Problem p = tiny(7, 4, 4, true);  // q_len > kv_len: rows 0..2 see no key, row 3 sees key 0
  CHECK(p.visible_keys(2) == 0);
  CHECK(p.visible_keys(3) == 1);
  CHECK(p.visible_keys(6) == 4);
  auto q = random_normal<float>(p.q_elems(), 1), k = random_normal<float>(p.kv_elems(), 2);
  auto v = random_normal<float>(p.kv_elems(), 3);
  std::vector<double> o, lse;
  reference_forward(p, q.data(), k.data(), v.data(), o, lse);
  for (int i = 0; i < 3; ++i) {
    CHECK(std::isinf(lse[i]));
    CHECK(lse[i] < 0);
    for (int c = 0; c < p.head_dim; ++c) CHECK(o[i * p.head_dim + c] == 0.0);
  }
  // Row 3 sees exactly key 0: O_3 = V_0.
  for (int c = 0; c < p.head_dim; ++c) CHECK(o[3 * p.head_dim + c] == doctest::Approx(v[c]).epsilon(1e-12));
}

TEST_CASE("reference: GQA equals attention with K/V replicated for every query head") {
  Problem g = tiny(9, 11, 4, true, 6, 2), full = g;
  full.kv_heads = 6;
  auto q = random_normal<float>(g.q_elems(), 1), k = random_normal<float>(g.kv_elems(), 2);
  auto v = random_normal<float>(g.kv_elems(), 3), dout = random_normal<float>(g.q_elems(), 4);
  std::vector<float> kr(full.kv_elems()), vr(full.kv_elems());
  const size_t head = size_t(g.kv_len) * g.head_dim;
  for (int b = 0; b < g.batch; ++b)
    for (int h = 0; h < g.heads; ++h)
      for (size_t e = 0; e < head; ++e) {
        kr[full.kv_offset(b, h) + e] = k[g.kv_offset(b, g.kv_head_of(h)) + e];
        vr[full.kv_offset(b, h) + e] = v[g.kv_offset(b, g.kv_head_of(h)) + e];
      }
  std::vector<double> o1, l1, o2, l2, dq1, dk1, dv1, dq2, dk2, dv2;
  reference_forward(g, q.data(), k.data(), v.data(), o1, l1);
  reference_forward(full, q.data(), kr.data(), vr.data(), o2, l2);
  CHECK(o1 == o2);
  CHECK(l1 == l2);
  reference_backward(g, q.data(), k.data(), v.data(), dout.data(), dq1, dk1, dv1);
  reference_backward(full, q.data(), kr.data(), vr.data(), dout.data(), dq2, dk2, dv2);
  for (size_t e = 0; e < dq1.size(); ++e) CHECK(dq1[e] == doctest::Approx(dq2[e]).epsilon(1e-12));
  // dK of a kv head is the sum of the replicated heads' dK
  for (int b = 0; b < g.batch; ++b)
    for (int hk = 0; hk < g.kv_heads; ++hk)
      for (size_t e = 0; e < head; ++e) {
        double sk = 0, sv = 0;
        for (int j = 0; j < g.group(); ++j) {
          sk += dk2[full.kv_offset(b, hk * g.group() + j) + e];
          sv += dv2[full.kv_offset(b, hk * g.group() + j) + e];
        }
        CHECK(dk1[g.kv_offset(b, hk) + e] == doctest::Approx(sk).epsilon(1e-12));
        CHECK(dv1[g.kv_offset(b, hk) + e] == doctest::Approx(sv).epsilon(1e-12));
      }
}

TEST_CASE("reference: dropout keeps about 1-p of P and rescales the kept entries by 1/(1-p)") {
  Problem p = tiny(64, 64, 4, false, 1, 1, 0.3f);
  p.batch = 1;
  auto q = random_normal<float>(p.q_elems(), 1), k = random_normal<float>(p.kv_elems(), 2);
  auto v = random_normal<float>(p.kv_elems(), 3);
  std::vector<double> o, lse, P(size_t(p.q_len) * p.kv_len), o0(p.q_elems()), l0(p.q_len);
  reference_forward(p, q.data(), k.data(), v.data(), o, lse);
  reference_forward_rows(p, 0, 0, 0, p.q_len, q.data(), k.data(), v.data(), o0.data(), l0.data(), P.data());
  const uint32_t thr = dropout_threshold(p.dropout_p);
  int kept = 0;
  for (int i = 0; i < p.q_len; ++i)
    for (int c = 0; c < p.head_dim; ++c) {
      double acc = 0;
      for (int j = 0; j < p.kv_len; ++j) {
        const bool keep = dropout_keep(p.seed, p.offset, 0, 0, i, j, thr);
        kept += keep && c == 0;
        if (keep) acc += P[size_t(i) * p.kv_len + j] / (1 - double(p.dropout_p)) * v[j * p.head_dim + c];
      }
      CHECK(o[i * p.head_dim + c] == doctest::Approx(acc).epsilon(1e-12));
    }
  const double frac = double(kept) / (p.q_len * p.kv_len);  // 4096 Bernoulli(0.7): sd 0.007
  CHECK(frac == doctest::Approx(0.7).epsilon(0.05));
}

TEST_CASE("reference backward equals central finite differences") {
  SUBCASE("plain") { check_gradient(tiny(3, 5, 4, false)); }
  SUBCASE("causal, q_len != kv_len") { check_gradient(tiny(5, 3, 4, true)); }
  SUBCASE("causal, GQA 4/2, custom scale") {
    Problem p = tiny(4, 4, 3, true, 4, 2);
    p.scale = 0.8f;
    check_gradient(p);
  }
  SUBCASE("dropout (the mask is fixed by the seed)") { check_gradient(tiny(4, 6, 4, false, 1, 1, 0.4f)); }
}

TEST_CASE("reference_dq_rows equals the rows of the full backward (causal, GQA, dropout, empty rows)") {
  Problem p = tiny(13, 9, 5, true, 4, 2, 0.3f);  // q_len > kv_len: rows 0-3 see no key
  const auto q = random_normal<float>(p.q_elems(), 1), k = random_normal<float>(p.kv_elems(), 2);
  const auto v = random_normal<float>(p.kv_elems(), 3), dout = random_normal<float>(p.q_elems(), 4, 0.0);
  std::vector<double> dq, dk, dv;
  reference_backward(p, q.data(), k.data(), v.data(), dout.data(), dq, dk, dv);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) {
      std::vector<double> rows(size_t(8) * p.head_dim);
      reference_dq_rows(p, b, h, 2, 10, q.data(), k.data(), v.data(), dout.data(), rows.data());
      for (size_t e = 0; e < rows.size(); ++e) CHECK(rows[e] == doctest::Approx(dq[p.q_offset(b, h) + 2 * p.head_dim + e]));
    }
}

TEST_CASE("reference_softmax: rows sum to 1 and large logits do not overflow") {
  auto x = random_normal<float>(5 * 33, 9, 0.0, 3000.0);
  std::vector<double> y(x.size());
  reference_softmax(x.data(), 5, 33, y.data());
  for (int r = 0; r < 5; ++r) {
    double s = 0;
    for (int j = 0; j < 33; ++j) {
      CHECK(std::isfinite(y[r * 33 + j]));
      s += y[r * 33 + j];
    }
    CHECK(s == doctest::Approx(1.0).epsilon(1e-12));
  }
}

TEST_CASE("reference_dkdv_rows equals the key rows of the full backward (causal, GQA, dropout, empty rows)") {
  for (bool causal : {false, true}) {
    Problem p = tiny(13, 9, 5, causal, 4, 2, 0.3f);
    const auto q = random_normal<float>(p.q_elems(), 1), k = random_normal<float>(p.kv_elems(), 2);
    const auto v = random_normal<float>(p.kv_elems(), 3), dout = random_normal<float>(p.q_elems(), 4, 0.0);
    std::vector<double> dq, dk, dv;
    reference_backward(p, q.data(), k.data(), v.data(), dout.data(), dq, dk, dv);
    for (int b = 0; b < p.batch; ++b)
      for (int hk = 0; hk < p.kv_heads; ++hk) {
        std::vector<double> rk(size_t(5) * p.head_dim), rv(rk.size());
        reference_dkdv_rows(p, b, hk, 3, 8, q.data(), k.data(), v.data(), dout.data(), rk.data(), rv.data());
        for (size_t e = 0; e < rk.size(); ++e) {
          CHECK(rk[e] == doctest::Approx(dk[p.kv_offset(b, hk) + 3 * p.head_dim + e]));
          CHECK(rv[e] == doctest::Approx(dv[p.kv_offset(b, hk) + 3 * p.head_dim + e]));
        }
      }
  }
}

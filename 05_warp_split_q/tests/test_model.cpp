// CPU tests of the chapter 05 model (forward/model.hpp): the tiled algorithm of every step, in both warp partitions
// and both exponential bases, against the fp64 reference fed the same rounded inputs, with the error rule of
// common/lowp.hpp; the split-K combination algebra; causal block skipping never skips a visible pair.
#include <doctest/doctest.h>

#include <cmath>

#include "lowp.hpp"
#include "metrics.hpp"
#include "random.hpp"
#include "reference.hpp"

#include "forward/model.hpp"

using namespace fa;

namespace {

Problem make(int H, int Hkv, int nq, int nk, int d, bool causal) {
  Problem p;
  p.batch = 1, p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  return p;
}

struct Inputs {
  std::vector<float> q, k, v;
};
Inputs inputs(Dtype t, const Problem& p, double stddev = 1.0) {
  return {rounded(t, random_normal<float>(p.q_elems(), 11, 0.0, stddev)),
          rounded(t, random_normal<float>(p.kv_elems(), 12, 0.0, stddev)),
          rounded(t, random_normal<float>(p.kv_elems(), 13))};
}

// max |plain - ref| over every row: the yardstick of the error rule.
double plain_error(Dtype t, const Problem& p, const Inputs& in, const std::vector<double>& ref_o) {
  double worst = 0;
  std::vector<float> o(size_t(p.q_len) * p.head_dim);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) {
      plain_lowp_forward_rows(t, p, b, h, 0, p.q_len, in.q.data(), in.k.data(), in.v.data(), o.data());
      for (size_t x = 0; x < o.size(); ++x) worst = std::max(worst, std::fabs(o[x] - ref_o[p.q_offset(b, h) + x]));
    }
  return worst;
}

void check(Dtype t, const Problem& p, double stddev = 1.0) {
  INFO(std::string(dtype_name(t)), " ", p.q_len, "x", p.kv_len, " d=", p.head_dim, " causal=", p.causal, " H=", p.heads, "/",
       p.kv_heads, " stddev=", stddev);
  const Inputs in = inputs(t, p, stddev);
  std::vector<double> ro, rl;
  reference_forward(p, in.q.data(), in.k.data(), in.v.data(), ro, rl);
  const double bound = lowp_error_bound(t, plain_error(t, p, in, ro));
  std::vector<float> o[4], lse;
  int x = 0;
  for (auto part : {wsq_model::Partition::split_q, wsq_model::Partition::split_k})
    for (bool base2 : {false, true}) {
      wsq_model::Config cfg;
      cfg.partition = part, cfg.base2 = base2;
      wsq_model::forward(t, p, cfg, in.q.data(), in.k.data(), in.v.data(), o[x], lse);
      const ErrorReport eo = compare(o[x], ro, {bound, 0});
      CHECK_MESSAGE(eo.ok(), eo.summary("model O vs fp64"), " bound ", bound);
      const ErrorReport el = compare(lse, rl, {1e-4, 1e-5});  // fp32 statistics: LSE is not rounded
      CHECK_MESSAGE(el.ok(), el.summary("model LSE vs fp64"));
      ++x;
    }
  // split-K vs split-Q: the same numbers up to the summation order (a few units of the dtype at most).
  const ErrorReport ek = compare(o[2], to_double(o[0]), {2 * lowp_floor(t), 0});
  CHECK_MESSAGE(ek.ok(), ek.summary("split-K model vs split-Q model"));
  // Step 10's deferred P V (Br = Bc = 128, base 2): the same error rule, and the same numbers as step 9's order
  // up to fp32 rounding (alpha (O + PV) instead of alpha O + PV), far below one unit of the dtype.
  wsq_model::Config c9, c10;
  c9.Br = c9.Bc = c10.Br = c10.Bc = 128, c9.base2 = c10.base2 = true, c10.deferred_pv = true;
  std::vector<float> o9, o10, lse9, lse10;
  wsq_model::forward(t, p, c9, in.q.data(), in.k.data(), in.v.data(), o9, lse9);
  wsq_model::forward(t, p, c10, in.q.data(), in.k.data(), in.v.data(), o10, lse10);
  const ErrorReport e10 = compare(o10, ro, {bound, 0});
  CHECK_MESSAGE(e10.ok(), e10.summary("deferred-PV model O vs fp64"), " bound ", bound);
  const ErrorReport d10 = compare(o10, to_double(o9), {2 * lowp_floor(t), 0});
  CHECK_MESSAGE(d10.ok(), d10.summary("deferred-PV model vs in-order model"));
  CHECK(lse10 == lse9);  // the statistics m, l are computed in the same order
}

}  // namespace

TEST_CASE("model vs fp64: ragged and tile-multiple lengths, causal on/off, fp16 and bf16") {
  for (Dtype t : {Dtype::fp16, Dtype::bf16})
    for (auto [nq, nk] : std::vector<std::pair<int, int>>{{1, 1}, {17, 17}, {64, 64}, {97, 97}, {113, 203}, {203, 113}})
      for (bool causal : {false, true}) check(t, make(2, 2, nq, nk, 64, causal));
}

TEST_CASE("model vs fp64: d = 128, GQA 8/2, 6/2 and MQA 8/1, large logits") {
  check(Dtype::fp16, make(2, 1, 97, 130, 128, true));
  check(Dtype::bf16, make(2, 2, 130, 97, 128, false));
  check(Dtype::fp16, make(8, 2, 33, 70, 64, true));
  check(Dtype::bf16, make(6, 2, 70, 33, 64, true));
  check(Dtype::fp16, make(8, 1, 40, 40, 64, false));
  // stddev 8 on Q and K: the logits scale q.k have a stddev of 64 at d = 64 and reach the hundreds.
  check(Dtype::fp16, make(1, 1, 64, 97, 64, true), 8.0);
  check(Dtype::bf16, make(1, 1, 64, 97, 64, false), 8.0);
}

TEST_CASE("model: rows that see no key give O = 0 and LSE = -inf") {
  const Problem p = make(1, 1, 90, 20, 64, true);  // rows 0..69 see no key
  const Inputs in = inputs(Dtype::fp16, p);
  std::vector<float> o, lse;
  wsq_model::forward(Dtype::fp16, p, {}, in.q.data(), in.k.data(), in.v.data(), o, lse);
  for (int i = 0; i < 70; ++i) {
    CHECK((std::isinf(lse[i]) && lse[i] < 0));
    for (int c = 0; c < 64; ++c) CHECK(o[size_t(i) * 64 + c] == 0.f);
  }
  CHECK(std::isfinite(lse[70]));
}

TEST_CASE("split-K algebra: combining partials over disjoint key sets equals the softmax over all keys") {
  std::vector<double> s = {3.0, -1.0, 7.5, 0.25, -INFINITY, 2.0}, v = {1, 2, 3, 4, 5, 6};
  auto partial = [&](int j0, int j1) {
    wsq_model::Partial r;
    r.o.assign(1, 0.0);
    for (int j = j0; j < j1; ++j) r.m = std::max(r.m, s[j]);
    const double use = r.m == -INFINITY ? 0 : r.m;
    for (int j = j0; j < j1; ++j) r.l += std::exp(s[j] - use), r.o[0] += std::exp(s[j] - use) * v[j];
    return r;
  };
  const wsq_model::Partial all = partial(0, 6);
  for (int cut = 0; cut <= 6; ++cut) {
    const wsq_model::Partial c = wsq_model::combine(partial(0, cut), partial(cut, 6));
    CHECK(c.m == all.m);
    CHECK(c.l == doctest::Approx(all.l).epsilon(1e-14));
    CHECK(c.o[0] / c.l == doctest::Approx(all.o[0] / all.l).epsilon(1e-14));
  }
  // Order does not matter (the shared-memory additions of split-K arrive in any order).
  const auto a = partial(0, 2), b = partial(2, 4), c = partial(4, 6);
  const auto x = combine(combine(a, b), c), y = combine(a, combine(c, b));
  CHECK(x.l == doctest::Approx(y.l).epsilon(1e-14));
  CHECK(x.o[0] == doctest::Approx(y.o[0]).epsilon(1e-14));
  // An empty slice (all keys masked) is the identity.
  wsq_model::Partial empty;
  empty.o.assign(1, 0.0);
  CHECK(combine(all, empty).l == all.l);
  CHECK(combine(empty, empty).l == 0.0);
}

TEST_CASE("causal block skipping visits every tile with a visible pair and no tile without one") {
  for (auto [nq, nk] : std::vector<std::pair<int, int>>{{1024, 1024}, {113, 203}, {203, 113}, {1, 97}, {97, 1}})
    for (auto [Br, Bc] : std::vector<std::pair<int, int>>{{64, 64}, {128, 64}, {128, 32}}) {
      Problem p = make(1, 1, nq, nk, 64, true);
      long long needed = 0;
      for (int i0 = 0; i0 < nq; i0 += Br)
        for (int j0 = 0; j0 < nk; j0 += Bc) {
          bool any = false;
          for (int i = i0; i < std::min(i0 + Br, nq) && !any; ++i)
            for (int j = j0; j < std::min(j0 + Bc, nk) && !any; ++j) any = p.visible(i, j);
          needed += any;
          if (any) CHECK(j0 < wsq_model::kv_end(p, i0, Br));  // a visible tile is never skipped
        }
      CHECK(wsq_model::tiles_visited(p, Br, Bc) == needed);
    }
}

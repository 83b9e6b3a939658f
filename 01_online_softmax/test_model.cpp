// CPU tests (CI): the chapter's model equals the fp64 reference; the merge operator is commutative,
// associative and indifferent to where the row is cut; |x| up to 1e4 does not overflow.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "model.hpp"
#include "program.hpp"
#include "random.hpp"
#include "reference.hpp"
#include "testing.hpp"

using namespace fa;
namespace om = online_softmax_model;

namespace {

// Each softmax variant of the model on every row of x [rows, cols] vs the fp64 reference.
void check_softmax(const std::vector<float>& x, int rows, int cols, uint64_t seed) {
  std::vector<double> ref(x.size());
  reference_softmax(x.data(), rows, cols, ref.data());
  Rng rng(seed);
  std::vector<float> y3(x.size()), y2(x.size()), ym(x.size());
  for (int r = 0; r < rows; ++r) {
    const float* xr = x.data() + size_t(r) * cols;
    om::softmax_3pass(xr, y3.data() + size_t(r) * cols, cols);
    om::softmax_online_2pass(xr, y2.data() + size_t(r) * cols, cols);
    std::vector<int> splits;  // random cut points, a different set per row
    for (int c = 1; c < cols; ++c)
      if (rng.uniform() < 0.05) splits.push_back(c);
    om::softmax_online_merge(xr, ym.data() + size_t(r) * cols, cols, splits);
  }
  INFO("rows=" << rows << " cols=" << cols);
  const auto e3 = compare(y3, ref, kTolFp32Forward), e2 = compare(y2, ref, kTolFp32Forward),
             em = compare(ym, ref, kTolFp32Forward);
  CHECK_MESSAGE(e3.ok(), e3.summary("3-pass"));
  CHECK_MESSAGE(e2.ok(), e2.summary("online 2-pass"));
  CHECK_MESSAGE(em.ok(), em.summary("online, pieces merged"));
}

bool close(float a, float b, float rel) { return std::fabs(a - b) <= rel * std::max(std::fabs(a), std::fabs(b)); }

}  // namespace

TEST_CASE("01 model softmax (3-pass, online 2-pass, merged pieces) equals the fp64 reference") {
  for (int cols : {1, 17, 97, 203, 1023, 4096}) {
    const int rows = 7;
    check_softmax(random_normal<float>(size_t(rows) * cols, cols, 0.5, 3.0), rows, cols, cols + 1);
  }
}

TEST_CASE("01 model: |x| up to 1e4 does not overflow") {
  // N(0, 3000) reaches |x| ~ 1e4; e^x itself would be inf (x > 88.7) or 0 in fp32.
  const int rows = 5, cols = 1000;
  std::vector<float> x = random_normal<float>(size_t(rows) * cols, 42, 0.0, 3000.0);
  x[3] = 1e4f, x[cols + 5] = -1e4f;
  CHECK(std::isinf(std::exp(1e4f)));  // why the max is subtracted at all
  check_softmax(x, rows, cols, 9);
  // A constant row of 1e4: every output is exactly representable 1/n, nothing overflows.
  std::vector<float> c(64, 1e4f), y(64);
  om::softmax_online_2pass(c.data(), y.data(), 64);
  for (float e : y) CHECK(e == doctest::Approx(1.0 / 64).epsilon(1e-6));
  const om::MaxSum s = om::max_sum_of_pieces(c.data(), 64, {5, 31, 32});
  CHECK(s.m == 1e4f);
  CHECK(s.l == doctest::Approx(64.0).epsilon(1e-6));
}

TEST_CASE("01 merge operator: identity, commutativity (exact), associativity (to rounding)") {
  Rng rng(7);
  auto random_state = [&] {  // (m, l) of a random piece: l >= 1 since the max element contributes 1
    return om::MaxSum{float(2000.0 * (rng.uniform() - 0.5)), float(1.0 + 100.0 * rng.uniform())};
  };
  const om::MaxSum empty;
  for (int t = 0; t < 1000; ++t) {
    const om::MaxSum a = random_state(), b = random_state(), c = random_state();
    const om::MaxSum ab = om::merge(a, b), ba = om::merge(b, a);
    CHECK(ab.m == ba.m);
    CHECK(ab.l == ba.l);
    const om::MaxSum left = om::merge(om::merge(a, b), c), right = om::merge(a, om::merge(b, c));
    CHECK(left.m == right.m);
    CHECK(close(left.l, right.l, 1e-6f));
    const om::MaxSum ae = om::merge(a, empty), ea = om::merge(empty, a);
    CHECK((ae.m == a.m && ae.l == a.l && ea.m == a.m && ea.l == a.l));
  }
  const om::MaxSum ee = om::merge(empty, empty);
  CHECK((std::isinf(ee.m) && ee.m < 0 && ee.l == 0.f));
}

TEST_CASE("01 merge: any cut of the row and any merge order give the sequential (m, l)") {
  Rng rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + int(rng.next() % 3000);
    const std::vector<float> x = random_normal<float>(n, 100 + trial, 0.0, trial % 2 ? 1000.0 : 1.0);
    const om::MaxSum seq = om::max_sum_of_pieces(x.data(), n, {});
    // Random cut points, then the pieces merged in a random tree (repeatedly merge two random
    // neighbours) - the order a GPU's threads and warps might use.
    std::vector<int> cuts;
    for (int c = 1; c < n; ++c)
      if (rng.next() % 97 == 0) cuts.push_back(c);
    std::vector<om::MaxSum> pieces;
    int begin = 0;
    for (size_t k = 0; k <= cuts.size(); ++k) {
      const int end = k < cuts.size() ? cuts[k] : n;
      om::MaxSum s;
      for (int j = begin; j < end; ++j) s = om::update(s, x[j]);
      pieces.push_back(s);
      begin = end;
    }
    while (pieces.size() > 1) {
      const size_t k = rng.next() % (pieces.size() - 1);
      pieces[k] = om::merge(pieces[k], pieces[k + 1]);
      pieces.erase(pieces.begin() + long(k) + 1);
    }
    INFO("n=" << n << " pieces=" << cuts.size() + 1);
    CHECK(pieces[0].m == seq.m);
    CHECK(close(pieces[0].l, seq.l, 1e-5f));
    double l_ref = 0;  // the fp64 sum
    for (float e : x) l_ref += std::exp(double(e) - double(seq.m));
    CHECK(pieces[0].l == doctest::Approx(l_ref).epsilon(1e-5));
  }
}

TEST_CASE("01 model fused attention row, both forms, equals the fp64 reference") {
  struct Shape {
    int B, H, Hkv, nq, nk, d;
  };
  std::vector<Shape> shapes;
  for (auto [nq, nk] : std::vector<std::pair<int, int>>{{1, 1}, {17, 17}, {33, 20}, {20, 33}, {97, 97}})
    shapes.push_back({2, 2, 2, nq, nk, 16});
  shapes.push_back({1, 4, 2, 29, 41, 8});    // GQA
  shapes.push_back({1, 2, 1, 13, 31, 256});  // MQA, largest head_dim
  for (const Shape& s : shapes)
    for (bool causal : {false, true})
      for (om::Form form : {om::Form::Fa1, om::Form::Fa2}) {
        Problem p;
        p.batch = s.B, p.heads = s.H, p.kv_heads = s.Hkv, p.q_len = s.nq, p.kv_len = s.nk, p.head_dim = s.d;
        p.causal = causal, p.seed = 5;
        const HostTensors in = random_inputs(p, false);
        std::vector<float> o, lse;
        om::attention(p, form, in.q.data(), in.k.data(), in.v.data(), o, lse);
        std::vector<double> ro, rl;
        reference_forward(p, in.q.data(), in.k.data(), in.v.data(), ro, rl);
        INFO(describe(p) << std::string(form == om::Form::Fa1 ? " FA1 form" : " FA2 form"));
        const auto eo = compare(o, ro, kTolFp32Forward), el = compare(lse, rl, kTolFp32Forward);
        CHECK_MESSAGE(eo.ok(), eo.summary("O"));
        CHECK_MESSAGE(el.ok(), el.summary("LSE"));
      }
}

TEST_CASE("01 model fused attention: logits far past exp's fp32 range and a custom scale do not overflow") {
  Problem p;
  p.q_len = 19, p.kv_len = 53, p.head_dim = 8, p.scale = 30.f, p.seed = 3;
  const HostTensors in = random_inputs(p, false);
  // x = scale q.k reaches a few hundred here; e^x overflows fp32 beyond x = 88.7, so a kernel that
  // forgot to subtract the running max would produce inf/NaN. (Larger x would not test more: the fp32
  // rounding of x itself, u |x| in the exponent, would then dominate the comparison with fp64.)
  double x_max = 0;
  for (int i = 0; i < p.q_len; ++i)
    for (int j = 0; j < p.kv_len; ++j) {
      double x = 0;
      for (int c = 0; c < p.head_dim; ++c) x += double(in.q[i * p.head_dim + c]) * in.k[j * p.head_dim + c];
      x_max = std::max(x_max, std::abs(p.scale * x));
    }
  REQUIRE(x_max > 200);
  std::vector<double> ro, rl;
  reference_forward(p, in.q.data(), in.k.data(), in.v.data(), ro, rl);
  for (om::Form form : {om::Form::Fa1, om::Form::Fa2}) {
    std::vector<float> o, lse;
    om::attention(p, form, in.q.data(), in.k.data(), in.v.data(), o, lse);
    const auto eo = compare(o, ro, kTolFp32Forward);
    CHECK_MESSAGE(eo.ok(), eo.summary("O"));
    // LSE ~ x_max carries the fp32 rounding of x itself (u |x|): compare relatively.
    for (size_t i = 0; i < lse.size(); ++i) CHECK(lse[i] == doctest::Approx(rl[i]).epsilon(1e-5));
  }
}

// README §4's worked example: one query row, d = 1, scale 1, q = 1, keys k = (1, 2, 4, 0) so the scores are
// x = (1, 2, 4, 0), values v = (1, 2, 3, 4), in two blocks of two keys. The numbers printed there, checked.
TEST_CASE("01 worked example: m, l, o~ and o after each block of two keys") {
  Problem p;
  p.q_len = 1, p.kv_len = 4, p.head_dim = 1, p.scale = 1.f;
  const float q[1] = {1.f}, k[4] = {1.f, 2.f, 4.f, 0.f}, v[4] = {1.f, 2.f, 3.f, 4.f};
  struct After {
    int keys;
    float m, l, o_tilde, o, L;
  };
  const After rows[] = {{2, 2.f, 1.367879f, 2.367879f, 1.731059f, 2.313262f},
                        {4, 4.f, 1.203438f, 3.393720f, 2.820021f, 4.185182f}};
  for (const After& a : rows) {
    INFO("after the first ", a.keys, " keys");
    // (m, l) of the keys seen so far, as the block-wise recurrence gives them: the merge of the blocks.
    const float x[4] = {1.f, 2.f, 4.f, 0.f};
    const om::MaxSum s = om::max_sum_of_pieces(x, a.keys, a.keys > 2 ? std::vector<int>{2} : std::vector<int>{});
    CHECK(s.m == a.m);
    CHECK(s.l == doctest::Approx(a.l).epsilon(1e-6));
    for (om::Form form : {om::Form::Fa1, om::Form::Fa2}) {
      float o = 0.f, L = 0.f;
      om::attention_row(p, form, q, k, v, a.keys, &o, &L);
      CHECK(o == doctest::Approx(a.o).epsilon(1e-6));
      CHECK(o * s.l == doctest::Approx(a.o_tilde).epsilon(1e-6));  // o~ = l o: the FA2 accumulator
      CHECK(L == doctest::Approx(a.L).epsilon(1e-6));
    }
  }
}

// SOLUTIONS.md, exercise 2: in Listing 2, m changes at every left-to-right maximum of the row. For a row of
// i.i.d. values the k-th element is a new maximum with probability 1/k, so the expected count is the
// harmonic number H_N = 1 + 1/2 + ... + 1/N ~ ln N + 0.577: 7.49 for N = 1000.
TEST_CASE("01 exercise 2: the running max of Listing 2 changes about H_N times per row") {
  const int N = 1000, rows = 4000;
  const std::vector<float> x = random_normal<float>(size_t(N) * rows, 17);
  double changes = 0;
  for (int r = 0; r < rows; ++r) {
    om::MaxSum s{-INFINITY, 0.f};
    for (int j = 0; j < N; ++j) {
      const float before = s.m;
      s = om::update(s, x[size_t(r) * N + j]);
      changes += s.m != before;
    }
  }
  double H = 0;
  for (int k = 1; k <= N; ++k) H += 1.0 / k;
  CHECK(changes / rows == doctest::Approx(H).epsilon(0.05));  // 4000 rows: standard error ~ 0.6 %
}

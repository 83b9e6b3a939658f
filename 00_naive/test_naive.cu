// GPU tests: the 00 kernels against the fp64 reference on edge shapes, tile multiples, single rows,
// GQA ratios 2, 3, 4 and large logits, outputs NaN-poisoned before every run. (Chapter 00 is the first
// link of the equivalence chain: later chapters compare with it.)
#include <doctest/doctest.h>

#include <cmath>

#include "device_tensors.cuh"
#include "naive.cuh"
#include "philox.hpp"
#include "random.hpp"
#include "reference.hpp"
#include "testing.hpp"

using namespace fa;

namespace {

Problem make(int B, int H, int Hkv, int nq, int nk, int d, bool causal, float dropout = 0.f) {
  Problem p;
  p.batch = B, p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  p.dropout_p = dropout, p.seed = 1234 + nq * 7 + nk + d, p.offset = 2;
  return p;
}

void check_naive(const Problem& p, bool large_logits = false) {
  INFO(describe(p), std::string(large_logits ? " large logits" : ""));
  const HostTensors in = large_logits ? large_logit_inputs(p, true) : random_inputs(p, true);
  DeviceTensors t(p, in);
  naive::Workspace ws(p, true);
  t.poison_outputs();
  ws.S.poison(), ws.P.poison(), ws.dP.poison();
  naive::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), ws);
  naive::backward(p, t.q.get(), t.k.get(), t.v.get(), t.dout.get(), ws, t.dq.get(), t.dk.get(), t.dv.get());
  CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<double> ro, rl, rq, rk, rv;
  reference_forward(p, in.q.data(), in.k.data(), in.v.data(), ro, rl);
  reference_backward(p, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), rq, rk, rv);
  const auto eo = compare(t.o.download(), ro, kTolFp32Forward), el = compare(t.lse.download(), rl, kTolLse);
  const auto eq = compare(t.dq.download(), rq, kTolFp32Backward), ek = compare(t.dk.download(), rk, kTolFp32Backward),
             ev = compare(t.dv.download(), rv, kTolFp32Backward);
  CHECK_MESSAGE(eo.ok(), eo.summary("O"));
  CHECK_MESSAGE(el.ok(), el.summary("LSE"));
  CHECK_MESSAGE(eq.ok(), eq.summary("dQ"));
  CHECK_MESSAGE(ek.ok(), ek.summary("dK"));
  CHECK_MESSAGE(ev.ok(), ev.summary("dV"));
}

}  // namespace

TEST_CASE("00 forward and backward vs fp64 reference: edge lengths, causal on/off, d = 64") {
  for (auto [nq, nk] : edge_lengths())
    for (bool causal : {false, true}) {
      const bool big = nq > 512;
      check_naive(make(big ? 1 : 2, big ? 2 : 3, big ? 2 : 3, nq, nk, 64, causal));
    }
}

TEST_CASE("00 vs fp64 reference: tile multiples, one query row and one key, a block of rows with no key") {
  for (auto [nq, nk] : tile_and_vector_lengths())
    for (bool causal : {false, true}) {
      const bool big = nq * nk > 100000;
      check_naive(make(big ? 1 : 2, 2, big ? 2 : 1, nq, nk, 64, causal));
    }
}

TEST_CASE("00 vs fp64 reference: large logits (|S| in the hundreds), d = 64 and 16, causal on/off") {
  for (bool causal : {false, true}) {
    check_naive(make(2, 3, 3, 113, 203, 64, causal), true);
    check_naive(make(1, 2, 1, 256, 256, 64, causal), true);
    check_naive(make(1, 2, 2, 97, 61, 16, causal), true);
  }
}

TEST_CASE("00 vs fp64 reference: head_dim 16, 128, 256 on a ragged rectangle") {
  for (int d : {16, 128, 256})
    for (bool causal : {false, true}) check_naive(make(2, 2, 2, 113, 203, d, causal));
}

TEST_CASE("00 vs fp64 reference: GQA (ratios 2 and 3), MQA, custom scale, dropout") {
  check_naive(make(2, 4, 2, 97, 97, 32, true));
  check_naive(make(1, 6, 2, 113, 97, 64, true));
  check_naive(make(1, 4, 1, 113, 203, 64, false));
  Problem p = make(2, 2, 2, 17, 97, 64, false);
  p.scale = 0.05f;
  check_naive(p);
  for (float drop : {0.1f, 0.5f}) check_naive(make(2, 2, 1, 113, 203, 64, true, drop));
}

TEST_CASE("00: a fully masked row gives O = 0 and LSE = -inf") {
  const Problem p = make(1, 2, 2, 203, 113, 64, true);  // rows 0..89 see no key
  const HostTensors in = random_inputs(p, false);
  DeviceTensors t(p, in);
  naive::Workspace ws(p, false);
  t.poison_outputs();
  naive::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), ws);
  const auto o = t.o.download(), lse = t.lse.download();
  for (int h = 0; h < p.heads; ++h)
    for (int i = 0; i < p.q_len - p.kv_len; ++i) {
      CHECK(std::isinf(lse[p.lse_offset(0, h) + i]));
      CHECK(lse[p.lse_offset(0, h) + i] < 0);
      for (int c = 0; c < p.head_dim; ++c) CHECK(o[p.q_offset(0, h) + size_t(i) * p.head_dim + c] == 0.f);
    }
}

TEST_CASE("00 softmax kernel: rows of P sum to 1, dropout keeps about 1-p and matches Philox on the host") {
  Problem p = make(1, 1, 1, 64, 1000, 16, false, 0.3f);
  const std::vector<float> x = random_normal<float>(p.s_elems(), 5, 0.0, 1000.0);  // large logits
  DeviceBuffer<float> S(x), P(p.s_elems()), Pd(p.s_elems()), lse(p.q_len);
  P.poison(), Pd.poison(), lse.poison();
  naive::softmax(p, S.get(), P.get(), Pd.get(), lse.get());
  const auto hp = P.download(), hd = Pd.download(), hl = lse.download();
  const uint32_t thr = dropout_threshold(p.dropout_p);
  size_t kept = 0;
  for (int i = 0; i < p.q_len; ++i) {
    double sum = 0, m = -INFINITY, l = 0;  // the row's log-sum-exp in fp64, from the same fp32 logits
    for (int j = 0; j < p.kv_len; ++j) m = std::max(m, double(x[size_t(i) * p.kv_len + j]));
    for (int j = 0; j < p.kv_len; ++j) l += std::exp(double(x[size_t(i) * p.kv_len + j]) - m);
    CHECK(hl[i] == doctest::Approx(m + std::log(l)).epsilon(1e-6));
    for (int j = 0; j < p.kv_len; ++j) {
      const size_t e = size_t(i) * p.kv_len + j;
      sum += hp[e];
      const bool keep = dropout_keep(p.seed, p.offset, 0, 0, i, j, thr);
      kept += keep;
      // The kernel multiplies by the fp32 reciprocal 1/(1-p); the same expression here makes the check exact.
      CHECK(hd[e] == (keep ? hp[e] * (1.f / (1.f - p.dropout_p)) : 0.f));
    }
    CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
  }
  // 64000 Bernoulli(0.7) draws: the kept fraction's standard deviation is 0.0018.
  CHECK(double(kept) / p.s_elems() == doctest::Approx(1.0 - p.dropout_p).epsilon(0.01));
}

// GPU tests: 02's forward feeding 03's backward; dQ, dK, dV against the fp64 reference AND against
// 00's backward on the same inputs, outputs NaN-poisoned before every run: edge lengths, tile
// multiples, single rows, GQA ratios 2-4, large logits, and sampled rows of dQ, dK, dV at N = 4096;
// a finite-difference gradient check of the whole 02 -> 03 pipeline.
#include <doctest/doctest.h>

#include <cmath>

#include "device_tensors.cuh"
#include "fa1_backward.cuh"
#include "model.hpp"
#include "naive.cuh"
#include "reference.hpp"
#include "testing.hpp"

using namespace fa;

namespace {

Problem make(int B, int H, int Hkv, int nq, int nk, int d, bool causal, float dropout = 0.f) {
  Problem p;
  p.batch = B, p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  p.dropout_p = dropout, p.seed = 4321 + nq * 7 + nk + d, p.offset = 3;
  return p;
}

// 02's forward then 03's backward on t, every output NaN-poisoned first.
void run_02_then_03(const Problem& p, DeviceTensors& t) {
  DeviceBuffer<float> l(p.lse_elems()), m(p.lse_elems());
  t.poison_outputs(), l.poison(), m.poison();
  const fa1::RngState rng = fa1::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), l.get(), m.get(), t.lse.get());
  fa1::backward(p, rng, t.q.get(), t.k.get(), t.v.get(), t.o.get(), l.get(), m.get(), t.dout.get(), t.dq.get(),
                t.dk.get(), t.dv.get());
  CUDA_CHECK(cudaDeviceSynchronize());
}

void check_fa1_backward(const Problem& p, bool large_logits = false) {
  INFO(describe(p), std::string(large_logits ? " large logits" : ""));
  const HostTensors in = large_logits ? large_logit_inputs(p, true) : random_inputs(p, true);
  DeviceTensors t(p, in);
  run_02_then_03(p, t);
  const auto dq = t.dq.download(), dk = t.dk.download(), dv = t.dv.download();

  std::vector<double> rq, rk, rv;
  reference_backward(p, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), rq, rk, rv);
  const auto eq = compare(dq, rq, kTolFp32Backward), ek = compare(dk, rk, kTolFp32Backward),
             ev = compare(dv, rv, kTolFp32Backward);
  CHECK_MESSAGE(eq.ok(), eq.summary("dQ vs fp64"));
  CHECK_MESSAGE(ek.ok(), ek.summary("dK vs fp64"));
  CHECK_MESSAGE(ev.ok(), ev.summary("dV vs fp64"));

  // The equivalence chain: 00's backward on the same inputs.
  naive::Workspace ws(p, true);
  DeviceBuffer<float> o0(p.q_elems()), lse0(p.lse_elems()), dq0(p.q_elems()), dk0(p.kv_elems()), dv0(p.kv_elems());
  dq0.poison(), dk0.poison(), dv0.poison();
  naive::forward(p, t.q.get(), t.k.get(), t.v.get(), o0.get(), lse0.get(), ws);
  naive::backward(p, t.q.get(), t.k.get(), t.v.get(), t.dout.get(), ws, dq0.get(), dk0.get(), dv0.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto fq = compare(dq, to_double(dq0.download()), kTolFp32Backward);
  const auto fk = compare(dk, to_double(dk0.download()), kTolFp32Backward);
  const auto fv = compare(dv, to_double(dv0.download()), kTolFp32Backward);
  CHECK_MESSAGE(fq.ok(), fq.summary("dQ vs 00"));
  CHECK_MESSAGE(fk.ok(), fk.summary("dK vs 00"));
  CHECK_MESSAGE(fv.ok(), fv.summary("dV vs 00"));
}

}  // namespace

TEST_CASE("03 vs fp64 reference and 00: edge lengths, causal on/off, d = 64, batch*heads > 1") {
  for (auto [nq, nk] : edge_lengths())
    for (bool causal : {false, true}) {
      const bool big = nq > 512;
      check_fa1_backward(make(big ? 1 : 2, big ? 2 : 3, big ? 2 : 3, nq, nk, 64, causal));
    }
}

TEST_CASE("03 vs fp64 reference and 00: tile multiples, one query row and one key, a Q block with no key") {
  for (auto [nq, nk] : tile_and_vector_lengths())
    for (bool causal : {false, true}) check_fa1_backward(make(1, 2, 1, nq, nk, 64, causal));
}

TEST_CASE("03 vs fp64 reference and 00: large logits (|S| in the hundreds), d = 64 and 16") {
  for (bool causal : {false, true}) {
    check_fa1_backward(make(2, 3, 3, 113, 203, 64, causal), true);
    check_fa1_backward(make(1, 2, 2, 97, 61, 16, causal, 0.1f), true);
  }
}

// At N = 4096 the whole fp64 backward of every head would take minutes: check dQ on bands of rows
// (first, middle and last 16 of the first and last query head) and dK, dV of the one kv head in full,
// each against the fp64 reference of exactly those rows (about 1e10 multiply-adds, ~10 s).
TEST_CASE("03 at N = 4096 (GQA 3, causal, dropout): sampled rows of dQ, dK and dV vs fp64") {
  const Problem p = make(1, 3, 1, 4096, 4096, 64, true, 0.1f);
  INFO(describe(p));
  const HostTensors in = random_inputs(p, true);
  DeviceTensors t(p, in);
  run_02_then_03(p, t);
  const auto dq = t.dq.download(), dk = t.dk.download(), dv = t.dv.download();
  constexpr int kBand = 16;
  const int d = p.head_dim;
  for (int r0 : {0, p.q_len / 2 - kBand / 2, p.q_len - kBand})
    for (int h : {0, p.heads - 1}) {
      std::vector<double> rq(size_t(kBand) * d);
      reference_dq_rows(p, 0, h, r0, r0 + kBand, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), rq.data());
      const auto e = compare(dq.data() + p.q_offset(0, h) + size_t(r0) * d, rq.data(), rq.size(), kTolFp32Backward);
      CHECK_MESSAGE(e.ok(), e.summary("dQ rows " + std::to_string(r0) + ".. of head " + std::to_string(h)));
    }
  std::vector<double> rk(size_t(p.kv_len) * d), rv(rk.size());
  reference_dkdv_rows(p, 0, 0, 0, p.kv_len, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), rk.data(), rv.data());
  const auto ek = compare(dk, rk, kTolFp32Backward), ev = compare(dv, rv, kTolFp32Backward);
  CHECK_MESSAGE(ek.ok(), ek.summary("dK"));
  CHECK_MESSAGE(ev.ok(), ev.summary("dV"));
}

TEST_CASE("03 vs fp64 reference and 00: head_dim 16, 32, 128 on ragged rectangles") {
  for (int d : {16, 32, 128})
    for (bool causal : {false, true}) {
      check_fa1_backward(make(2, 2, 2, 113, 203, d, causal));
      check_fa1_backward(make(2, 2, 2, 203, 113, d, causal));
    }
}

TEST_CASE("03: GQA (ratios 2 and 3), MQA, custom scale, dropout p in {0, 0.1, 0.5} through 02 -> 03") {
  check_fa1_backward(make(2, 4, 2, 97, 97, 32, true));
  check_fa1_backward(make(1, 6, 2, 113, 97, 64, true));
  check_fa1_backward(make(1, 4, 1, 113, 203, 64, false));
  Problem p = make(2, 2, 2, 17, 97, 64, false);
  p.scale = 0.05f;
  check_fa1_backward(p);
  for (float drop : {0.f, 0.1f, 0.5f})
    for (bool causal : {false, true}) check_fa1_backward(make(2, 4, 2, 113, 203, 64, causal, drop));
}

TEST_CASE("03 alone: O, l, m from the CPU model (isolates 03 from 02)") {
  const Problem p = make(2, 4, 2, 203, 113, 64, true, 0.1f);
  INFO(describe(p));
  const HostTensors in = random_inputs(p, true);
  std::vector<float> o, l, m;
  fa1_bwd_model::forward(p, in.q.data(), in.k.data(), in.v.data(), o, l, m);
  DeviceTensors t(p, in);
  DeviceBuffer<float> od(o), ld(l), md(m);
  t.poison_outputs();
  fa1::backward(p, {p.seed, p.offset}, t.q.get(), t.k.get(), t.v.get(), od.get(), ld.get(), md.get(), t.dout.get(),
                t.dq.get(), t.dk.get(), t.dv.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> rq, rk, rv;
  reference_backward(p, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), rq, rk, rv);
  const auto eq = compare(t.dq.download(), rq, kTolFp32Backward), ek = compare(t.dk.download(), rk, kTolFp32Backward),
             ev = compare(t.dv.download(), rv, kTolFp32Backward);
  CHECK_MESSAGE(eq.ok(), eq.summary("dQ"));
  CHECK_MESSAGE(ek.ok(), ek.summary("dK"));
  CHECK_MESSAGE(ev.ok(), ev.summary("dV"));
}

// Finite differences of f = sum(dO o O), O from 02's forward on the GPU, against 03's gradients.
// Central differences with step e: truncation error ~ e^2 |f'''| / 6 ~ 2e-5 for e = 1e-2 (|f'''| = O(1)
// at this scale), rounding ~ (error of f) / e, where f is summed in double from fp32 O elements each
// off by ~1e-7 relative: sqrt(80) * 1e-7 / 1e-2 ~ 1e-4. Tolerance 1e-3 + 1e-2 |grad| covers both with
// margin; a wrong index, a lost mask or a mismatched dropout mask is off by O(0.1).
TEST_CASE("03: gradient check of the 02 -> 03 pipeline by finite differences (GQA, causal, dropout)") {
  const Problem p = make(1, 2, 1, 5, 7, 16, true, 0.1f);
  HostTensors in = random_inputs(p, true);
  DeviceTensors t(p, in);
  DeviceBuffer<float> l(p.lse_elems()), m(p.lse_elems());
  const fa1::RngState rng = fa1::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), l.get(), m.get(), t.lse.get());
  t.dq.poison(), t.dk.poison(), t.dv.poison();
  fa1::backward(p, rng, t.q.get(), t.k.get(), t.v.get(), t.o.get(), l.get(), m.get(), t.dout.get(), t.dq.get(),
                t.dk.get(), t.dv.get());
  const std::vector<float> grads[3] = {t.dq.download(), t.dk.download(), t.dv.download()};
  auto f = [&] {
    t.q.upload(in.q), t.k.upload(in.k), t.v.upload(in.v);
    fa1::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), l.get(), m.get(), t.lse.get());
    const auto o = t.o.download();
    double s = 0;
    for (size_t e = 0; e < o.size(); ++e) s += double(o[e]) * in.dout[e];
    return s;
  };
  constexpr float kStep = 1e-2f;
  std::vector<float>* inputs[3] = {&in.q, &in.k, &in.v};
  const char* names[3] = {"dQ", "dK", "dV"};
  for (int x = 0; x < 3; ++x)
    for (size_t e = 0; e < inputs[x]->size(); ++e) {
      const float keep = (*inputs[x])[e];
      (*inputs[x])[e] = keep + kStep;
      const double up = f();
      (*inputs[x])[e] = keep - kStep;
      const double down = f();
      (*inputs[x])[e] = keep;
      const double fd = (up - down) / (2.0 * kStep), g = grads[x][e];
      INFO(std::string(names[x]), "[", e, "]: finite difference ", fd, ", backward ", g);
      CHECK(std::fabs(fd - g) <= 1e-3 + 1e-2 * std::fabs(g));
    }
}

// GPU tests of block-sparse FlashAttention-2 (README §6): fa2::forward and fa2::backward (both dQ modes) with a
// block mask, against the fp64 reference with the same mask, outputs NaN-poisoned before every run. Shapes: the
// edge lengths (ragged against the 128 x 64 mask blocks and the tiles), causal with and without a mask, GQA,
// head_dim 16/32/64/128, a fully masked row block and key block, large logits; and the dense mask against no mask.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "block_mask.hpp"
#include "device_tensors.cuh"
#include "fa2.cuh"
#include "reference.hpp"
#include "testing.hpp"

using namespace fa;

namespace {

Problem make(int B, int H, int Hkv, int nq, int nk, int d, bool causal) {
  Problem p;
  p.batch = B, p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  return p;
}

void expect(const ErrorReport& e, const std::string& what) { CHECK_MESSAGE(e.ok(), e.summary(what.c_str())); }

// Forward and both backward modes with `mask` against the fp64 reference with it; returns the forward's O
// (for tests that look at particular rows).
std::vector<float> check_block_sparse(const Problem& p, const BlockMask& mask) {
  INFO(describe(p), " block mask ", mask.Tr, " x ", mask.Tc, " density ", mask.density());
  const HostTensors in = random_inputs(p, true);
  DeviceTensors t(p, in);
  DeviceBuffer<float> ws(fa2::backward_workspace_bytes(p) / sizeof(float));
  const DeviceBuffer<uint8_t> bits(mask.bits);
  std::vector<double> ro, rl, rq, rk, rv;
  reference_forward(p, in.q.data(), in.k.data(), in.v.data(), ro, rl, &mask);
  reference_backward(p, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), rq, rk, rv, &mask);

  t.poison_outputs();
  fa2::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), bits.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> o = t.o.download();
  expect(compare(o, ro, kTolFp32Forward), "04 block-sparse O vs fp64");
  expect(compare(t.lse.download(), rl, kTolFp32Forward), "04 block-sparse LSE vs fp64");

  const fa2::DqMode modes[] = {fa2::DqMode::Atomic, fa2::DqMode::Deterministic};
  for (int mi = 0; mi < 2; ++mi) {
    INFO(std::string(mi == 0 ? "dQ mode: Atomic" : "dQ mode: Deterministic"));
    t.dq.poison(), t.dk.poison(), t.dv.poison(), ws.poison();
    fa2::backward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), t.dout.get(), t.dq.get(), t.dk.get(),
                  t.dv.get(), modes[mi], ws.get(), bits.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    expect(compare(t.dq.download(), rq, kTolFp32Backward), "04 block-sparse dQ vs fp64");
    expect(compare(t.dk.download(), rk, kTolFp32Backward), "04 block-sparse dK vs fp64");
    expect(compare(t.dv.download(), rv, kTolFp32Backward), "04 block-sparse dV vs fp64");
  }
  return o;
}

}  // namespace

TEST_CASE("04 block-sparse vs fp64: edge lengths (1, 17, 97, 113 x 203, 1023), local/strided/random, causal on/off") {
  for (auto [nq, nk] : edge_lengths())
    for (bool causal : {false, true}) {
      const Problem p = make(1, 2, 2, nq, nk, 64, causal);
      for (const BlockMask& m : {local_block_mask(p, 100), strided_block_mask(p, 3), random_block_mask(p, 0.3, 17)})
        check_block_sparse(p, m);
    }
}

TEST_CASE("04 block-sparse vs fp64: head_dim 16, 32, 128; GQA 8/2 and MQA; tile multiples") {
  for (int d : {16, 32, 128})
    for (bool causal : {false, true}) {
      const Problem p = make(1, 2, 1, 300, 260, d, causal);
      check_block_sparse(p, random_block_mask(p, 0.5, 3));
    }
  for (int hkv : {2, 1}) {
    const Problem p = make(2, 8, hkv, 203, 331, 64, true);
    check_block_sparse(p, local_block_mask(p, 64));
  }
  const Problem p = make(1, 4, 2, 1024, 1024, 64, false);
  check_block_sparse(p, strided_block_mask(p, 4));
}

TEST_CASE("04 block-sparse: the dense mask and the causal-equivalent mask give the unmasked results") {
  for (bool causal : {false, true}) {
    const Problem p = make(1, 4, 2, 203, 113, 64, causal);
    check_block_sparse(p, dense_block_mask(p));
    if (causal) check_block_sparse(p, causal_block_mask(p));
  }
}

TEST_CASE("04 block-sparse: a fully masked row block gives O = 0, LSE = -inf; an unseen key block dK = dV = 0") {
  const Problem p = make(1, 2, 1, 400, 300, 64, false);  // 4 x 5 mask blocks
  BlockMask m = dense_block_mask(p);
  for (int c = 0; c < m.Tc; ++c) m.bits[size_t(1) * m.Tc + c] = 0;  // queries 128..255 see no key
  for (int r = 0; r < m.Tr; ++r) m.bits[size_t(r) * m.Tc + 2] = 0;  // keys 128..191 are seen by no query
  const std::vector<float> o = check_block_sparse(p, m);  // the reference has O = 0, LSE = -inf, dK = dV = 0 there
  for (int c = 0; c < p.head_dim; ++c) CHECK(o[size_t(200) * p.head_dim + c] == 0.f);
  // Everything masked: every row empty.
  BlockMask none = dense_block_mask(p);
  std::fill(none.bits.begin(), none.bits.end(), 0);
  check_block_sparse(p, none);
}

TEST_CASE("04 block-sparse: large logits (S ~ 200), causal, q_len > kv_len") {
  Problem p = make(1, 2, 1, 203, 113, 64, true);
  p.scale = 25.f / std::sqrt(64.f);
  const BlockMask m = random_block_mask(p, 0.6, 5);
  // The tolerances of test_fa2.cu's large-logit cases (S rounding grows with |S|).
  const HostTensors in = random_inputs(p, false);
  DeviceTensors t(p, in);
  const DeviceBuffer<uint8_t> bits(m.bits);
  std::vector<double> ro, rl;
  reference_forward(p, in.q.data(), in.k.data(), in.v.data(), ro, rl, &m);
  t.poison_outputs();
  fa2::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), bits.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  expect(compare(t.o.download(), ro, Tolerance{5e-4, 1e-4}), "04 block-sparse O vs fp64, large logits");
  expect(compare(t.lse.download(), rl, Tolerance{5e-4, 1e-4}), "04 block-sparse LSE vs fp64, large logits");
}

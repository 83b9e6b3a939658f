// GPU tests: the FA1 forward kernel against the fp64 reference, chapter 00 (also with dropout: same
// Philox mask) and chapter 01's fused FA1-form kernel (no dropout), on the same inputs, outputs
// NaN-poisoned before every run; ragged lengths, causal, q_len != kv_len, GQA, every head_dim, and
// tile sizes below the kernel's capacity (the tiling of a device with less shared memory).
#include <doctest/doctest.h>

#include <cmath>

#include "device_tensors.cuh"
#include "fa1_forward.cuh"
#include "naive.cuh"
#include "reference.hpp"
#include "testing.hpp"
#include "online_softmax.cuh"

using namespace fa;

namespace {

Problem make(int B, int H, int Hkv, int nq, int nk, int d, bool causal, float dropout = 0.f) {
  Problem p;
  p.batch = B, p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  p.dropout_p = dropout, p.seed = 4321 + nq * 7 + nk + d, p.offset = 3;
  return p;
}

// One run of 02 (with the device's block sizes, or `bs`), compared with the reference, 00 and 01.
void check_fa1(const Problem& p, const fa1::BlockSizes* bs = nullptr, bool large_logits = false) {
  INFO(describe(p), bs ? " Br=" + std::to_string(bs->Br) + " Bc=" + std::to_string(bs->Bc) : std::string(),
       large_logits ? " large logits" : "");
  const HostTensors in = large_logits ? large_logit_inputs(p, false) : random_inputs(p, false);
  DeviceTensors t(p, in);
  DeviceBuffer<float> l(p.lse_elems()), m(p.lse_elems());
  t.poison_outputs(), l.poison(), m.poison();
  const fa1::RngState rng =
      bs ? fa1::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), l.get(), m.get(), t.lse.get(), *bs)
         : fa1::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), l.get(), m.get(), t.lse.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(rng.seed == p.seed);
  CHECK(rng.offset == p.offset);
  const std::vector<float> o = t.o.download(), lse = t.lse.download(), hl = l.download(), hm = m.download();

  std::vector<double> ro, rl;
  reference_forward(p, in.q.data(), in.k.data(), in.v.data(), ro, rl);
  const auto eo = compare(o, ro, kTolFp32Forward), el = compare(lse, rl, kTolLse);
  CHECK_MESSAGE(eo.ok(), eo.summary("O vs fp64"));
  CHECK_MESSAGE(el.ok(), el.summary("LSE vs fp64"));
  for (size_t r = 0; r < lse.size(); ++r) {  // l, m consistent with LSE; empty rows l = 0, m = -inf
    if (std::isinf(rl[r])) {
      CHECK(hl[r] == 0.f);
      CHECK(hm[r] == -INFINITY);
    } else {
      CHECK(double(lse[r]) == doctest::Approx(double(hm[r]) + std::log(double(hl[r]))).epsilon(1e-6));
    }
  }

  // Chapter 00 on the same inputs (the same dropout mask): the chain 00 -> 02.
  naive::Workspace ws(p, false);
  t.poison_outputs();
  naive::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), ws);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto e0 = compare(o, to_double(t.o.download()), kTolFp32Forward);
  const auto e0l = compare(lse, to_double(t.lse.download()), kTolLse);
  CHECK_MESSAGE(e0.ok(), e0.summary("O vs chapter 00"));
  CHECK_MESSAGE(e0l.ok(), e0l.summary("LSE vs chapter 00"));

  if (p.dropout_p == 0.f && p.head_dim <= 256) {  // 01 has no dropout
    t.poison_outputs();
    online_softmax::attention_fused(p, online_softmax::Form::Fa1NormalisedEachStep, t.q.get(), t.k.get(), t.v.get(),
                                    t.o.get(), t.lse.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto e1 = compare(o, to_double(t.o.download()), kTolFp32Forward);
    const auto e1l = compare(lse, to_double(t.lse.download()), kTolLse);
    CHECK_MESSAGE(e1.ok(), e1.summary("O vs chapter 01 (fused, FA1 form)"));
    CHECK_MESSAGE(e1l.ok(), e1l.summary("LSE vs chapter 01 (fused, FA1 form)"));
  }
}

}  // namespace

TEST_CASE("02 vs fp64, 00 and 01: edge lengths, causal on/off, d = 64, batch*heads > 1") {
  for (auto [nq, nk] : edge_lengths())
    for (bool causal : {false, true}) {
      const bool big = nq > 512;
      check_fa1(make(big ? 1 : 2, big ? 2 : 3, big ? 2 : 3, nq, nk, 64, causal));
    }
}

TEST_CASE("02: tile multiples (every tile full), one query row and one key, a whole Q block with no key") {
  for (auto [nq, nk] : tile_and_vector_lengths())
    for (bool causal : {false, true}) check_fa1(make(1, 2, 1, nq, nk, 64, causal));
}

TEST_CASE("02: large logits (|S| in the hundreds), d = 64 and 16, causal on/off, small tiles too") {
  const fa1::BlockSizes small{7, 13};
  for (bool causal : {false, true}) {
    check_fa1(make(2, 3, 3, 113, 203, 64, causal), nullptr, true);
    check_fa1(make(1, 2, 1, 1024, 1024, 64, causal), nullptr, true);
    check_fa1(make(1, 2, 2, 97, 61, 16, causal), nullptr, true);
    check_fa1(make(1, 2, 2, 113, 203, 64, causal), &small, true);
  }
}

TEST_CASE("02: every head_dim (16, 32, 64, 128) on ragged rectangles both ways") {
  for (int d : {16, 32, 64, 128})
    for (bool causal : {false, true}) {
      check_fa1(make(2, 2, 2, 113, 203, d, causal));
      check_fa1(make(2, 2, 2, 203, 113, d, causal));
    }
}

TEST_CASE("02: GQA (ratios 2 and 3), MQA, custom scale") {
  check_fa1(make(2, 4, 2, 97, 97, 32, true));
  check_fa1(make(1, 6, 2, 113, 97, 64, true));
  check_fa1(make(1, 4, 1, 113, 203, 64, false));
  Problem p = make(2, 2, 2, 17, 97, 64, false);
  p.scale = 0.05f;
  check_fa1(p);
}

TEST_CASE("02: dropout p in {0, 0.1, 0.5} equals 00's (same Philox mask) and the reference") {
  for (float drop : {0.f, 0.1f, 0.5f})
    for (bool causal : {false, true}) {
      check_fa1(make(2, 2, 1, 113, 203, 64, causal, drop));
      check_fa1(make(1, 2, 2, 203, 113, 128, causal, drop));
    }
}

TEST_CASE("02: block sizes below the kernel's capacity (the tiling of a small-SRAM device)") {
  for (auto bs : std::vector<fa1::BlockSizes>{{1, 1}, {7, 13}, {16, 48}, {64, 17}})
    for (bool causal : {false, true}) check_fa1(make(1, 2, 2, 113, 203, 64, causal, 0.1f), &bs);
  fa1::BlockSizes small{5, 9};
  check_fa1(make(1, 2, 2, 97, 61, 16, true), &small);
}

TEST_CASE("02: block_sizes follows line 2 and clamps to the kernel; bad head_dim is a usage error") {
  const fa1::BlockSizes h100 = fa1::block_sizes(64, 232448);  // seed: Br = 64, Bc = 227
  CHECK(h100.Br == 64);
  CHECK(h100.Bc == fa1::max_bc());
  CHECK(fa1::block_sizes(16, 232448).Br == 16);  // Br = min(ceil(M/4d), d) = d
  const fa1::BlockSizes small = fa1::block_sizes(128, 49152);  // ceil(12288 / 512) = 24
  CHECK(small.Br == 24);
  CHECK(small.Bc == 24);
  CHECK_THROWS_AS(fa1::block_sizes(48, 232448), UsageError);
  const Problem p = make(1, 1, 1, 16, 16, 80, false);
  CHECK_THROWS_AS(fa1::forward(p, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), UsageError);
}

// GPU tests, the equivalence chain: kernels 1-3 vs the fp64 reference softmax and vs chapter 00's
// softmax kernel on the same inputs; kernel 4 (both forms) vs the fp64 reference and vs chapter 00's
// forward. Outputs NaN-poisoned before every run; ragged lengths, causal on/off, head_dim up to 256.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "device_tensors.cuh"
#include "naive.cuh"
#include "online_softmax.cuh"
#include "random.hpp"
#include "reference.hpp"
#include "testing.hpp"

using namespace fa;

namespace {

using SoftmaxFn = void (*)(const float*, float*, int, int);
struct Variant {
  const char* name;
  SoftmaxFn fn;
};
const Variant kVariants[] = {{"3-pass", online_softmax::softmax_3pass},
                             {"online 2-pass", online_softmax::softmax_online_2pass},
                             {"online merge", online_softmax::softmax_online_merge}};

// x [rows, cols]; `misalign` offsets x and y by one float, forcing the scalar path even when
// cols % 4 == 0.
void check_softmax(int rows, int cols, double stddev, bool misalign = false) {
  const std::vector<float> x = random_normal<float>(size_t(rows) * cols, rows * 31 + cols, 0.5, stddev);
  std::vector<double> ref(x.size());
  reference_softmax(x.data(), rows, cols, ref.data());
  const size_t off = misalign ? 1 : 0;
  std::vector<float> xpad(off, 0.f);
  xpad.insert(xpad.end(), x.begin(), x.end());
  DeviceBuffer<float> dx(xpad), dy(x.size() + off), dp(x.size()), dl(rows);

  Problem p;  // chapter 00's softmax: one head whose rows are our rows
  p.q_len = rows, p.kv_len = cols;
  dp.poison(), dl.poison();
  naive::softmax(p, dx.get() + off, dp.get(), nullptr, dl.get());
  const std::vector<double> naive_y = to_double(dp.download());

  for (const Variant& v : kVariants) {
    INFO(std::string(v.name) << " rows=" << rows << " cols=" << cols << " stddev=" << stddev << std::string(misalign ? " misaligned" : ""));
    dy.poison();
    v.fn(dx.get() + off, dy.get() + off, rows, cols);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> y = dy.download();
    y.erase(y.begin(), y.begin() + long(off));
    const auto er = compare(y, ref, kTolFp32Forward), en = compare(y, naive_y, kTolFp32Forward);
    CHECK_MESSAGE(er.ok(), er.summary("vs fp64"));
    CHECK_MESSAGE(en.ok(), en.summary("vs 00 softmax"));
  }
}

Problem make(int B, int H, int Hkv, int nq, int nk, int d, bool causal) {
  Problem p;
  p.batch = B, p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  p.seed = 77 + nq * 5 + nk + d;
  return p;
}

void check_attention(const Problem& p, bool large_logits = false) {
  const HostTensors in = large_logits ? large_logit_inputs(p, false) : random_inputs(p, false);
  DeviceTensors t(p, in);
  naive::Workspace ws(p, false);
  t.poison_outputs();
  naive::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), ws);
  const std::vector<double> no = to_double(t.o.download()), nl = to_double(t.lse.download());
  std::vector<double> ro, rl;
  reference_forward(p, in.q.data(), in.k.data(), in.v.data(), ro, rl);
  for (auto form : {online_softmax::Form::Fa1NormalisedEachStep, online_softmax::Form::Fa2DeferredNormalisation}) {
    INFO(describe(p) << std::string(form == online_softmax::Form::Fa1NormalisedEachStep ? " FA1 form" : " FA2 form")
                     << std::string(large_logits ? " large logits" : ""));
    t.poison_outputs();
    online_softmax::attention_fused(p, form, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> o = t.o.download(), lse = t.lse.download();
    const auto eo = compare(o, ro, kTolFp32Forward), el = compare(lse, rl, kTolLse);
    const auto no_ = compare(o, no, kTolFp32Forward), nl_ = compare(lse, nl, kTolLse);
    CHECK_MESSAGE(eo.ok(), eo.summary("O vs fp64"));
    CHECK_MESSAGE(el.ok(), el.summary("LSE vs fp64"));
    CHECK_MESSAGE(no_.ok(), no_.summary("O vs 00"));
    CHECK_MESSAGE(nl_.ok(), nl_.summary("LSE vs 00"));
  }
}

}  // namespace

TEST_CASE("01 softmax kernels 1-3 vs fp64 and vs 00: edge lengths (scalar path)") {
  for (auto [r, c] : edge_lengths()) check_softmax(r, c, 1.0);
}

TEST_CASE("01 softmax kernels 1-3: float4 path, long rows, misaligned pointers") {
  for (auto [r, c] : std::vector<std::pair<int, int>>{{3, 4}, {5, 100}, {64, 1024}, {33, 4096}, {4, 16384}, {2, 65536}})
    check_softmax(r, c, 1.0);
  check_softmax(9, 1024, 1.0, true);  // cols % 4 == 0 but x, y not 16-byte aligned: scalar path
  check_softmax(3, 70001, 1.0);       // scalar path (odd length), 1024 threads, several unrolled rounds
}

TEST_CASE("01 softmax kernels 1-3: |x| up to 1e4 does not overflow") {
  check_softmax(16, 1000, 3000.0);
  check_softmax(16, 4096, 3000.0);
}

TEST_CASE("01 fused attention (both forms) vs fp64 and vs 00: edge lengths, causal on/off, d = 64") {
  for (auto [nq, nk] : edge_lengths())
    for (bool causal : {false, true}) {
      const bool big = nq > 512;
      check_attention(make(big ? 1 : 2, big ? 2 : 3, big ? 2 : 3, nq, nk, 64, causal));
    }
}

TEST_CASE("01 fused attention: tile multiples, one query row and one key, a block of rows with no key") {
  for (auto [nq, nk] : tile_and_vector_lengths())
    for (bool causal : {false, true}) check_attention(make(1, 2, 1, nq, nk, 64, causal));
}

TEST_CASE("01 fused attention: large logits (|S| in the hundreds), d = 64 and 16, causal on/off") {
  for (bool causal : {false, true}) {
    check_attention(make(2, 3, 3, 113, 203, 64, causal), true);
    check_attention(make(1, 2, 1, 1024, 1024, 64, causal), true);
    check_attention(make(1, 2, 2, 97, 61, 16, causal), true);
  }
}

TEST_CASE("01 fused attention: head_dim 1..256 (every register-slot instantiation, ragged d)") {
  for (int d : {1, 16, 32, 33, 100, 128, 129, 256})
    for (bool causal : {false, true}) check_attention(make(2, 2, 2, 113, 203, d, causal));
}

TEST_CASE("01 fused attention: GQA (ratios 2 and 3), MQA, custom scale, fully masked rows") {
  check_attention(make(2, 4, 2, 97, 97, 32, true));
  check_attention(make(1, 6, 2, 113, 97, 64, true));
  check_attention(make(1, 4, 1, 113, 203, 64, false));
  Problem p = make(2, 2, 2, 17, 97, 64, false);
  p.scale = 0.05f;
  check_attention(p);
  const Problem e = make(1, 2, 2, 203, 113, 64, true);  // rows 0..89 see no key: O = 0, LSE = -inf
  const HostTensors in = random_inputs(e, false);
  DeviceTensors t(e, in);
  t.poison_outputs();
  online_softmax::attention_fused(e, online_softmax::Form::Fa2DeferredNormalisation, t.q.get(), t.k.get(),
                                  t.v.get(), t.o.get(), t.lse.get());
  const auto o = t.o.download(), lse = t.lse.download();
  for (int h = 0; h < e.heads; ++h)
    for (int i = 0; i < e.q_len - e.kv_len; ++i) {
      CHECK((std::isinf(lse[e.lse_offset(0, h) + i]) && lse[e.lse_offset(0, h) + i] < 0));
      for (int c = 0; c < e.head_dim; ++c) CHECK(o[e.q_offset(0, h) + size_t(i) * e.head_dim + c] == 0.f);
    }
}

TEST_CASE("01 fused attention refuses what it does not support") {
  Problem p = make(1, 1, 1, 8, 8, 257, false);
  CHECK_THROWS_AS(online_softmax::check_supported(p), UsageError);
  p.head_dim = 64, p.dropout_p = 0.1f;
  CHECK_THROWS_AS(online_softmax::check_supported(p), UsageError);
}

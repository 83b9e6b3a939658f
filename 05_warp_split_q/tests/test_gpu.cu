// GPU tests: every step of the ladder (split-K included) x fp16/bf16 x head_dim 64/128 against the fp64
// reference fed the rounded inputs (error rule: max |O - ref| <= 2 x plain same-dtype error + floor; LSE with
// check.hpp's tolerance) and against chapter 04 (fp32, same rounded inputs). Outputs NaN-poisoned before each
// run. Shapes: the edge lengths (1, 17, 64, 97, 113x203, 1023, 1024), q_len != kv_len causal with rows that
// see no key, GQA 8/2, MQA 8/1, GQA 6/2, large logits (Q, K with stddev 8: logits in the hundreds).
#include <doctest/doctest.h>

#include <cmath>

#include "device.cuh"
#include "device_buffer.cuh"
#include "fa2.cuh"
#include "program.hpp"
#include "random.hpp"
#include "testing.hpp"

#include "forward/check.hpp"
#include "forward/warp_split_q.cuh"

using namespace fa;

namespace {

Problem make(int B, int H, int Hkv, int nq, int nk, int d, bool causal) {
  Problem p;
  p.batch = B, p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  p.seed = 77 + nq + 3 * nk + d;
  return p;
}

struct Inputs {
  std::vector<float> q, k, v;  // rounded to the dtype
};
Inputs inputs(Dtype t, const Problem& p, double qk_stddev) {
  return {rounded(t, random_normal<float>(p.q_elems(), p.seed * 4 + 1, 0.0, qk_stddev)),
          rounded(t, random_normal<float>(p.kv_elems(), p.seed * 4 + 2, 0.0, qk_stddev)),
          rounded(t, random_normal<float>(p.kv_elems(), p.seed * 4 + 3))};
}

template <class T>
void check_steps(Dtype t, const Problem& p, double qk_stddev) {
  const Inputs in = inputs(t, p, qk_stddev);
  DeviceBuffer<T> q(to_dtype<T>(in.q)), k(to_dtype<T>(in.k)), v(to_dtype<T>(in.v)), o(p.q_elems());
  DeviceBuffer<float> lse(p.lse_elems());
  DeviceBuffer<float> q32(in.q), k32(in.k), v32(in.v), o32(p.q_elems()), lse32(p.lse_elems());
  o32.poison(), lse32.poison();
  fa2::forward(p, q32.get(), k32.get(), v32.get(), o32.get(), lse32.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> o04 = to_double(o32.download()), lse04 = to_double(lse32.download());
  const wsq::LowpReference ref = wsq::lowp_reference(t, p, in.q, in.k, in.v, 1e30);  // every row
  for (const wsq::ForwardStep& s : wsq::forward_steps()) {
    INFO("step ", std::string(s.name), ", ", std::string(dtype_name(t)), ", ", describe(p), ", Q/K stddev ", qk_stddev);
    o.poison(), lse.poison();
    try {
      s.launch.of<T>()(p, q.get(), k.get(), v.get(), o.get(), lse.get());
    } catch (const NotOnThisGpu& e) {  // more shared memory than this GPU gives a block: skipped, said so
      MESSAGE("skipped: ", e.what());
      continue;
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<T> o_t = o.download();
    std::vector<float> o_f(o_t.size());
    for (size_t x = 0; x < o_t.size(); ++x) o_f[x] = to_float(o_t[x]);
    const std::vector<float> lse_f = lse.download();
    const wsq::LowpCheck c = wsq::check_lowp_forward(p, ref, o_f, lse_f);
    CHECK_MESSAGE(c.ok(), c.summary());
    const ErrorReport e04 = compare(o_f, o04, {c.bound + kTolFp32Forward.atol, 0});
    CHECK_MESSAGE(e04.ok(), e04.summary("O vs 04"));
    const ErrorReport l04 = compare(lse_f, lse04, wsq::kTolLse);
    CHECK_MESSAGE(l04.ok(), l04.summary("LSE vs 04"));
  }
}

void check_all(const Problem& p, double qk_stddev = 1.0) {
  check_steps<half_t>(Dtype::fp16, p, qk_stddev);
  check_steps<bfloat16_t>(Dtype::bf16, p, qk_stddev);
}

}  // namespace

TEST_CASE("05 every step vs fp64 and 04: ragged and tile-multiple lengths, causal on/off, d = 64 and 128") {
  const std::vector<std::pair<int, int>> lengths = {{1, 1}, {17, 17}, {64, 64}, {97, 97}, {113, 203}, {203, 113},
                                                    {1023, 1023}, {1024, 1024}};
  for (int d : {64, 128})
    for (auto [nq, nk] : lengths)
      for (bool causal : {false, true}) {
        const bool big = nq > 512;
        check_all(make(big ? 1 : 2, big ? 2 : 3, big ? 2 : 3, nq, nk, d, causal));
      }
}

TEST_CASE("05 every step: GQA 8/2, MQA 8/1, GQA 6/2, causal with q_len != kv_len both ways") {
  for (auto [h, hkv] : std::vector<std::pair<int, int>>{{8, 2}, {8, 1}, {6, 2}})
    for (bool causal : {false, true}) {
      check_all(make(1, h, hkv, 97, 203, 64, causal));
      check_all(make(2, h, hkv, 203, 97, 128, causal));
    }
}

TEST_CASE("05 every step: large logits (Q, K stddev 8: logits in the hundreds) and a custom scale") {
  for (int d : {64, 128}) check_all(make(1, 2, 1, 130, 257, d, true), 8.0);
  Problem p = make(2, 4, 2, 130, 70, 64, true);
  p.scale = 0.05f;
  check_all(p);
}

TEST_CASE("05 every step: rows that see no key give O = 0 exactly and LSE = -inf") {
  const Problem p = make(1, 2, 2, 203, 113, 64, true);  // rows 0..89 see no key
  const Inputs in = inputs(Dtype::fp16, p, 1.0);
  DeviceBuffer<half_t> q(to_dtype<half_t>(in.q)), k(to_dtype<half_t>(in.k)), v(to_dtype<half_t>(in.v)),
      o(p.q_elems());
  DeviceBuffer<float> lse(p.lse_elems());
  for (const wsq::ForwardStep& s : wsq::forward_steps()) {
    INFO("step ", std::string(s.name));
    o.poison(), lse.poison();
    s.launch.fp16(p, q.get(), k.get(), v.get(), o.get(), lse.get());
    const std::vector<half_t> ot = o.download();
    const std::vector<float> l = lse.download();
    for (int h = 0; h < p.heads; ++h)
      for (int i = 0; i < p.q_len - p.kv_len; ++i) {
        const float L = l[p.lse_offset(0, h) + i];
        CHECK((std::isinf(L) && L < 0));
        for (int c = 0; c < p.head_dim; ++c) CHECK(to_float(ot[p.q_offset(0, h) + size_t(i) * p.head_dim + c]) == 0.f);
      }
  }
}

TEST_CASE("05: unsupported head_dim and dropout are UsageErrors naming what works") {
  Problem p = make(1, 1, 1, 8, 8, 96, false);
  CHECK_THROWS_WITH_AS(wsq::check_supported(p), doctest::Contains("64 or 128"), UsageError);
  p.head_dim = 64, p.dropout_p = 0.1f;
  CHECK_THROWS_AS(wsq::check_supported(p), UsageError);
  CHECK_THROWS_AS(wsq::find_step("v9"), UsageError);
}

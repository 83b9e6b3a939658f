// GPU tests of the backward: every step, both dQ modes, fp16 and bf16, against
//   * the fp64 reference with the error rule: max error <= 2 x the plain same-dtype backward's + the floor
//     (bwd_testing.hpp; the plain backward is bwd_model.hpp's, CPU-tested in test_bwd_model.cpp);
//   * chapter 04's fp32 backward on the same rounded inputs, O and LSE (the equivalence chain), same bound.
// The backward is fed the fp64 forward's O (rounded to the dtype) and LSE, so a forward bug cannot hide here;
// one case runs the chapter's own forward first (end to end). Outputs and workspace are NaN-poisoned before
// every run. Shapes: the edge lengths (ragged against the 64-key and 32/64-query tiles), causal on/off with
// q_len != kv_len both ways, head_dim 64 and 128, GQA 8/2 and MQA 8/1, large logits. On an sm_90 GPU the list of
// steps includes the Hopper steps 9-13, and one case gives them longer rows.
#include <doctest/doctest.h>

#include <cstring>

#include "device.cuh"
#include "device_buffer.cuh"
#include "fa2.cuh"
#include "lowp.hpp"
#include "program.hpp"
#include "testing.hpp"

#include "backward/backward.cuh"
#include "backward/bwd_program.cuh"
#include "bwd_testing.hpp"
#include "forward/warp_split_q.cuh"

using namespace fa;
using wsq_bwd_testing::Case;
using wsq_bwd_testing::make;

namespace {

// A case's tensors on the device, inputs in the dtype T.
template <class T>
struct Device {
  Problem p;
  DeviceBuffer<T> q, k, v, o, dout;
  DeviceBuffer<float> lse, dq, dk, dv, ws;
  explicit Device(const Case& c)
      : p(c.p), q(to_dtype<T>(c.q)), k(to_dtype<T>(c.k)), v(to_dtype<T>(c.v)), o(to_dtype<T>(c.o)),
        dout(to_dtype<T>(c.dout)), lse(c.lse), dq(c.p.q_elems()), dk(c.p.kv_elems()), dv(c.p.kv_elems()),
        ws(wsq::backward_workspace_bytes(c.p) / sizeof(float)) {}
  // One run of step s on NaN-poisoned outputs and workspace; false (and a message) where the step needs more shared
  // memory than this GPU gives a block.
  bool run(const wsq::BackwardStep& s, wsq::DqMode mode) {
    dq.poison(), dk.poison(), dv.poison(), ws.poison();
    try {
      s.launch.of<T>()(p, q.get(), k.get(), v.get(), o.get(), lse.get(), dout.get(), dq.get(), dk.get(), dv.get(),
                       mode, ws.get());
    } catch (const NotOnThisGpu& e) {
      MESSAGE("skipped: ", e.what());
      return false;
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    return true;
  }
};

// Chapter 04's fp32 backward on the same rounded inputs, O and LSE: dq, dk, dv widened to double.
void run_04(const Case& c, std::vector<double>& dq, std::vector<double>& dk, std::vector<double>& dv) {
  DeviceBuffer<float> q(c.q), k(c.k), v(c.v), o(c.o), dout(c.dout), lse(c.lse);
  DeviceBuffer<float> gq(c.p.q_elems()), gk(c.p.kv_elems()), gv(c.p.kv_elems());
  DeviceBuffer<float> ws(fa2::backward_workspace_bytes(c.p) / sizeof(float));
  fa2::backward(c.p, q.get(), k.get(), v.get(), o.get(), lse.get(), dout.get(), gq.get(), gk.get(), gv.get(),
                fa2::DqMode::Deterministic, ws.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  dq = to_double(gq.download()), dk = to_double(gk.download()), dv = to_double(gv.download());
}

void expect(const ErrorReport& e, const std::string& what, double bound) {
  CHECK_MESSAGE(e.ok(), e.summary(what), " (bound ", bound, ")");
}

template <class T>
void check_case_t(const Case& c, const std::vector<const wsq::BackwardStep*>& steps) {
  Device<T> dev(c);
  std::vector<double> q4, k4, v4;
  run_04(c, q4, k4, v4);
  // vs 04: the same bound, plus 04's own fp32 error (kTolFp32Backward).
  const double a4 = kTolFp32Backward.atol;
  for (const wsq::BackwardStep* s : steps)
    for (wsq::DqMode mode : {wsq::DqMode::Atomic, wsq::DqMode::Deterministic}) {
      const std::string mode_name = mode == wsq::DqMode::Atomic ? "Atomic" : "Deterministic";
      INFO("step ", std::string(s->name), ", dQ mode ", mode_name);
      if (!dev.run(*s, mode)) continue;
      const std::vector<float> dq = dev.dq.download(), dk = dev.dk.download(), dv = dev.dv.download();
      expect(wsq_bwd_testing::check(dq, c.rdq, c.bound_dq), "dQ vs fp64", c.bound_dq);
      expect(wsq_bwd_testing::check(dk, c.rdk, c.bound_dk), "dK vs fp64", c.bound_dk);
      expect(wsq_bwd_testing::check(dv, c.rdv, c.bound_dv), "dV vs fp64", c.bound_dv);
      expect(wsq_bwd_testing::check(dq, q4, c.bound_dq + a4), "dQ vs 04", c.bound_dq + a4);
      expect(wsq_bwd_testing::check(dk, k4, c.bound_dk + a4), "dK vs 04", c.bound_dk + a4);
      expect(wsq_bwd_testing::check(dv, v4, c.bound_dv + a4), "dV vs 04", c.bound_dv + a4);
    }
}

std::vector<const wsq::BackwardStep*> all_steps() {
  std::vector<const wsq::BackwardStep*> v;
  for (const wsq::BackwardStep& s : wsq::backward_steps()) v.push_back(&s);
  return v;
}

void check_case(Dtype t, const Problem& p, double stddev = 1.0,
                const std::vector<const wsq::BackwardStep*>& steps = all_steps()) {
  INFO(describe(p), " dtype=", std::string(dtype_name(t)), " stddev=", stddev);
  const Case c = wsq_bwd_testing::make_case(t, p, stddev);
  if (t == Dtype::fp16) check_case_t<half_t>(c, steps);
  else check_case_t<bfloat16_t>(c, steps);
}

}  // namespace

TEST_CASE("05 backward vs fp64 and 04: edge lengths, causal on/off, d = 64, fp16 and bf16") {
  for (Dtype t : {Dtype::fp16, Dtype::bf16})
    for (auto [nq, nk] : edge_lengths())
      for (bool causal : {false, true}) {
        const bool big = nq > 512;  // keep the fp64 reference quick
        check_case(t, make(big ? 1 : 2, 2, big ? 1 : 2, nq, nk, 64, causal));
      }
}

TEST_CASE("05 backward vs fp64 and 04: head_dim 128 (Br = 32) on ragged rectangles both ways") {
  for (Dtype t : {Dtype::fp16, Dtype::bf16})
    for (auto [nq, nk] : std::vector<std::pair<int, int>>{{113, 203}, {203, 113}, {64, 64}})
      for (bool causal : {false, true}) check_case(t, make(1, 2, 1, nq, nk, 128, causal));
}

TEST_CASE("05 backward vs fp64 and 04: GQA 8/2, MQA 8/1, causal with q_len != kv_len, custom scale") {
  for (int hkv : {2, 1})
    for (bool causal : {false, true}) {
      check_case(Dtype::fp16, make(1, 8, hkv, 97, 203, 64, causal));
      check_case(Dtype::bf16, make(1, 8, hkv, 203, 97, 128, causal));
    }
  Problem p = make(2, 4, 2, 130, 70, 64, true);
  p.scale = 0.05f;
  check_case(Dtype::fp16, p);
}

TEST_CASE("05 backward vs fp64 and 04: large logits (one key dominates each row)") {
  for (Dtype t : {Dtype::fp16, Dtype::bf16}) {
    check_case(t, make(1, 2, 1, 113, 203, 64, true), 6.0);
    check_case(t, make(1, 2, 2, 203, 113, 128, false), 6.0);
  }
}

TEST_CASE("05 backward: rows that see no key get dQ = 0 exactly, in both dQ modes") {
  const Problem p = make(1, 2, 2, 203, 113, 64, true);  // query rows 0..89 see no key
  const Case c = wsq_bwd_testing::make_case(Dtype::fp16, p);
  Device<half_t> dev(c);
  for (const wsq::BackwardStep& s : wsq::backward_steps())
    for (wsq::DqMode mode : {wsq::DqMode::Atomic, wsq::DqMode::Deterministic}) {
      if (!dev.run(s, mode)) continue;
      const std::vector<float> dq = dev.dq.download();
      for (int h = 0; h < p.heads; ++h)
        for (int i = 0; i < p.q_len - p.kv_len; ++i)
          for (int e = 0; e < p.head_dim; ++e) REQUIRE(dq[p.q_offset(0, h) + size_t(i) * p.head_dim + e] == 0.f);
    }
}

TEST_CASE("05 backward: deterministic mode is bit-identical run to run, every step (dQ, and dK, dV summed over GQA heads)") {
  for (int d : {64, 128}) {
    const Problem p = make(1, 8, 2, 1023, 1023, d, true);
    const Case c = wsq_bwd_testing::make_case(Dtype::bf16, p);
    Device<bfloat16_t> dev(c);
    for (const wsq::BackwardStep& s : wsq::backward_steps()) {
      INFO("step ", std::string(s.name), ", ", describe(p));
      std::vector<float> first[3];
      for (int run = 0; run < 3; ++run) {
        if (!dev.run(s, wsq::DqMode::Deterministic)) break;
        const std::vector<float> got[3] = {dev.dq.download(), dev.dk.download(), dev.dv.download()};
        for (int x = 0; x < 3; ++x) {
          if (run == 0) first[x] = got[x];
          else CHECK(std::memcmp(first[x].data(), got[x].data(), got[x].size() * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("05 backward end to end: the chapter's last forward step, then every backward step") {
  for (Dtype t : {Dtype::fp16, Dtype::bf16}) {
    const Problem p = make(1, 4, 2, 203, 113, 64, true);
    INFO(describe(p), " dtype=", std::string(dtype_name(t)));
    Case c = wsq_bwd_testing::make_case(t, p);
    const wsq::ForwardStep& fwd = wsq::forward_steps().back();
    auto run_forward = [&](auto tag) {  // O (dtype) and LSE from the kernel replace the reference's
      using T = decltype(tag);
      DeviceBuffer<T> q(to_dtype<T>(c.q)), k(to_dtype<T>(c.k)), v(to_dtype<T>(c.v)), o(p.q_elems());
      DeviceBuffer<float> lse(p.lse_elems());
      o.poison(), lse.poison();
      fwd.launch.of<T>()(p, q.get(), k.get(), v.get(), o.get(), lse.get());
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<T> o16 = o.download();
      for (size_t e = 0; e < o16.size(); ++e) c.o[e] = to_float(o16[e]);
      c.lse = lse.download();
    };
    if (t == Dtype::fp16) run_forward(half_t{}), check_case_t<half_t>(c, all_steps());
    else run_forward(bfloat16_t{}), check_case_t<bfloat16_t>(c, all_steps());
  }
}

// The Hopper steps (listed on an sm_90 GPU only) on longer rows than the cases above: a K/V block walks up to 22
// (query head, Q block) tiles, so every Q_i/dO_i buffer and every dQ tile goes through many phases of its barriers.
TEST_CASE("05 backward, Hopper steps: many Q tiles per K/V block (ring and dQ tile phases), GQA, causal, d = 64, 128") {
  std::vector<const wsq::BackwardStep*> hopper;
  for (const wsq::BackwardStep& s : wsq::backward_steps())
    if (s.arch == Arch::sm90a) hopper.push_back(&s);
  if (hopper.empty()) {
    MESSAGE("skipped: no sm_90 GPU, so no Hopper step is listed");
    return;
  }
  for (Dtype t : {Dtype::fp16, Dtype::bf16})
    for (int d : {64, 128}) check_case(t, make(1, 4, 2, 700, 333, d, true), 1.0, hopper);
  check_case(Dtype::bf16, make(2, 2, 2, 517, 517, 128, false), 6.0, hopper);
  // q_len a multiple of 64: every Q block whole (step 12: all of dQ in fragment order, then the rows kernel)
  for (int d : {64, 128}) check_case(Dtype::fp16, make(2, 4, 2, 512, 384, d, d == 64), 1.0, hopper);
  // step 13's 128-row Q blocks at d = 64: the last one half whole, half partial (600), or half past q_len (192)
  check_case(Dtype::bf16, make(1, 2, 1, 600, 450, 64, true), 1.0, hopper);
  check_case(Dtype::fp16, make(2, 2, 2, 192, 260, 64, false), 1.0, hopper);
  Problem p = make(1, 4, 1, 257, 300, 64, true);
  p.scale = -0.2f;
  check_case(Dtype::fp16, p, 1.0, hopper);
}

// The sanitizers' run (CMakeLists.txt): small shapes that still cross every tile edge, every step and path.
TEST_CASE("05 backward sanitizer workload") {
  for (int d : {64, 128}) {
    check_case(Dtype::fp16, make(1, 4, 2, 97, 113, d, true));
    check_case(Dtype::bf16, make(1, 2, 1, 113, 70, d, true));
  }
}

TEST_CASE("05 backward: unsupported head_dim and dropout are UsageErrors before any GPU work") {
  Problem p = make(1, 1, 1, 8, 8, 96, false);
  DeviceBuffer<float> ws(1);
  for (const wsq::BackwardStep& s : wsq::backward_steps()) {
    CHECK_THROWS_AS(s.launch.fp16(p, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                           wsq::DqMode::Atomic, ws.get()),
                    UsageError);
    Problem pd = make(1, 1, 1, 8, 8, 64, false);
    pd.dropout_p = 0.1f;
    CHECK_THROWS_AS(s.launch.bf16(pd, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                           wsq::DqMode::Deterministic, ws.get()),
                    UsageError);
  }
}

TEST_CASE("05 backward program section (--backward): every step checked and timed next to 04") {
  Options opts;
  opts.problem = make(1, 4, 2, 203, 113, 64, true);
  opts.iters = 2, opts.warmup = 1;
  const HostTensors in = random_inputs(opts.problem, true);
  for (Dtype t : {Dtype::fp16, Dtype::bf16}) {
    std::vector<ResultRow> rows;
    CHECK(wsq::run_backward_section(opts, t, opts.problem, in, "all", rows));
    CHECK(rows.size() == 2 * wsq::backward_steps().size() + 1);  // both dQ modes per step, then 04
  }
  std::vector<ResultRow> rows;
  CHECK_THROWS_AS(wsq::run_backward_section(opts, Dtype::fp16, opts.problem, in, "bwd_v9", rows), UsageError);
}

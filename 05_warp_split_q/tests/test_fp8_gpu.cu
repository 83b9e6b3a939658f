// GPU tests of step 11 (FP8; on an sm_90 GPU, else each case says it skipped): the quantisation pass on the GPU
// writes exactly the bytes and scales of the CPU model (fp8_model.hpp) - block and tensor scales, with and without
// the Hadamard rotation, d = 64 and 128, ragged lengths - and the step's O (bf16) and LSE pass the fp8 rule against
// the fp64 reference of the unquantised inputs: edge lengths, causal with rows that see no key, GQA, large logits,
// outliers. Outputs NaN-poisoned before each run. "sanitizer workload": one small case for compute-sanitizer.
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "device_buffer.cuh"
#include "forward/warp_split_q.cuh"
#include "hopper/fp8.cuh"
#include "hopper/fp8_model.hpp"

using namespace wsq::fp8;

namespace {

fa::Problem make(int B, int H, int Hkv, int nq, int nk, int d, bool causal) {
  fa::Problem p;
  p.batch = B, p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  return p;
}

struct Case {
  std::vector<float> q, k, v;  // bf16 values
  fa::DeviceBuffer<fa::bfloat16_t> dq, dk, dv;
};
Case inputs(const fa::Problem& p, double qk_stddev, double outliers) {
  auto q = lab_inputs(p.q_elems(), 5 + p.q_len, outliers), k = lab_inputs(p.kv_elems(), 6 + p.kv_len, outliers),
       v = lab_inputs(p.kv_elems(), 7, outliers);
  for (float& x : q) x = fa::to_float(fa::from_float<fa::bfloat16_t>(float(x * qk_stddev)));
  for (float& x : k) x = fa::to_float(fa::from_float<fa::bfloat16_t>(float(x * qk_stddev)));
  Case c{q, k, v, fa::DeviceBuffer<fa::bfloat16_t>(fa::to_dtype<fa::bfloat16_t>(q)),
         fa::DeviceBuffer<fa::bfloat16_t>(fa::to_dtype<fa::bfloat16_t>(k)),
         fa::DeviceBuffer<fa::bfloat16_t>(fa::to_dtype<fa::bfloat16_t>(v))};
  return c;
}

template <class T>
bool same_bytes(const fa::DeviceBuffer<T>& got, const std::vector<T>& want) {
  const std::vector<T> g = got.download();
  return g.size() == want.size() && std::memcmp(g.data(), want.data(), g.size() * sizeof(T)) == 0;
}

void check_quantise(const fa::Problem& p, const Options& o) {
  INFO(fa::describe(p), (o.scaling == Scaling::block ? " block" : " tensor"), " hadamard=", o.hadamard);
  Case c = inputs(p, 1.0, 0.001);
  Tensors z(p);
  z.q.poison(), z.k.poison(), z.vt.poison();
  quantise(p, o, c.dq.get(), c.dk.get(), c.dv.get(), z);
  CUDA_CHECK(cudaDeviceSynchronize());
  const Quantised m = quantise(p, o, c.q.data(), c.k.data(), c.v.data());
  CHECK(same_bytes(z.q, m.q));
  CHECK(same_bytes(z.k, m.k));
  CHECK(same_bytes(z.vt, m.vt));
  CHECK(same_bytes(z.sq, m.sq));
  CHECK(same_bytes(z.sk, m.sk));
  CHECK(same_bytes(z.sv, m.sv));
}

void check_step(const fa::Problem& p, const Options& o, double qk_stddev = 1.0, double outliers = 0.0) {
  Case c = inputs(p, qk_stddev, outliers);
  Tensors z(p);
  fa::DeviceBuffer<fa::bfloat16_t> out(p.q_elems());
  fa::DeviceBuffer<float> lse(p.lse_elems());
  const Reference ref = reference(p, o, c.q, c.k, c.v, 1e30);
  for (const wsq::Fp8Step& s : wsq::fp8_steps()) {
    INFO("step ", std::string(s.name), ", ", fa::describe(p), (o.scaling == Scaling::block ? " block" : " tensor"),
         " hadamard=", o.hadamard, " Q/K stddev ", qk_stddev, " outliers ", outliers);
    out.poison(), lse.poison();
    quantise(p, o, c.dq.get(), c.dk.get(), c.dv.get(), z);
    s.launch(p, z.view(), out.get(), lse.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<fa::bfloat16_t> o_t = out.download();
    std::vector<float> o_f(o_t.size());
    for (size_t x = 0; x < o_t.size(); ++x) o_f[x] = fa::to_float(o_t[x]);
    const wsq::LowpCheck r = check_forward(p, ref, o_f, lse.download());
    CHECK_MESSAGE(r.ok(), r.summary());
  }
}

bool have_fp8() {
  if (!wsq::fp8_steps().empty()) return true;
  MESSAGE("skipped: no fp8 step on this GPU (step 11 needs sm_90 and a build with FA_HOPPER)");
  return false;
}

}  // namespace

TEST_CASE("FP8 quantisation pass: the GPU writes the CPU model's bytes and scales") {
  for (int d : {64, 128})
    for (Scaling s : {Scaling::block, Scaling::tensor})
      for (bool had : {false, true}) {
        Options o;
        o.scaling = s, o.hadamard = had;
        check_quantise(make(2, 4, 2, 113, 203, d, false), o);
      }
}

TEST_CASE("FP8 step: edge lengths, causal, GQA, large logits, outliers, both scalings, Hadamard") {
  if (!have_fp8()) return;
  Options tensor, rotated;
  tensor.scaling = Scaling::tensor, rotated.hadamard = true;
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      for (int n : {1, 17, 64, 97, 1023, 1024}) check_step(make(1, 2, 2, n, n, d, causal), {});
      check_step(make(2, 8, 2, 113, 203, d, causal), rotated);   // GQA 8/2, q_len != kv_len
      check_step(make(1, 8, 1, 300, 100, d, causal), tensor);    // MQA; causal: rows that see no key
    }
  check_step(make(1, 4, 4, 512, 512, 128, false), {}, 8.0);         // logits in the hundreds
  check_step(make(1, 4, 4, 512, 777, 128, true), rotated, 1.0, 0.001);
  check_step(make(1, 4, 4, 512, 777, 64, false), tensor, 1.0, 0.001);
}

// More Q blocks than the GPU has SMs, so that step 14's blocks each run several items (and, causal, items of every
// length, some without a key when q_len > kv_len); every step runs twice on the same inputs (step 14's counter must
// be back at 0 after a launch).
TEST_CASE("FP8 step: more Q blocks than SMs, launch after launch") {
  if (!have_fp8()) return;
  for (int launch = 0; launch < 2; ++launch) {
    check_step(make(2, 32, 8, 300, 300, 128, true), {});   // 3 x 64 = 192 items
    check_step(make(3, 16, 16, 400, 150, 64, true), {});   // rows that see no key (4 x 48 items)
    check_step(make(2, 32, 8, 260, 400, 128, false), {});
  }
}

TEST_CASE("FP8 sanitizer workload: quantisation pass and every fp8 step, ragged, causal, GQA, Hadamard") {
  if (!have_fp8()) return;
  Options o;
  o.hadamard = true;
  check_step(make(1, 4, 2, 113, 203, 128, true), o);
  check_step(make(1, 2, 1, 97, 65, 64, false), {});
  check_step(make(2, 4, 2, 700, 700, 64, true), {});  // 48 items: step 14's blocks run several on a small GPU
  check_step(make(2, 24, 8, 300, 300, 64, true), {});  // 144 items: more than an H100's 132 SMs
}

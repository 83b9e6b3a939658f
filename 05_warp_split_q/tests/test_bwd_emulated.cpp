// The backward kernels themselves, run on the CPU through tests/emu/emu_bwd.hpp (tests/emu/emu.hpp: every GPU thread a
// cooperative context, barriers, shuffles, ldmatrix and mma.sync computed from the PTX ISA's rules, cp.async landing
// only when a wait lets its group complete): every step x both dQ modes x fp16/bf16 x head_dim 64/128 on small
// ragged shapes, causal with rows that see no key, GQA/MQA, large logits, and the dQ kernel alone on longer ones,
// outputs NaN-poisoned, judged by the same rule as the GPU tests (bwd_testing.hpp). It tests the kernels' index arithmetic, operand addresses, masks, buffers and barriers
// without a GPU; it says nothing about speed, races or the asynchrony of cp.async (the sanitizer runs do).
#include <doctest/doctest.h>

#include <cstring>

#include "program.hpp"

#include "backward/backward.cuh"
#include "bwd_testing.hpp"

using namespace fa;
using wsq_bwd_testing::Case;
using wsq_bwd_testing::make;

namespace {

// Every step in both dQ modes; or, with dq_kernel_only, the deterministic mode of the first step alone (the dQ
// kernel is the same for every step), for shapes too long to run through every step.
template <class T>
void check_steps(const Case& c, bool dq_kernel_only) {
  const Problem& p = c.p;
  const std::vector<T> q = to_dtype<T>(c.q), k = to_dtype<T>(c.k), v = to_dtype<T>(c.v), o = to_dtype<T>(c.o),
                       dout = to_dtype<T>(c.dout);
  const std::vector<wsq::BackwardStep>& all = wsq::backward_steps();
  const std::vector<wsq::BackwardStep> steps(all.begin(), dq_kernel_only ? all.begin() + 1 : all.end());
  std::vector<wsq::DqMode> modes{wsq::DqMode::Deterministic};
  if (!dq_kernel_only) modes.insert(modes.begin(), wsq::DqMode::Atomic);
  for (const wsq::BackwardStep& s : steps)
    for (wsq::DqMode mode : modes) {
      const std::string mode_name = mode == wsq::DqMode::Atomic ? "Atomic" : "Deterministic";
      INFO("step ", std::string(s.name), ", dQ mode ", mode_name);
      std::vector<float> dq(p.q_elems()), dk(p.kv_elems()), dv(p.kv_elems()), ws(p.lse_elems());
      for (std::vector<float>* x : {&dq, &dk, &dv, &ws}) std::memset(x->data(), 0xFF, x->size() * sizeof(float));
      s.launch.of<T>()(p, q.data(), k.data(), v.data(), o.data(), c.lse.data(), dout.data(), dq.data(),
                       dk.data(), dv.data(), mode, ws.data());
      wsq_bwd_testing::check_grads(c, dq, dk, dv);
    }
}

void check_all(const Problem& p, double stddev = 1.0, bool dq_kernel_only = false) {
  INFO(describe(p), " stddev=", stddev);
  check_steps<half_t>(wsq_bwd_testing::make_case(Dtype::fp16, p, stddev), dq_kernel_only);
  check_steps<bfloat16_t>(wsq_bwd_testing::make_case(Dtype::bf16, p, stddev), dq_kernel_only);
}

}  // namespace

TEST_CASE("emulated backward: ragged lengths across the tiles, causal on/off, q_len != kv_len both ways, d = 64") {
  for (auto [nq, nk] : std::vector<std::pair<int, int>>{{1, 1}, {17, 17}, {64, 64}, {97, 130}, {130, 97}})
    for (bool causal : {false, true}) check_all(make(1, 1, 1, nq, nk, 64, causal));
}

TEST_CASE("emulated backward: d = 128 (Br = 32), GQA 4/2 and MQA 4/1 (dK, dV summed over the group), batch 2") {
  check_all(make(1, 1, 1, 97, 70, 128, true));
  check_all(make(1, 1, 1, 33, 130, 128, false));
  check_all(make(1, 4, 2, 40, 33, 64, true));
  check_all(make(2, 4, 1, 20, 40, 128, true));
}

TEST_CASE("emulated backward: large logits, custom scale") {
  check_all(make(1, 1, 1, 40, 70, 64, true), 6.0);
  Problem p = make(1, 2, 1, 70, 40, 64, true);
  p.scale = 0.05f;
  check_all(p);
}

TEST_CASE("emulated backward: the dQ kernel's two K/V buffers over 5 K/V blocks, and Q blocks that see no key") {
  // 300 keys: blocks 0-4, the last one 44 keys long, so each buffer is refilled twice; causal with q_len - kv_len
  // = 133: Q blocks 0 and 1 never enter the K/V loop, block 2 does one K/V block and block 3 two.
  for (int d : {64, 128})
    for (bool causal : {false, true}) check_all(make(1, 1, 1, 113, 300, d, causal), 1.0, true);
  check_all(make(1, 2, 1, 203, 70, 128, true), 1.0, true);
}

// The backward's Hopper steps 9-14 themselves, run on the CPU through tests/emu/emu_sm90_bwd.hpp (every GPU thread a
// cooperative context; the producer and the MMA warpgroups meet at emulated mbarriers, the dQ writer warp at named
// barriers; TMA, wgmma and the bulk reduce-add land as late as the PTX ISA allows): both dtypes, head_dim 64 and
// 128, ragged lengths, causal with Q blocks that see no key, GQA (dK, dV summed over the group), large logits, a
// negative scale, more Q tiles than ring buffers; outputs NaN-poisoned, judged by the rule of the GPU tests
// (bwd_testing.hpp). D = rowsum(dO o O) is computed here, as the chapter's preprocess kernel does; the deterministic
// mode's dQ kernel is the one test_bwd_emulated runs. Step 14 in both of its modes at d = 64 and 128, with its dQ
// counters and the deterministic mode's bit-identity checked.
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "program.hpp"

#include "tests/emu/emu_schedule.hpp"

#include "backward/bwd_steps.hpp"
#include "bwd_testing.hpp"

using namespace fa;
using wsq_bwd_testing::Case;
using wsq_bwd_testing::make;

namespace {

template <class T>
using KvFn = void (*)(const Problem&, const T*, const T*, const T*, const float*, const T*, const float*, float*,
                      float*, float*, bool);

// Step 14 in both modes, in two schedules each. Deterministic: each dQ tile's counter must end at the number of
// K/V blocks that add to it (a prefix of the blocks: those that start at or before the tile), each having taken its
// turn once; and dQ must come out bit-identical in every run.
template <class T>
void check_ordered(const Case& c, const std::vector<T>& q, const std::vector<T>& k, const std::vector<T>& v,
                   const std::vector<T>& dout, const std::vector<float>& Dv) {
  const Problem& p = c.p;
  const int Br = wsq::dq_order_rows(p.head_dim), Bc = 128;  // step 14's tile: step 13's (Br = 128 at d = 64)
  const int q_blocks = (p.q_len + Br - 1) / Br, kv_blocks = (p.kv_len + Bc - 1) / Bc;
  std::vector<float> first_dq;  // the deterministic mode's dQ of the first run
  for (const emu9::Schedule schedule : {emu9::Schedule::round_robin, emu9::Schedule::lowest_first})
    for (const bool ordered : {false, true}) {
      emu9::schedule = schedule;
      INFO("step bwd_v14_dq_ordered, ", std::string(ordered ? "deterministic" : "atomic"), ", ",
           std::string(emu9::schedule_name(schedule)), " schedule");
      std::vector<float> dq(p.q_elems(), 0.f), dk(p.kv_elems()), dv(p.kv_elems());
      std::memset(dk.data(), 0xFF, dk.size() * sizeof(float));  // NaN poison
      std::memset(dv.data(), 0xFF, dv.size() * sizeof(float));
      std::vector<int> order(wsq::dq_order_ints(p), 0);
      REQUIRE(order.size() == size_t(p.batch) * p.heads * q_blocks);
      wsq::backward_v14_dq_ordered<T>(p, q.data(), k.data(), v.data(), c.lse.data(), dout.data(), Dv.data(),
                                      dq.data(), dk.data(), dv.data(), ordered ? order.data() : nullptr);
      wsq_bwd_testing::check_grads(c, dq, dk, dv);
      for (int bh = 0; bh < p.batch * p.heads; ++bh)
        for (int i = 0; i < q_blocks; ++i) {
          int adders = 0;
          for (int j = 0; j < kv_blocks; ++j) adders += p.first_query_seeing(j * Bc) / Br <= i;
          REQUIRE(order[size_t(bh) * q_blocks + i] == (ordered ? adders : 0));
        }
      if (!ordered) continue;
      if (first_dq.empty()) first_dq = dq;
      else REQUIRE(std::memcmp(dq.data(), first_dq.data(), dq.size() * sizeof(float)) == 0);  // bit-identical
    }
}

// The preprocess: D_i = rowsum(dO_i o O_i) in fp32.
std::vector<float> rowsum_do_o(const Case& c) {
  std::vector<float> Dv(c.p.lse_elems());
  for (size_t r = 0; r < Dv.size(); ++r) {
    float s = 0.f;
    for (int e = 0; e < c.p.head_dim; ++e) s += c.o[r * c.p.head_dim + e] * c.dout[r * c.p.head_dim + e];
    Dv[r] = s;
  }
  return Dv;
}

template <class T>
void check_steps(const Case& c, bool with_dq) {
  const Problem& p = c.p;
  const std::vector<T> q = to_dtype<T>(c.q), k = to_dtype<T>(c.k), v = to_dtype<T>(c.v), dout = to_dtype<T>(c.dout);
  const std::vector<float> Dv = rowsum_do_o(c);
  const std::pair<const char*, KvFn<T>> steps[] = {{"bwd_v9_wgmma_tma", wsq::backward_v9_wgmma_tma<T>},
                                                   {"bwd_v10_dq_bulk_reduce", wsq::backward_v10_dq_bulk_reduce<T>},
                                                   {"bwd_v11_dq_double_buffer", wsq::backward_v11_dq_double_buffer<T>},
                                                   {"bwd_v12_dq_tile_reduce", wsq::backward_v12_dq_tile_reduce<T>},
                                                   {"bwd_v13_br128", wsq::backward_v13_br128<T>}};
  for (const emu9::Schedule schedule : {emu9::Schedule::round_robin, emu9::Schedule::lowest_first})
  for (const auto& [name, fn] : steps) {
    emu9::schedule = schedule;  // emu_schedule.hpp: a missing wait shows in one order of the threads or the other
    INFO("step ", std::string(name), std::string(with_dq ? ", with dQ" : ", dK and dV only"), ", ",
         std::string(emu9::schedule_name(schedule)), " schedule");  // (a const char* would print as its address)
    std::vector<float> dq(p.q_elems(), 0.f), dk(p.kv_elems()), dv(p.kv_elems());
    std::memset(dk.data(), 0xFF, dk.size() * sizeof(float));  // NaN poison
    std::memset(dv.data(), 0xFF, dv.size() * sizeof(float));
    fn(p, q.data(), k.data(), v.data(), c.lse.data(), dout.data(), Dv.data(), dq.data(), dk.data(), dv.data(), with_dq);
    if (with_dq) {
      wsq_bwd_testing::check_grads(c, dq, dk, dv);
      continue;
    }
    const ErrorReport ek = wsq_bwd_testing::check(dk, c.rdk, c.bound_dk);
    const ErrorReport ev = wsq_bwd_testing::check(dv, c.rdv, c.bound_dv);
    CHECK_MESSAGE(ek.ok(), ek.summary("dK vs fp64"), " (bound ", c.bound_dk, ")");
    CHECK_MESSAGE(ev.ok(), ev.summary("dV vs fp64"), " (bound ", c.bound_dv, ")");
    for (float x : dq) REQUIRE(x == 0.f);  // the deterministic mode's kernel must leave dq alone
  }
  if (with_dq) check_ordered<T>(c, q, k, v, dout, Dv);  // step 14 has no K/V kernel without dQ
}

void check_all(const Problem& p, double stddev = 1.0, bool with_dq = true) {
  INFO(describe(p), " stddev=", stddev);
  check_steps<half_t>(wsq_bwd_testing::make_case(Dtype::fp16, p, stddev), with_dq);
  check_steps<bfloat16_t>(wsq_bwd_testing::make_case(Dtype::bf16, p, stddev), with_dq);
}

// Step 14 alone (both modes, both dtypes).
void check_step14(const Problem& p) {
  INFO(describe(p));
  for (const Dtype t : {Dtype::fp16, Dtype::bf16}) {
    const Case c = wsq_bwd_testing::make_case(t, p);
    const std::vector<float> Dv = rowsum_do_o(c);
    if (t == Dtype::fp16)
      check_ordered<half_t>(c, to_dtype<half_t>(c.q), to_dtype<half_t>(c.k), to_dtype<half_t>(c.v),
                            to_dtype<half_t>(c.dout), Dv);
    else
      check_ordered<bfloat16_t>(c, to_dtype<bfloat16_t>(c.q), to_dtype<bfloat16_t>(c.k), to_dtype<bfloat16_t>(c.v),
                                to_dtype<bfloat16_t>(c.dout), Dv);
  }
}

}  // namespace

TEST_CASE("emulated Hopper backward: ragged lengths, causal on/off, q_len != kv_len both ways, d = 64 and 128") {
  for (bool causal : {false, true}) {
    check_all(make(1, 1, 1, 1, 1, 64, causal));
    check_all(make(1, 1, 1, 97, 130, 64, causal));   // 2 K/V blocks, the second 2 keys long; 2 Q tiles
    check_all(make(1, 1, 1, 130, 97, 128, causal));  // 3 Q tiles: buffer 0 used twice
  }
}

TEST_CASE("emulated Hopper backward: GQA 4/2 (dK, dV summed over the group), 5 Q tiles per head (ring phases)") {
  check_all(make(1, 4, 2, 65, 129, 64, true));
  check_all(make(2, 2, 1, 300, 70, 128, false));  // 10 (head, Q block) tiles per block: each buffer 5 times
  // q_len a multiple of 64: every Q block whole (step 12: every tile by bulk copy, in fragment order, then rows)
  check_all(make(2, 2, 1, 128, 130, 64, true));
  check_all(make(1, 2, 2, 192, 64, 128, false));
  // Step 13 (d = 64, Q blocks of 128 rows): 10 tiles per block (each ring buffer and dQ tile 5 times), the last
  // Q block half whole (rows 512-575 by bulk copy), half partial (576-599: atomics); and q_len = 192, a multiple of
  // 64 but not of 128: the second Q block's region 1 lies wholly past q_len (nothing to add)
  check_all(make(1, 2, 1, 600, 140, 64, false));
  check_all(make(1, 2, 2, 192, 64, 64, false));
}

TEST_CASE("emulated Hopper backward: large logits, a negative and a tiny scale, Q blocks that see no key") {
  check_all(make(1, 1, 1, 70, 200, 128, false), 6.0);
  for (float scale : {-0.3f, 1e-6f}) {
    INFO("scale ", scale);
    Problem p = make(1, 2, 1, 97, 203, 64, true);
    p.scale = scale;
    check_all(p);
  }
  // q_len - kv_len = 200: query rows 0-199 see no key, so Q blocks 0-2 are never visited (i_first skips them)
  check_all(make(1, 1, 1, 300, 100, 64, true));
}

TEST_CASE("emulated Hopper backward: the deterministic mode's K/V kernel (dK, dV only; dq untouched)") {
  check_all(make(1, 2, 1, 97, 130, 128, true), 1.0, false);
  check_all(make(1, 2, 1, 300, 130, 64, true), 1.0, false);  // step 13's own kernel (d = 128 is step 12's): 4 tiles
}

// Step 14's ordered dQ at d = 64 on step 13's tile (Br = 128, each warpgroup its own 64 rows of a Q block): Q blocks
// half whole, half partial (113 rows: region 0 whole, region 1 15 rows, added in rows), wholly partial (17, 1),
// q_len != kv_len both ways (causal: 90 rows see no key when q_len = 203, kv_len = 113), GQA 2/1 and batch 2: two
// K/V blocks adding to each Q block in turn, two tiles (query heads) per block. (Step 14 also runs in check_steps,
// at every shape of the cases above: GQA 4/2, 10 tiles per block, Q blocks that see no key.)
TEST_CASE("emulated Hopper backward: step 14's ordered dQ at d = 64 (Q blocks of 128 rows, ragged, GQA, batch 2)") {
  for (bool causal : {false, true}) {
    check_step14(make(2, 2, 1, 113, 203, 64, causal));
    check_step14(make(1, 2, 1, 203, 113, 64, causal));
    check_step14(make(1, 1, 1, 17, 1, 64, causal));
    check_step14(make(1, 1, 1, 1, 17, 64, causal));
  }
}

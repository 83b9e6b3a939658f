// Steps 11 to 19 (forward/v11_fp8.cu, v12_fp8_lean.cu, v13_fp8_scales_ahead.cu, v14_fp8_persistent.cu,
// v15_fp8_three_warpgroups.cu, v16_fp8_row_sums.cu, v17_fp8_no_turns.cu, v18_fp8_tma_store.cu,
// v19_fp8_producer_coords.cu), run on the CPU through
// tests/emu/emu_sm90.hpp: the e4m3 wgmma, the K-major Vt tiles, the packing of P into A fragments (the permutation),
// the descales folded into S and O, on the bytes of the model's quantisation pass (hopper/fp8_model.hpp, which
// fp8_quant.cu reproduces on the GPU). Judged by the fp8 rule: O and LSE vs the fp64 reference of the unquantised
// inputs at most 2x the plain fp8 attention's error plus the floors. Ragged lengths, several K/V tiles, causal with
// rows that see no key, GQA, large logits, outliers, per-block and per-tensor scales, with and without the Hadamard
// rotation; a negative softmax scale (step 12 takes the minimum of S then); enough K/V tiles that each of step 12's
// three buffers is reused; 128 K/V tiles of positive products, where an O~ kept in the e4m3 wgmma's accumulator across
// all tiles comes out too small (the emulation models that accumulator's truncation, tests/emu/emu_sm90.hpp).
#include <doctest/doctest.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "tests/emu/emu_schedule.hpp"
#include "forward/steps.hpp"
#include "hopper/fp8_model.hpp"

using namespace wsq::fp8;

namespace {

fa::Problem make(int H, int Hkv, int nq, int nk, int d, bool causal) {
  fa::Problem p;
  p.batch = 1, p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  return p;
}

// The program's default inputs: uniform in [0, 1) (bf16), so O ~ 0.5 and every P V product is positive.
std::vector<float> uniform_inputs(size_t n, uint64_t seed) {
  fa::Rng rng(seed);
  std::vector<float> x(n);
  for (float& e : x) e = fa::to_float(fa::from_float<fa::bfloat16_t>(float(rng.uniform())));
  return x;
}

// A step's O (as bf16 bits) and LSE, from outputs poisoned with NaN first, as on the GPU.
using Fp8Fn = void (*)(const fa::Problem&, const View&, fa::bfloat16_t*, float*);
struct Output {
  std::vector<uint16_t> o_bits;
  std::vector<float> lse;
  bool operator==(const Output& other) const {  // the same bits (a NaN in LSE differs from itself: compared as bytes)
    return o_bits == other.o_bits && lse.size() == other.lse.size() &&
           std::memcmp(lse.data(), other.lse.data(), lse.size() * sizeof(float)) == 0;
  }
};
Output run_step(Fp8Fn step, const fa::Problem& p, const Quantised& z) {
  std::vector<fa::bfloat16_t> out(p.q_elems());
  Output r;
  r.lse.resize(p.lse_elems());
  std::memset(out.data(), 0xFF, out.size() * sizeof(fa::bfloat16_t));
  std::memset(r.lse.data(), 0xFF, r.lse.size() * sizeof(float));
  step(p, {z.q.data(), z.k.data(), z.vt.data(), z.sq.data(), z.sk.data(), z.sv.data()}, out.data(), r.lse.data());
  r.o_bits.resize(out.size());
  std::memcpy(r.o_bits.data(), out.data(), out.size() * sizeof(uint16_t));
  return r;
}

// One problem's inputs, their quantised bytes and the fp64 reference, made once for all the steps checked on it.
// qk_stddev scales Q and K (large logits); outliers: the fraction of entries drawn 10x larger; uniform: the
// program's inputs instead of the lab's normal ones.
struct Case {
  fa::Problem p;
  std::string what;
  Quantised z;
  Reference r;
};
Case make_case(const fa::Problem& p, Options o, double qk_stddev, double outliers, bool uniform) {
  auto q = uniform ? uniform_inputs(p.q_elems(), 1 + p.q_len) : lab_inputs(p.q_elems(), 1 + p.q_len, outliers),
       k = uniform ? uniform_inputs(p.kv_elems(), 2 + p.kv_len) : lab_inputs(p.kv_elems(), 2 + p.kv_len, outliers),
       v = uniform ? uniform_inputs(p.kv_elems(), 3) : lab_inputs(p.kv_elems(), 3, outliers);
  for (float& x : q) x = fa::to_float(fa::from_float<fa::bfloat16_t>(float(x * qk_stddev)));
  for (float& x : k) x = fa::to_float(fa::from_float<fa::bfloat16_t>(float(x * qk_stddev)));
  const std::string what = std::to_string(p.heads) + "/" + std::to_string(p.kv_heads) + " heads, batch " +
                           std::to_string(p.batch) + ", " + std::to_string(p.q_len) + "x" + std::to_string(p.kv_len) +
                           " d=" + std::to_string(p.head_dim) + " causal=" + std::to_string(p.causal) + " scales " +
                           (o.scaling == Scaling::block ? "block" : "tensor") + " hadamard=" +
                           std::to_string(o.hadamard) + " Q/K stddev " + std::to_string(qk_stddev) + " outliers " +
                           std::to_string(outliers) + " uniform " + std::to_string(uniform);
  return {p, what, quantise(p, o, q.data(), k.data(), v.data()), reference(p, o, q, k, v, 1e30)};
}

// A step judged by the fp8 rule; its output returned, for steps that must give the same bits.
Output check_one(const char* name, Fp8Fn step, const Case& c) {
  INFO(std::string(name), ": ", c.what);
  Output out = run_step(step, c.p, c.z);
  std::vector<float> o_f(out.o_bits.size());
  for (size_t x = 0; x < o_f.size(); ++x) o_f[x] = fa::bits_to_float(uint32_t(out.o_bits[x]) << 16);
  const wsq::LowpCheck check = check_forward(c.p, c.r, o_f, out.lse);
  CHECK_MESSAGE(check.ok(), check.summary());
  return out;
}
Output check_one(const char* name, Fp8Fn step, const fa::Problem& p, Options o, double qk_stddev, double outliers,
                 bool uniform) {
  return check_one(name, step, make_case(p, o, qk_stddev, outliers, uniform));
}
// Every fp8 step on one problem. Step 17 is step 16 without the turn barriers: the same arithmetic in each
// warpgroup, so it must give step 16's bits; at d = 64 the two compile to the same code (no turns there in step 16
// either), so it runs at d = 128 only. Step 18 only writes O differently (a TMA store) and step 19 only reads the
// item's coordinates from the producer: step 16's bits too, here at d = 128 (at d = 64 in their own cases below).
void check_v11(const fa::Problem& p, Options o, double qk_stddev = 1.0, double outliers = 0.0, bool uniform = false) {
  const Case c = make_case(p, o, qk_stddev, outliers, uniform);
  check_one("v11_fp8", wsq::forward_v11_fp8, c);
  check_one("v12_fp8_lean", wsq::forward_v12_fp8_lean, c);
  check_one("v13_fp8_scales_ahead", wsq::forward_v13_fp8_scales_ahead, c);
  check_one("v14_fp8_persistent", wsq::forward_v14_fp8_persistent, c);
  check_one("v15_fp8_three_warpgroups", wsq::forward_v15_fp8_three_warpgroups, c);
  const Output o16 = check_one("v16_fp8_row_sums", wsq::forward_v16_fp8_row_sums, c);
  if (p.head_dim == 128) {
    INFO("v17_fp8_no_turns: ", c.what);
    CHECK(run_step(wsq::forward_v17_fp8_no_turns, p, c.z) == o16);
    INFO("v18_fp8_tma_store: ", c.what);
    CHECK(run_step(wsq::forward_v18_fp8_tma_store, p, c.z) == o16);
    INFO("v19_fp8_producer_coords: ", c.what);
    CHECK(run_step(wsq::forward_v19_fp8_producer_coords, p, c.z) == o16);
  }
}

}  // namespace

TEST_CASE("emulated FP8 step: ragged lengths, several K/V tiles, causal on/off, d = 64 and 128") {
  for (bool causal : {false, true}) {
    check_v11(make(1, 1, 1, 1, 64, causal), {});
    check_v11(make(2, 1, 97, 300, 64, causal), {});   // 3 K/V tiles (3 V scales): both buffers, one reused
    check_v11(make(1, 1, 300, 203, 128, causal), {});  // 3 Q blocks; causal: rows that see no key
  }
}

TEST_CASE("emulated FP8 step: GQA, large logits, outliers, per-tensor scales, the Hadamard rotation") {
  Options tensor, rotated, both;
  tensor.scaling = Scaling::tensor, rotated.hadamard = true, both.scaling = Scaling::tensor, both.hadamard = true;
  check_v11(make(4, 2, 65, 129, 64, true), rotated);
  check_v11(make(1, 1, 130, 257, 128, false), {}, 8.0);       // logits of ~100s
  check_v11(make(1, 1, 130, 257, 128, false), tensor, 1.0, 0.01);
  check_v11(make(2, 1, 100, 226, 128, true), both, 1.0, 0.01);  // Bc - 2 past the diagonal in every K/V tile
}

TEST_CASE("emulated FP8 steps: a negative softmax scale, five K/V tiles (each of three buffers reused)") {
  fa::Problem neg = make(1, 1, 70, 250, 64, true);
  neg.scale = -0.125f;
  check_v11(neg, {});
  check_v11(make(1, 1, 64, 600, 64, false), {});
  check_v11(make(1, 1, 200, 600, 128, true), {});
}

TEST_CASE("emulated FP8 steps: 128 K/V tiles of the program's inputs (O~ summed in fp32, not in the e4m3 wgmma)") {
  check_v11(make(1, 1, 64, 16384, 64, false), {}, 1.0, 0.0, true);
}

// Step 14 on an emulated GPU of two SMs (emu_sm90.hpp's sm_count), in both schedules: one block runs items of 0, 1,
// 2 and 3 K/V tiles one after another (the Q buffers and the K/V buffers counted across items, the ping-pong across
// items), causal items in the order of their lengths, heads and batches mixed; launched again and again (the counter
// must be back at 0 for the next launch).
TEST_CASE("emulated FP8 step 14: one block runs many items of different lengths, launch after launch") {
  fa::Problem p = make(3, 1, 300, 300, 64, true);
  p.batch = 2;
  fa::Problem rows_without_keys = make(2, 2, 400, 150, 128, true);  // Q blocks 0 and 1 see no key: no tiles
  for (const emu9::Schedule schedule : {emu9::Schedule::round_robin, emu9::Schedule::lowest_first}) {
    emu9::schedule = schedule;
    INFO(std::string(emu9::schedule_name(schedule)), " schedule");
    for (int launch = 0; launch < 2; ++launch)
      check_one("v14_fp8_persistent", wsq::forward_v14_fp8_persistent, p, {}, 1.0, 0.0, false);
    check_one("v14_fp8_persistent", wsq::forward_v14_fp8_persistent, rows_without_keys, {}, 1.0, 0.0, false);
    check_one("v14_fp8_persistent", wsq::forward_v14_fp8_persistent, make(7, 1, 200, 200, 64, true), {}, 1.0, 0.0,
              false);  // causal: 7 heads in groups of 4 and 3 (handed_out)
    check_one("v14_fp8_persistent", wsq::forward_v14_fp8_persistent, make(4, 2, 257, 200, 128, false), {}, 1.0, 0.01,
              false);
  }
  emu9::schedule = emu9::Schedule::round_robin;
}

// Step 15 computes every row as step 14 does (the same K/V tiles in the same order, the same arithmetic); only the
// warpgroup that owns the row and the item it belongs to change. Without a mask every row sees every tile, so O and
// LSE must be the same bits: a wrong Q descale for the third warpgroup (rows 128-191 of an item lie in the next
// scale block), a turn that lets a warpgroup read a buffer too early, or a P8 from another tile shows here at once.
// Causal items of 192 rows send some rows through tiles past their diagonal that step 14 skips (P = 0 there, O~
// rescaled by the V scales): the fp8 rule above judges those. Both schedules, items of different lengths, heads
// and batches mixed, ragged lengths and Q lengths that are and are not multiples of 192 and of 128.
TEST_CASE("emulated FP8 step 15: three consumer warpgroups give step 14's bits without a mask, launch after launch") {
  for (const emu9::Schedule schedule : {emu9::Schedule::round_robin, emu9::Schedule::lowest_first}) {
    emu9::schedule = schedule;
    for (const auto& [H, Hkv, B, nq, nk, d] : std::vector<std::array<int, 6>>{
             {3, 1, 2, 200, 260, 64}, {2, 2, 1, 1, 17, 64}, {1, 1, 1, 97, 203, 64}, {1, 1, 1, 384, 257, 64},
             {1, 1, 1, 193, 130, 64}, {1, 1, 1, 200, 300, 128}}) {
      fa::Problem p = make(H, Hkv, nq, nk, d, false);
      p.batch = B;
      INFO(std::string(emu9::schedule_name(schedule)), " schedule, ", H, "/", Hkv, " heads, batch ", B, ", ", nq, "x",
           nk, " d=", d);
      Options rotated;
      rotated.hadamard = true;
      const auto q = lab_inputs(p.q_elems(), 11 + nq, 0.01), k = lab_inputs(p.kv_elems(), 12 + nk, 0.01),
                 v = lab_inputs(p.kv_elems(), 13, 0.01);
      const Quantised z = quantise(p, rotated, q.data(), k.data(), v.data());
      const Output o14 = run_step(wsq::forward_v14_fp8_persistent, p, z);
      for (int launch = 0; launch < 2; ++launch) CHECK(run_step(wsq::forward_v15_fp8_three_warpgroups, p, z) == o14);
    }
    check_one("v15_fp8_three_warpgroups", wsq::forward_v15_fp8_three_warpgroups, make(7, 1, 200, 200, 64, true), {},
              1.0, 0.01, false);  // causal: 7 heads in groups, items of 192 rows and of 8
    check_one("v15_fp8_three_warpgroups", wsq::forward_v15_fp8_three_warpgroups, make(2, 2, 400, 150, 64, true), {},
              1.0, 0.0, false);  // causal, q_len > kv_len: the first item of each head sees no key
  }
  emu9::schedule = emu9::Schedule::round_robin;
}

// Step 16 takes l_i from P V's column of ones: judged by the fp8 rule (its l_i sums the rounded P, so its bits differ
// from step 15's), on an emulated GPU of two SMs in both schedules, launched twice (the ones are written once per
// launch, before any wgmma reads them), with items of 192 and 128 rows, heads and batches mixed, rows without keys,
// outliers, and V scales that differ from tile to tile (l_i must not take V's ratio, which O~'s factor carries).
TEST_CASE("emulated FP8 step 16: the row sums from P V's column of ones, launch after launch, both schedules") {
  for (const emu9::Schedule schedule : {emu9::Schedule::round_robin, emu9::Schedule::lowest_first}) {
    emu9::schedule = schedule;
    INFO(std::string(emu9::schedule_name(schedule)), " schedule");
    fa::Problem p = make(3, 1, 200, 260, 64, false);
    p.batch = 2;
    for (int launch = 0; launch < 2; ++launch)
      check_one("v16_fp8_row_sums", wsq::forward_v16_fp8_row_sums, p, {}, 1.0, 0.01, false);
    check_one("v16_fp8_row_sums", wsq::forward_v16_fp8_row_sums, make(7, 1, 200, 200, 64, true), {}, 1.0, 0.01, false);
    check_one("v16_fp8_row_sums", wsq::forward_v16_fp8_row_sums, make(2, 2, 400, 150, 128, true), {}, 1.0, 0.0, false);
    check_one("v16_fp8_row_sums", wsq::forward_v16_fp8_row_sums, make(4, 2, 257, 300, 128, false), {}, 1.0, 0.01,
              false);
  }
  emu9::schedule = emu9::Schedule::round_robin;
}

namespace {
// `step` must give `before`'s O and LSE bits on each shape {H, Hkv, B, nq, nk, d, causal}, under both schedules of an
// emulated GPU of two SMs, a batch launched twice (the work counter back at 0); inputs with outliers, seeded by `seed`.
void check_same_bits(Fp8Fn before, Fp8Fn step, const std::vector<std::array<int, 7>>& shapes, int seed) {
  for (const emu9::Schedule schedule : {emu9::Schedule::round_robin, emu9::Schedule::lowest_first}) {
    emu9::schedule = schedule;
    for (const auto& [H, Hkv, B, nq, nk, d, causal] : shapes) {
      fa::Problem p = make(H, Hkv, nq, nk, d, causal != 0);
      p.batch = B;
      INFO(std::string(emu9::schedule_name(schedule)), " schedule, ", H, "/", Hkv, " heads, batch ", B, ", ", nq, "x",
           nk, " d=", d, " causal=", causal);
      const auto q = lab_inputs(p.q_elems(), seed + nq, 0.01), k = lab_inputs(p.kv_elems(), seed + 1 + nk, 0.01),
                 v = lab_inputs(p.kv_elems(), seed + 2, 0.01);
      const Quantised z = quantise(p, {}, q.data(), k.data(), v.data());
      const Output expected = run_step(before, p, z);
      CHECK(run_step(step, p, z) == expected);
      if (B > 1) CHECK(run_step(step, p, z) == expected);
    }
  }
  emu9::schedule = emu9::Schedule::round_robin;
}
}  // namespace

// Step 17 drops step 16's turn barriers at d = 128: each warpgroup computes the same rows from the same tiles in the
// same order, so O and LSE must be step 16's bits. What the turns also did, keeping the two warpgroups within a tile
// of each other, now rests on the K/V buffers' mbarriers alone (every consumer thread must release a buffer before
// the producer refills it): the lowest-first schedule lets one warpgroup run as far ahead of the other as they allow.
// Two emulated SMs, both schedules, items of different lengths (causal, rows without keys), heads and batches mixed
// (launched twice), GQA, outliers.
TEST_CASE("emulated FP8 step 17: no turn barriers at d = 128, step 16's bits, launch after launch, both schedules") {
  check_same_bits(wsq::forward_v16_fp8_row_sums, wsq::forward_v17_fp8_no_turns,
                  {{3, 1, 2, 200, 260, 128, 1}, {2, 2, 1, 400, 150, 128, 1}, {1, 1, 1, 1, 17, 128, 0}}, 21);
}

// Step 18 writes O through a staging tile per warpgroup and a TMA store; its values are step 17's, so O and LSE must
// be step 17's bits. What can go wrong is the handover of the tile (emu_sm90.hpp's bulk copies): a warpgroup that
// hands it to the store before all its threads wrote it, or writes the next item's rows before the store has read
// the last one, stops the emulation; a store no wait_group retired before the block ends does too. Two emulated SMs,
// so each block writes several items through the same tile; both schedules; d = 64 (three warpgroups, one panel)
// and 128 (two, two panels); Q lengths that are not multiples of 64 (rows past the end lie outside the tensor map,
// and at 200 rows the second item's last two warpgroups have none inside: their whole box is dropped); causal items
// without keys (O = 0, LSE = -inf written all the same); GQA; batches (launched twice); outliers.
TEST_CASE("emulated FP8 step 18: O through a TMA store, step 17's bits, launch after launch, both schedules") {
  check_same_bits(wsq::forward_v17_fp8_no_turns, wsq::forward_v18_fp8_tma_store,
                  {{3, 1, 2, 200, 260, 64, 1}, {2, 2, 1, 400, 150, 128, 1}, {4, 2, 1, 97, 203, 128, 0},
                   {1, 1, 1, 1, 17, 64, 0}, {2, 1, 1, 200, 300, 64, 0}},
                  31);
}

// Step 19 reads each item's Q block, head and batch from the producer instead of dividing them out of the item's
// number: the same numbers, so O and LSE must be step 18's bits. What can go wrong is the slot they travel in, next
// to the Q buffer: the producer must write it before its arrive on the buffer's full barrier (the emulated arrive and
// TMA load let the waiting consumers run at once), and rewrites it for the buffer's next item once every consumer
// thread has arrived on the empty barrier, so a consumer must read it before its own arrive. Both schedules, two
// emulated SMs (each block takes items one after another, both slots reused), GQA groups of 2 and 3, batches of 2
// (launched twice), causal items without keys, d = 64 and 128, one item on its own.
TEST_CASE("emulated FP8 step 19: each item's coordinates from the producer, step 18's bits, both schedules") {
  check_same_bits(wsq::forward_v18_fp8_tma_store, wsq::forward_v19_fp8_producer_coords,
                  {{3, 1, 2, 200, 260, 64, 1}, {4, 2, 2, 97, 203, 128, 0}, {2, 2, 1, 400, 150, 128, 1},
                   {1, 1, 1, 1, 17, 64, 0}},
                  41);
}

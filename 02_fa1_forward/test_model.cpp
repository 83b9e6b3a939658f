// CPU tests (CI): the chapter's plain C++ model of Algorithm 2 equals the fp64 reference.
#include <doctest/doctest.h>

#include "model.hpp"
#include "program.hpp"
#include "reference.hpp"
#include "testing.hpp"

using namespace fa;

namespace {
void check_model(const Problem& p, int Br, int Bc) {
  const HostTensors in = random_inputs(p, false);
  std::vector<float> o, l, m, lse;
  fa1_model::forward(p, Br, Bc, in.q.data(), in.k.data(), in.v.data(), o, l, m, lse);
  std::vector<double> ro, rl;
  reference_forward(p, in.q.data(), in.k.data(), in.v.data(), ro, rl);
  INFO(describe(p), " Br=", Br, " Bc=", Bc);
  const auto eo = compare(o, ro, kTolFp32Forward), el = compare(lse, rl, kTolFp32Forward);
  CHECK_MESSAGE(eo.ok(), eo.summary("O"));
  CHECK_MESSAGE(el.ok(), el.summary("LSE"));
  for (size_t r = 0; r < lse.size(); ++r) {  // LSE = m + log l, and the empty-row convention
    if (std::isinf(rl[r])) {
      CHECK(l[r] == 0.f);
      CHECK(m[r] == -INFINITY);
    } else {
      CHECK(lse[r] == doctest::Approx(m[r] + std::log(l[r])).epsilon(1e-6));
    }
  }
}

Problem make(int nq, int nk, int d, bool causal, float drop = 0.f) {
  Problem p;
  p.batch = 2, p.heads = 2, p.kv_heads = 2, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  p.dropout_p = drop, p.seed = 5 + nq, p.offset = 1;
  return p;
}
}  // namespace

TEST_CASE("02 model equals the fp64 reference: ragged lengths, causal on/off, tiles that do not divide N") {
  for (auto [nq, nk] : std::vector<std::pair<int, int>>{{1, 1}, {17, 17}, {33, 20}, {20, 33}, {97, 97}})
    for (bool causal : {false, true})
      for (auto [Br, Bc] : std::vector<std::pair<int, int>>{{16, 16}, {5, 7}, {64, 64}}) check_model(make(nq, nk, 16, causal), Br, Bc);
}

TEST_CASE("02 model: GQA, custom scale, dropout p in {0.1, 0.5} (same Philox mask as the reference)") {
  for (float drop : {0.1f, 0.5f}) {
    Problem p = make(29, 41, 8, true, drop);
    p.heads = 4, p.kv_heads = 2, p.scale = 0.3f;
    check_model(p, 8, 16);
    p.causal = false;
    check_model(p, 3, 5);
  }
}

TEST_CASE("02 model: large logits (the max subtraction and the rescaling at every step)") {
  const Problem p = make(40, 70, 16, false);
  HostTensors in = random_inputs(p, false);
  for (auto& x : in.q) x *= 30.f;
  std::vector<float> o, l, m, lse;
  fa1_model::forward(p, 16, 16, in.q.data(), in.k.data(), in.v.data(), o, l, m, lse);
  std::vector<double> ro, rl;
  reference_forward(p, in.q.data(), in.k.data(), in.v.data(), ro, rl);
  const auto eo = compare(o, ro, kTolFp32Forward);
  CHECK_MESSAGE(eo.ok(), eo.summary("O"));
}

TEST_CASE("02 block sizes (line 2) and the HBM count") {
  // H100: 227 KiB of shared memory per block = 58112 fp32 elements
  const auto h100 = fa1_model::paper_block_sizes(64, 232448 / 4);
  CHECK(h100.Bc == 227);
  CHECK(h100.Br == 64);
  CHECK(fa1_model::paper_block_sizes(16, 232448 / 4).Br == 16);
  CHECK(fa1_model::paper_block_sizes(128, 49152 / 4).Bc == 24);
  // N = 1024, d = 64, Bc = 64: Tc = 16, leading term 3 N d Tc
  Problem p = make(1024, 1024, 64, false);
  const double N = 1024, d = 64, Tc = 16;
  CHECK(fa1_model::hbm_elements_per_head(p, 64, 64) == N * d + 2 * N + 2 * N * d + Tc * (3 * N * d + 4 * N) + 3 * N);
  // Causal, Br = Bc = 64: K/V block j is visited by Q blocks j..15, 16 * 17 / 2 = 136 (i, j) pairs of 64 rows.
  p.causal = true;
  CHECK(fa1_model::visited_rows(p, 64, 64) == 136 * 64);
  CHECK(fa1_model::hbm_elements_per_head(p, 64, 64) == N * d + 2 * N + 2 * N * d + 136 * 64 * (3 * d + 4) + 3 * N);
  p.causal = false;
  CHECK(fa1_model::paper_formula_elements_per_head(p, 64) == N * d * (2 + 3 * Tc));
}

// README §3's worked example (chapter 01's numbers, now as FA1's Algorithm 2 runs them): one query row, d = 1,
// scale 1, keys k = (1, 2, 4, 0), values v = (1, 2, 3, 4), Bc = 2. After block 1 the state equals the final
// state of a run over the first two keys; after block 2, of the whole run.
TEST_CASE("02 worked example: m_i, l_i and the normalised O_i after each K/V block of two keys") {
  Problem p;
  p.q_len = 1, p.kv_len = 4, p.head_dim = 1, p.scale = 1.f;
  const float q[1] = {1.f}, k[4] = {1.f, 2.f, 4.f, 0.f}, v[4] = {1.f, 2.f, 3.f, 4.f};
  struct After {
    int keys;
    float m, l, O;
  };
  for (const After& a : {After{2, 2.f, 1.367879f, 1.731059f}, After{4, 4.f, 1.203438f, 2.820021f}}) {
    INFO("after the first ", a.keys, " keys");
    p.kv_len = a.keys;
    float o = 0.f, l = 0.f, m = 0.f, lse = 0.f;
    fa1_model::forward_head(p, 0, 0, 1, 2, q, k, v, &o, &l, &m, &lse);
    CHECK(m == a.m);
    CHECK(l == doctest::Approx(a.l).epsilon(1e-6));
    CHECK(o == doctest::Approx(a.O).epsilon(1e-6));
  }
}

// SOLUTIONS.md, exercise 1: line 2's block sizes for --sram-kb 48 and 24 at d = 64, and the HBM bytes of §4
// they imply at N = 4096 (one head): Tc grows as Bc shrinks and the leading term 3 N d Tc with it.
TEST_CASE("02 exercise 1: Bc, Tc and the HBM count for a 48 KiB and a 24 KiB tiling") {
  const Problem p = make(4096, 4096, 64, false);
  const auto kb48 = fa1_model::paper_block_sizes(64, 48 * 1024 / 4), kb24 = fa1_model::paper_block_sizes(64, 24 * 1024 / 4);
  CHECK(kb48.Bc == 48);
  CHECK(kb48.Br == 48);
  CHECK(kb24.Bc == 24);
  CHECK(kb24.Br == 24);
  CHECK(fa1_model::ceil_div(4096, 48) == 86);
  CHECK(fa1_model::ceil_div(4096, 24) == 171);
  const double N = 4096, d = 64;
  CHECK(fa1_model::hbm_elements_per_head(p, 48, 48) == N * d + 2 * N + 2 * N * d + 86 * N * (3 * d + 4) + 3 * N);
  CHECK(fa1_model::hbm_elements_per_head(p, 24, 24) == N * d + 2 * N + 2 * N * d + 171 * N * (3 * d + 4) + 3 * N);
}

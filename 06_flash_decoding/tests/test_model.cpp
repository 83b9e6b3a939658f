// CPU tests of chapter 06's model (model.hpp) and shared indexing (plan.hpp): split + merge and the unified max with
// its fallback against the fp64 reference (ragged lengths with 0 and 1, empty splits, GQA, causal q_len 4, large
// logits), the merge operator's edge cases, the split ranges, the heuristic's properties and the byte counts, the
// shared-memory counts, split_kv_even's decomposition and model, and §4.6's L2 rule. The tensor-core step
// (split_kv_mma) has its own file, test_model_mma.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "model_testing.hpp"

using namespace fdec_model;
using namespace fdec_test;

TEST_CASE("06 model: the merge of split partials is the attention of the whole row, empty splits included") {
  const int d = 8;
  // Three pieces of one row, one of them empty: merged, they give the LSE and O of the union.
  std::vector<float> s = {0.3f, -1.f, 2.5f, 0.f, 1.f};
  std::vector<std::vector<float>> v(s.size(), std::vector<float>(d));
  for (size_t j = 0; j < s.size(); ++j)
    for (int c = 0; c < d; ++c) v[j][c] = float(j) - 0.5f * c;
  auto piece = [&](size_t j0, size_t j1) {
    Partial p;
    p.o.assign(d, 0.f);
    if (j0 == j1) return p;
    double m = -INFINITY, l = 0;
    for (size_t j = j0; j < j1; ++j) m = std::max(m, double(s[j]));
    for (size_t j = j0; j < j1; ++j) l += std::exp(s[j] - m);
    for (size_t j = j0; j < j1; ++j)
      for (int c = 0; c < d; ++c) p.o[c] += float(std::exp(s[j] - m) / l * v[j][c]);
    p.lse = float(m + std::log(l));
    return p;
  };
  const Partial whole = piece(0, 5), merged = merge({piece(0, 2), piece(2, 2), piece(2, 5)}, d);
  CHECK(merged.lse == doctest::Approx(whole.lse).epsilon(1e-6));
  for (int c = 0; c < d; ++c) CHECK(merged.o[c] == doctest::Approx(whole.o[c]).epsilon(1e-5));
  // Order does not matter, and the empty split carries no weight even if its O_s were garbage.
  Partial junk = piece(2, 2);
  junk.o.assign(d, NAN);
  const Partial again = merge({piece(2, 5), junk, piece(0, 2)}, d);
  for (int c = 0; c < d; ++c) CHECK(again.o[c] == doctest::Approx(whole.o[c]).epsilon(1e-5));
  // All empty: O = 0, LSE = -inf.
  const Partial none = merge({junk, junk}, d);
  CHECK(none.lse == -INFINITY);
  for (float x : none.o) CHECK(x == 0.f);
}

TEST_CASE("06 model: split ranges tile the keys in whole warp chunks, empty splits last") {
  for (int n : {0, 1, 17, 32, 33, 1000, 4096, 131072})
    for (int splits : {1, 2, 3, 7, 64, 128}) {
      int next = 0, nonempty = 0;
      for (int s = 0; s < splits; ++s) {
        const fdec::KeyRange r = fdec::split_range(n, splits, s);
        CHECK(r.begin == std::min(next, n));
        if (!r.empty()) {
          CHECK(r.begin % fdec::kKeysPerWarp == 0);
          CHECK(nonempty == s);  // no empty split before a non-empty one
          ++nonempty;
        }
        next = std::max(next, r.end);
      }
      CHECK(next == n);
    }
}

TEST_CASE("06 model: every query row belongs to exactly one (unit, row) of the packed and unpacked grids") {
  const fa::Problem p = make(1, 32, 8, 3, 64, 64, false);
  for (bool packed : {false, true}) {
    const fdec::Rows R = fdec::rows_of(p, packed);
    std::set<std::pair<int, int>> seen;
    for (int u = 0; u < fdec::units_of(p, packed); ++u)
      for (int r = 0; r < R.per_unit(); ++r) {
        CHECK(p.kv_head_of(R.head(u, r)) == p.kv_head_of(R.head(u, 0)));  // one kv head per unit
        seen.insert({R.head(u, r), R.query(r)});
      }
    CHECK(seen.size() == size_t(p.heads) * p.q_len);
  }
}

TEST_CASE("06 model: split + merge matches the fp64 reference on ragged lengths, GQA, causal q_len 4") {
  struct Shape {
    fa::Problem p;
    std::vector<int> lens;
  };
  const std::vector<Shape> shapes = {
      {make(4, 4, 4, 1, 203, 64, false), {203, 0, 1, 97}},    // MHA, lengths 0 and 1, a ragged tail
      {make(2, 8, 2, 1, 300, 64, false), {300, 33}},          // GQA 8/2
      {make(2, 8, 1, 4, 113, 64, true), {113, 5}},            // MQA, speculative q_len 4, causal (row 0 of len 5 sees 2)
      {make(1, 2, 1, 2, 1023, 128, true), {1023}},            // d = 128, a long row
      {make(3, 4, 2, 3, 64, 64, true), {2, 0, 64}},           // causal rows with no visible key (n_b < q_len)
  };
  for (fa::Dtype t : {fa::Dtype::fp16, fa::Dtype::bf16})
    for (const Shape& sh : shapes) {
      const Case c = inputs(t, sh.p, sh.lens);
      const int max_len = *std::max_element(sh.lens.begin(), sh.lens.end());
      for (bool packed : {false, true})
        for (int splits : {1, 2, 5, max_splits(max_len) + 3}) {  // the last one leaves splits empty
          INFO(std::string(fa::dtype_name(t)), " B=", sh.p.batch, " H=", sh.p.heads, "/", sh.p.kv_heads, " q_len=", sh.p.q_len,
               " packed=", packed, " splits=", splits);
          const Result r = forward(t, c.p, c.lens, c.q, c.k, c.v, packed, splits, Softmax{});
          expect_matches(t, c, r);
          CHECK(r.fallbacks == 0);
          for (int b = 0; b < c.p.batch; ++b)  // an empty context: O = 0 exactly, LSE = -inf
            if (c.lens[b] == 0)
              for (int h = 0; h < c.p.heads; ++h) {
                CHECK(r.lse[c.p.lse_offset(b, h)] == -INFINITY);
                CHECK(r.o[c.p.q_offset(b, h)] == 0.f);
              }
        }
    }
}

TEST_CASE("06 model: the unified max agrees with the running max, and falls back where it must") {
  const fa::Dtype t = fa::Dtype::fp16;
  const fa::Problem p = make(2, 4, 2, 1, 500, 64, false);
  const Case c = inputs(t, p, {500, 77});
  // Ordinary logits (|S| of a few units), phi = 0: no fallback, the same answer.
  const Result r0 = forward(t, p, c.lens, c.q, c.k, c.v, true, 3, Softmax{true, 0.f});
  CHECK(r0.fallbacks == 0);
  expect_matches(t, c, r0);
  // phi far above every score: exp(S - phi) would underflow the whole row. Every non-empty split falls back.
  const Result r1 = forward(t, p, c.lens, c.q, c.k, c.v, true, 3, Softmax{true, 200.f});
  CHECK(r1.fallbacks > 0);
  expect_matches(t, c, r1);
  // Large logits (scale 30: S in the hundreds) with phi = 0: exp(S - phi) would overflow. Falls back, still right.
  const fa::Problem pl = make(2, 4, 2, 1, 500, 64, false, 30.f);
  const Case cl = inputs(t, pl, {500, 77});
  const Result r2 = forward(t, pl, cl.lens, cl.q, cl.k, cl.v, true, 3, Softmax{true, 0.f});
  CHECK(r2.fallbacks > 0);
  expect_matches(t, cl, r2);
  // The test itself: an empty split never trips; the window is [phi - 60, phi + 60].
  CHECK_FALSE(fdec::unified_max_trips(-INFINITY, 0.f));
  CHECK_FALSE(fdec::unified_max_trips(59.f, 0.f));
  CHECK_FALSE(fdec::unified_max_trips(-59.f, 0.f));
  CHECK(fdec::unified_max_trips(61.f, 0.f));
  CHECK(fdec::unified_max_trips(-61.f, 0.f));
  CHECK(std::isfinite(std::exp(fdec::kOverflow) * 2097152.f * 65504.f));  // 2^21 keys of |v| <= 65504: no overflow
  CHECK(std::exp(-fdec::kUnderflow) >= 1.1754944e-38f);                   // the largest term stays a normal number
}

TEST_CASE("06 model: the split heuristic") {
  for (int sms : {108, 132})
    for (int per_sm : {1, 2, 3})
      for (long long blocks : {1LL, 8LL, 32LL, 64LL, 256LL, 1024LL})
        for (int n : {1, 100, 256, 257, 4096, 32768, 131072}) {
          const int slots = sms * per_sm, s = choose_splits(blocks, n, slots);
          INFO("blocks=", blocks, " n=", n, " slots=", slots, " -> ", s);
          CHECK(s >= 1);
          CHECK(s <= max_splits(n));
          if (blocks >= slots) CHECK(s == 1);                  // a full grid is not split
          if (n <= fdec::kMinSplitKeys) CHECK(s == 1);         // nor a short context
          if (blocks >= slots) continue;
          // Below one full wave: the cheapest in waves x keys per block, within 5%, and the smallest such count.
          auto cost = [&](int x) { return double((blocks * x + slots - 1) / slots) / x; };
          double best = cost(1);
          for (int x = 2; x <= max_splits(n); ++x) best = std::min(best, cost(x));
          CHECK(cost(s) <= kHeuristicSlack * best + 1e-12);
          for (int x = 1; x < s; ++x) CHECK(cost(x) > kHeuristicSlack * best - 1e-12);  // the smallest such s
        }
  // On an H100 the slots are its 132 SMs (README §4). B=1 with 8 kv groups takes 16 splits = 128 blocks, one per
  // SM, at 32k and at 128k (33 would fill two waves of 132 a little better, but 16 is within 5% and leaves half
  // the partials); the sweep that motivated the rule measured 16 as the best count there.
  CHECK(choose_splits(8, 32768, 132) == 16);
  CHECK(choose_splits(8, 131072, 132) == 16);
  // B=1 MHA, 32 unpacked heads: 4 splits (128 blocks). B=8, GQA 32/8: 64 groups, 2 splits (128 blocks).
  CHECK(choose_splits(32, 131072, 132) == 4);
  CHECK(choose_splits(8 * 8, 32768, 132) == 2);
  // B=8 MHA: 256 blocks already give every SM a block (the measured table: not splitting was 0.4-2.4% faster than
  // the 3 splits that counting resident blocks chose).
  CHECK(choose_splits(8 * 32, 131072, 132) == 1);
  // Counting resident blocks as slots (2 per SM) would have chosen 32 for the same B=1 GQA shape.
  CHECK(choose_splits(8, 131072, 264) == 32);
}

TEST_CASE("06 model: bytes read per decode step") {
  const fa::Problem p = make(2, 32, 8, 1, 4096, 128, false);
  const std::vector<int> lens = {4096, 100};
  CHECK(kv_bytes(p, lens, 2) == 2.0 * 2 * (4096 + 100) * 8 * 128);
  const double io = double(p.lse_elems()) * (128 * 2 * 2 + 4);  // Q read, O and LSE written
  CHECK(model_hbm_bytes(p, lens, 2, true, 1) == doctest::Approx(kv_bytes(p, lens, 2) + io));
  CHECK(model_hbm_bytes(p, lens, 2, false, 1) == doctest::Approx(4 * kv_bytes(p, lens, 2) + io));  // group 4
  CHECK(model_hbm_bytes(p, lens, 2, true, 8) ==
        doctest::Approx(kv_bytes(p, lens, 2) + io + 2.0 * 8 * p.lse_elems() * 129 * 4));
  // split_kv_even: one block writes every tile directly; with a block per chunk (T = 8 x 128 + 8 x 4) every chunk
  // of a 4-row tile is a piece with a partial to write and read back.
  CHECK(model_hbm_bytes_even(p, lens, 2, 1) == doctest::Approx(model_hbm_bytes(p, lens, 2, true, 1)));
  CHECK(model_hbm_bytes_even(p, lens, 2, 1056) ==
        doctest::Approx(model_hbm_bytes(p, lens, 2, true, 1) + 2.0 * (8 * 128 + 8 * 4) * 4 * 129 * 4));
  // MQA 32/1 with q_len 1: 32 rows per kv head = two 16-row chunks, K/V read twice.
  const fa::Problem mqa = make(1, 32, 1, 1, 4096, 128, false);
  CHECK(model_hbm_bytes(mqa, {4096}, 2, true, 1) ==
        doctest::Approx(2 * kv_bytes(mqa, {4096}, 2) + double(mqa.lse_elems()) * (128 * 4 + 4)));
}

TEST_CASE("06 model: the device-made inputs have the project's statistics and differ per tensor") {
  double sum = 0, sum2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = fdec::input_value(5, fdec::Tensor::k, size_t(i));
    sum += x, sum2 += x * x;
    CHECK((x >= -1.5 && x < 2.5));
  }
  const double mean = sum / n, var = sum2 / n - mean * mean;
  CHECK(mean == doctest::Approx(0.5).epsilon(0.02));
  CHECK(var == doctest::Approx(16.0 / 12).epsilon(0.02));
  CHECK(fdec::input_value(5, fdec::Tensor::k, 7) != fdec::input_value(5, fdec::Tensor::v, 7));
  CHECK(fdec::input_value(5, fdec::Tensor::k, 7) != fdec::input_value(6, fdec::Tensor::k, 7));
}

TEST_CASE("06 model: shared memory of the split blocks (README §4.1, §7, exercise 1)") {
  using fdec::split_smem_bytes;
  constexpr int kSm80 = 166912, kSm86 = 101376, kSm90 = 232448;  // opt-in bytes per block: 163, 99, 227 KB
  constexpr int kSm90PerSm = 233472, kReservedPerBlock = 1024;      // 228 KB per SM, 1 KB of it per block
  // One stage, 16 rows, d = 128: 86,400 bytes, so two blocks fit on an H100 SM (what the occupancy API reported).
  CHECK(split_smem_bytes(128, 16, 1) == 86400);
  CHECK(2 * (split_smem_bytes(128, 16, 1) + kReservedPerBlock) <= kSm90PerSm);
  CHECK(3 * (split_smem_bytes(128, 16, 1) + kReservedPerBlock) > kSm90PerSm);
  // Two stages: 156,032 bytes (152 KB) at d = 128 and 16 rows: sm_80 and sm_90 hold it, sm_86/89 do not; one per SM.
  CHECK(split_smem_bytes(128, 16, 2) == 156032);
  CHECK(split_smem_bytes(128, 16, 2) <= kSm80);
  CHECK(split_smem_bytes(128, 16, 2) > kSm86);
  CHECK(2 * (split_smem_bytes(128, 16, 2) + kReservedPerBlock) > kSm90PerSm);
  // At d = 64 two stages fit everywhere (sm_86 included).
  CHECK(split_smem_bytes(64, 16, 2) <= kSm86);
  // Exercise 1: three stages (225,664 bytes) fit sm_90's 227 KB, not sm_80's 163 KB.
  CHECK(split_smem_bytes(128, 16, 3) == 225664);
  CHECK(split_smem_bytes(128, 16, 3) <= kSm90);
  CHECK(split_smem_bytes(128, 16, 3) > kSm80);
}

TEST_CASE("06 model: the even decomposition (split_kv_even) covers every chunk once, in near-equal shares") {
  struct Shape {
    std::vector<int> lens;
    int tiles_per_entry;
  };
  const std::vector<Shape> shapes = {{{32768}, 8},                     // B = 1, GQA 32/8: 8 tiles
                                     {{131072, 131072}, 32},          // MHA, B = 2
                                     {{4096, 0, 1, 97, 1000}, 3},     // ragged, an empty entry, tails
                                     {{5, 17, 33}, 1},                // fewer chunks than blocks
                                     {{0, 0}, 2}};                    // nothing but empty tiles
  for (const Shape& sh : shapes)
    for (int C : {1, 2, 3, 7, 128, 132, 256}) {
      const int B = int(sh.lens.size());
      INFO("lens ", sh.lens.size(), " tiles/entry ", sh.tiles_per_entry, " C ", C);
      fdec::EvenWalk walk = fdec::even_walk(sh.lens.data(), B, sh.tiles_per_entry, C);
      // per (entry, tile): the pieces' keys in part order, the parts they claim, the blocks they come from
      std::vector<std::vector<std::pair<int, fdec::KeyRange>>> seen(size_t(B) * sh.tiles_per_entry);
      std::vector<int> claimed(seen.size(), 0);
      long long least = walk.T, most = 0;
      for (int k = 0; k < walk.C; ++k) {
        const long long x0 = fdec::even_begin(k, walk.T, walk.C), x1 = fdec::even_begin(k + 1, walk.T, walk.C);
        least = std::min(least, x1 - x0), most = std::max(most, x1 - x0);
        for (long long x = x0; x < x1;) {
          const fdec::Piece pc = walk.piece(k, x, x1);
          CHECK(pc.next > x);
          CHECK(pc.next <= x1);
          CHECK(pc.keys.begin % fdec::kKeysPerWarp == 0);
          CHECK(fdec::even_block_of(x, walk.T, walk.C) == k);
          const size_t id = size_t(pc.b) * sh.tiles_per_entry + pc.tile;
          CHECK(pc.parts <= walk.C);
          if (claimed[id]) CHECK(pc.parts == claimed[id]);
          claimed[id] = pc.parts;
          CHECK(pc.part == int(seen[id].size()));  // a tile's pieces come from consecutive blocks, in order
          seen[id].push_back({k, pc.keys});
          x = pc.next;
        }
      }
      CHECK(least >= 1);
      CHECK(most - least <= 1);  // the shares differ by at most one chunk
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < sh.tiles_per_entry; ++t) {
          const auto& ps = seen[size_t(b) * sh.tiles_per_entry + t];
          REQUIRE(!ps.empty());  // every tile is visited, an empty entry's too (it writes O = 0, LSE = -inf)
          CHECK(int(ps.size()) == claimed[size_t(b) * sh.tiles_per_entry + t]);
          int next = 0;
          for (size_t i = 0; i < ps.size(); ++i) {
            CHECK(ps[i].second.begin == next);  // the keys 0 .. n_b, each once, in order
            if (i) CHECK(ps[i].first == ps[i - 1].first + 1);
            next = ps[i].second.end;
          }
          CHECK(next == sh.lens[b]);
        }
    }
}

TEST_CASE("06 model: split_kv_even meets the 2x rule and agrees with split_kv_mma, whatever the block count") {
  struct Shape {
    fa::Problem p;
    std::vector<int> lens;
  };
  const std::vector<Shape> shapes = {
      {make(4, 4, 4, 1, 203, 64, false), {203, 0, 1, 97}},  // MHA, ragged with an empty entry
      {make(2, 8, 2, 1, 300, 128, false), {300, 33}},       // GQA 4 rows
      {make(2, 8, 1, 4, 113, 64, true), {113, 5}},          // MQA q_len 4: two row chunks per unit, causal
      {make(2, 4, 2, 1, 500, 64, false, 30.f), {500, 77}},  // large logits
  };
  for (fa::Dtype t : {fa::Dtype::fp16, fa::Dtype::bf16})
    for (const Shape& sh : shapes) {
      const Case c = inputs(t, sh.p, sh.lens);
      std::vector<double> ro, rl;
      reference(c.p, c.lens, c.q, c.k, c.v, ro, rl);
      const double bound = fa::lowp_error_bound(t, fa::compare(plain(t, c.p, c.lens, c.q, c.k, c.v), ro, {1e30, 0}).max_abs);
      const Result mma = forward(t, c.p, c.lens, c.q, c.k, c.v, true, 3, Softmax{}, Products::tensor_cores);
      for (int blocks : {1, 3, 5, 132}) {
        INFO(std::string(fa::dtype_name(t)), " B=", sh.p.batch, " H=", sh.p.heads, "/", sh.p.kv_heads, " blocks=", blocks);
        std::vector<fdec::Piece> pieces;
        const Result r = forward_even(t, c.p, c.lens, c.q, c.k, c.v, blocks, &pieces);
        expect_matches(t, c, r);
        CHECK(fa::compare(r.o, fa::to_double(mma.o), {bound, 0}).ok());
        CHECK(fa::compare(r.lse, fa::to_double(mma.lse), fa::kTolFp32Forward).ok());
        if (blocks == 3) CHECK(std::any_of(pieces.begin(), pieces.end(), [](auto& pc) { return pc.parts > 1; }));
      }
    }
}

TEST_CASE("06 model: the K/V stream's L2 policy (README §4.6): evict-first up to a few L2s of K and V per step") {
  // K and V of every kv head at max_len, 16-bit: B x Hkv x N x d x 2 matrices x 2 bytes.
  CHECK(fdec::kv_step_bytes(make(1, 32, 8, 1, 32768, 128, false), 32768) == 134217728.0);
  CHECK(fdec::kv_step_bytes(make(8, 32, 32, 1, 4096, 128, false), 4096) == 536870912.0);
  CHECK(fdec::kv_step_bytes(make(8, 32, 32, 1, 4096, 128, false), 17) == 536870912.0 / 4096 * 17);  // max_len, not N
  const double l2 = 50.0 * (1 << 20);  // an H100's
  // The shapes the rule was measured at (README §4.6): 17 and 134 MB per step evict-first, 537 MB and more not.
  CHECK(fdec::kv_evict_first(fdec::kv_step_bytes(make(1, 32, 8, 1, 4096, 128, false), 4096), l2));
  CHECK(fdec::kv_evict_first(fdec::kv_step_bytes(make(1, 32, 8, 1, 32768, 128, false), 32768), l2));
  CHECK_FALSE(fdec::kv_evict_first(fdec::kv_step_bytes(make(1, 32, 8, 1, 131072, 128, false), 131072), l2));
  CHECK_FALSE(fdec::kv_evict_first(fdec::kv_step_bytes(make(1, 32, 32, 1, 32768, 128, false), 32768), l2));
  // The line itself: at most kEvictFirstL2s L2s.
  CHECK(fdec::kv_evict_first(fdec::kEvictFirstL2s * l2, l2));
  CHECK_FALSE(fdec::kv_evict_first(fdec::kEvictFirstL2s * l2 + 1, l2));
}

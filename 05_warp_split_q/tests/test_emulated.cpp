// The kernels themselves, run on the CPU through tests/emu/emu.hpp (one std::thread per GPU thread; warp-wide
// instructions computed from the PTX ISA's rules): every step x fp16/bf16 x head_dim 64/128 on small ragged
// shapes, causal with rows that see no key, GQA, large logits, outputs NaN-poisoned, judged by the same rule
// as the GPU tests (check.hpp). This is what lets the chapter's index arithmetic, masks, buffers and barriers
// be tested on a machine without a GPU (cp.async copies land only at the wait that allows them, so a missing
// wait shows too); it says nothing about speed and cannot see races between warps (the GPU sanitizer runs do).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "block_mask.hpp"
#include "random.hpp"

#include "forward/check.hpp"
#include "forward/warp_split_q.cuh"

using namespace fa;

namespace {

Problem make(int B, int H, int Hkv, int nq, int nk, int d, bool causal) {
  Problem p;
  p.batch = B, p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  p.seed = 5 + nq + 7 * nk + d;
  return p;
}

template <class T>
void check_steps(Dtype t, const Problem& p, double qk_stddev) {
  const std::vector<float> qf = rounded(t, random_normal<float>(p.q_elems(), p.seed * 4 + 1, 0.0, qk_stddev)),
                           kf = rounded(t, random_normal<float>(p.kv_elems(), p.seed * 4 + 2, 0.0, qk_stddev)),
                           vf = rounded(t, random_normal<float>(p.kv_elems(), p.seed * 4 + 3));
  const std::vector<T> q = to_dtype<T>(qf), k = to_dtype<T>(kf), v = to_dtype<T>(vf);
  const wsq::LowpReference ref = wsq::lowp_reference(t, p, qf, kf, vf, 1e30);
  for (const wsq::ForwardStep& s : wsq::forward_steps()) {
    INFO("step ", std::string(s.name), ", ", std::string(dtype_name(t)), ", ", p.batch, "x", p.heads, "/", p.kv_heads, " ", p.q_len, "x", p.kv_len,
         " d=", p.head_dim, " causal=", p.causal, " Q/K stddev ", qk_stddev);
    std::vector<T> o(p.q_elems());
    std::vector<float> lse(p.lse_elems());
    std::memset(o.data(), 0xFF, o.size() * sizeof(T));  // NaN poison, as on the GPU
    std::memset(lse.data(), 0xFF, lse.size() * sizeof(float));
    s.launch.of<T>()(p, q.data(), k.data(), v.data(), o.data(), lse.data());
    std::vector<float> o_f(o.size());
    for (size_t x = 0; x < o.size(); ++x) o_f[x] = to_float(o[x]);
    const wsq::LowpCheck c = wsq::check_lowp_forward(p, ref, o_f, lse);
    CHECK_MESSAGE(c.ok(), c.summary());
  }
}

void check_all(const Problem& p, double qk_stddev = 1.0) {
  check_steps<half_t>(Dtype::fp16, p, qk_stddev);
  check_steps<bfloat16_t>(Dtype::bf16, p, qk_stddev);
}

// Step 8 block-sparse (wsq::forward_block_sparse) with `mask` against the fp64 reference and the plain
// same-dtype attention with the same mask, by the chapter's rule.
template <class T>
void check_block_sparse(Dtype t, const Problem& p, const BlockMask& mask) {
  INFO(std::string(dtype_name(t)), ", ", p.batch, "x", p.heads, "/", p.kv_heads, " ", p.q_len, "x", p.kv_len, " d=", p.head_dim,
       " causal=", p.causal, " mask density ", mask.density());
  const std::vector<float> qf = rounded(t, random_normal<float>(p.q_elems(), p.seed * 4 + 1, 0.0, 1.0)),
                           kf = rounded(t, random_normal<float>(p.kv_elems(), p.seed * 4 + 2, 0.0, 1.0)),
                           vf = rounded(t, random_normal<float>(p.kv_elems(), p.seed * 4 + 3));
  const std::vector<T> q = to_dtype<T>(qf), k = to_dtype<T>(kf), v = to_dtype<T>(vf);
  const wsq::LowpReference ref = wsq::lowp_reference(t, p, qf, kf, vf, 1e30, &mask);
  std::vector<T> o(p.q_elems());
  std::vector<float> lse(p.lse_elems());
  std::memset(o.data(), 0xFF, o.size() * sizeof(T));
  std::memset(lse.data(), 0xFF, lse.size() * sizeof(float));
  wsq::forward_block_sparse<T>(p, q.data(), k.data(), v.data(), o.data(), lse.data(), mask.bits.data());
  std::vector<float> o_f(o.size());
  for (size_t x = 0; x < o.size(); ++x) o_f[x] = to_float(o[x]);
  const wsq::LowpCheck c = wsq::check_lowp_forward(p, ref, o_f, lse);
  CHECK_MESSAGE(c.ok(), c.summary());
}

void check_block_sparse_both(const Problem& p, const BlockMask& mask) {
  check_block_sparse<half_t>(Dtype::fp16, p, mask);
  check_block_sparse<bfloat16_t>(Dtype::bf16, p, mask);
}

}  // namespace

TEST_CASE("emulated kernels: ragged lengths, causal on/off, q_len != kv_len both ways, d = 64") {
  for (auto [nq, nk] : std::vector<std::pair<int, int>>{{1, 1}, {17, 17}, {64, 64}, {97, 130}, {130, 97}, {113, 203},
                                                        {203, 113}})
    for (bool causal : {false, true}) check_all(make(1, 1, 1, nq, nk, 64, causal));
}

TEST_CASE("emulated kernels: d = 128, GQA 6/2, MQA, large logits") {
  check_all(make(1, 1, 1, 97, 130, 128, true));
  check_all(make(1, 1, 1, 130, 70, 128, false));
  check_all(make(1, 6, 2, 20, 33, 64, true));
  check_all(make(1, 8, 2, 17, 40, 64, false));
  check_all(make(1, 8, 1, 40, 17, 128, true));
  check_all(make(2, 2, 1, 33, 20, 128, true));
  check_all(make(1, 1, 1, 70, 97, 64, false), 8.0);
}

TEST_CASE("emulated kernels: a custom scale, and rows that see no key give O = 0 exactly") {
  Problem p = make(1, 2, 1, 130, 70, 64, true);  // rows 0..59 see no key
  p.scale = 0.05f;
  check_all(p);
  const std::vector<float> x = rounded(Dtype::fp16, random_normal<float>(p.q_elems(), 3));
  const std::vector<half_t> q = to_dtype<half_t>(x), kv = to_dtype<half_t>(std::vector<float>(x.begin(), x.begin() + p.kv_elems()));
  for (const wsq::ForwardStep& s : wsq::forward_steps()) {
    INFO("step ", std::string(s.name));
    std::vector<half_t> o(p.q_elems());
    std::vector<float> lse(p.lse_elems());
    std::memset(o.data(), 0xFF, o.size() * sizeof(half_t));
    s.launch.fp16(p, q.data(), kv.data(), kv.data(), o.data(), lse.data());
    for (int h = 0; h < p.heads; ++h)
      for (int i = 0; i < p.q_len - p.kv_len; ++i) {
        CHECK((std::isinf(lse[p.lse_offset(0, h) + i]) && lse[p.lse_offset(0, h) + i] < 0));
        for (int c = 0; c < p.head_dim; ++c) CHECK(to_float(o[p.q_offset(0, h) + size_t(i) * p.head_dim + c]) == 0.f);
      }
  }
}

TEST_CASE("emulated step 8 block-sparse: ragged lengths, causal on/off, d = 64 and 128, GQA; masked tiles skipped") {
  for (bool causal : {false, true}) {
    const Problem p = make(1, 2, 1, 203, 300, 64, causal);  // 2 x 5 mask blocks: the pipeline skips across gaps
    check_block_sparse_both(p, strided_block_mask(p, 3));
    check_block_sparse_both(p, random_block_mask(p, 0.4, 2));
    const Problem r = make(1, 1, 1, 300, 113, 128, causal);  // q_len > kv_len: rows with no key under causal
    check_block_sparse_both(r, local_block_mask(r, 40));
  }
  const Problem g = make(1, 6, 2, 17, 130, 64, true);
  check_block_sparse_both(g, random_block_mask(g, 0.5, 4));
  const Problem dense = make(1, 1, 1, 97, 130, 64, true);
  check_block_sparse_both(dense, dense_block_mask(dense));
}

TEST_CASE("emulated step 8 block-sparse: a fully masked row block gives O = 0, LSE = -inf; an empty mask") {
  const Problem p = make(1, 1, 1, 300, 200, 64, false);  // 3 x 4 mask blocks
  BlockMask m = dense_block_mask(p);
  for (int c = 0; c < m.Tc; ++c) m.bits[size_t(1) * m.Tc + c] = 0;  // queries 128..255 see no key
  m.bits[2] = 0;                                                     // and a gap in the first row block
  check_block_sparse_both(p, m);
  std::fill(m.bits.begin(), m.bits.end(), 0);
  check_block_sparse_both(p, m);
}

TEST_CASE("emulated kernels: causal edges of the tiles: kv_len - q_len = Bc - 2 (mod Bc), a whole Q block with no key") {
  // kv_len - q_len = 62 and 126: the diagonal crosses every K/V tile (Bc = 64 or 128) two keys before its end, where
  // a tile-level causal test off by one keeps or drops a tile it should not. q_len - kv_len = 200: the first Q block
  // of 128 rows (steps 7 and 8) sees no key at all.
  for (auto [nq, nk] : std::vector<std::pair<int, int>>{{70, 132}, {70, 196}, {300, 100}}) {
    check_all(make(2, 2, 1, nq, nk, 64, true));
    check_all(make(1, 1, 1, nq, nk, 128, true));
  }
}

TEST_CASE("emulated kernels: a negative and a tiny scale, causal and ragged") {
  for (float scale : {-0.125f, 1e-6f}) {
    INFO("scale ", scale);
    Problem p = make(2, 2, 1, 97, 203, 64, true);
    p.scale = scale;
    check_all(p);
  }
}

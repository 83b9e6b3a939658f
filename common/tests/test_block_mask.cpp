// CPU tests of the block mask (common/block_mask.hpp) and of the fp64 reference with one: the generators'
// patterns and densities, SPEC parsing, the .npy round trip, and the reference against an independent
// element-mask reference, a dense mask against no mask (bit for bit), and rows that see no key.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

#include "block_mask.hpp"
#include "inputs.hpp"
#include "npy.hpp"
#include "reference.hpp"

using namespace fa;

namespace {

Problem make(int nq, int nk, bool causal, int H = 2, int Hkv = 1, int d = 16) {
  Problem p;
  p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  return p;
}

std::string rows_of(const BlockMask& m) {  // "1100/0011"
  std::string s;
  for (int r = 0; r < m.Tr; ++r) {
    if (r) s += '/';
    for (int c = 0; c < m.Tc; ++c) s += m.get(r, c) ? '1' : '0';
  }
  return s;
}

// The definition, element by element, for one head: S = scale q k^T where (causal test AND mask bit), else
// excluded; softmax; O = P V; LSE. Written without block_mask.hpp's predicate (direct bit lookup).
void element_reference(const Problem& p, const BlockMask& m, const HostTensors& in, int h, std::vector<double>& o,
                       std::vector<double>& lse) {
  const int d = p.head_dim;
  const float* Q = in.q.data() + p.q_offset(0, h);
  const float* K = in.k.data() + p.kv_offset(0, p.kv_head_of(h));
  const float* V = in.v.data() + p.kv_offset(0, p.kv_head_of(h));
  o.assign(size_t(p.q_len) * d, 0.0), lse.assign(p.q_len, -std::numeric_limits<double>::infinity());
  for (int i = 0; i < p.q_len; ++i) {
    std::vector<double> s(p.kv_len, 0.0);
    std::vector<bool> on(p.kv_len);
    double mx = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < p.kv_len; ++j) {
      on[j] = (!p.causal || j <= i + p.kv_len - p.q_len) && m.bits[size_t(i / 128) * m.Tc + j / 64];
      for (int c = 0; c < d; ++c) s[j] += double(Q[size_t(i) * d + c]) * K[size_t(j) * d + c];
      s[j] *= p.softmax_scale();
      if (on[j]) mx = std::max(mx, s[j]);
    }
    if (mx == -std::numeric_limits<double>::infinity()) continue;  // no key: O = 0, LSE = -inf
    double l = 0;
    for (int j = 0; j < p.kv_len; ++j) l += on[j] ? std::exp(s[j] - mx) : 0.0;
    lse[i] = mx + std::log(l);
    for (int j = 0; j < p.kv_len; ++j)
      for (int c = 0; c < d && on[j]; ++c) o[size_t(i) * d + c] += std::exp(s[j] - mx) / l * V[size_t(j) * d + c];
  }
}

void expect_close(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t e = 0; e < a.size(); ++e) {
    if (std::isinf(b[e])) {
      CHECK(a[e] == b[e]);
    } else {
      CHECK(std::fabs(a[e] - b[e]) <= 1e-12 * (1 + std::fabs(b[e])));
    }
  }
}

}  // namespace

TEST_CASE("block mask: shape and the generators' patterns (Nq = Nk = 256: 2 x 4 blocks of 128 x 64)") {
  const Problem p = make(256, 256, false);
  CHECK(mask_rows_of(1) == 1);
  CHECK(mask_rows_of(129) == 2);
  CHECK(mask_cols_of(64) == 1);
  CHECK(mask_cols_of(65) == 2);
  CHECK(rows_of(dense_block_mask(p)) == "1111/1111");
  CHECK(dense_block_mask(p).density() == 1.0);
  CHECK(rows_of(causal_block_mask(p)) == "1100/1111");
  CHECK(rows_of(local_block_mask(p, 0)) == "1100/0011");    // the diagonal blocks
  CHECK(rows_of(local_block_mask(p, 64)) == "1110/0111");   // one more key block either side
  CHECK(rows_of(local_block_mask(p, 1000)) == "1111/1111");
  CHECK(rows_of(strided_block_mask(p, 3)) == "1101/1011");  // key blocks 0 and 3, plus the diagonal
  CHECK(local_block_mask(p, 0).density() == 0.5);
  // Bottom-right alignment: with Nq = 128, Nk = 256 the diagonal is at key i + 128 (key blocks 2, 3).
  CHECK(rows_of(local_block_mask(make(128, 256, false), 0)) == "0011");
  CHECK(rows_of(causal_block_mask(make(128, 256, false))) == "1111");
  // Ragged: Nq = 203, Nk = 113 (2 x 2 blocks), shift -90: row block 0 (queries 0..127) sees keys 0..37.
  CHECK(rows_of(causal_block_mask(make(203, 113, false))) == "10/11");
}

TEST_CASE("block mask: random density, seed, and the local window's density ~ (2W + block) / N") {
  const Problem p = make(8192, 16384, false);  // 64 x 256 blocks
  CHECK(random_block_mask(p, 0.0, 1).density() == 0.0);
  CHECK(random_block_mask(p, 1.0, 1).density() == 1.0);
  const BlockMask a = random_block_mask(p, 0.3, 7), b = random_block_mask(p, 0.3, 7), c = random_block_mask(p, 0.3, 8);
  CHECK(a.bits == b.bits);
  CHECK(a.bits != c.bits);
  CHECK(std::fabs(a.density() - 0.3) < 0.02);
  const Problem sq = make(16384, 16384, false);
  const double s = local_block_mask(sq, 512).density();  // keys within 512: about (2 * 512 + 128 + 64) / 16384
  CHECK(s > 1024.0 / 16384);
  CHECK(s < (1024.0 + 2 * 192) / 16384);
}

TEST_CASE("block mask: SPEC parsing, bad SPECs are usage errors") {
  const Problem p = make(256, 256, false);
  CHECK(rows_of(block_mask_from_spec("local:64", p)) == "1110/0111");
  CHECK(rows_of(block_mask_from_spec("strided:3", p)) == "1101/1011");
  CHECK(block_mask_from_spec("random:0.5:3", p).bits == random_block_mask(p, 0.5, 3).bits);
  CHECK(block_mask_from_spec("random:1", p).density() == 1.0);
  for (const char* bad : {"", "local", "local:", "local:-1", "local:x", "local:1.5", "strided:0", "strided:",
                          "random:", "random:1.5", "random:-0.1", "random:abc", "random:nan", "random:0.5:x",
                          "blocks:3", "no_such_file.npy", "no_such_file"})
    CHECK_THROWS_AS(block_mask_from_spec(bad, p), UsageError);
}

TEST_CASE("block mask: .npy round trip (uint8 and bool), shape and dtype checked") {
  const Problem p = make(300, 200, false);  // 3 x 4 blocks
  const BlockMask m = random_block_mask(p, 0.5, 11);
  const std::string path = "test_block_mask.npy";
  save_block_mask(path, m);
  CHECK(load_block_mask(path, p).bits == m.bits);
  CHECK(block_mask_from_spec(path, p).bits == m.bits);
  CHECK_THROWS_AS(load_block_mask(path, make(300, 300, false)), UsageError);  // [3, 5] expected
  // The same bytes as bool ('|b1' has the header length of '|u1').
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    std::string head(128, '\0');
    f.read(head.data(), 128);
    const size_t at = head.find("|u1");
    REQUIRE(at != std::string::npos);
    f.seekp(std::streamoff(at + 1));
    f.write("b", 1);
  }
  CHECK(load_block_mask(path, p).bits == m.bits);
  const float x[12] = {};
  npy_write(path, {3, 4}, x);  // float32: not a mask
  CHECK_THROWS_AS(load_block_mask(path, p), UsageError);
  CHECK_THROWS_AS(npy_read_bytes(path), UsageError);
  CHECK(npy_read(path).data.size() == 12);  // and the float reader is unchanged
  std::remove(path.c_str());
}

TEST_CASE("reference with a dense mask equals the reference without one, bit for bit") {
  for (bool causal : {false, true})
    for (auto [nq, nk] : std::vector<std::pair<int, int>>{{17, 17}, {113, 203}, {203, 113}}) {
      const Problem p = make(nq, nk, causal, 2, 1);
      INFO(describe(p));
      const HostTensors in = random_inputs(p, true);
      const BlockMask dense = dense_block_mask(p);
      std::vector<double> o0, l0, o1, l1, q0, k0, v0, q1, k1, v1;
      reference_forward(p, in.q.data(), in.k.data(), in.v.data(), o0, l0);
      reference_forward(p, in.q.data(), in.k.data(), in.v.data(), o1, l1, &dense);
      CHECK(o0 == o1);
      CHECK(l0 == l1);
      reference_backward(p, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), q0, k0, v0);
      reference_backward(p, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), q1, k1, v1, &dense);
      CHECK(q0 == q1);
      CHECK(k0 == k1);
      CHECK(v0 == v1);
      // The causal-equivalent mask with p.causal is the causal mask itself.
      if (causal) {
        const BlockMask cm = causal_block_mask(p);
        reference_forward(p, in.q.data(), in.k.data(), in.v.data(), o1, l1, &cm);
        CHECK(o0 == o1);
        CHECK(l0 == l1);
      }
    }
}

TEST_CASE("reference with a block mask equals the element-mask reference (local, strided, random; causal on/off)") {
  for (bool causal : {false, true})
    for (auto [nq, nk] : std::vector<std::pair<int, int>>{{1, 97}, {300, 300}, {113, 203}, {203, 113}}) {
      const Problem p = make(nq, nk, causal, 2, 1);
      const HostTensors in = random_inputs(p, false);
      for (const BlockMask& m : {local_block_mask(p, 40), strided_block_mask(p, 2), random_block_mask(p, 0.5, 5)}) {
        INFO(describe(p), " mask ", rows_of(m));
        std::vector<double> o, lse, eo, el;
        reference_forward(p, in.q.data(), in.k.data(), in.v.data(), o, lse, &m);
        for (int h = 0; h < p.heads; ++h) {
          element_reference(p, m, in, h, eo, el);
          expect_close(std::vector<double>(o.begin() + p.q_offset(0, h), o.begin() + p.q_offset(0, h) + eo.size()), eo);
          expect_close(std::vector<double>(lse.begin() + p.lse_offset(0, h), lse.begin() + p.lse_offset(0, h) + el.size()),
                       el);
        }
      }
    }
}

TEST_CASE("reference: a fully masked row block gives O = 0, LSE = -inf, dQ = 0; an unseen key block dK = dV = 0") {
  const Problem p = make(300, 200, false, 2, 2);  // 3 x 4 blocks
  BlockMask m = dense_block_mask(p);
  for (int c = 0; c < m.Tc; ++c) m.bits[size_t(1) * m.Tc + c] = 0;  // query rows 128..255 see nothing
  for (int r = 0; r < m.Tr; ++r) m.bits[size_t(r) * m.Tc + 2] = 0;  // keys 128..191 are seen by no query
  const HostTensors in = random_inputs(p, true);
  std::vector<double> o, lse, dq, dk, dv;
  reference_forward(p, in.q.data(), in.k.data(), in.v.data(), o, lse, &m);
  reference_backward(p, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), dq, dk, dv, &m);
  const int d = p.head_dim;
  for (int h = 0; h < p.heads; ++h)
    for (int i = 0; i < p.q_len; ++i) {
      const bool empty = i >= 128 && i < 256;
      CHECK((lse[p.lse_offset(0, h) + i] == -INFINITY) == empty);
      for (int c = 0; c < d && empty; ++c) {
        CHECK(o[p.q_offset(0, h) + size_t(i) * d + c] == 0.0);
        CHECK(dq[p.q_offset(0, h) + size_t(i) * d + c] == 0.0);
      }
    }
  for (int j = 128; j < 192; ++j)
    for (int c = 0; c < d; ++c) {
      CHECK(dk[p.kv_offset(0, 0) + size_t(j) * d + c] == 0.0);
      CHECK(dv[p.kv_offset(0, 1) + size_t(j) * d + c] == 0.0);
    }
  // The row and column samplers a program uses agree with the whole-problem reference.
  std::vector<double> rq(size_t(16) * d), rk(size_t(8) * d), rv(size_t(8) * d);
  reference_dq_rows(p, 0, 1, 120, 136, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), rq.data(), &m);
  expect_close(rq, std::vector<double>(dq.begin() + p.q_offset(0, 1) + 120 * d, dq.begin() + p.q_offset(0, 1) + 136 * d));
  reference_dkdv_rows(p, 0, 1, 60, 68, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), rk.data(), rv.data(), &m);
  expect_close(rk, std::vector<double>(dk.begin() + p.kv_offset(0, 1) + 60 * d, dk.begin() + p.kv_offset(0, 1) + 68 * d));
  expect_close(rv, std::vector<double>(dv.begin() + p.kv_offset(0, 1) + 60 * d, dv.begin() + p.kv_offset(0, 1) + 68 * d));
}

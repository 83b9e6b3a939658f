// Chapter 02 model: FlashAttention-1 forward (FA1's Algorithm 2) in plain C++ (float, like the kernel),
// loop for loop, with the pseudo-code line numbers of README.md §3 in the comments. "HBM" is the
// caller's o, l, m arrays; "SRAM" is the local tiles. Tested against the fp64 reference on the CPU
// (test_model.cpp). Also here, because the kernel's host code uses them too: the block sizes of
// line 2 and the HBM traffic the algorithm implies.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "problem.hpp"

namespace fa1_model {

// Line 2, straight from the paper: M is the on-chip memory in elements (fp32: bytes / 4).
// K_j and V_j take Bc*d elements each and Q_i, O_i Br*d each; with Bc*d ~ M/4 and Br <= Bc the four
// tiles and S_ij (Br*Bc <= d*Bc ~ M/4) fit in M. Br <= d keeps S_ij no larger than one K_j tile.
struct PaperBlockSizes {
  int Br, Bc;
};
inline PaperBlockSizes paper_block_sizes(int d, size_t M_elements) {
  const int c = int((M_elements + 4 * size_t(d) - 1) / (4 * size_t(d)));  // ceil(M / 4d)
  return {std::min(c, d), c};
}

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Query rows the inner loop (line 8) visits, summed over the K/V blocks: Tc Nq without a mask; with
// the causal mask the kernel skips a Q block that lies entirely above the diagonal of K/V block j.
inline double visited_rows(const fa::Problem& p, int Br, int Bc) {
  if (!p.causal) return double(ceil_div(p.kv_len, Bc)) * p.q_len;
  double rows = 0;
  for (int j0 = 0; j0 < p.kv_len; j0 += Bc)
    for (int i0 = 0; i0 < p.q_len; i0 += Br) {
      const int r = std::min(Br, p.q_len - i0);
      if (p.visible_keys(i0 + r - 1) > j0) rows += r;  // the kernel's skip test, negated
    }
  return rows;
}

// HBM elements one head moves in Algorithm 2, line by line (R = visited_rows, Tc Nq without a mask):
//   line 3   initialise O, l, m                     Nq d + 2 Nq   (writes)
//   line 7   K_j, V_j, once per outer step          2 Nk d
//   line 9   Q_i, O_i, l_i, m_i per (i, j)          R (2 d + 2)
//   line 15  O_i per (i, j)                         R d
//   line 16  l_i, m_i per (i, j)                    R 2
//   LSE      read l, m, write LSE                   3 Nq
// Leading term 3 Nq d Tc: Tc passes over Q and O, the cost chapter 04 removes. For Nq = Nk = N and
// FA1's Theta(N d Tc) = Theta(N^2 d^2 / M) (its Theorem 2).
inline double hbm_elements_per_head(const fa::Problem& p, int Br, int Bc) {
  const double Nq = p.q_len, Nk = p.kv_len, d = p.head_dim;
  return (Nq * d + 2 * Nq) + 2 * Nk * d + visited_rows(p, Br, Bc) * (3 * d + 4) + 3 * Nq;
}

// The closed form often quoted for the same traffic is 2 N d (2 + 3 Tc) BYTES per head at 2 bytes per element
// (fp16), i.e. N d (2 + 3 Tc) elements: K, V once (2) and, per outer step, Q_i and O_i read and O_i
// written (3 Tc). With N split into Nk (the K, V term) and Nq (the Tc passes over Q and O) that is
// d (2 Nk + 3 Nq Tc) elements - the Nd-sized terms of the line-by-line count above without line 3's
// initialisation (the l, m terms are N-sized and left out of both).
inline double paper_formula_elements_per_head(const fa::Problem& p, int Bc) {
  const double Nq = p.q_len, Nk = p.kv_len, d = p.head_dim, Tc = ceil_div(p.kv_len, Bc);
  return d * (2 * Nk + 3 * Nq * Tc);
}

// Algorithm 2 for head (b, h): o [Nq, d], l, m, lse [Nq].
inline void forward_head(const fa::Problem& p, int b, int h, int Br, int Bc, const float* q, const float* k,
                         const float* v, float* o, float* l, float* m, float* lse) {
  const int Nq = p.q_len, Nk = p.kv_len, d = p.head_dim;
  const float scale = p.softmax_scale();
  const float* Q = q + p.q_offset(b, h);
  const float* K = k + p.kv_offset(b, p.kv_head_of(h));
  const float* V = v + p.kv_offset(b, p.kv_head_of(h));
  // line 1: the RNG state R is (p.seed, p.offset); the caller keeps it for the backward.
  // line 3: O = 0, l = 0, m = -inf in HBM
  std::fill(o, o + size_t(Nq) * d, 0.f);
  std::fill(l, l + Nq, 0.f);
  std::fill(m, m + Nq, -INFINITY);
  // lines 4-5: Tr blocks of Br rows of Q, O, l, m; Tc blocks of Bc rows of K, V
  const int Tr = ceil_div(Nq, Br), Tc = ceil_div(Nk, Bc);
  std::vector<float> Kj(size_t(Bc) * d), Vj(size_t(Bc) * d), Qi(size_t(Br) * d), Oi(size_t(Br) * d);
  std::vector<float> li(Br), mi(Br), Sij(size_t(Br) * Bc), Pij(size_t(Br) * Bc), m_tilde(Br), l_tilde(Br);
  for (int j = 0; j < Tc; ++j) {  // line 6
    const int j0 = j * Bc, cols = std::min(Bc, Nk - j0);
    // line 7: load K_j, V_j
    std::copy(K + size_t(j0) * d, K + size_t(j0 + cols) * d, Kj.begin());
    std::copy(V + size_t(j0) * d, V + size_t(j0 + cols) * d, Vj.begin());
    for (int i = 0; i < Tr; ++i) {  // line 8
      const int i0 = i * Br, rows = std::min(Br, Nq - i0);
      // line 9: load Q_i, O_i, l_i, m_i
      std::copy(Q + size_t(i0) * d, Q + size_t(i0 + rows) * d, Qi.begin());
      std::copy(o + size_t(i0) * d, o + size_t(i0 + rows) * d, Oi.begin());
      std::copy(l + i0, l + i0 + rows, li.begin());
      std::copy(m + i0, m + i0 + rows, mi.begin());
      for (int r = 0; r < rows; ++r) {
        const int visible = p.visible_keys(i0 + r);
        for (int c = 0; c < cols; ++c) {
          // line 10: S_ij = scale Q_i K_j^T;  line 11: MASK (causal, bottom-right) -> -inf
          float s = 0;
          for (int x = 0; x < d; ++x) s += Qi[size_t(r) * d + x] * Kj[size_t(c) * d + x];
          Sij[size_t(r) * Bc + c] = j0 + c < visible ? scale * s : -INFINITY;
        }
        // line 12: m~_ij = rowmax(S_ij), P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij).
        // A row of this block may be fully masked: m~ = -inf and exp(-inf - -inf) = NaN, so a masked
        // entry's P~ is set to 0 explicitly instead.
        m_tilde[r] = -INFINITY;
        for (int c = 0; c < cols; ++c) m_tilde[r] = std::fmax(m_tilde[r], Sij[size_t(r) * Bc + c]);
        l_tilde[r] = 0;
        for (int c = 0; c < cols; ++c) {
          const float s = Sij[size_t(r) * Bc + c];
          Pij[size_t(r) * Bc + c] = s == -INFINITY ? 0.f : std::exp(s - m_tilde[r]);
          l_tilde[r] += Pij[size_t(r) * Bc + c];
        }
        // line 13: m_new = max(m_i, m~_ij), l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij.
        // A factor whose m is -inf (nothing seen yet / nothing visible here) is 0, not exp(NaN).
        const float m_new = std::fmax(mi[r], m_tilde[r]);
        const float alpha = mi[r] == -INFINITY ? 0.f : std::exp(mi[r] - m_new);
        const float beta = m_tilde[r] == -INFINITY ? 0.f : std::exp(m_tilde[r] - m_new);
        const float l_new = alpha * li[r] + beta * l_tilde[r];
        // line 14: P~_ij dropped = P~_ij o Z_ij / (1 - p)  (l keeps the undropped sum)
        for (int c = 0; c < cols; ++c) Pij[size_t(r) * Bc + c] *= p.dropout_scale(b, h, i0 + r, j0 + c);
        // line 15: O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j)
        // to HBM. l_new = 0 only for a row that has seen no key yet: its O_i stays 0.
        for (int x = 0; x < d; ++x) {
          float pv = 0;
          for (int c = 0; c < cols; ++c) pv += Pij[size_t(r) * Bc + c] * Vj[size_t(c) * d + x];
          const float acc = li[r] * alpha * Oi[size_t(r) * d + x] + beta * pv;
          o[size_t(i0 + r) * d + x] = l_new > 0.f ? acc / l_new : 0.f;
        }
        // line 16: l_i <- l_new, m_i <- m_new to HBM
        l[i0 + r] = l_new;
        m[i0 + r] = m_new;
      }
    }
  }
  // line 19 returns O, l, m, R; the later chapters' LSE L_i = m_i + log l_i (-inf for an empty row)
  for (int r = 0; r < Nq; ++r) lse[r] = l[r] > 0.f ? m[r] + std::log(l[r]) : -INFINITY;
}

// Whole problem: o [B,H,Nq,d]; l, m, lse [B,H,Nq].
inline void forward(const fa::Problem& p, int Br, int Bc, const float* q, const float* k, const float* v,
                    std::vector<float>& o, std::vector<float>& l, std::vector<float>& m, std::vector<float>& lse) {
  o.assign(p.q_elems(), 0.f), l.assign(p.lse_elems(), 0.f), m.assign(p.lse_elems(), 0.f);
  lse.assign(p.lse_elems(), 0.f);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) {
      const size_t r = p.lse_offset(b, h);
      forward_head(p, b, h, Br, Bc, q, k, v, &o[p.q_offset(b, h)], &l[r], &m[r], &lse[r]);
    }
}

}  // namespace fa1_model

// Chapter 03 model: the FlashAttention-1 backward pass (FA1's Algorithm 4) in plain C++ (float, like
// the kernel), loop for loop, with the pseudo-code line numbers of README.md §3 in the comments.
// "HBM" is the caller's arrays; "SRAM" is the local tiles. It visits the tiles in the kernel's order
// (kv group, then j, then the group's query heads, then i) and skips the same causal tiles. Tested
// against the fp64 reference on the CPU (test_model.cpp) for several tile sizes, the kernel's
// (Br = 32, Bc = 64) included. Also here: forward(), which produces the O, l, m the backward consumes
// (the statistics of chapter 02's forward, computed row by row), so the model is tested on its own.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "problem.hpp"

namespace fa1_bwd_model {

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// First row of the Q tile (of Br rows) that holds the first query row seeing any key of the K/V tile
// starting at j0 (Problem::first_query_seeing). Earlier tiles are masked entirely, so the inner loop
// starts here. 0 without the mask.
inline int first_q_tile_row(const fa::Problem& p, int Br, int j0) { return p.first_query_seeing(j0) / Br * Br; }

// The forward's outputs the backward consumes, row by row (not tiled: chapter 02 tests its own
// tiling): m_i = max_j S_ij and l_i = sum_j exp(S_ij - m_i) over the visible keys, O = P^drop V.
// An empty causal row has l = 0, m = -inf, O = 0, as 02's forward leaves it.
inline void forward(const fa::Problem& p, const float* q, const float* k, const float* v, std::vector<float>& o,
                    std::vector<float>& l, std::vector<float>& m) {
  const int Nq = p.q_len, d = p.head_dim;
  const float scale = p.softmax_scale();
  o.assign(p.q_elems(), 0.f), l.assign(p.lse_elems(), 0.f), m.assign(p.lse_elems(), -INFINITY);
  std::vector<float> S(p.kv_len);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) {
      const float* Q = q + p.q_offset(b, h);
      const float* K = k + p.kv_offset(b, p.kv_head_of(h));
      const float* V = v + p.kv_offset(b, p.kv_head_of(h));
      for (int i = 0; i < Nq; ++i) {
        const int n = p.visible_keys(i);
        float& mi = m[p.lse_offset(b, h) + i];
        float& li = l[p.lse_offset(b, h) + i];
        for (int j = 0; j < n; ++j) {
          float s = 0;
          for (int x = 0; x < d; ++x) s += Q[size_t(i) * d + x] * K[size_t(j) * d + x];
          S[j] = scale * s;
          mi = std::fmax(mi, S[j]);
        }
        for (int j = 0; j < n; ++j) li += std::exp(S[j] - mi);
        float* Oi = &o[p.q_offset(b, h) + size_t(i) * d];
        for (int j = 0; j < n; ++j) {
          const float Pd = std::exp(S[j] - mi) / li * p.dropout_scale(b, h, i, j);
          for (int x = 0; x < d; ++x) Oi[x] += Pd * V[size_t(j) * d + x];
        }
      }
    }
}

// Algorithm 4 for kv group (b, hk) with Br x Bc tiles: dq of its query heads, dk and dv of kv head
// hk. All arrays are the whole problem's, in the layout of problem.hpp.
inline void backward_group(const fa::Problem& p, int Br, int Bc, int b, int hk, const float* q, const float* k,
                           const float* v, const float* o, const float* l, const float* m, const float* dout,
                           float* dq, float* dk, float* dv) {
  const int Nq = p.q_len, Nk = p.kv_len, d = p.head_dim, G = p.group();
  const float scale = p.softmax_scale();
  const float* K = k + p.kv_offset(b, hk);
  const float* V = v + p.kv_offset(b, hk);
  // line 1: the RNG state R is (p.seed, p.offset).  Lines 2-4: Tr blocks of Br rows, Tc blocks of Bc rows.
  const int Tc = ceil_div(Nk, Bc);
  // line 5: dQ = 0 in HBM (dK_j, dV_j are written whole at line 24: they need no initialisation)
  for (int g = 0; g < G; ++g) std::fill_n(dq + p.q_offset(b, hk * G + g), size_t(Nq) * d, 0.f);
  std::vector<float> Kj(size_t(Bc) * d), Vj(size_t(Bc) * d), dKj(size_t(Bc) * d), dVj(size_t(Bc) * d);
  std::vector<float> Pdij(size_t(Br) * Bc), dSij(size_t(Br) * Bc);
  for (int jt = 0; jt < Tc; ++jt) {  // line 6
    const int j0 = jt * Bc, cols = std::min(Bc, Nk - j0);
    // line 7: load K_j, V_j;  line 8: dK~_j = dV~_j = 0 on chip
    std::copy(K + size_t(j0) * d, K + size_t(j0 + cols) * d, Kj.begin());
    std::copy(V + size_t(j0) * d, V + size_t(j0 + cols) * d, Vj.begin());
    std::fill(dKj.begin(), dKj.end(), 0.f);
    std::fill(dVj.begin(), dVj.end(), 0.f);
    for (int g = 0; g < G; ++g) {  // GQA: every query head of the group adds into the same dK~_j, dV~_j
      const int h = hk * G + g;
      const float* Q = q + p.q_offset(b, h);
      const float* O = o + p.q_offset(b, h);
      const float* dO = dout + p.q_offset(b, h);
      const float* lh = l + p.lse_offset(b, h);
      const float* mh = m + p.lse_offset(b, h);
      float* dQ = dq + p.q_offset(b, h);
      for (int i0 = first_q_tile_row(p, Br, j0); i0 < Nq; i0 += Br) {  // line 9 (causal: skip empty tiles)
        const int rows = std::min(Br, Nq - i0);
        // line 10: Q_i, O_i, dO_i, dQ_i, l_i, m_i are read in place below
        for (int r = 0; r < rows; ++r) {
          const int i = i0 + r;
          const int visible = p.visible_keys(i);
          // line 19: D_i = rowsum(dO_i o O_i) (recomputed for every j, as FA1's Algorithm 4 does)
          float D = 0;
          for (int x = 0; x < d; ++x) D += dO[size_t(i) * d + x] * O[size_t(i) * d + x];
          for (int c = 0; c < cols; ++c) {
            const int j = j0 + c;
            float P = 0, Z = 0, dPd = 0;
            if (j < visible) {  // line 12: masked entries have P = 0
              // line 11: S_ij = scale Q_i K_j^T
              float s = 0;
              for (int x = 0; x < d; ++x) s += Q[size_t(i) * d + x] * Kj[size_t(c) * d + x];
              // line 13: P_ij = diag(l_i)^-1 exp(S_ij - m_i). A visible entry has l_i >= 1 and a
              // finite m_i; an empty row (l = 0, m = -inf) never gets here: no 0/0, no inf - inf.
              P = std::exp(scale * s - mh[i]) / lh[i];
              // line 14: Z_ij regenerated from R: the forward's mask
              Z = p.dropout_scale(b, h, i, j);
              // line 17: dP^drop_ij = dO_i V_j^T
              for (int x = 0; x < d; ++x) dPd += dO[size_t(i) * d + x] * Vj[size_t(c) * d + x];
            }
            // line 15: P^drop_ij = P_ij o Z_ij;  line 18: dP_ij = dP^drop_ij o Z_ij;  line 20: dS_ij = P_ij o (dP_ij - D_i)
            Pdij[size_t(r) * Bc + c] = P * Z;
            dSij[size_t(r) * Bc + c] = P * (dPd * Z - D);
          }
        }
        // line 16: dV~_j += P^drop_ij^T dO_i;  line 22: dK~_j += dS_ij^T Q_i (scale applied once, at line 24)
        for (int c = 0; c < cols; ++c)
          for (int x = 0; x < d; ++x)
            for (int r = 0; r < rows; ++r) {
              dVj[size_t(c) * d + x] += Pdij[size_t(r) * Bc + c] * dO[size_t(i0 + r) * d + x];
              dKj[size_t(c) * d + x] += dSij[size_t(r) * Bc + c] * Q[size_t(i0 + r) * d + x];
            }
        // line 21: dQ_i <- dQ_i + scale dS_ij K_j, written to HBM
        for (int r = 0; r < rows; ++r)
          for (int x = 0; x < d; ++x) {
            float acc = 0;
            for (int c = 0; c < cols; ++c) acc += dSij[size_t(r) * Bc + c] * Kj[size_t(c) * d + x];
            dQ[size_t(i0 + r) * d + x] += scale * acc;
          }
      }
    }
    // line 24: dK_j = scale dK~_j, dV_j = dV~_j to HBM
    for (int c = 0; c < cols; ++c)
      for (int x = 0; x < d; ++x) {
        dk[p.kv_offset(b, hk) + size_t(j0 + c) * d + x] = scale * dKj[size_t(c) * d + x];
        dv[p.kv_offset(b, hk) + size_t(j0 + c) * d + x] = dVj[size_t(c) * d + x];
      }
  }
}

// Whole problem: dq [B,H,Nq,d], dk, dv [B,Hkv,Nk,d].
inline void backward(const fa::Problem& p, int Br, int Bc, const float* q, const float* k, const float* v,
                     const float* o, const float* l, const float* m, const float* dout, std::vector<float>& dq,
                     std::vector<float>& dk, std::vector<float>& dv) {
  dq.assign(p.q_elems(), 0.f), dk.assign(p.kv_elems(), 0.f), dv.assign(p.kv_elems(), 0.f);
  for (int b = 0; b < p.batch; ++b)
    for (int hk = 0; hk < p.kv_heads; ++hk)
      backward_group(p, Br, Bc, b, hk, q, k, v, o, l, m, dout, dq.data(), dk.data(), dv.data());
}

// HBM traffic of the kernel, in bytes (fp32), for the result rows (README section 4). Per kv head K, V are
// read and dK, dV written once; per visited (K/V tile, Q tile) pair Q_i, O_i, dO_i are read and dQ_i read
// and written (5 Br d) plus m_i, l_i; dQ is zeroed once. Without a mask, Nq = Nk = N and H = Hkv this is
// Nd(5 + 5 Tc) + 2 N Tc elements per head.
inline double hbm_bytes(const fa::Problem& p, int Br, int Bc) {
  double rows = 0;  // query rows visited, summed over the K/V tiles
  for (int j0 = 0; j0 < p.kv_len; j0 += Bc) rows += p.q_len - first_q_tile_row(p, Br, j0);
  const double d = p.head_dim;
  const double per_kv_head = 4.0 * p.kv_len * d;
  const double per_head = rows * (5.0 * d + 2.0) + p.q_len * d;
  return 4.0 * (double(p.batch) * p.kv_heads * per_kv_head + double(p.batch) * p.heads * per_head);
}

// The closed form often quoted, 2 N d (4 + 5 Tc), is in BYTES at 2 bytes per element (fp16): N d (4 + 5 Tc) elements
// per head, as d (4 Nk + 5 Nq Tc). Here in fp32 bytes, printed next to the count above for comparison
// (README section 4 says how the two differ).
inline double paper_formula_bytes(const fa::Problem& p, int Bc) {
  const double d = p.head_dim, Tc = ceil_div(p.kv_len, Bc);
  return 4.0 * p.batch * p.heads * d * (4.0 * p.kv_len + 5.0 * p.q_len * Tc);
}

}  // namespace fa1_bwd_model

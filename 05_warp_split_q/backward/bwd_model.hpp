// Chapter 05 backward in plain C++, two ways, both tested against the fp64 reference on the CPU
// (test_bwd_model.cpp):
//   plain_lowp_backward_*      the yardstick of the error rule: a plain same-dtype backward, rounding where a
//                              straightforward fp16/bf16 implementation (one kernel per matrix, PyTorch's math
//                              path) stores its matrices;
//   backward                   the tensor-core kernels' algorithm (BACKWARD.md Algorithm B), with their loop
//                              order, tile sizes and rounding points: P and dS rounded to the dtype only where
//                              they become mma operands, everything else fp32.
// Inputs are dtype values widened to float (fa::rounded). No dropout (chapter 05 has none).
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "lowp.hpp"
#include "problem.hpp"

namespace wsq_bwd_model {

// The kernels' tiles (bwd_common.cuh's KvTile and DqTile): steps 1-5's. Step 6 takes Bc = 128
// keys per block; the arithmetic per key and per query row, which is what this model fixes, is the same.
inline int kv_Br(int head_dim) { return head_dim == 64 ? 64 : 32; }
constexpr int kv_Bc = 64, dq_Br = 64, dq_Bc = 64;

// The plain same-dtype backward, the error rule's yardstick, for one query row i of head h of batch entry b:
//   S = tau Q K^T        fp32 dot products, stored in the dtype
//   P = softmax(S)       fp32, stored in the dtype                (masked: 0; a row with no key: all 0)
//   dP = dO V^T          fp32 dot products, stored in the dtype
//   dS = P o (dP - D)    D_i = sum_j P_ij dP_ij in fp32 (the softmax backward), dS stored in the dtype
//   dQ_i = tau dS K      an fp32 sum, stored in the dtype
// P and dS [kv_len] are left for the caller's dV = P^T dO and dK = tau dS^T Q; dq_row: [d].
inline void plain_lowp_backward_row(fa::Dtype t, const fa::Problem& p, int b, int h, int i, const float* q,
                                    const float* k, const float* v, const float* dout, float* P, float* dS,
                                    float* dq_row) {
  const int d = p.head_dim;
  const float tau = p.softmax_scale();
  const float* Q = q + p.q_offset(b, h) + size_t(i) * d;
  const float* dO = dout + p.q_offset(b, h) + size_t(i) * d;
  const float* K = k + p.kv_offset(b, p.kv_head_of(h));
  const float* V = v + p.kv_offset(b, p.kv_head_of(h));
  const int n = p.visible_keys(i);
  float m = -INFINITY;
  for (int j = 0; j < n; ++j) {
    float s = 0.f;
    for (int c = 0; c < d; ++c) s += Q[c] * K[size_t(j) * d + c];
    P[j] = fa::round_to(t, tau * s);
    m = std::max(m, P[j]);
  }
  float l = 0.f;
  for (int j = 0; j < n; ++j) l += (P[j] = std::exp(P[j] - m));
  float D = 0.f;
  for (int j = 0; j < n; ++j) {
    P[j] = fa::round_to(t, P[j] / l);
    float dp = 0.f;
    for (int c = 0; c < d; ++c) dp += dO[c] * V[size_t(j) * d + c];
    dS[j] = fa::round_to(t, dp);  // dP for now
    D += P[j] * dS[j];
  }
  for (int j = 0; j < n; ++j) dS[j] = fa::round_to(t, P[j] * (dS[j] - D));
  for (int j = n; j < p.kv_len; ++j) P[j] = dS[j] = 0.f;
  for (int c = 0; c < d; ++c) {
    float acc = 0.f;
    for (int j = 0; j < n; ++j) acc += dS[j] * K[size_t(j) * d + c];
    dq_row[c] = fa::round_to(t, tau * acc);
  }
}

// The plain backward of kv group (b, hk): every row of its query heads, dK and dV summed in fp32 over the group
// and stored in the dtype. dq: [group, q_len, d]; dk, dv: [kv_len, d].
inline void plain_lowp_backward_group(fa::Dtype t, const fa::Problem& p, int b, int hk, const float* q, const float* k,
                                      const float* v, const float* dout, float* dq, float* dk, float* dv) {
  const int d = p.head_dim, Nq = p.q_len, Nk = p.kv_len;
  const float tau = p.softmax_scale();
  std::vector<float> dK(size_t(Nk) * d, 0.f), dV(size_t(Nk) * d, 0.f), P(Nk), dS(Nk);
  for (int g = 0; g < p.group(); ++g) {
    const int h = hk * p.group() + g;
    const float* Q = q + p.q_offset(b, h);
    const float* dO = dout + p.q_offset(b, h);
    for (int i = 0; i < Nq; ++i) {
      plain_lowp_backward_row(t, p, b, h, i, q, k, v, dout, P.data(), dS.data(), dq + (size_t(g) * Nq + i) * d);
      for (int j = 0; j < p.visible_keys(i); ++j)
        for (int c = 0; c < d; ++c) {
          dV[size_t(j) * d + c] += P[j] * dO[size_t(i) * d + c];
          dK[size_t(j) * d + c] += dS[j] * Q[size_t(i) * d + c];
        }
    }
  }
  for (size_t e = 0; e < dK.size(); ++e) dk[e] = fa::round_to(t, tau * dK[e]), dv[e] = fa::round_to(t, dV[e]);
}

// The plain backward's dQ for rows [i0, i1) of head (b, h) alone ([i1 - i0, d]): a sample of a large problem.
inline void plain_lowp_dq_rows(fa::Dtype t, const fa::Problem& p, int b, int h, int i0, int i1, const float* q,
                               const float* k, const float* v, const float* dout, float* dq) {
  std::vector<float> P(p.kv_len), dS(p.kv_len);
  for (int i = i0; i < i1; ++i)
    plain_lowp_backward_row(t, p, b, h, i, q, k, v, dout, P.data(), dS.data(), dq + size_t(i - i0) * p.head_dim);
}

// The plain backward of every kv group: dq in Q's layout, dk and dv in K's.
inline void plain_lowp_backward(fa::Dtype t, const fa::Problem& p, const float* q, const float* k, const float* v,
                                const float* dout, std::vector<float>& dq, std::vector<float>& dk,
                                std::vector<float>& dv) {
  dq.assign(p.q_elems(), 0.f), dk.assign(p.kv_elems(), 0.f), dv.assign(p.kv_elems(), 0.f);
  for (int b = 0; b < p.batch; ++b)
    for (int hk = 0; hk < p.kv_heads; ++hk)
      plain_lowp_backward_group(t, p, b, hk, q, k, v, dout, dq.data() + p.q_offset(b, hk * p.group()),
                                dk.data() + p.kv_offset(b, hk), dv.data() + p.kv_offset(b, hk));
}

// The kernels' backward (BACKWARD.md Algorithm B) from the forward's O (dtype values) and LSE (fp32):
// dq [B,H,Nq,d], dk, dv [B,Hkv,Nk,d], fp32, dQ summed the deterministic way (lines 11-16). A GPU block is one
// iteration of an outer loop here; the element loops inside a tile stand for the warps' mma fragments.
inline void backward(fa::Dtype t, const fa::Problem& p, const float* q, const float* k, const float* v, const float* o,
                     const float* lse, const float* dout, std::vector<float>& dq, std::vector<float>& dk,
                     std::vector<float>& dv) {
  const int d = p.head_dim;
  const float tau = p.softmax_scale();
  dq.assign(p.q_elems(), 0.f), dk.assign(p.kv_elems(), 0.f), dv.assign(p.kv_elems(), 0.f);
  std::vector<float> Dv(p.lse_elems());  // line 0: D = rowsum(dO o O), fp32 sums of dtype values
  for (size_t row = 0; row < Dv.size(); ++row) {
    float s = 0.f;
    for (int c = 0; c < d; ++c) s += dout[row * d + c] * o[row * d + c];
    Dv[row] = s;
  }
  // S_ij and dP_ij of one (query, key) pair, fp32 dot products (an mma accumulates in fp32 as well).
  auto dots = [&](int b, int h, int i, int j, float& s, float& dp) {
    const float* Qi = q + p.q_offset(b, h) + size_t(i) * d;
    const float* dOi = dout + p.q_offset(b, h) + size_t(i) * d;
    const float* Kj = k + p.kv_offset(b, p.kv_head_of(h)) + size_t(j) * d;
    const float* Vj = v + p.kv_offset(b, p.kv_head_of(h)) + size_t(j) * d;
    s = dp = 0.f;
    for (int c = 0; c < d; ++c) s += Qi[c] * Kj[c], dp += dOi[c] * Vj[c];
  };

  const int Br = kv_Br(d), Bc = kv_Bc;
  for (int b = 0; b < p.batch; ++b)
    for (int hk = 0; hk < p.kv_heads; ++hk)
      for (int j0 = 0; j0 < p.kv_len; j0 += Bc) {  // the grid: one block per K/V block
        const int cols = std::min(Bc, p.kv_len - j0);
        std::vector<float> dK(size_t(cols) * d, 0.f), dV(size_t(cols) * d, 0.f);  // line 1
        for (int h = hk * p.group(); h < (hk + 1) * p.group(); ++h)              // line 2
          for (int i0 = p.first_query_seeing(j0) / Br * Br; i0 < p.q_len; i0 += Br)  // lines 3-4
            for (int i = i0; i < std::min(i0 + Br, p.q_len); ++i)
              for (int c = 0; c < cols; ++c) {
                const int j = j0 + c;
                if (!p.visible(i, j)) continue;  // masked: P = dS = 0
                float s, dp;
                dots(b, h, i, j, s, dp);                                            // line 5
                const float P = std::exp(tau * s - lse[p.lse_offset(b, h) + i]);    // line 6
                const float dS = P * (dp - Dv[p.lse_offset(b, h) + i]);
                const float Pt = fa::round_to(t, P), dSt = fa::round_to(t, dS);     // mma operands
                for (int e = 0; e < d; ++e) {
                  dV[size_t(c) * d + e] += Pt * dout[p.q_offset(b, h) + size_t(i) * d + e];  // line 7
                  dK[size_t(c) * d + e] += dSt * q[p.q_offset(b, h) + size_t(i) * d + e];    // line 8
                }
              }
        for (int c = 0; c < cols; ++c)  // line 10
          for (int e = 0; e < d; ++e) {
            dk[p.kv_offset(b, hk) + size_t(j0 + c) * d + e] = tau * dK[size_t(c) * d + e];
            dv[p.kv_offset(b, hk) + size_t(j0 + c) * d + e] = dV[size_t(c) * d + e];
          }
      }

  for (int b = 0; b < p.batch; ++b)  // lines 11-16: the dQ kernel, one block per Q block
    for (int h = 0; h < p.heads; ++h)
      for (int i0 = 0; i0 < p.q_len; i0 += dq_Br) {
        const int kv_end = p.visible_keys(std::min(i0 + dq_Br, p.q_len) - 1);
        for (int i = i0; i < std::min(i0 + dq_Br, p.q_len); ++i) {
          const float* K = k + p.kv_offset(b, p.kv_head_of(h));
          std::vector<float> acc(d, 0.f);
          for (int j0 = 0; j0 < kv_end; j0 += dq_Bc)
            for (int j = j0; j < std::min(j0 + dq_Bc, p.kv_len); ++j) {
              if (!p.visible(i, j)) continue;
              float s, dp;
              dots(b, h, i, j, s, dp);
              const float P = std::exp(tau * s - lse[p.lse_offset(b, h) + i]);
              const float dSt = fa::round_to(t, P * (dp - Dv[p.lse_offset(b, h) + i]));
              for (int e = 0; e < d; ++e) acc[e] += dSt * K[size_t(j) * d + e];
            }
          for (int e = 0; e < d; ++e) dq[p.q_offset(b, h) + size_t(i) * d + e] = tau * acc[e];
        }
      }
}

}  // namespace wsq_bwd_model

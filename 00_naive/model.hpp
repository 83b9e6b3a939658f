// Chapter 00 model: standard attention in plain C++ (float, like the kernels), one head at a time,
// the same steps as naive.cu. Seed Algorithm 0 (forward) and Algorithm 3 (backward), line numbers
// in the comments. Tested against the fp64 reference on the CPU (test_model.cpp).
#pragma once
#include <cmath>
#include <vector>

#include "problem.hpp"

namespace naive_model {

struct Head {  // the N x N matrices of one head, as they would sit in HBM
  std::vector<float> S, P, Pd;
};

// Forward of head (b, h): o [Nq, d], lse [Nq]; returns S, P, P^drop for the backward.
inline Head forward_head(const fa::Problem& p, int b, int h, const float* q, const float* k, const float* v,
                         float* o, float* lse) {
  const int Nq = p.q_len, Nk = p.kv_len, d = p.head_dim;
  const float* Q = q + p.q_offset(b, h);
  const float* K = k + p.kv_offset(b, p.kv_head_of(h));
  const float* V = v + p.kv_offset(b, p.kv_head_of(h));
  Head m{std::vector<float>(size_t(Nq) * Nk), std::vector<float>(size_t(Nq) * Nk), std::vector<float>(size_t(Nq) * Nk)};
  // Algorithm 0, line 1: S = scale * Q K^T, written to HBM
  for (int i = 0; i < Nq; ++i)
    for (int j = 0; j < Nk; ++j) {
      float s = 0;
      for (int c = 0; c < d; ++c) s += Q[i * d + c] * K[j * d + c];
      m.S[size_t(i) * Nk + j] = p.softmax_scale() * s;
    }
  // line 2: P = softmax(mask(S)) row by row (max, sum, normalise), L = m + log l
  for (int i = 0; i < Nq; ++i) {
    const int n = p.visible_keys(i);
    float mx = -INFINITY, l = 0;
    for (int j = 0; j < n; ++j) mx = std::fmax(mx, m.S[size_t(i) * Nk + j]);
    for (int j = 0; j < n; ++j) l += std::exp(m.S[size_t(i) * Nk + j] - mx);
    for (int j = 0; j < Nk; ++j) {
      const float pij = j < n ? std::exp(m.S[size_t(i) * Nk + j] - mx) / l : 0.f;
      m.P[size_t(i) * Nk + j] = pij;
      m.Pd[size_t(i) * Nk + j] = pij * p.dropout_scale(b, h, i, j);
    }
    lse[i] = n > 0 ? mx + std::log(l) : -INFINITY;
  }
  // line 3: O = P^drop V
  for (int i = 0; i < Nq; ++i)
    for (int c = 0; c < d; ++c) {
      float acc = 0;
      for (int j = 0; j < Nk; ++j) acc += m.Pd[size_t(i) * Nk + j] * V[j * d + c];
      o[i * d + c] = acc;
    }
  return m;
}

// Backward of head (b, h) from its P, P^drop: writes dq [Nq, d]; ADDS into dk, dv [Nk, d] (the heads
// of a GQA group share them).
inline void backward_head(const fa::Problem& p, int b, int h, const Head& m, const float* q, const float* k,
                          const float* v, const float* dout, float* dq, float* dk, float* dv) {
  const int Nq = p.q_len, Nk = p.kv_len, d = p.head_dim;
  const float scale = p.softmax_scale();
  const float* Q = q + p.q_offset(b, h);
  const float* dO = dout + p.q_offset(b, h);
  const float* K = k + p.kv_offset(b, p.kv_head_of(h));
  const float* V = v + p.kv_offset(b, p.kv_head_of(h));
  // Algorithm 3, line 1: dV = P^drop^T dO
  for (int j = 0; j < Nk; ++j)
    for (int c = 0; c < d; ++c) {
      float acc = 0;
      for (int i = 0; i < Nq; ++i) acc += m.Pd[size_t(i) * Nk + j] * dO[i * d + c];
      dv[j * d + c] += acc;
    }
  // line 2: dP = (dO V^T) o Z / (1-p)
  std::vector<float> dS(size_t(Nq) * Nk);
  for (int i = 0; i < Nq; ++i)
    for (int j = 0; j < Nk; ++j) {
      float acc = 0;
      for (int c = 0; c < d; ++c) acc += dO[i * d + c] * V[j * d + c];
      dS[size_t(i) * Nk + j] = acc * p.dropout_scale(b, h, i, j);
    }
  // line 3: dS_ij = P_ij (dP_ij - D_i), D_i = sum_j P_ij dP_ij
  for (int i = 0; i < Nq; ++i) {
    float D = 0;
    for (int j = 0; j < Nk; ++j) D += m.P[size_t(i) * Nk + j] * dS[size_t(i) * Nk + j];
    for (int j = 0; j < Nk; ++j) dS[size_t(i) * Nk + j] = m.P[size_t(i) * Nk + j] * (dS[size_t(i) * Nk + j] - D);
  }
  // line 4: dQ = scale dS K;  line 5: dK = scale dS^T Q
  for (int i = 0; i < Nq; ++i)
    for (int c = 0; c < d; ++c) {
      float acc = 0;
      for (int j = 0; j < Nk; ++j) acc += dS[size_t(i) * Nk + j] * K[j * d + c];
      dq[i * d + c] = scale * acc;
    }
  for (int j = 0; j < Nk; ++j)
    for (int c = 0; c < d; ++c) {
      float acc = 0;
      for (int i = 0; i < Nq; ++i) acc += dS[size_t(i) * Nk + j] * Q[i * d + c];
      dk[j * d + c] += scale * acc;
    }
}

// Whole problem: o, lse (forward) and, if dout is non-null, dq, dk, dv.
inline void attention(const fa::Problem& p, const float* q, const float* k, const float* v, const float* dout,
                      std::vector<float>& o, std::vector<float>& lse, std::vector<float>& dq, std::vector<float>& dk,
                      std::vector<float>& dv) {
  o.assign(p.q_elems(), 0.f), lse.assign(p.lse_elems(), 0.f);
  dq.assign(p.q_elems(), 0.f), dk.assign(p.kv_elems(), 0.f), dv.assign(p.kv_elems(), 0.f);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) {
      const Head m = forward_head(p, b, h, q, k, v, &o[p.q_offset(b, h)], &lse[p.lse_offset(b, h)]);
      if (dout)
        backward_head(p, b, h, m, q, k, v, dout, &dq[p.q_offset(b, h)], &dk[p.kv_offset(b, p.kv_head_of(h))],
                      &dv[p.kv_offset(b, p.kv_head_of(h))]);
    }
}

}  // namespace naive_model

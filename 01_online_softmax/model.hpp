// Chapter 01 model: the three softmax recurrences and the fused attention row in plain C++ (float,
// like the kernels). Line numbers refer to the pseudo-code in README.md (Listings 1-4).
// Tested against the fp64 reference on the CPU (test_model.cpp).
#pragma once
#include <cmath>
#include <vector>

#include "problem.hpp"

namespace online_softmax_model {

// Listing 1: safe softmax, three passes over the row.
inline void softmax_3pass(const float* x, float* y, int n) {
  float m = -INFINITY;
  for (int j = 0; j < n; ++j) m = std::fmax(m, x[j]);     // line 1
  float l = 0.f;
  for (int j = 0; j < n; ++j) l += std::exp(x[j] - m);    // line 2
  for (int j = 0; j < n; ++j) y[j] = std::exp(x[j] - m) / l;  // line 3
}

// The state of the online recurrence: running max m and the sum l of exp(x - m) seen so far.
// (m, l) = (-inf, 0) is the empty prefix, the identity of merge().
struct MaxSum {
  float m = -INFINITY, l = 0.f;
};

// Listing 2, lines 2-3: absorb one element. (m - m_new is 0 or negative: no overflow.)
inline MaxSum update(MaxSum s, float x) {
  const float m_new = std::fmax(s.m, x);
  if (m_new == -INFINITY) return s;  // only -inf seen so far
  return {m_new, s.l * std::exp(s.m - m_new) + std::exp(x - m_new)};
}

// Listing 3: the merge operator. (m_a, l_a) (+) (m_b, l_b) = (m, l_a e^{m_a-m} + l_b e^{m_b-m}),
// m = max(m_a, m_b). Commutative exactly (max and + are), associative up to rounding.
inline MaxSum merge(MaxSum a, MaxSum b) {
  const float m = std::fmax(a.m, b.m);
  if (m == -INFINITY) return {};  // both empty: avoid exp(-inf - (-inf)) = NaN
  return {m, a.l * std::exp(a.m - m) + b.l * std::exp(b.m - m)};
}

// Listing 2: one pass for (m, l), one pass to write the outputs.
inline void softmax_online_2pass(const float* x, float* y, int n) {
  MaxSum s;
  for (int j = 0; j < n; ++j) s = update(s, x[j]);               // lines 1-3
  for (int j = 0; j < n; ++j) y[j] = std::exp(x[j] - s.m) / s.l;  // line 5
}

// Listing 3: the row cut at `splits` (increasing, inside (0, n)), each piece's (m, l) by the
// recurrence, the pieces merged left to right; then the output pass.
inline MaxSum max_sum_of_pieces(const float* x, int n, const std::vector<int>& splits) {
  MaxSum total;
  int begin = 0;
  for (size_t k = 0; k <= splits.size(); ++k) {
    const int end = k < splits.size() ? splits[k] : n;
    MaxSum piece;
    for (int j = begin; j < end; ++j) piece = update(piece, x[j]);
    total = merge(total, piece);
    begin = end;
  }
  return total;
}
inline void softmax_online_merge(const float* x, float* y, int n, const std::vector<int>& splits) {
  const MaxSum s = max_sum_of_pieces(x, n, splits);
  for (int j = 0; j < n; ++j) y[j] = std::exp(x[j] - s.m) / s.l;
}

// Listing 4: one query row of attention in one pass over the keys, S never stored.
enum class Form { Fa1, Fa2 };
inline void attention_row(const fa::Problem& p, Form form, const float* q, const float* K, const float* V,
                          int visible, float* o, float* lse) {
  const int d = p.head_dim;
  std::vector<float> acc(d, 0.f);
  float m = -INFINITY, l = 0.f;
  for (int j = 0; j < visible; ++j) {
    float x = 0.f;
    for (int c = 0; c < d; ++c) x += q[c] * K[size_t(j) * d + c];
    x *= p.softmax_scale();                                  // line 2: x_j = scale q . k_j
    const float m_new = std::fmax(m, x);                     // line 3
    const float alpha = std::exp(m - m_new), pj = std::exp(x - m_new);
    const float l_new = l * alpha + pj;                      // line 4
    for (int c = 0; c < d; ++c) {
      if (form == Form::Fa1)  // line 5 (FA1): o'_j = o'_{j-1} l_{j-1} alpha / l_j + p_j v_j / l_j
        acc[c] = acc[c] * (l * alpha / l_new) + (pj / l_new) * V[size_t(j) * d + c];
      else                    // line 5 (FA2): acc_j = acc_{j-1} alpha + p_j v_j
        acc[c] = acc[c] * alpha + pj * V[size_t(j) * d + c];
    }
    m = m_new, l = l_new;
  }
  for (int c = 0; c < d; ++c)  // line 7: FA2 divides once; an empty row keeps 0
    o[c] = (form == Form::Fa2 && visible > 0) ? acc[c] / l : acc[c];
  *lse = visible > 0 ? m + std::log(l) : -INFINITY;  // line 8
}

inline void attention(const fa::Problem& p, Form form, const float* q, const float* k, const float* v,
                      std::vector<float>& o, std::vector<float>& lse) {
  o.assign(p.q_elems(), 0.f), lse.assign(p.lse_elems(), 0.f);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) {
      const size_t kv = p.kv_offset(b, p.kv_head_of(h));
      for (int i = 0; i < p.q_len; ++i)
        attention_row(p, form, q + p.q_offset(b, h) + size_t(i) * p.head_dim, k + kv, v + kv, p.visible_keys(i),
                      &o[p.q_offset(b, h) + size_t(i) * p.head_dim], &lse[p.lse_offset(b, h) + i]);
    }
}

}  // namespace online_softmax_model

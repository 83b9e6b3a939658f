#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "philox.hpp"

namespace fa {
namespace {

// Every function below is written once for the arithmetic type R: R = double is the reference; R = float is
// the plain fp32 attention of the same definition (the same order of operations, every intermediate rounded
// to fp32), the yardstick of the fp32 chapters' error rule (testing.hpp).

// Z_ij / (1-p): 1/(1-p) for a kept element, 0 for a dropped one (1 without dropout).
template <class R>
R dropout_factor(const Problem& p, int b, int h, int i, int j) {
  if (p.dropout_p == 0.f) return R(1);
  const bool keep = dropout_keep(p.seed, p.offset, b, h, i, j, dropout_threshold(p.dropout_p));
  return keep ? R(1) / (R(1) - R(p.dropout_p)) : R(0);
}

// Scores, softmax and (when dropout is on) the kept-and-rescaled probabilities of rows [i0, i1) of
// head (b, h). P and Pd (= P o Z / (1-p)) are [i1 - i0, kv_len]; masked entries are 0.
template <class R>
void softmax_rows(const Problem& p, int b, int h, int i0, int i1, const float* q, const float* k,
                  R* P, R* Pd, R* lse, const BlockMask* mask) {
  const int d = p.head_dim, Nk = p.kv_len;
  const R scale = R(p.softmax_scale());
  const R inf = std::numeric_limits<R>::infinity();
  const float* Q = q + p.q_offset(b, h);
  const float* K = k + p.kv_offset(b, p.kv_head_of(h));
  for (int i = i0; i < i1; ++i) {
    R* row = P + size_t(i - i0) * Nk;
    const int n = p.visible_keys(i);
    // The element mask: the causal (or length) test AND the block mask's bit.
    auto visible = [&](int j) { return j < n && (mask == nullptr || mask->visible(i, j)); };
    bool any = false;  // does row i see a key? (if not: O = 0, LSE = -inf)
    R m = -inf;
    for (int j = 0; j < Nk; ++j) {
      R s = 0;
      for (int c = 0; c < d; ++c) s += R(Q[size_t(i) * d + c]) * R(K[size_t(j) * d + c]);
      row[j] = visible(j) ? s * scale : -inf;
      any = any || visible(j);
      m = std::max(m, row[j]);
    }
    R l = 0;
    for (int j = 0; j < Nk; ++j) {
      row[j] = visible(j) ? std::exp(row[j] - m) : R(0);
      l += row[j];
    }
    lse[i - i0] = any ? m + std::log(l) : -inf;
    for (int j = 0; j < Nk; ++j) {
      if (any) row[j] /= l;
      Pd[size_t(i - i0) * Nk + j] = row[j] * dropout_factor<R>(p, b, h, i, j);
    }
  }
}

// Row i of dP = (dO V^T) o Z / (1-p) into dP [kv_len]; returns D_i = sum_j P_ij dP_ij.
template <class R>
R dP_row(const Problem& p, int b, int h, int i, const R* Pi, const float* dO_i, const float* V, R* dP) {
  const int d = p.head_dim;
  R D = 0;
  for (int j = 0; j < p.kv_len; ++j) {
    R dpd = 0;
    for (int c = 0; c < d; ++c) dpd += R(dO_i[c]) * R(V[size_t(j) * d + c]);
    dP[j] = dpd * dropout_factor<R>(p, b, h, i, j);
    D += Pi[j] * dP[j];
  }
  return D;
}

template <class R>
void forward_rows(const Problem& p, int b, int h, int i0, int i1, const float* q, const float* k, const float* v,
                  R* o, R* lse, R* P_out, const BlockMask* mask) {
  const int d = p.head_dim, Nk = p.kv_len;
  std::vector<R> P(size_t(i1 - i0) * Nk), Pd(P.size());
  softmax_rows(p, b, h, i0, i1, q, k, P.data(), Pd.data(), lse, mask);
  const float* V = v + p.kv_offset(b, p.kv_head_of(h));
  for (int i = 0; i < i1 - i0; ++i)
    for (int c = 0; c < d; ++c) {
      R acc = 0;
      for (int j = 0; j < Nk; ++j) acc += Pd[size_t(i) * Nk + j] * R(V[size_t(j) * d + c]);
      o[size_t(i) * d + c] = acc;
    }
  if (P_out) std::copy(P.begin(), P.end(), P_out);
}

template <class R>
void backward_group(const Problem& p, int b, int hk, const float* q, const float* k, const float* v,
                    const float* dout, R* dq, R* dk, R* dv, const BlockMask* mask) {
  const int d = p.head_dim, Nq = p.q_len, Nk = p.kv_len;
  const R scale = R(p.softmax_scale());
  const float* K = k + p.kv_offset(b, hk);
  const float* V = v + p.kv_offset(b, hk);
  std::fill(dk, dk + size_t(Nk) * d, R(0));
  std::fill(dv, dv + size_t(Nk) * d, R(0));
  std::vector<R> P(size_t(Nq) * Nk), Pd(P.size()), lse(Nq), dP(Nk);
  for (int g = 0; g < p.group(); ++g) {
    const int h = hk * p.group() + g;
    const float* Q = q + p.q_offset(b, h);
    const float* dO = dout + p.q_offset(b, h);
    R* dQ = dq + size_t(g) * Nq * d;
    std::fill(dQ, dQ + size_t(Nq) * d, R(0));
    softmax_rows(p, b, h, 0, Nq, q, k, P.data(), Pd.data(), lse.data(), mask);
    for (int i = 0; i < Nq; ++i) {
      const R* Pi = &P[size_t(i) * Nk];
      const R* Pdi = &Pd[size_t(i) * Nk];
      for (int j = 0; j < Nk; ++j)  // dV_j += P~_ij dO_i
        for (int c = 0; c < d; ++c) dv[size_t(j) * d + c] += Pdi[j] * R(dO[size_t(i) * d + c]);
      const R D = dP_row(p, b, h, i, Pi, dO + size_t(i) * d, V, dP.data());
      for (int j = 0; j < Nk; ++j) {
        const R dS = Pi[j] * (dP[j] - D);
        for (int c = 0; c < d; ++c) {
          dQ[size_t(i) * d + c] += scale * dS * R(K[size_t(j) * d + c]);
          dk[size_t(j) * d + c] += scale * dS * R(Q[size_t(i) * d + c]);
        }
      }
    }
  }
}

template <class R>
void dq_rows(const Problem& p, int b, int h, int i0, int i1, const float* q, const float* k, const float* v,
             const float* dout, R* dq, const BlockMask* mask) {
  const int d = p.head_dim, Nk = p.kv_len;
  const R scale = R(p.softmax_scale());
  const float* K = k + p.kv_offset(b, p.kv_head_of(h));
  const float* V = v + p.kv_offset(b, p.kv_head_of(h));
  const float* dO = dout + p.q_offset(b, h);
  std::vector<R> P(size_t(i1 - i0) * Nk), Pd(P.size()), lse(i1 - i0), dP(Nk);
  softmax_rows(p, b, h, i0, i1, q, k, P.data(), Pd.data(), lse.data(), mask);
  for (int i = i0; i < i1; ++i) {
    const R* Pi = &P[size_t(i - i0) * Nk];
    const R D = dP_row(p, b, h, i, Pi, dO + size_t(i) * d, V, dP.data());
    R* dQ = dq + size_t(i - i0) * d;
    std::fill(dQ, dQ + d, R(0));
    for (int j = 0; j < Nk; ++j) {
      const R dS = Pi[j] * (dP[j] - D);
      for (int c = 0; c < d; ++c) dQ[c] += scale * dS * R(K[size_t(j) * d + c]);
    }
  }
}

}  // namespace

void reference_forward_rows(const Problem& p, int b, int h, int i0, int i1, const float* q,
                            const float* k, const float* v, double* o, double* lse, double* P_out,
                            const BlockMask* mask) {
  forward_rows<double>(p, b, h, i0, i1, q, k, v, o, lse, P_out, mask);
}
void plain_fp32_forward_rows(const Problem& p, int b, int h, int i0, int i1, const float* q, const float* k,
                             const float* v, float* o, float* lse, const BlockMask* mask) {
  forward_rows<float>(p, b, h, i0, i1, q, k, v, o, lse, nullptr, mask);
}

void reference_forward(const Problem& p, const float* q, const float* k, const float* v,
                       std::vector<double>& o, std::vector<double>& lse, const BlockMask* mask) {
  o.assign(p.q_elems(), 0.0);
  lse.assign(p.lse_elems(), 0.0);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h)
      reference_forward_rows(p, b, h, 0, p.q_len, q, k, v, o.data() + p.q_offset(b, h),
                             lse.data() + p.lse_offset(b, h), nullptr, mask);
}

void reference_backward_group(const Problem& p, int b, int hk, const float* q, const float* k,
                              const float* v, const float* dout, double* dq, double* dk, double* dv,
                              const BlockMask* mask) {
  backward_group<double>(p, b, hk, q, k, v, dout, dq, dk, dv, mask);
}
void plain_fp32_backward_group(const Problem& p, int b, int hk, const float* q, const float* k, const float* v,
                               const float* dout, float* dq, float* dk, float* dv, const BlockMask* mask) {
  backward_group<float>(p, b, hk, q, k, v, dout, dq, dk, dv, mask);
}

void reference_dkdv_rows(const Problem& p, int b, int hk, int j0, int j1, const float* q, const float* k,
                         const float* v, const float* dout, double* dk, double* dv, const BlockMask* mask) {
  const int d = p.head_dim, Nk = p.kv_len;
  const double scale = p.softmax_scale();
  const float* V = v + p.kv_offset(b, hk);
  std::fill(dk, dk + size_t(j1 - j0) * d, 0.0);
  std::fill(dv, dv + size_t(j1 - j0) * d, 0.0);
  std::vector<double> P(Nk), Pd(Nk), dP(Nk);
  double lse;
  for (int g = 0; g < p.group(); ++g) {
    const int h = hk * p.group() + g;
    const float* Q = q + p.q_offset(b, h);
    const float* dO = dout + p.q_offset(b, h);
    for (int i = 0; i < p.q_len; ++i) {  // one query row at a time: its P, dP and D need the whole row
      softmax_rows<double>(p, b, h, i, i + 1, q, k, P.data(), Pd.data(), &lse, mask);
      const double D = dP_row<double>(p, b, h, i, P.data(), dO + size_t(i) * d, V, dP.data());
      for (int j = j0; j < j1; ++j) {
        const double dS = P[j] * (dP[j] - D);
        for (int c = 0; c < d; ++c) {
          dv[size_t(j - j0) * d + c] += Pd[j] * double(dO[size_t(i) * d + c]);
          dk[size_t(j - j0) * d + c] += scale * dS * double(Q[size_t(i) * d + c]);
        }
      }
    }
  }
}

void reference_dq_rows(const Problem& p, int b, int h, int i0, int i1, const float* q, const float* k,
                       const float* v, const float* dout, double* dq, const BlockMask* mask) {
  dq_rows<double>(p, b, h, i0, i1, q, k, v, dout, dq, mask);
}
void plain_fp32_dq_rows(const Problem& p, int b, int h, int i0, int i1, const float* q, const float* k,
                        const float* v, const float* dout, float* dq, const BlockMask* mask) {
  dq_rows<float>(p, b, h, i0, i1, q, k, v, dout, dq, mask);
}

void reference_backward(const Problem& p, const float* q, const float* k, const float* v,
                        const float* dout, std::vector<double>& dq, std::vector<double>& dk,
                        std::vector<double>& dv, const BlockMask* mask) {
  dq.assign(p.q_elems(), 0.0);
  dk.assign(p.kv_elems(), 0.0);
  dv.assign(p.kv_elems(), 0.0);
  for (int b = 0; b < p.batch; ++b)
    for (int hk = 0; hk < p.kv_heads; ++hk)
      reference_backward_group(p, b, hk, q, k, v, dout, dq.data() + p.q_offset(b, hk * p.group()),
                               dk.data() + p.kv_offset(b, hk), dv.data() + p.kv_offset(b, hk), mask);
}

void reference_softmax(const float* x, int rows, int cols, double* y) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + size_t(r) * cols;
    double* yr = y + size_t(r) * cols;
    double m = -std::numeric_limits<double>::infinity(), l = 0;
    for (int j = 0; j < cols; ++j) m = std::max(m, double(xr[j]));
    for (int j = 0; j < cols; ++j) l += (yr[j] = std::exp(double(xr[j]) - m));
    for (int j = 0; j < cols; ++j) yr[j] /= l;
  }
}

}  // namespace fa

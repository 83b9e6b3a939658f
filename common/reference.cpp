#include "reference.hpp"

#include <cmath>
#include <limits>

#include "philox.hpp"

namespace fa {
namespace {

// Z_ij / (1-p): 1/(1-p) for a kept element, 0 for a dropped one (1 without dropout).
double dropout_factor(const Problem& p, int b, int h, int i, int j) {
  if (p.dropout_p == 0.f) return 1.0;
  const bool keep = dropout_keep(p.seed, p.offset, b, h, i, j, dropout_threshold(p.dropout_p));
  return keep ? 1.0 / (1.0 - double(p.dropout_p)) : 0.0;
}

// Scores, softmax and (when dropout is on) the kept-and-rescaled probabilities of rows [i0, i1) of
// head (b, h). P and Pd (= P o Z / (1-p)) are [i1 - i0, kv_len]; masked entries are 0.
void softmax_rows(const Problem& p, int b, int h, int i0, int i1, const float* q, const float* k,
                  double* P, double* Pd, double* lse, const BlockMask* mask) {
  const int d = p.head_dim, Nk = p.kv_len;
  const double scale = p.softmax_scale();
  const float* Q = q + p.q_offset(b, h);
  const float* K = k + p.kv_offset(b, p.kv_head_of(h));
  for (int i = i0; i < i1; ++i) {
    double* row = P + size_t(i - i0) * Nk;
    const int n = p.visible_keys(i);
    // The element mask: the causal (or length) test AND the block mask's bit.
    auto visible = [&](int j) { return j < n && (mask == nullptr || mask->visible(i, j)); };
    bool any = false;  // does row i see a key? (if not: O = 0, LSE = -inf)
    double m = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < Nk; ++j) {
      double s = 0;
      for (int c = 0; c < d; ++c) s += double(Q[size_t(i) * d + c]) * double(K[size_t(j) * d + c]);
      row[j] = visible(j) ? s * scale : -std::numeric_limits<double>::infinity();
      any = any || visible(j);
      m = std::max(m, row[j]);
    }
    double l = 0;
    for (int j = 0; j < Nk; ++j) {
      row[j] = visible(j) ? std::exp(row[j] - m) : 0.0;
      l += row[j];
    }
    lse[i - i0] = any ? m + std::log(l) : -std::numeric_limits<double>::infinity();
    for (int j = 0; j < Nk; ++j) {
      if (any) row[j] /= l;
      Pd[size_t(i - i0) * Nk + j] = row[j] * dropout_factor(p, b, h, i, j);
    }
  }
}

// Row i of dP = (dO V^T) o Z / (1-p) into dP [kv_len]; returns D_i = sum_j P_ij dP_ij.
double dP_row(const Problem& p, int b, int h, int i, const double* Pi, const float* dO_i, const float* V,
              double* dP) {
  const int d = p.head_dim;
  double D = 0;
  for (int j = 0; j < p.kv_len; ++j) {
    double dpd = 0;
    for (int c = 0; c < d; ++c) dpd += double(dO_i[c]) * double(V[size_t(j) * d + c]);
    dP[j] = dpd * dropout_factor(p, b, h, i, j);
    D += Pi[j] * dP[j];
  }
  return D;
}

}  // namespace

void reference_forward_rows(const Problem& p, int b, int h, int i0, int i1, const float* q,
                            const float* k, const float* v, double* o, double* lse, double* P_out,
                            const BlockMask* mask) {
  const int d = p.head_dim, Nk = p.kv_len;
  std::vector<double> P(size_t(i1 - i0) * Nk), Pd(P.size());
  softmax_rows(p, b, h, i0, i1, q, k, P.data(), Pd.data(), lse, mask);
  const float* V = v + p.kv_offset(b, p.kv_head_of(h));
  for (int i = 0; i < i1 - i0; ++i)
    for (int c = 0; c < d; ++c) {
      double acc = 0;
      for (int j = 0; j < Nk; ++j) acc += Pd[size_t(i) * Nk + j] * double(V[size_t(j) * d + c]);
      o[size_t(i) * d + c] = acc;
    }
  if (P_out) std::copy(P.begin(), P.end(), P_out);
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
  const int d = p.head_dim, Nq = p.q_len, Nk = p.kv_len;
  const double scale = p.softmax_scale();
  const float* K = k + p.kv_offset(b, hk);
  const float* V = v + p.kv_offset(b, hk);
  std::fill(dk, dk + size_t(Nk) * d, 0.0);
  std::fill(dv, dv + size_t(Nk) * d, 0.0);
  std::vector<double> P(size_t(Nq) * Nk), Pd(P.size()), lse(Nq), dP(Nk);
  for (int g = 0; g < p.group(); ++g) {
    const int h = hk * p.group() + g;
    const float* Q = q + p.q_offset(b, h);
    const float* dO = dout + p.q_offset(b, h);
    double* dQ = dq + size_t(g) * Nq * d;
    std::fill(dQ, dQ + size_t(Nq) * d, 0.0);
    softmax_rows(p, b, h, 0, Nq, q, k, P.data(), Pd.data(), lse.data(), mask);
    for (int i = 0; i < Nq; ++i) {
      const double* Pi = &P[size_t(i) * Nk];
      const double* Pdi = &Pd[size_t(i) * Nk];
      for (int j = 0; j < Nk; ++j)  // dV_j += P~_ij dO_i
        for (int c = 0; c < d; ++c) dv[size_t(j) * d + c] += Pdi[j] * double(dO[size_t(i) * d + c]);
      const double D = dP_row(p, b, h, i, Pi, dO + size_t(i) * d, V, dP.data());
      for (int j = 0; j < Nk; ++j) {
        const double dS = Pi[j] * (dP[j] - D);
        for (int c = 0; c < d; ++c) {
          dQ[size_t(i) * d + c] += scale * dS * double(K[size_t(j) * d + c]);
          dk[size_t(j) * d + c] += scale * dS * double(Q[size_t(i) * d + c]);
        }
      }
    }
  }
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
      softmax_rows(p, b, h, i, i + 1, q, k, P.data(), Pd.data(), &lse, mask);
      const double D = dP_row(p, b, h, i, P.data(), dO + size_t(i) * d, V, dP.data());
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
  const int d = p.head_dim, Nk = p.kv_len;
  const double scale = p.softmax_scale();
  const float* K = k + p.kv_offset(b, p.kv_head_of(h));
  const float* V = v + p.kv_offset(b, p.kv_head_of(h));
  const float* dO = dout + p.q_offset(b, h);
  std::vector<double> P(size_t(i1 - i0) * Nk), Pd(P.size()), lse(i1 - i0), dP(Nk);
  softmax_rows(p, b, h, i0, i1, q, k, P.data(), Pd.data(), lse.data(), mask);
  for (int i = i0; i < i1; ++i) {
    const double* Pi = &P[size_t(i - i0) * Nk];
    const double D = dP_row(p, b, h, i, Pi, dO + size_t(i) * d, V, dP.data());
    double* dQ = dq + size_t(i - i0) * d;
    std::fill(dQ, dQ + d, 0.0);
    for (int j = 0; j < Nk; ++j) {
      const double dS = Pi[j] * (dP[j] - D);
      for (int c = 0; c < d; ++c) dQ[c] += scale * dS * double(K[size_t(j) * d + c]);
    }
  }
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

// Chapter 04 model: FlashAttention-2 forward and backward in plain C++ (float, like the kernels), with the
// kernels' loop order and block sizes, line numbers of the README's Algorithms 1 and 2 in the comments.
// A "block" of the GPU grid is one iteration of an outer loop here. Tested against the fp64 reference on the CPU.
// Block-sparse attention (README §6): every function takes an optional fa::BlockMask (nullptr = dense); the
// tiles it masks are skipped exactly where the kernels skip them, and the counts below count only the rest.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "block_mask.hpp"
#include "problem.hpp"

namespace fa2_model {

constexpr int Br = 64, Bc = 64;  // the kernels' tile sizes (fa2::forward_tiles())

// Keys seen by the rows [i0, i0 + rows) at most (its last row sees the most): a Q block's K/V loop stops
// there (causal block skipping).
inline int kv_rows_seen(const fa::Problem& p, int i0, int rows) {
  return p.visible_keys(std::min(i0 + rows, p.q_len) - 1);
}
inline int kv_end(const fa::Problem& p, int i0) { return kv_rows_seen(p, i0, Br); }
// Does the block mask let the tile starting at query i0, key j0 through? (the kernels' fa::block_visible)
inline bool tile_visible(const fa::BlockMask* mask, int i0, int j0) { return mask == nullptr || mask->visible(i0, j0); }

// Forward (Algorithm 1): o [B,H,Nq,d], lse [B,H,Nq].
inline void forward(const fa::Problem& p, const float* q, const float* k, const float* v, std::vector<float>& o,
                    std::vector<float>& lse, const fa::BlockMask* mask = nullptr) {
  const int d = p.head_dim;
  const float scale = p.softmax_scale();
  o.assign(p.q_elems(), 0.f), lse.assign(p.lse_elems(), 0.f);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) {
      const float* Q = q + p.q_offset(b, h);
      const float* K = k + p.kv_offset(b, p.kv_head_of(h));
      const float* V = v + p.kv_offset(b, p.kv_head_of(h));
      for (int i0 = 0; i0 < p.q_len; i0 += Br) {  // line 1: one GPU block per Q block
        const int rows = std::min(Br, p.q_len - i0);
        std::vector<float> m(rows, -INFINITY), l(rows, 0.f), acc(size_t(rows) * d, 0.f);  // line 2
        for (int j0 = 0; j0 < kv_end(p, i0); j0 += Bc) {                                  // line 3
          if (!tile_visible(mask, i0, j0)) continue;                                      // block-sparse: skipped
          const int cols = std::min(Bc, p.kv_len - j0);                                   // line 4
          for (int r = 0; r < rows; ++r) {
            const int i = i0 + r;
            std::vector<float> S(cols);
            float mx = -INFINITY;
            for (int c = 0; c < cols; ++c) {  // line 5: S_ij = scale Q_i K_j^T, masked
              float s = 0;
              for (int e = 0; e < d; ++e) s += Q[size_t(i) * d + e] * K[size_t(j0 + c) * d + e];
              S[c] = p.visible(i, j0 + c) ? scale * s : -INFINITY;
              mx = std::max(mx, S[c]);
            }
            const float m_new = std::max(m[r], mx);                  // line 6
            const float m_use = m_new == -INFINITY ? 0.f : m_new;    // guard (-inf) - (-inf)
            const float alpha = std::exp(m[r] - m_use);
            float rs = 0;
            for (int c = 0; c < cols; ++c) rs += (S[c] = std::exp(S[c] - m_use));
            l[r] = alpha * l[r] + rs;                                // line 7
            m[r] = m_new;
            for (int e = 0; e < d; ++e) {                            // line 8: O~_i = diag(alpha) O~_i + P~_ij V_j
              float pv = 0;
              for (int c = 0; c < cols; ++c) pv += S[c] * p.dropout_scale(b, h, i, j0 + c) * V[size_t(j0 + c) * d + e];
              acc[size_t(r) * d + e] = alpha * acc[size_t(r) * d + e] + pv;
            }
          }
        }
        for (int r = 0; r < rows; ++r) {  // lines 9-11: one division, O and L written
          const float inv_l = l[r] > 0.f ? 1.f / l[r] : 0.f;
          for (int e = 0; e < d; ++e) o[p.q_offset(b, h) + size_t(i0 + r) * d + e] = acc[size_t(r) * d + e] * inv_l;
          lse[p.lse_offset(b, h) + i0 + r] = l[r] > 0.f ? m[r] + std::log(l[r]) : -INFINITY;
        }
      }
    }
}

// Backward (Algorithm 2) from O and L: dq [B,H,Nq,d]; dk, dv [B,Hkv,Nk,d] summed over each GQA group.
// dQ is accumulated the deterministic way (lines 13-16); the Atomic variant adds the same terms in another order.
inline void backward(const fa::Problem& p, const float* q, const float* k, const float* v, const float* o,
                     const float* lse, const float* dout, std::vector<float>& dq, std::vector<float>& dk,
                     std::vector<float>& dv, const fa::BlockMask* mask = nullptr) {
  const int d = p.head_dim;
  const float scale = p.softmax_scale();
  dq.assign(p.q_elems(), 0.f), dk.assign(p.kv_elems(), 0.f), dv.assign(p.kv_elems(), 0.f);
  std::vector<float> D_rows(p.lse_elems());  // D_i of every row
  for (size_t row = 0; row < D_rows.size(); ++row) {  // line 1: D = rowsum(dO o O)
    float s = 0;
    for (int e = 0; e < d; ++e) s += dout[row * d + e] * o[row * d + e];
    D_rows[row] = s;
  }
  // P_ij and dS_ij of one element, recomputed from L (lines 6, 8, 9); returns P~_ij through pd.
  auto element = [&](int b, int h, int i, int j, float* pd) {
    const float* Qi = q + p.q_offset(b, h) + size_t(i) * d;
    const float* dOi = dout + p.q_offset(b, h) + size_t(i) * d;
    const float* Kj = k + p.kv_offset(b, p.kv_head_of(h)) + size_t(j) * d;
    const float* Vj = v + p.kv_offset(b, p.kv_head_of(h)) + size_t(j) * d;
    const float L = lse[p.lse_offset(b, h) + i];
    if (!p.visible(i, j) || L == -INFINITY) return *pd = 0.f, 0.f;
    float s = 0, dp = 0;
    for (int e = 0; e < d; ++e) s += Qi[e] * Kj[e], dp += dOi[e] * Vj[e];
    const float P = std::exp(scale * s - L), z = p.dropout_scale(b, h, i, j);
    *pd = P * z;
    return P * (dp * z - D_rows[p.lse_offset(b, h) + i]);
  };
  for (int b = 0; b < p.batch; ++b)
    for (int hk = 0; hk < p.kv_heads; ++hk)
      for (int j0 = 0; j0 < p.kv_len; j0 += Bc) {  // line 2: one GPU block per K/V block
        const int cols = std::min(Bc, p.kv_len - j0);
        std::vector<float> dK(size_t(cols) * d, 0.f), dV(size_t(cols) * d, 0.f);  // line 3
        for (int h = hk * p.group(); h < (hk + 1) * p.group(); ++h)              // line 4: heads of the group
          for (int i = 0; i < p.q_len; ++i) {                                     // lines 5-10
            if (!tile_visible(mask, i, j0)) continue;                              // block-sparse: skipped
            for (int c = 0; c < cols; ++c) {
              float pd;
              const float dS = element(b, h, i, j0 + c, &pd);
              for (int e = 0; e < d; ++e) {
                dV[size_t(c) * d + e] += pd * dout[p.q_offset(b, h) + size_t(i) * d + e];
                dK[size_t(c) * d + e] += dS * q[p.q_offset(b, h) + size_t(i) * d + e];
              }
            }
          }
        for (int c = 0; c < cols; ++c)  // line 12
          for (int e = 0; e < d; ++e) {
            dk[p.kv_offset(b, hk) + size_t(j0 + c) * d + e] = scale * dK[size_t(c) * d + e];
            dv[p.kv_offset(b, hk) + size_t(j0 + c) * d + e] = dV[size_t(c) * d + e];
          }
      }
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h)
      for (int i = 0; i < p.q_len; ++i) {  // lines 13-16: deterministic dQ_i = scale sum_j dS_ij K_j
        const float* K = k + p.kv_offset(b, p.kv_head_of(h));
        std::vector<float> acc(d, 0.f);
        for (int j = 0; j < kv_end(p, i / Br * Br); ++j) {
          if (!tile_visible(mask, i, j)) continue;
          float pd;
          const float dS = element(b, h, i, j, &pd);
          for (int e = 0; e < d; ++e) acc[e] += dS * K[size_t(j) * d + e];
        }
        for (int e = 0; e < d; ++e) dq[p.q_offset(b, h) + size_t(i) * d + e] = scale * acc[e];
      }
}

// K/V rows the Q block at i0 (of `rows` rows) streams: its tiles of Bc keys up to the causal end, less the
// tiles the block mask masks.
inline double kv_rows_streamed(const fa::Problem& p, int i0, int rows, const fa::BlockMask* mask) {
  const int stop = kv_rows_seen(p, i0, rows);
  double n = 0;
  for (int j0 = 0; j0 < stop; j0 += Bc)
    if (tile_visible(mask, i0, j0)) n += std::min(Bc, stop - j0);
  return n;
}
// Query rows the K/V block at j0 reads in the backward's K/V kernel (Q tiles of Br_kv rows from the first
// query that sees key j0, less the masked tiles).
inline double q_rows_streamed(const fa::Problem& p, int j0, int Br_kv, const fa::BlockMask* mask) {
  double n = 0;
  for (int i0 = p.first_query_seeing(j0) / Br_kv * Br_kv; i0 < p.q_len; i0 += Br_kv)
    if (tile_visible(mask, i0, j0)) n += std::min(Br_kv, p.q_len - i0);
  return n;
}

// HBM traffic of the kernels, in bytes (fp32), for the result rows, as the code reads and writes.
// Forward with Q blocks of Br rows: Q, O once, LSE once; every Q block streams the K/V rows it sees.
inline double hbm_bytes_forward(const fa::Problem& p, int Br, const fa::BlockMask* mask = nullptr) {
  double kv_rows = 0;  // per head
  for (int i0 = 0; i0 < p.q_len; i0 += Br) kv_rows += kv_rows_streamed(p, i0, Br, mask);
  const double per_head = 4.0 * (2.0 * p.q_len * p.head_dim + p.q_len + 2.0 * kv_rows * p.head_dim);
  return per_head * p.batch * p.heads;
}
// Backward: the D kernel (O, dO -> D); the K/V kernel with Br_kv x Bc_kv tiles (K, V once; Q, dO, L, D once
// per K/V block that sees them; dK, dV once); then either atomic dQ (read and written once per K/V block)
// or the deterministic dQ kernel with Q blocks of Br_q rows (Q, dO, L, D read and dQ written once; K, V per
// Q block).
inline double hbm_bytes_backward(const fa::Problem& p, bool atomic_dq, int Br_kv, int Bc_kv, int Br_q,
                                 const fa::BlockMask* mask = nullptr) {
  const double d = p.head_dim, heads = double(p.batch) * p.heads;
  double q_rows = 0;  // per head: query rows the K/V blocks read, summed over K/V blocks
  for (int j0 = 0; j0 < p.kv_len; j0 += Bc_kv) q_rows += q_rows_streamed(p, j0, Br_kv, mask);
  double bytes = 4.0 * heads * p.q_len * (2.0 * d + 1);                          // D = rowsum(dO o O)
  bytes += 4.0 * (4.0 * p.kv_elems() + heads * q_rows * (2.0 * d + 2));           // K/V kernel
  if (atomic_dq) return bytes + 4.0 * heads * q_rows * 2.0 * d;                   // dQ read-modify-write
  double kv_rows = 0;
  for (int i0 = 0; i0 < p.q_len; i0 += Br_q) kv_rows += kv_rows_streamed(p, i0, Br_q, mask);
  return bytes + 4.0 * heads * (p.q_len * (3.0 * d + 2) + 2.0 * kv_rows * d);
}

}  // namespace fa2_model

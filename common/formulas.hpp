// FLOP and HBM-byte formulas shared by every chapter's report.
//   forward FLOPs  = 4 * d * (number of visible (i, j) pairs) per head: two matmuls, 2 FLOPs per MAC
//                    (= 4 B H Nq Nk d without a mask; about half of it with the causal mask)
//   backward FLOPs = 2.5 x forward (five matmuls instead of two)
//   minimal HBM bytes: every input read once, every output written once (the floor any kernel pays)
//   standard attention additionally writes and reads the Nq x Nk matrices S and P.
#pragma once
#include <algorithm>
#include <cstdint>

#include "block_mask.hpp"
#include "problem.hpp"

namespace fa {

inline double visible_pairs(const Problem& p) {  // per head
  double n = 0;
  if (!p.causal) return double(p.q_len) * p.kv_len;
  for (int i = 0; i < p.q_len; ++i) n += p.visible_keys(i);
  return n;
}
inline double flops_forward(const Problem& p) {
  return 4.0 * p.batch * p.heads * p.head_dim * visible_pairs(p);
}
inline double flops_backward(const Problem& p) { return 2.5 * flops_forward(p); }
// Block-sparse attention (block_mask.hpp): the pairs that pass the causal (or length) test AND the block mask,
// per head, counted per mask block; a density s of a dense problem costs s of its FLOPs.
inline double visible_pairs(const Problem& p, const BlockMask* mask) {
  if (mask == nullptr) return visible_pairs(p);
  double n = 0;
  for (int i = 0; i < p.q_len; ++i) {
    const int keys = p.visible_keys(i);
    for (int j0 = 0; j0 < keys; j0 += kMaskCols)
      if (mask->visible(i, j0)) n += std::min(kMaskCols, keys - j0);
  }
  return n;
}
inline double flops_forward(const Problem& p, const BlockMask* mask) {
  return 4.0 * p.batch * p.heads * p.head_dim * visible_pairs(p, mask);
}
inline double flops_backward(const Problem& p, const BlockMask* mask) { return 2.5 * flops_forward(p, mask); }

// Bytes of the tensors themselves, at `elem` bytes per element (LSE is always fp32).
inline double hbm_bytes_min_forward(const Problem& p, int elem = 4) {
  return double(elem) * (2.0 * p.q_elems() + 2.0 * p.kv_elems()) + 4.0 * p.lse_elems();  // Q,K,V -> O, LSE
}

// Standard attention (chapter 00), each kernel reading its operands once and writing its result:
//   forward:  Q,K -> S;  S -> P (+ P~ with dropout), L;  P~,V -> O        4 (5) N^2 matrix accesses
//   backward: P~,dO -> dV;  dO,V -> dP;  P,dP -> dS;  dS,K -> dQ;  dS,Q -> dK  7 N^2 matrix accesses
inline double hbm_bytes_naive_forward(const Problem& p) {
  const double nn = 4.0 * p.s_elems() * (p.dropout_p > 0.f ? 5 : 4);
  return nn + 4.0 * (2.0 * p.q_elems() + 2.0 * p.kv_elems() + p.lse_elems());
}
inline double hbm_bytes_naive_backward(const Problem& p) {
  const double nn = 4.0 * p.s_elems() * 7;
  return nn + 4.0 * (4.0 * p.q_elems() + 4.0 * p.kv_elems());  // dO twice, Q, dQ; K, V, dK, dV
}

inline double tflops(double flops, double ms) { return ms > 0 ? flops / (ms * 1e9) : 0.0; }
inline double gbps(double bytes, double ms) { return ms > 0 ? bytes / (ms * 1e6) : 0.0; }

}  // namespace fa

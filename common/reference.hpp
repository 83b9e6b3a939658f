// The fp64 CPU reference every kernel is checked against: straight from the definition,
//   S = scale * Q K^T,  P = softmax(mask(S)),  P~ = dropout(P),  O = P~ V,  LSE_i = log sum_j exp(S_ij)
// and its gradients (dropout mask Z, D_i = rowsum(dO_i o O_i)):
//   dV = P~^T dO,  dP = (dO V^T) o Z / (1-p),  dS = P o (dP - D),  dQ = scale dS K,  dK = scale dS^T Q
// Inputs are the float values the kernels read (for fp16/bf16 kernels: the rounded inputs, widened).
// Per-head entry points let a program validate a sample of heads of a large problem.
// Block-sparse attention: every entry point takes an optional block mask (block_mask.hpp; nullptr = dense).
// The element mask is then (block bit) AND (the causal test if p.causal); without one, nothing changes.
#pragma once
#include <cstddef>
#include <vector>

#include "block_mask.hpp"
#include "problem.hpp"

namespace fa {

// Forward for query rows [i0, i1) of head (b, h). o: [i1 - i0, head_dim], lse: [i1 - i0],
// P (optional): [i1 - i0, kv_len], the softmax before dropout. Masked entries of P are 0; an empty
// row has o = 0, lse = -inf. (A program checks a few rows of a large problem this way.)
void reference_forward_rows(const Problem& p, int b, int h, int i0, int i1, const float* q,
                            const float* k, const float* v, double* o, double* lse,
                            double* P = nullptr, const BlockMask* mask = nullptr);

// Forward for every head: o in Q's layout, lse [batch, heads, q_len].
void reference_forward(const Problem& p, const float* q, const float* k, const float* v,
                       std::vector<double>& o, std::vector<double>& lse, const BlockMask* mask = nullptr);

// Backward for kv group (b, hk): dq for its group() query heads ([group, q_len, head_dim]),
// dk and dv for kv head hk ([kv_len, head_dim]) summed over the group.
void reference_backward_group(const Problem& p, int b, int hk, const float* q, const float* k,
                              const float* v, const float* dout, double* dq, double* dk, double* dv,
                              const BlockMask* mask = nullptr);

// dQ of query rows [i0, i1) of head (b, h) alone ([i1 - i0, head_dim]): each row of dQ needs only its
// own row of P and dP, so a program can check a sample of rows of a problem too large for the group.
void reference_dq_rows(const Problem& p, int b, int h, int i0, int i1, const float* q, const float* k,
                       const float* v, const float* dout, double* dq, const BlockMask* mask = nullptr);

// dK and dV of key rows [j0, j1) of kv head (b, hk) alone ([j1 - j0, head_dim] each, summed over the
// group): a key row needs every query row, so this costs a forward over the group's rows, without the
// Nq x Nk buffers of reference_backward_group (tests check a sample of key rows of a large problem).
void reference_dkdv_rows(const Problem& p, int b, int hk, int j0, int j1, const float* q, const float* k,
                         const float* v, const float* dout, double* dk, double* dv,
                         const BlockMask* mask = nullptr);

// Backward for every head: dq in Q's layout, dk and dv in K's layout.
void reference_backward(const Problem& p, const float* q, const float* k, const float* v,
                        const float* dout, std::vector<double>& dq, std::vector<double>& dk,
                        std::vector<double>& dv, const BlockMask* mask = nullptr);

// The plain fp32 attention: the same definition with every intermediate rounded to fp32 (S, the row max and sum,
// P, the products), as a straightforward fp32 implementation computes it. Its error against the reference is
// the yardstick of the fp32 chapters' error rule (testing.hpp): a kernel may be off by at most twice as much,
// plus a floor, so an ill-conditioned input (large logits) that no fp32 attention gets closer is not a failure.
void plain_fp32_forward_rows(const Problem& p, int b, int h, int i0, int i1, const float* q, const float* k,
                             const float* v, float* o, float* lse, const BlockMask* mask = nullptr);
void plain_fp32_backward_group(const Problem& p, int b, int hk, const float* q, const float* k, const float* v,
                               const float* dout, float* dq, float* dk, float* dv, const BlockMask* mask = nullptr);
void plain_fp32_dq_rows(const Problem& p, int b, int h, int i0, int i1, const float* q, const float* k,
                        const float* v, const float* dout, float* dq, const BlockMask* mask = nullptr);

// Row softmax of x [rows, cols] (no scale, no mask), the building block chapter 01 studies.
void reference_softmax(const float* x, int rows, int cols, double* y);

}  // namespace fa

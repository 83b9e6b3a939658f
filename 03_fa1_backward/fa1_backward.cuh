// Chapter 03 host API: the FlashAttention-1 backward pass with recomputation (FA1's Algorithm 4), fp32.
#pragma once
#include "fa1_forward.cuh"

namespace fa1 {

// dQ, dK [B,Hkv,Nk,d], dV from the forward's O, l, m and RNG state; no N x N buffer.
// head_dim in {16, 32, 64, 128}; anything else, or a shape the grid cannot hold, is a fa::UsageError
// (check_supported, as the forward).
void backward(const fa::Problem& p, RngState rng, const float* q, const float* k, const float* v, const float* o,
              const float* l, const float* m, const float* dout, float* dq, float* dk, float* dv);

// Bytes of HBM traffic backward() moves (the chapter's IO model; see README), fp32.
double backward_hbm_bytes(const fa::Problem& p);
// The closed form often quoted, 2 N d (4 + 5 Tc) bytes at 2 bytes per element, i.e. N d (4 + 5 Tc) elements per head,
// as d (4 Nk + 5 Nq Tc) x 4 bytes x B H: printed next to the count above (README section 4 compares them).
double backward_paper_formula_bytes(const fa::Problem& p);

}  // namespace fa1

// Chapter 00 host API: standard attention, the way a framework without fused kernels computes it.
// S = scale Q K^T and P = softmax(S) are materialised in HBM: O(N^2) memory per head.
#pragma once
#include <cstddef>

#include "device_buffer.cuh"
#include "problem.hpp"

namespace naive {

// The N x N matrices standard attention keeps in device memory (each [B, H, Nq, Nk], fp32):
//   forward:  S, P, and P^drop = dropout(P) when dropout is on (P itself is kept for the backward)
//   backward: dP, overwritten in place by dS
size_t workspace_bytes(const fa::Problem& p, bool backward);

struct Workspace {
  fa::DeviceBuffer<float> S, P, Pd, dP;
  Workspace(const fa::Problem& p, bool backward);
};

// O [B,H,Nq,d] and LSE [B,H,Nq]; leaves P (and P^drop) in ws for backward().
void forward(const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* lse,
             Workspace& ws);

// dQ, dK, dV from the P (and P^drop) that forward() left in ws (Algorithm 3 of the FA1 paper).
void backward(const fa::Problem& p, const float* q, const float* k, const float* v, const float* dout,
              Workspace& ws, float* dq, float* dk, float* dv);

// The row softmax kernel alone: P = softmax(mask(S)) per row of S [B,H,Nq,Nk] (S already scaled),
// lse = log-sum-exp per row, and Pd = dropout(P) when p.dropout_p > 0 (else Pd may be null).
// Chapter 01 compares its softmax kernels with this one (Problem with q_len = rows, kv_len = cols).
void softmax(const fa::Problem& p, const float* S, float* P, float* Pd, float* lse);

}  // namespace naive

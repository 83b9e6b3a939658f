// The host functions of the backward's steps, one per kernel file (the registry in backward.cu lists them).
#pragma once
#include "backward.cuh"

namespace wsq {
#define WSQ_BWD_DECLARE(fn)                                                                                    \
  template <class T>                                                                                           \
  void fn(const fa::Problem& p, const T* q, const T* k, const T* v, const T* o, const float* lse, const T* dout, \
          float* dq, float* dk, float* dv, DqMode mode, void* workspace);
WSQ_BWD_DECLARE(backward_v1_mma)
WSQ_BWD_DECLARE(backward_v2_regs)
WSQ_BWD_DECLARE(backward_v3_cp_async)
WSQ_BWD_DECLARE(backward_v4_exp2)
WSQ_BWD_DECLARE(backward_v5_vec_atomic)
WSQ_BWD_DECLARE(backward_v6_bc128)
WSQ_BWD_DECLARE(backward_v7_br64)
WSQ_BWD_DECLARE(backward_v8_kv_frags)
#undef WSQ_BWD_DECLARE

// The Hopper steps (sm_90a, built with FA_HOPPER; BACKWARD.md, "The Hopper backward"). Each file gives the launch of
// its K/V-block kernel alone, with D = rowsum(dO o O) already in Dv and, with_dq, dq zeroed; backward.cu's registry
// wraps it in the same driver as steps 1-8 (D first; in the deterministic mode with_dq = false, then the dQ kernel).
#define WSQ_BWD_KV_DECLARE(fn)                                                                                 \
  template <class T>                                                                                           \
  void fn(const fa::Problem& p, const T* q, const T* k, const T* v, const float* lse, const T* dout,           \
          const float* Dv, float* dq, float* dk, float* dv, bool with_dq);
WSQ_BWD_KV_DECLARE(backward_v9_wgmma_tma)
WSQ_BWD_KV_DECLARE(backward_v10_dq_bulk_reduce)
WSQ_BWD_KV_DECLARE(backward_v11_dq_double_buffer)
WSQ_BWD_KV_DECLARE(backward_v12_dq_tile_reduce)
WSQ_BWD_KV_DECLARE(backward_v13_br128)
#undef WSQ_BWD_KV_DECLARE

// Step 14 computes dQ in its K/V kernel in both modes (dq zeroed): dq_order nullptr is the atomic mode, else the
// deterministic one, with dq_order_ints(p) counters, zeroed, one per (batch, query head, Q block of
// dq_order_rows(head_dim) rows: step 14's Br, step 13's tile: 128 at d = 64, 64 at d = 128).
constexpr int dq_order_rows(int head_dim) { return head_dim == 64 ? 128 : 64; }
inline size_t dq_order_ints(const fa::Problem& p) {
  const int rows = dq_order_rows(p.head_dim);
  return size_t(p.batch) * p.heads * ((p.q_len + rows - 1) / rows);
}
template <class T>
void backward_v14_dq_ordered(const fa::Problem& p, const T* q, const T* k, const T* v, const float* lse, const T* dout,
                             const float* Dv, float* dq, float* dk, float* dv, int* dq_order);
}  // namespace wsq

// Explicit instantiations of a Hopper step's K/V-block launch for both dtypes.
#define WSQ_BWD_KV_INSTANTIATE(fn)                                                                                 \
  template void fn<fa::half_t>(const fa::Problem&, const fa::half_t*, const fa::half_t*, const fa::half_t*,          \
                               const float*, const fa::half_t*, const float*, float*, float*, float*, bool);        \
  template void fn<fa::bfloat16_t>(const fa::Problem&, const fa::bfloat16_t*, const fa::bfloat16_t*,                 \
                                   const fa::bfloat16_t*, const float*, const fa::bfloat16_t*, const float*, float*, \
                                   float*, float*, bool);

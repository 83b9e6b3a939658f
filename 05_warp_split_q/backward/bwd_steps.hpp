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
}  // namespace wsq

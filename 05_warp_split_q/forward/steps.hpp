// The host functions of the ladder's steps, one per kernel file (the registry in warp_split_q.cpp lists them).
#pragma once
#include "dtype.hpp"
#include "problem.hpp"
#include "hopper/fp8.hpp"

namespace wsq {
#define WSQ_DECLARE(fn) \
  template <class T>    \
  void fn(const fa::Problem& p, const T* q, const T* k, const T* v, T* o, float* lse);
WSQ_DECLARE(forward_split_k)
WSQ_DECLARE(forward_v1_mma)
WSQ_DECLARE(forward_v2_ldmatrix)
WSQ_DECLARE(forward_v3_swizzle)
WSQ_DECLARE(forward_v4_cp_async)
WSQ_DECLARE(forward_v5_regs_p)
WSQ_DECLARE(forward_v6_exp2)
WSQ_DECLARE(forward_v7_tiles)
WSQ_DECLARE(forward_v8_two_row_tiles)
WSQ_DECLARE(forward_v9_wgmma_tma)  // steps 9 and 10: sm_90a only (built when WSQ_HOPPER is defined)
WSQ_DECLARE(forward_v10_pingpong)
#undef WSQ_DECLARE

// ---- step 11 (FP8, sm_90a only): reads the quantisation pass's e4m3 tensors (hopper/fp8.hpp), writes O in bf16 ----
void forward_v11_fp8(const fa::Problem& p, const fp8::View& in, fa::bfloat16_t* o, float* lse);
// ---- step 12 (FP8, sm_90a only): step 11 with a leaner softmax (FFMA, ex2.ftz, kPScale in the exponent), 3 buffers ----
void forward_v12_fp8_lean(const fa::Problem& p, const fp8::View& in, fa::bfloat16_t* o, float* lse);
// ---- step 13 (FP8, sm_90a only): step 12 with the descales of K and V loaded one tile ahead ----
void forward_v13_fp8_scales_ahead(const fa::Problem& p, const fp8::View& in, fa::bfloat16_t* o, float* lse);
// ---- step 14 (FP8, sm_90a only): step 13 with persistent blocks (one per SM, work items from a counter) ----
void forward_v14_fp8_persistent(const fa::Problem& p, const fp8::View& in, fa::bfloat16_t* o, float* lse);
// ---- step 15 (FP8, sm_90a only): step 14 with three consumer warpgroups at d = 64 (Br = 192) ----
void forward_v15_fp8_three_warpgroups(const fa::Problem& p, const fp8::View& in, fa::bfloat16_t* o, float* lse);
// ---- step 16 (FP8, sm_90a only): step 15 with the row sums l_i from P V's column of ones ----
void forward_v16_fp8_row_sums(const fa::Problem& p, const fp8::View& in, fa::bfloat16_t* o, float* lse);
// ---- step 17 (FP8, sm_90a only): step 16 without the turn barriers at d = 128 ----
void forward_v17_fp8_no_turns(const fa::Problem& p, const fp8::View& in, fa::bfloat16_t* o, float* lse);
// ---- step 18 (FP8, sm_90a only): step 17 with O_i written through shared memory by a TMA store ----
void forward_v18_fp8_tma_store(const fa::Problem& p, const fp8::View& in, fa::bfloat16_t* o, float* lse);
// ---- step 19 (FP8, sm_90a only): step 18 with each item's coordinates handed over by the producer ----
void forward_v19_fp8_producer_coords(const fa::Problem& p, const fp8::View& in, fa::bfloat16_t* o, float* lse);
}  // namespace wsq

// Explicit instantiations of a step's host function for both dtypes (at the end of each step file).
#define WSQ_INSTANTIATE(fn)                                                                                      \
  template void fn<fa::half_t>(const fa::Problem&, const fa::half_t*, const fa::half_t*, const fa::half_t*,       \
                               fa::half_t*, float*);                                                             \
  template void fn<fa::bfloat16_t>(const fa::Problem&, const fa::bfloat16_t*, const fa::bfloat16_t*,              \
                                   const fa::bfloat16_t*, fa::bfloat16_t*, float*);

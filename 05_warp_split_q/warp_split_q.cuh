// Chapter 05 host API: the FlashAttention-2 forward on tensor cores (mma.sync m16n8k16), fp16 and bf16 in,
// fp32 accumulation, built as a ladder of steps (README). Every step computes the same thing:
//   O [B,H,Nq,d] in the dtype, LSE [B,H,Nq] in fp32 (natural log), from Q [B,H,Nq,d], K, V [B,Hkv,Nk,d]
// with common/problem.hpp's semantics: softmax scale, causal bottom-right with the blocks past the diagonal
// skipped, GQA/MQA (query head h reads kv head p.kv_head_of(h)), any q_len, kv_len >= 1 (tail tiles masked and
// zero-filled), a row that sees no key gives O = 0 and LSE = -inf.
// Supported: head_dim 64 and 128; no dropout (README says why). Pointers from cudaMalloc (16-byte aligned).
#pragma once
#include <cstdint>
#include <vector>

#include "dtype.hpp"
#include "problem.hpp"

namespace wsq {

template <class T>
using ForwardFn = void (*)(const fa::Problem&, const T* q, const T* k, const T* v, T* o, float* lse);

struct Step {
  const char* name;  // what --kernel selects
  const char* idea;  // the one idea of this step, for the program's table
  ForwardFn<fa::half_t> fp16;
  ForwardFn<fa::bfloat16_t> bf16;
};

// Split-K first (Part A), then the split-Q ladder v1 .. v8 (sm_80 and newer), then on an sm_90 GPU of a build with
// FA_HOPPER the Hopper steps v9 and v10 (wgmma, TMA; README section 3).
const std::vector<Step>& forward_steps();
// The step called `name`; fa::UsageError listing the names if there is none.
const Step& find_step(const std::string& name);

// Throws fa::UsageError naming what is supported: head_dim 64 or 128, no dropout, grid limits.
void check_supported(const fa::Problem& p);

// Block-sparse attention with step 8's kernel: `block_mask` is a device copy of a fa::BlockMask's bits for p's
// lengths (common/block_mask.hpp; nullptr = dense); the K/V tiles it masks are never loaded. Same contract as the
// steps otherwise, with the element mask (block bit) AND (causal test if p.causal).
template <class T>
void forward_block_sparse(const fa::Problem& p, const T* q, const T* k, const T* v, T* o, float* lse,
                          const uint8_t* block_mask);

// A step's function for dtype T (T = fa::half_t or fa::bfloat16_t).
template <class T>
ForwardFn<T> fn(const Step& s);
template <>
inline ForwardFn<fa::half_t> fn<fa::half_t>(const Step& s) { return s.fp16; }
template <>
inline ForwardFn<fa::bfloat16_t> fn<fa::bfloat16_t>(const Step& s) { return s.bf16; }

}  // namespace wsq

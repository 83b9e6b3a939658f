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
#include "step.hpp"
#include "hopper/fp8.hpp"

namespace wsq {

template <class T>
using ForwardFn = void (*)(const fa::Problem&, const T* q, const T* k, const T* v, T* o, float* lse);

// A step (common/step.hpp): name (what --kernel selects), the idea it adds in a line, launch (its host function
// for each dtype: s.launch.of<T>()), dtypes "fp16,bf16", arch (sm_80; sm_90a for the Hopper steps).
using ForwardStep = fa::Step<fa::PerDtype<ForwardFn>>;

// Split-K first (Part A), then the split-Q ladder v1 .. v8 (sm_80 and newer), then on an sm_90 GPU of a build with
// FA_HOPPER the Hopper steps v9 and v10 (wgmma, TMA; README section 3).
const std::vector<ForwardStep>& forward_steps();
// The step called `name`; fa::UsageError listing the names if there is none.
const ForwardStep& find_step(const std::string& name);
// Whether this build has the Hopper steps (FA_HOPPER): the program's help names them only then.
bool hopper_steps_built();

// Throws fa::UsageError naming what is supported: head_dim 64 or 128, no dropout, grid limits.
void check_supported(const fa::Problem& p);

// Block-sparse attention with step 8's kernel: `block_mask` is a device copy of a fa::BlockMask's bits for p's
// lengths (common/block_mask.hpp; nullptr = dense); the K/V tiles it masks are never loaded. Same contract as the
// steps otherwise, with the element mask (block bit) AND (causal test if p.causal).
template <class T>
void forward_block_sparse(const fa::Problem& p, const T* q, const T* k, const T* v, T* o, float* lse,
                          const uint8_t* block_mask);

// ---- step 11 (FP8, FP8.md): its own list, as its host function takes the quantised tensors ----
using Fp8ForwardFn = void (*)(const fa::Problem&, const fp8::View& in, fa::bfloat16_t* o, float* lse);
using Fp8Step = fa::Step<Fp8ForwardFn>;  // dtypes "fp8", arch sm_90a
// Step 11 on an sm_90 GPU of a build with FA_HOPPER; empty elsewhere.
const std::vector<Fp8Step>& fp8_steps();
// The steps --kernel names for a --dtype fp8 run ("all": every fp8 step). fa::UsageError with the reason where
// there is none (no sm_90 GPU, a build without the Hopper steps) or a named step has no fp8 form.
std::vector<Fp8Step> select_fp8_steps(const std::string& kernel);
// A --kernel list for fp16/bf16 that names an fp8 step: fa::UsageError (it takes --dtype fp8 only).
void check_not_fp8_steps(const std::string& kernel);

}  // namespace wsq

// Chapter 05 host API, backward: the FlashAttention-2 backward on tensor cores (mma.sync m16n8k16), fp16 and
// bf16 in, fp32 accumulation, built as a ladder of steps (BACKWARD.md). Every step computes the same thing:
//   dQ [B,H,Nq,d], dK, dV [B,Hkv,Nk,d], all three in fp32,
// from Q, O, dO [B,H,Nq,d] and K, V [B,Hkv,Nk,d] in the dtype and the forward's LSE [B,H,Nq] (fp32, natural log),
// with common/problem.hpp's semantics: causal bottom-right (Q blocks before the first query that sees a K/V block
// are skipped), GQA/MQA (dK, dV summed over the query heads of a group, in a fixed order), any q_len, kv_len >= 1.
// A query row that sees no key gets dQ = 0; a key that no query sees gets dK = dV = 0.
// Why fp32 gradients: dQ is summed by fp32 atomics (or a second kernel) anyway, and an fp32 gradient is the
// kernel's own accuracy, not the dtype's output rounding (BACKWARD.md, "Outputs").
// Supported: what wsq::check_supported accepts (head_dim 64 and 128, no dropout). Pointers from cudaMalloc.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "dtype.hpp"
#include "problem.hpp"
#include "step.hpp"

namespace wsq {

// How dQ is accumulated (the same two ways as chapter 04).
enum class DqMode {
  Atomic,         // every K/V block adds its dS_ij K_j into a zeroed dQ with fp32 atomicAdd: fast, but the order of
                  // the additions depends on block scheduling, so dQ may differ in the last bits run to run
  Deterministic,  // a second kernel over Q blocks recomputes dS_ij and sums dQ_i on chip in a fixed order
};

template <class T>
using BackwardFn = void (*)(const fa::Problem&, const T* q, const T* k, const T* v, const T* o, const float* lse,
                            const T* dout, float* dq, float* dk, float* dv, DqMode mode, void* workspace);

// A step (common/step.hpp): name (what --bwd-kernel selects), the idea it adds in a line, launch (its host
// function for each dtype: s.launch.of<T>()), dtypes "fp16,bf16", arch sm_80.
using BackwardStep = fa::Step<fa::PerDtype<BackwardFn>>;

// The backward's ladder; the last is the fastest.
const std::vector<BackwardStep>& backward_steps();

// Device memory backward needs besides its inputs and outputs: D = rowsum(dO o O), [B,H,Nq] fp32, then step 14's
// dQ counters (an int per Q block of each head: 128 rows at d = 64, 64 at d = 128).
// Allocate it once (outside timing loops) and pass it as `workspace`.
size_t backward_workspace_bytes(const fa::Problem& p);

}  // namespace wsq

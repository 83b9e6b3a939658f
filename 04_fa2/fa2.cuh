// Chapter 04 host API: the FlashAttention-2 forward and backward passes (FA2's Algorithms 1 and 2), fp32 on
// CUDA cores. Chapter 05 keeps this API and moves the matrix products to tensor cores (fp16/bf16).
//
// Layout and semantics are common/problem.hpp's: Q, O, dO, dQ [B,H,Nq,d]; K, V, dK, dV [B,Hkv,Nk,d]; LSE [B,H,Nq]
// (natural log; -inf for a row that sees no key, whose O is 0). GQA/MQA: query head h reads kv head
// p.kv_head_of(h). Dropout draws fa::dropout_keep(p.seed, p.offset, b, h, i, j), the same mask as chapters 00-03.
// Supported head_dim: 16, 32, 64, 128 (anything else is a fa::UsageError naming these). Pointers must be 16-byte
// aligned (cudaMalloc's are): the kernels load four floats at a time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "block_mask.hpp"
#include "problem.hpp"
#include "step.hpp"

namespace fa2 {

// The tile sizes the kernels are compiled with (the same for every head_dim), for the program's report.
struct Tiles {
  int Br, Bc;  // rows of a Q block, rows of a K/V block
};
Tiles forward_tiles();
Tiles backward_tiles();  // main backward kernel (grid over K/V blocks); the deterministic dQ pass uses forward_tiles()

// Throws fa::UsageError naming what this chapter supports (head_dim 16/32/64/128, grid limits).
void check_supported(const fa::Problem& p);

// Block-sparse attention: `block_mask` is a device copy of a fa::BlockMask's bits for p's lengths
// (common/block_mask.hpp: Tr x Tc bytes, blocks of 128 queries x 64 keys), or nullptr for dense attention.
// The element mask is (block bit) AND (the causal test if p.causal); the tiles it masks are never loaded.

// Forward: writes O and L = m + log l only (no l, m, no N x N buffer). Grid over (Q block, head, batch).
// The last step of the ladder below.
void forward(const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* lse,
             const uint8_t* block_mask = nullptr);

// The forward as a ladder of complete kernels, one file each (v01_*.cu .. v04_*.cu), each adding one
// idea to the previous one. Every step has forward()'s contract (same inputs, outputs, checks and errors).
using ForwardFn = void (*)(const fa::Problem&, const float* q, const float* k, const float* v, float* o, float* lse);
// A step (common/step.hpp): name (e.g. "v1_loop_swap", the program's --kernel NAME), the idea it adds in a line,
// launch (its ForwardFn), dtypes "fp32", arch fa::Arch::any (CUDA cores only: every GPU).
using ForwardStep = fa::Step<ForwardFn>;
const std::vector<ForwardStep>& forward_steps();  // in ladder order; the last is the fastest, = fa2::forward

// How dQ is accumulated in the backward pass.
enum class DqMode {
  Atomic,         // the K/V-block kernel atomicAdds its dS_ij K_j into a zeroed dQ: fast, but the order of the
                  // fp32 additions depends on the scheduling of blocks, so dQ may differ in the last bits run to run
  Deterministic,  // a second kernel, parallel over Q blocks, recomputes dS_ij and sums dQ_i in a fixed order
};

// Device memory backward() needs besides its inputs and outputs: D = rowsum(dO o O), [B,H,Nq] fp32.
// Allocate it once (outside timing loops) and pass it as `workspace`.
size_t backward_workspace_bytes(const fa::Problem& p);

// Backward from the forward's O and LSE: dQ [B,H,Nq,d], dK and dV [B,Hkv,Nk,d] (summed over the query heads of a
// GQA group). Every output element is written (dQ is zeroed first in Atomic mode), so outputs need no clearing.
void backward(const fa::Problem& p, const float* q, const float* k, const float* v, const float* o, const float* lse,
              const float* dout, float* dq, float* dk, float* dv, DqMode mode, void* workspace,
              const uint8_t* block_mask = nullptr);

}  // namespace fa2

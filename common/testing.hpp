// What the tests of every chapter share: the edge shapes and the stated fp32 tolerances.
#pragma once
#include <utility>
#include <vector>

#include "metrics.hpp"
#include "problem.hpp"

namespace fa {

// (q_len, kv_len) pairs that are not multiples of any tile size: a single row, primes, a rectangle
// both ways (causal bottom-right alignment; q_len > kv_len gives empty rows), one short of 1024.
inline std::vector<std::pair<int, int>> edge_lengths() {
  return {{1, 1}, {17, 17}, {97, 97}, {113, 203}, {203, 113}, {1023, 1023}};
}
// Shapes the edge lengths miss: exact tile multiples (every tile full: the unmasked path), one query
// row against many keys (decoding) and many rows against one key, and a q_len - kv_len of 64 or more,
// where with causal a whole block of 64 query rows sees no key.
inline std::vector<std::pair<int, int>> tile_and_vector_lengths() {
  return {{64, 64}, {128, 128}, {1024, 1024}, {1, 203}, {1, 1024}, {203, 1}, {200, 64}};
}

// The error rule of every program's verdict (program.hpp's check_forward, check_backward), the one chapters 05 and
// 06 use for fp16/bf16 (lowp.hpp), here for fp32: an element of a kernel's output passes when
//   |got - ref| <= 2 E_plain + atol + rtol |ref|,
// E_plain being the largest error against the fp64 reference of a plain fp32 attention (reference.hpp's
// plain_fp32_*: the definition computed in fp32) on the same elements of the same inputs. On well-conditioned
// inputs E_plain is ~1e-7 and the floor atol + rtol |ref| below decides; on ill-conditioned ones (logits in the
// hundreds: an fp32 score carries an absolute error of ~1e-5 that exp turns into a relative one) no fp32 kernel
// can do better than E_plain ~3e-4, and a correct kernel passes where a fixed tolerance would call it broken.
// A broken kernel (no running max: overflow to inf/NaN; a wrong row; an unwritten element) is off by far more
// than twice a plain attention's error on any input.
//
// The floor: fp32 kernels vs the fp64 reference, element-wise atol + rtol |ref|.
// Inputs are N(0.5, 1), or inputs.hpp's large_logit_inputs at d = 16, 64 or 256, whose S is exact
// in fp32. An output element of O is an average of up to Nk values of V (|v| ~ 1),
// accumulated in fp32 (unit roundoff u = 6e-8) with weights exp(S - m) whose argument carries the
// rounding of a d-term dot product. Rounding errors of random sign grow like sqrt(n) u: about 2e-6 for
// n = Nk = 1023 (the tests' longest rows) and 1.5e-5 for n = 65536 (the longest program run), against
// the worst case n u (6e-5 and 4e-3), which does not occur in practice. Measured on an H100 (the
// programs' max_abs_err column in docs/results/): 1e-7 .. 4e-6 for Nk up to 65536, d up to 128. So
// atol 2e-5 leaves 5x room over everything observed, while a real bug (wrong row, missing mask,
// unwritten element) is off by O(0.1) or NaN. Gradients are sums over Nq (dK, dV) or Nk (dQ) of
// products of two such quantities: observed up to 6e-6, hence 5x the forward's atol and 2x its rtol.
constexpr Tolerance kTolFp32Forward{2e-5, 1e-4};
constexpr Tolerance kTolFp32Backward{1e-4, 2e-4};

// LSE_i = m_i + log l_i needs its own rule: it is not bounded like O (|LSE| ~ log Nk + max_j S_ij,
// about 10 for N(0.5, 1) inputs and several hundred for large logits), so a relative bound lets a
// real bias through (1e-4 |LSE| = 1e-3 at |LSE| = 10; a bias of 3e-4 would pass). Its error has two
// parts: (1) m_i is a rounded d-term dot product times scale, and log l_i sums up to Nk terms in
// (0, 1]: together about sqrt(d) u |S| + sqrt(Nk) u, i.e. 1e-6 .. 3e-6 at the tests' sizes; atol
// 1e-5 covers that 3x over. (2) fp32 cannot hold LSE closer than half an ulp, 2^-24 |LSE| (3e-5 at
// |LSE| = 500); rtol 1e-6 = 16 ulp covers the rounding of m and of the final add. A bias of 3e-4 at
// |LSE| = 10 now fails (limit 2e-5).
constexpr Tolerance kTolLse{1e-5, 1e-6};

}  // namespace fa

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

// fp32 kernels vs the fp64 reference, element-wise |got - ref| <= atol + rtol |ref|.
// Inputs are N(0.5, 1). An output element of O is an average of up to Nk values of V (|v| ~ 1),
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

}  // namespace fa

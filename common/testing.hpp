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
// Inputs are N(0.5, 1). An output element is a sum of up to Nk <= 1023 terms accumulated in fp32
// (unit roundoff u = 6e-8), through an exp whose argument carries the rounding of a d-term dot
// product: the observed error is 1e-7..1e-6, and a rounding-error bound of order sqrt(Nk d) u |terms|
// stays below 1e-5. A real bug (wrong row, missing mask, unwritten element) is off by O(0.1) or NaN.
// Gradients sum Nq terms of products of two such quantities, hence twice the room.
constexpr Tolerance kTolFp32Forward{2e-5, 1e-4};
constexpr Tolerance kTolFp32Backward{1e-4, 2e-4};

}  // namespace fa

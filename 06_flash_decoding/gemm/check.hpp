// The GEMM's inputs and its check against fp64, shared by decode_gemm and the tests (plain C++, no CUDA).
// Inputs: X ~ N(0.1, 1) and W ~ N(0, 1 / K) in fp16 (seeded), so Y is O(1), as in a linear layer after a norm.
// The rule (the repository's, common/lowp.hpp): a kernel's max error vs the fp64 reference, on the sampled entries,
// may be at most 2 x that of a plain same-dtype GEMM (fp16 inputs, fp32 sums in k order, Y rounded to fp16) on the
// same entries, plus one fp16 ulp at 1 (2^-10). The output's own rounding dominates a correct kernel's error; a
// dropped K tile or a wrong row is far above it. A NaN fails.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "dtype.hpp"
#include "lowp.hpp"
#include "random.hpp"

namespace fdec::gemm {

struct HostGemm {
  int m = 0, n = 0, k = 0;
  std::vector<fa::half_t> x, w;  // [m, k], [n, k]
};
inline HostGemm make_inputs(int m, int n, int k, uint64_t seed) {
  HostGemm h{m, n, k, fa::random_normal<fa::half_t>(size_t(m) * k, seed, 0.1, 1.0),
             fa::random_normal<fa::half_t>(size_t(n) * k, seed + 1, 0.0, 1.0 / std::sqrt(double(k)))};
  return h;
}

// `want` indices of 0 .. count - 1: all of them if there are few, else the first, the last and evenly spaced ones.
inline std::vector<int> sample(int count, int want) {
  std::vector<int> s;
  if (count <= want) {
    for (int i = 0; i < count; ++i) s.push_back(i);
    return s;
  }
  for (int i = 0; i < want; ++i) s.push_back(int((long long)i * (count - 1) / (want - 1)));
  return s;
}

struct GemmError {
  double max_abs = 0, bound = 0;
  int checked = 0;
  bool ok() const { return max_abs <= bound; }  // false for a NaN
  std::string summary() const {
    return "max |Y - fp64| " + std::to_string(max_abs) + " (bound " + std::to_string(bound) + ", " +
           std::to_string(checked) + " entries) " + (ok() ? "ok" : "FAILED");
  }
};

// y [m, n] (fp16) on rows x cols of the sample, against fp64 and the plain fp16 GEMM.
inline GemmError check(const HostGemm& h, const std::vector<fa::half_t>& y, const std::vector<int>& rows,
                       const std::vector<int>& cols) {
  double plain_max = 0;
  GemmError e;
  for (int m : rows)
    for (int n : cols) {
      double ref = 0;
      float plain = 0;
      for (int k = 0; k < h.k; ++k) {
        const float xv = fa::to_float(h.x[size_t(m) * h.k + k]), wv = fa::to_float(h.w[size_t(n) * h.k + k]);
        ref += double(xv) * double(wv);
        plain += xv * wv;
      }
      plain_max = std::max(plain_max, std::fabs(double(fa::to_float(fa::from_float<fa::half_t>(plain))) - ref));
      const double err = std::fabs(double(fa::to_float(y[size_t(m) * h.n + n])) - ref);
      if (!(err <= e.max_abs)) e.max_abs = std::isnan(err) ? INFINITY : err;  // a NaN counts as infinitely wrong
      ++e.checked;
    }
  e.bound = fa::lowp_error_bound(fa::Dtype::fp16, plain_max);
  return e;
}
inline GemmError check_all(const HostGemm& h, const std::vector<fa::half_t>& y) {
  return check(h, y, sample(h.m, h.m), sample(h.n, h.n));
}

}  // namespace fdec::gemm

// Error metrics: compare a result (float, half or bf16) with the fp64 reference.
// An element passes when |got - ref| <= atol + rtol * |ref| (llm.c's rule). A non-finite reference
// value (LSE = -inf of an empty row) must be matched exactly; a non-finite result where the
// reference is finite - e.g. an element the kernel never wrote over the NaN poison - always fails.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <sstream>
#include <string>
#include <vector>

#include "dtype.hpp"

namespace fa {

struct Tolerance {
  double atol, rtol;
};

struct ErrorReport {
  size_t n = 0, n_bad = 0;
  double max_abs = 0;  // over elements with a finite reference
  double rel_fro = 0;  // ||got - ref||_F / ||ref||_F over the same elements
  size_t first_bad = 0;
  double first_got = 0, first_ref = 0;
  double err2 = 0, ref2 = 0;  // sums behind rel_fro, so reports of several pieces can be merged
  // Where the error rule was applied (program.hpp's checks): the largest error of the plain same-dtype attention
  // on the same elements, the yardstick the kernel's error is allowed twice of (plus a floor); -1 where not.
  double plain_max_abs = -1;
  bool ok() const { return n_bad == 0; }
  // Merge the report of a further piece (its indices counted after this one's).
  ErrorReport& operator+=(const ErrorReport& o) {
    if (o.n_bad && !n_bad) first_bad = n + o.first_bad, first_got = o.first_got, first_ref = o.first_ref;
    n += o.n, n_bad += o.n_bad, err2 += o.err2, ref2 += o.ref2;
    max_abs = std::max(max_abs, o.max_abs);
    plain_max_abs = std::max(plain_max_abs, o.plain_max_abs);
    rel_fro = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
    return *this;
  }
  std::string summary(const std::string& what) const {
    std::ostringstream s;
    s << what << ": max_abs_err " << max_abs << ", rel_fro_err " << rel_fro;
    if (plain_max_abs >= 0) s << " (a plain attention of the same dtype: max_abs_err " << plain_max_abs << ")";
    if (n_bad)
      s << ", " << n_bad << " of " << n << " out of tolerance, first at index " << first_bad
        << " (got " << first_got << ", expected " << first_ref << ")";
    return s.str();
  }
};

template <class T>
ErrorReport compare(const T* got, const double* ref, size_t n, Tolerance tol) {
  ErrorReport r;
  r.n = n;
  double& err2 = r.err2;
  double& ref2 = r.ref2;
  for (size_t i = 0; i < n; ++i) {
    const double g = to_float(got[i]), e = ref[i];
    bool bad;
    if (!std::isfinite(e)) {
      bad = !(g == e);
    } else {
      const double d = std::fabs(g - e);
      bad = !(d <= tol.atol + tol.rtol * std::fabs(e));  // NaN compares false: bad
      if (std::isfinite(d)) {
        r.max_abs = std::max(r.max_abs, d);
        err2 += d * d;
      } else {
        r.max_abs = INFINITY;
      }
      ref2 += e * e;
    }
    if (bad && r.n_bad++ == 0) {
      r.first_bad = i;
      r.first_got = g;
      r.first_ref = e;
    }
  }
  r.rel_fro = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  if (r.n_bad && r.max_abs == 0) r.max_abs = INFINITY;  // only non-finite mismatches
  return r;
}
template <class T>
ErrorReport compare(const std::vector<T>& got, const std::vector<double>& ref, Tolerance tol) {
  if (got.size() != ref.size()) {
    ErrorReport r;
    r.n = r.n_bad = std::max(got.size(), ref.size());
    r.max_abs = INFINITY;
    return r;
  }
  return compare(got.data(), ref.data(), got.size(), tol);
}

// Widen any element type to double (to use a lower-precision result as a reference of its own).
template <class T>
std::vector<double> to_double(const std::vector<T>& x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = to_float(x[i]);
  return y;
}

}  // namespace fa

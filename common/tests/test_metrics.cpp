#include <doctest/doctest.h>

#include <cmath>

#include "metrics.hpp"

using namespace fa;

TEST_CASE("metrics: tolerance, NaN poison, -inf rows and merging") {
  const Tolerance tol{1e-5, 1e-4};
  std::vector<float> got = {1.0f, 2.0f, -INFINITY};
  std::vector<double> ref = {1.0, 2.0001, -INFINITY};
  ErrorReport r = compare(got, ref, tol);
  CHECK(r.ok());  // 1e-4 <= 1e-5 + 1e-4 * 2.0001
  CHECK(r.max_abs == doctest::Approx(1e-4).epsilon(1e-3));

  got[1] = NAN;  // an element left at the poison value
  r = compare(got, ref, tol);
  CHECK_FALSE(r.ok());
  CHECK(r.first_bad == 1);
  CHECK(std::isinf(r.max_abs));

  got[1] = 2.0f;
  got[2] = 0.0f;  // an empty row must be -inf, not 0
  r = compare(got, ref, tol);
  CHECK_FALSE(r.ok());
  CHECK(r.first_bad == 2);

  ErrorReport a = compare(std::vector<float>{1.0f}, std::vector<double>{1.0}, tol);
  a += compare(std::vector<float>{3.0f}, std::vector<double>{2.0}, tol);
  CHECK(a.n == 2);
  CHECK(a.n_bad == 1);
  CHECK(a.first_bad == 1);
  CHECK(a.rel_fro == doctest::Approx(1.0 / std::sqrt(5.0)));
  CHECK(compare(std::vector<float>{1.0f}, std::vector<double>{1.0, 2.0}, tol).n_bad == 2);  // size mismatch
}

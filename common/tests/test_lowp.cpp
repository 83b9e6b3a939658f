#include <doctest/doctest.h>

#include <cmath>

#include "lowp.hpp"
#include "metrics.hpp"
#include "random.hpp"
#include "reference.hpp"

using namespace fa;

TEST_CASE("lowp: rounding to fp16 and bf16") {
  CHECK(round_to(Dtype::fp16, 1.0f + 0x1p-11f) == 1.0f);           // a tie rounds to even
  CHECK(round_to(Dtype::fp16, 1.0f + 0x1p-10f) == 1.0f + 0x1p-10f);  // representable
  CHECK(round_to(Dtype::bf16, 1.0f + 0x1p-9f) == 1.0f);
  CHECK(round_to(Dtype::bf16, 1.0f + 0x1p-7f) == 1.0f + 0x1p-7f);
  CHECK(parse_dtype("bf16") == Dtype::bf16);
  CHECK_THROWS_AS(parse_dtype("fp8"), UsageError);
}

// The plain same-dtype attention is the yardstick of the error rule: its error must be of the dtype's order
// (not 0, not O(1)), and bf16's larger than fp16's.
TEST_CASE("lowp: plain same-dtype attention error is of the dtype's order") {
  Problem p;
  p.q_len = 17, p.kv_len = 203, p.head_dim = 64, p.causal = true;
  double err[2];
  for (Dtype t : {Dtype::fp16, Dtype::bf16}) {
    const auto q = rounded(t, random_normal<float>(p.q_elems(), 1));
    const auto k = rounded(t, random_normal<float>(p.kv_elems(), 2));
    const auto v = rounded(t, random_normal<float>(p.kv_elems(), 3));
    std::vector<double> ro(p.q_elems()), rl(p.q_len);
    reference_forward_rows(p, 0, 0, 0, p.q_len, q.data(), k.data(), v.data(), ro.data(), rl.data());
    std::vector<float> o(p.q_elems());
    plain_lowp_forward_rows(t, p, 0, 0, 0, p.q_len, q.data(), k.data(), v.data(), o.data());
    const ErrorReport r = compare(o, ro, Tolerance{1.0, 0.0});
    err[int(t)] = r.max_abs;
    CHECK(r.max_abs > 0.1 * lowp_floor(t));
    CHECK(r.max_abs < 8 * lowp_floor(t));
    CHECK(lowp_error_bound(t, r.max_abs) == 2 * r.max_abs + lowp_floor(t));
  }
  CHECK(err[1] > err[0]);
}

// How chapter 05 judges a result (the program and the GPU tests): O against the fp64 reference with the error
// rule of common/lowp.hpp (at most 2x the error of a plain same-dtype attention on the same rows, plus a
// floor), LSE against the reference with an absolute+relative tolerance, both on the rounded inputs.
#pragma once
#include <string>
#include <vector>

#include "lowp.hpp"
#include "metrics.hpp"
#include "problem.hpp"
#include "reference.hpp"

namespace wsq {

// LSE is computed from fp32 statistics (S accumulated in fp32 from the dtype's exact products; ex2/lg2 with
// ~2^-22 relative error), so its error is that of fp32 arithmetic on a logit: ~1e-6 relative, ~1e-5 at
// |logit| ~ 10 and ~3e-4 at the hundreds of the large-logit tests. atol 1e-4 + rtol 1e-5 covers both with
// room, while one key lost from a row of 1024 keys moves LSE by ~1e-3.
constexpr fa::Tolerance kTolLse{1e-4, 1e-5};

struct LowpCheck {
  fa::ErrorReport o, lse;
  double plain_err = 0, bound = 0;  // the plain same-dtype attention's max error, the resulting bound for O
  std::string what;                 // which rows were checked
  bool ok() const { return o.ok() && lse.ok(); }
  std::string summary() const {
    return o.summary("O vs fp64") + " (bound " + std::to_string(bound) + " = 2 x plain " +
           std::to_string(plain_err) + " + floor); " + lse.summary("LSE vs fp64");
  }
};

// q, k, v: the rounded inputs (as floats); o, lse: the kernel's whole outputs (O widened to float).
// Every row when the reference is cheap (below `budget` multiply-adds), else 16-row bands at the start,
// middle and end of the first and the last head.
inline LowpCheck check_lowp_forward(fa::Dtype t, const fa::Problem& p, const std::vector<float>& q,
                                    const std::vector<float>& k, const std::vector<float>& v,
                                    const std::vector<float>& o, const std::vector<float>& lse, double budget = 2e9) {
  struct Piece {
    int b, h, i0, i1;
  };
  std::vector<Piece> pieces;
  LowpCheck r;
  if (2.0 * p.batch * p.heads * p.q_len * double(p.kv_len) * p.head_dim <= budget) {
    for (int b = 0; b < p.batch; ++b)
      for (int h = 0; h < p.heads; ++h) pieces.push_back({b, h, 0, p.q_len});
    r.what = "all " + std::to_string(p.lse_elems()) + " rows";
  } else {
    const int band = std::min(16, p.q_len);
    for (auto [b, h] : {std::pair<int, int>{0, 0}, {p.batch - 1, p.heads - 1}})
      for (int i0 : {0, (p.q_len - band) / 2, p.q_len - band}) pieces.push_back({b, h, i0, i0 + band});
    r.what = std::to_string(pieces.size() * band) + " sampled rows (first/middle/last of the first and last head)";
  }
  const int d = p.head_dim;
  std::vector<std::vector<double>> ref_o(pieces.size()), ref_l(pieces.size());
  for (size_t x = 0; x < pieces.size(); ++x) {  // reference and plain attention first: the bound needs all rows
    const Piece& c = pieces[x];
    const int rows = c.i1 - c.i0;
    ref_o[x].resize(size_t(rows) * d), ref_l[x].resize(rows);
    fa::reference_forward_rows(p, c.b, c.h, c.i0, c.i1, q.data(), k.data(), v.data(), ref_o[x].data(), ref_l[x].data());
    std::vector<float> plain(size_t(rows) * d);
    fa::plain_lowp_forward_rows(t, p, c.b, c.h, c.i0, c.i1, q.data(), k.data(), v.data(), plain.data());
    for (size_t e = 0; e < plain.size(); ++e) r.plain_err = std::max(r.plain_err, std::fabs(plain[e] - ref_o[x][e]));
  }
  r.bound = fa::lowp_error_bound(t, r.plain_err);
  for (size_t x = 0; x < pieces.size(); ++x) {
    const Piece& c = pieces[x];
    r.o += fa::compare(o.data() + p.q_offset(c.b, c.h) + size_t(c.i0) * d, ref_o[x].data(), ref_o[x].size(),
                       fa::Tolerance{r.bound, 0});
    r.lse += fa::compare(lse.data() + p.lse_offset(c.b, c.h) + c.i0, ref_l[x].data(), ref_l[x].size(), kTolLse);
  }
  return r;
}

}  // namespace wsq

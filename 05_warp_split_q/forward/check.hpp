// How chapter 05 judges a result (the program and the GPU tests): O against the fp64 reference with the error
// rule of common/lowp.hpp (at most 2x the error of a plain same-dtype attention on the same rows, plus a
// floor), LSE against the reference with an absolute+relative tolerance, both on the rounded inputs.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
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

// The fp64 reference and the plain same-dtype attention on the rows to check, computed once per problem and
// then used for every step. q, k, v: the rounded inputs (as floats). Every row when the reference is cheap
// (below `budget` multiply-adds), else 16-row bands at the start, middle and end of the first and last head.
// With a block mask (block-sparse), both apply it.
struct LowpReference {
  struct Piece {
    int b, h, i0, i1;
  };
  std::vector<Piece> pieces;
  std::vector<std::vector<double>> o, lse;  // per piece
  double plain_err = 0, bound = 0;
  std::string what;
};

inline LowpReference lowp_reference(fa::Dtype t, const fa::Problem& p, const std::vector<float>& q,
                                    const std::vector<float>& k, const std::vector<float>& v, double budget = 2e9,
                                    const fa::BlockMask* mask = nullptr) {
  LowpReference r;
  if (2.0 * p.batch * p.heads * p.q_len * double(p.kv_len) * p.head_dim <= budget) {
    for (int b = 0; b < p.batch; ++b)
      for (int h = 0; h < p.heads; ++h) r.pieces.push_back({b, h, 0, p.q_len});
    r.what = "all " + std::to_string(p.lse_elems()) + " rows";
  } else {
    const int band = std::min(16, p.q_len);
    for (auto [b, h] : {std::pair<int, int>{0, 0}, {p.batch - 1, p.heads - 1}})
      for (int i0 : {0, (p.q_len - band) / 2, p.q_len - band}) r.pieces.push_back({b, h, i0, i0 + band});
    r.what = std::to_string(r.pieces.size() * band) + " sampled rows (first/middle/last of the first and last head)";
  }
  const int d = p.head_dim;
  for (const auto& c : r.pieces) {
    const int rows = c.i1 - c.i0;
    std::vector<double> ro(size_t(rows) * d), rl(rows);
    fa::reference_forward_rows(p, c.b, c.h, c.i0, c.i1, q.data(), k.data(), v.data(), ro.data(), rl.data(), nullptr,
                               mask);
    std::vector<float> plain(size_t(rows) * d);
    fa::plain_lowp_forward_rows(t, p, c.b, c.h, c.i0, c.i1, q.data(), k.data(), v.data(), plain.data(), mask);
    for (size_t e = 0; e < plain.size(); ++e) r.plain_err = std::max(r.plain_err, std::fabs(plain[e] - ro[e]));
    r.o.push_back(std::move(ro)), r.lse.push_back(std::move(rl));
  }
  r.bound = fa::lowp_error_bound(t, r.plain_err);
  return r;
}

// A kernel's whole outputs (O widened to float) against the reference rows.
inline LowpCheck check_lowp_forward(const fa::Problem& p, const LowpReference& ref, const std::vector<float>& o,
                                    const std::vector<float>& lse) {
  LowpCheck r;
  r.plain_err = ref.plain_err, r.bound = ref.bound, r.what = ref.what;
  for (size_t x = 0; x < ref.pieces.size(); ++x) {
    const auto& c = ref.pieces[x];
    r.o += fa::compare(o.data() + p.q_offset(c.b, c.h) + size_t(c.i0) * p.head_dim, ref.o[x].data(), ref.o[x].size(),
                       fa::Tolerance{ref.bound, 0});
    r.lse += fa::compare(lse.data() + p.lse_offset(c.b, c.h) + c.i0, ref.lse[x].data(), ref.lse[x].size(), kTolLse);
  }
  return r;
}

}  // namespace wsq

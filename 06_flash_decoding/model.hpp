// Chapter 06 in plain C++: split-KV decoding (partials per split, then the LSE merge), FlashDecoding++'s unified
// max with its fallback, the split heuristic and the byte counts. The CPU tests check it against the fp64
// reference; it walks the keys exactly as the kernels do (plan.hpp's rows, split ranges and warp chunks), so a
// wrong index shows up here first.
//
// Inputs are float vectors holding dtype values (fa::rounded), in the layouts of plan.hpp: Q [B, H, q_len, d],
// K, V [B, Hkv, N, d] with N = p.kv_len the capacity, lens[b] the context length of batch entry b.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "lowp.hpp"
#include "plan.hpp"
#include "reference.hpp"

namespace fdec_model {

using fdec::KeyRange;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A partial result of one split for one query row: O_s normalised by its own l_s, and LSE_s = m_s + log l_s.
// The empty split is (O_s = 0, LSE_s = -inf).
struct Partial {
  std::vector<float> o;
  float lse = kNegInf;
};

// The merge (chapter 01's operator across blocks): O = sum_s w_s O_s / sum_s w_s, w_s = exp(LSE_s - M),
// M = max_s LSE_s, LSE = M + log sum_s w_s. Empty partials carry no weight; all empty -> O = 0, LSE = -inf.
inline Partial merge(const std::vector<Partial>& parts, int d) {
  Partial out;
  out.o.assign(d, 0.f);
  float M = kNegInf;
  for (const Partial& s : parts) M = std::max(M, s.lse);
  if (M == kNegInf) return out;
  float L = 0.f;
  for (const Partial& s : parts) {
    if (s.lse == kNegInf) continue;  // never touch an empty split's O_s: in the kernel it is 0, but weight 0 says all
    const float w = std::exp(s.lse - M);
    L += w;
    for (int c = 0; c < d; ++c) out.o[c] += w * s.o[c];
  }
  for (int c = 0; c < d; ++c) out.o[c] /= L;
  out.lse = M + std::log(L);
  return out;
}

// How a split's softmax is referenced: the running max (Flash-Decoding) or a fixed phi (FlashDecoding++).
struct Softmax {
  bool unified = false;
  float phi = 0.f;
};

// Where the products are computed. cuda_cores: fp32 FMAs on the widened values, Q pre-scaled (every kernel but
// split_kv_mma). tensor_cores (split_kv_mma, README §4.3): S = (Q K_j^T) scale with Q as it is (the mma operand), and
// P rounded to the dtype before P V_j (its mma operand); l sums the unrounded P, as the kernel does.
enum class Products { cuda_cores, tensor_cores };

// One block of the split kernel: rows [r0, r0 + nrows) of unit u of batch entry b, over `keys` (split s's range,
// or a piece of split_kv_even). Returns one Partial per row and sets *tripped when the unified max had to fall
// back to the running max.
inline std::vector<Partial> split_block(const fa::Problem& p, const std::vector<int>& lens, const float* q,
                                        const float* k, const float* v, fdec::Rows R, int b, int u, int r0,
                                        int nrows, KeyRange keys, Softmax sm, bool* tripped, fa::Dtype t,
                                        Products products) {
  const bool tc = products == Products::tensor_cores;
  const int d = p.head_dim, n_b = lens[b];
  const fa::Problem pb = fdec::seen_by(p, n_b);
  const int hk = p.kv_head_of(R.head(u, r0));
  const float* K = k + p.kv_offset(b, hk);
  const float* V = v + p.kv_offset(b, hk);
  std::vector<std::vector<float>> qs(nrows, std::vector<float>(d));
  for (int r = 0; r < nrows; ++r)
    for (int c = 0; c < d; ++c)
      qs[r][c] = q[p.q_offset(b, R.head(u, r0 + r)) + size_t(R.query(r0 + r)) * d + c] * (tc ? 1.f : p.softmax_scale());

  // Per warp w and row r: the reference m (running max, or phi), l, O~ and the largest score seen.
  auto attend = [&](bool unified, std::vector<Partial>& out, bool* trip) {
    const int W = fdec::kWarps, L32 = fdec::kKeysPerWarp;
    std::vector<std::vector<float>> m(W, std::vector<float>(nrows)), l(W, std::vector<float>(nrows, 0.f)),
        mx(W, std::vector<float>(nrows, kNegInf));
    std::vector<std::vector<std::vector<float>>> acc(W, std::vector<std::vector<float>>(nrows, std::vector<float>(d, 0.f)));
    for (int w = 0; w < W; ++w)
      for (int r = 0; r < nrows; ++r) {
        m[w][r] = unified ? sm.phi : kNegInf;
        std::vector<float> l_lane(L32, 0.f);  // each lane keeps its own sum; reduced once at the end
        for (int c0 = keys.begin + w * L32; c0 < keys.end; c0 += W * L32) {
          float S[32], P[32];
          const int i = R.query(r0 + r);
          for (int lane = 0; lane < L32; ++lane) {
            const int key = c0 + lane;
            S[lane] = kNegInf;
            if (key < keys.end && pb.visible(i, key)) {
              float acc_s = 0.f;
              for (int c = 0; c < d; ++c) acc_s += qs[r][c] * K[size_t(key) * d + c];
              S[lane] = tc ? acc_s * p.softmax_scale() : acc_s;
            }
          }
          float alpha = 1.f, m_use = sm.phi;
          if (!unified) {
            float m_new = m[w][r];
            for (float x : S) m_new = std::max(m_new, x);
            m_use = m_new == kNegInf ? 0.f : m_new;  // nothing visible yet: avoid (-inf) - (-inf)
            alpha = std::exp(m[w][r] - m_use);
            m[w][r] = m_new;
          }
          for (int lane = 0; lane < L32; ++lane) {
            P[lane] = std::exp(S[lane] - m_use);
            l_lane[lane] = l_lane[lane] * alpha + P[lane];
            mx[w][r] = std::max(mx[w][r], S[lane]);
          }
          for (int c = 0; c < d; ++c) {
            float a = acc[w][r][c] * alpha;
            for (int jj = 0; jj < L32; ++jj)
              if (c0 + jj < keys.end) a += (tc ? fa::round_to(t, P[jj]) : P[jj]) * V[size_t(c0 + jj) * d + c];
            acc[w][r][c] = a;
          }
        }
        for (float x : l_lane) l[w][r] += x;
      }
    // The fallback test looks at the split's largest score (over all warps), as the kernel does.
    for (int r = 0; r < nrows; ++r) {
      float M = kNegInf;
      for (int w = 0; w < W; ++w) M = std::max(M, mx[w][r]);
      if (unified && fdec::unified_max_trips(M, sm.phi)) *trip = true;
    }
    // Combine the warps (chapter 01's merge once more, inside the block).
    out.assign(nrows, Partial{});
    for (int r = 0; r < nrows; ++r) {
      float M = kNegInf, Lsum = 0.f;
      for (int w = 0; w < W; ++w) M = std::max(M, m[w][r]);
      std::vector<float> o(d, 0.f);
      for (int w = 0; w < W; ++w) {
        if (m[w][r] == kNegInf) continue;
        const float wt = std::exp(m[w][r] - M);
        Lsum += wt * l[w][r];
        for (int c = 0; c < d; ++c) o[c] += wt * acc[w][r][c];
      }
      out[r].o.assign(d, 0.f);
      if (Lsum > 0.f) {
        for (int c = 0; c < d; ++c) out[r].o[c] = o[c] / Lsum;
        out[r].lse = M + std::log(Lsum);
      }
    }
  };
  std::vector<Partial> out;
  bool trip = false;
  attend(sm.unified, out, &trip);
  if (trip) attend(false, out, &trip);  // the fallback: recompute this split with the running max
  *tripped = trip;
  return out;
}

struct Result {
  std::vector<float> o, lse;  // o rounded to the dtype (the kernels store O in it), lse fp32
  int fallbacks = 0, blocks = 0;  // split blocks that fell back to the running max, of all split blocks
};

// The whole chapter-06 forward: every (batch, unit, row chunk, split) block, then the merge per query row.
inline Result forward(fa::Dtype t, const fa::Problem& p, const std::vector<int>& lens, const std::vector<float>& q,
                      const std::vector<float>& k, const std::vector<float>& v, bool packed, int splits, Softmax sm,
                      Products products = Products::cuda_cores) {
  const fdec::Rows R = fdec::rows_of(p, packed);
  const int d = p.head_dim, rows = R.per_unit();
  const int bucket = fdec::row_bucket(rows, products == Products::tensor_cores);
  Result res;
  res.o.assign(p.q_elems(), 0.f), res.lse.assign(p.lse_elems(), 0.f);
  for (int b = 0; b < p.batch; ++b)
    for (int u = 0; u < fdec::units_of(p, packed); ++u)
      for (int r0 = 0; r0 < rows; r0 += bucket) {
        const int nrows = std::min(bucket, rows - r0);
        std::vector<std::vector<Partial>> per_row(nrows);
        for (int s = 0; s < splits; ++s) {
          bool tripped = false;
          const auto parts =
              split_block(p, lens, q.data(), k.data(), v.data(), R, b, u, r0, nrows, fdec::split_range(lens[b], splits, s),
                          sm, &tripped, t, products);
          res.fallbacks += tripped, res.blocks += 1;
          for (int r = 0; r < nrows; ++r) per_row[r].push_back(parts[r]);
        }
        for (int r = 0; r < nrows; ++r) {
          const int h = R.head(u, r0 + r), i = R.query(r0 + r);
          const Partial m = merge(per_row[r], d);
          for (int c = 0; c < d; ++c) res.o[p.q_offset(b, h) + size_t(i) * d + c] = fa::round_to(t, m.o[c]);
          res.lse[p.lse_offset(b, h) + i] = m.lse;
        }
      }
  return res;
}

// Every piece of split_kv_even (README §4.5) on `blocks` blocks, block by block in launch order, walked as the
// kernel walks them (plan.hpp's EvenWalk). tiles_per_entry: the kv groups x row chunks of 16 rows.
inline std::vector<fdec::Piece> even_pieces(const fa::Problem& p, const std::vector<int>& lens, int blocks) {
  const int tiles_per_entry = p.kv_heads * fdec::row_chunks(fdec::rows_of(p, true).per_unit());
  fdec::EvenWalk walk = fdec::even_walk(lens.data(), p.batch, tiles_per_entry, blocks);
  std::vector<fdec::Piece> pieces;
  for (int k = 0; k < walk.C; ++k) {
    const long long x1 = fdec::even_begin(k + 1, walk.T, walk.C);
    for (long long x = fdec::even_begin(k, walk.T, walk.C); x < x1; x = pieces.back().next)
      pieces.push_back(walk.piece(k, x, x1));
  }
  return pieces;
}

// split_kv_even on `blocks` blocks: each piece a split_kv_mma block over its keys, each tile's pieces merged in
// order. pieces, if given, receives the pieces (the CPU tests check the decomposition).
inline Result forward_even(fa::Dtype t, const fa::Problem& p, const std::vector<int>& lens, const std::vector<float>& q,
                           const std::vector<float>& k, const std::vector<float>& v, int blocks,
                           std::vector<fdec::Piece>* pieces = nullptr) {
  const fdec::Rows R = fdec::rows_of(p, true);
  const int d = p.head_dim, rows = R.per_unit(), chunks = fdec::row_chunks(rows), tiles_per_entry = p.kv_heads * chunks;
  const std::vector<fdec::Piece> all = even_pieces(p, lens, blocks);
  if (pieces) *pieces = all;
  // per (entry, tile): per row, the partials in piece order
  std::vector<std::vector<std::vector<Partial>>> parts(size_t(p.batch) * tiles_per_entry);
  Result res;
  res.o.assign(p.q_elems(), 0.f), res.lse.assign(p.lse_elems(), 0.f);
  for (const fdec::Piece& pc : all) {
    const int u = pc.tile / chunks, r0 = (pc.tile % chunks) * fdec::kMaxRows, nrows = std::min(fdec::kMaxRows, rows - r0);
    bool tripped = false;
    const auto out = split_block(p, lens, q.data(), k.data(), v.data(), R, pc.b, u, r0, nrows, pc.keys, Softmax{},
                                 &tripped, t, Products::tensor_cores);
    auto& tile = parts[size_t(pc.b) * tiles_per_entry + pc.tile];
    tile.resize(nrows);
    for (int r = 0; r < nrows; ++r) tile[r].push_back(out[r]);
    res.blocks += 1;
  }
  for (int b = 0; b < p.batch; ++b)
    for (int tile = 0; tile < tiles_per_entry; ++tile) {
      const int u = tile / chunks, r0 = (tile % chunks) * fdec::kMaxRows;
      const auto& per_row = parts[size_t(b) * tiles_per_entry + tile];
      for (int r = 0; r < int(per_row.size()); ++r) {
        const int h = R.head(u, r0 + r), i = R.query(r0 + r);
        const Partial m = merge(per_row[r], d);
        for (int c = 0; c < d; ++c) res.o[p.q_offset(b, h) + size_t(i) * d + c] = fa::round_to(t, m.o[c]);
        res.lse[p.lse_offset(b, h) + i] = m.lse;
      }
    }
  return res;
}

// ---- references on ragged lengths: per batch entry, the cache rows 0 .. n_b - 1 as a problem of its own ----
struct BatchView {
  fa::Problem p;  // batch 1, kv_len n_b
  std::vector<float> q, k, v;
};
inline BatchView batch_view(const fa::Problem& p, int n_b, const float* q, const float* k, const float* v, int b) {
  BatchView bv;
  bv.p = p, bv.p.batch = 1, bv.p.kv_len = n_b;
  const size_t qn = size_t(p.heads) * p.q_len * p.head_dim, rown = size_t(n_b) * p.head_dim;
  bv.q.assign(q + p.q_offset(b, 0), q + p.q_offset(b, 0) + qn);
  for (int hk = 0; hk < p.kv_heads; ++hk) {
    bv.k.insert(bv.k.end(), k + p.kv_offset(b, hk), k + p.kv_offset(b, hk) + rown);
    bv.v.insert(bv.v.end(), v + p.kv_offset(b, hk), v + p.kv_offset(b, hk) + rown);
  }
  return bv;
}

// fp64 reference (o, lse in Q's and LSE's layouts) on ragged lengths; n_b = 0 gives O = 0, LSE = -inf.
inline void reference(const fa::Problem& p, const std::vector<int>& lens, const std::vector<float>& q,
                      const std::vector<float>& k, const std::vector<float>& v, std::vector<double>& o,
                      std::vector<double>& lse) {
  o.assign(p.q_elems(), 0.0), lse.assign(p.lse_elems(), -std::numeric_limits<double>::infinity());
  for (int b = 0; b < p.batch; ++b) {
    if (lens[b] == 0) continue;
    const BatchView bv = batch_view(p, lens[b], q.data(), k.data(), v.data(), b);
    std::vector<double> ob, lb;
    fa::reference_forward(bv.p, bv.q.data(), bv.k.data(), bv.v.data(), ob, lb);
    std::copy(ob.begin(), ob.end(), o.begin() + p.q_offset(b, 0));
    std::copy(lb.begin(), lb.end(), lse.begin() + p.lse_offset(b, 0));
  }
}

// The plain same-dtype attention (the yardstick of the 2x error rule) on ragged lengths: O only.
inline std::vector<float> plain(fa::Dtype t, const fa::Problem& p, const std::vector<int>& lens,
                                const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v) {
  std::vector<float> o(p.q_elems(), 0.f);
  for (int b = 0; b < p.batch; ++b) {
    if (lens[b] == 0) continue;
    const BatchView bv = batch_view(p, lens[b], q.data(), k.data(), v.data(), b);
    for (int h = 0; h < p.heads; ++h)
      fa::plain_lowp_forward_rows(t, bv.p, 0, h, 0, p.q_len, bv.q.data(), bv.k.data(), bv.v.data(),
                                  o.data() + p.q_offset(b, h));
  }
  return o;
}

// ---- the split heuristic (README §4) ----
// Splits worth having for a sequence of n keys: each split keeps >= kMinSplitKeys keys, at most kMaxSplits.
inline int max_splits(int n) { return std::clamp((n + fdec::kMinSplitKeys - 1) / fdec::kMinSplitKeys, 1, fdec::kMaxSplits); }

// blocks = blocks without splitting (batch x units x row chunks); slots = the SMs (the program passes the device's
// SM count). Not SMs x resident blocks: on an H100 the sweep of B = 1, GQA 32/8, 32k measured 2019 GB/s at 16
// splits (128 blocks, one per SM) against 1883 at the 48 that counting 3 resident blocks per SM chose. A second
// block on an SM shares that SM's bandwidth rather than adding its own; what counts is the bytes each SM keeps in
// flight (README §4.1), and every extra split adds a partial to write and merge.
// Time ~ waves(S) x keys per block ~ ceil(blocks S / slots) x n / S: pick the smallest S within 5% of the best
// over 1 .. max_splits(n). Once the unsplit grid gives every SM a block, S = 1.
constexpr double kHeuristicSlack = 1.05;
inline int choose_splits(long long blocks, int n, int slots) {
  if (blocks >= slots || n <= 0) return 1;
  auto cost = [&](int s) { return double((blocks * s + slots - 1) / slots) / s; };
  double best = cost(1);
  for (int s = 2; s <= max_splits(n); ++s) best = std::min(best, cost(s));
  for (int s = 1;; ++s)
    if (cost(s) <= kHeuristicSlack * best) return s;
}

// ---- bytes ----
// The K and V bytes a decode step must read at least: every visible key's K and V row once (per kv head).
inline double kv_bytes(const fa::Problem& p, const std::vector<int>& lens, int elem) {
  double keys = 0;
  for (int b = 0; b < p.batch; ++b) keys += lens[b];
  return 2.0 * elem * keys * p.kv_heads * p.head_dim;
}
// What a kernel's loads ask for: K/V once per unit and row chunk (an unpacked kernel reads a kv head once per
// query head of its group), plus Q read, O and LSE written, and with splits > 1 the workspace written and read
// back by the merge (O_s fp32 and LSE_s per row and split) and O written by the merge instead. bucket: the kernel's
// row bucket (plan.hpp's row_bucket; flat_gemm's 8 cuts a unit into more row chunks than 16 does).
inline double model_hbm_bytes(const fa::Problem& p, const std::vector<int>& lens, int elem, bool packed, int splits,
                              int bucket = fdec::kMaxRows) {
  const fdec::Rows R = fdec::rows_of(p, packed);
  const double reads_per_kv_head = double(packed ? 1 : p.group()) * fdec::row_chunks(R.per_unit(), bucket);
  const double rows = double(p.lse_elems());
  double bytes = kv_bytes(p, lens, elem) * reads_per_kv_head + rows * p.head_dim * elem * 2 + rows * 4;
  if (splits > 1) bytes += 2.0 * splits * rows * (p.head_dim + 1) * 4;
  return bytes;
}

// split_kv_even on `blocks` blocks: as the packed kernels with one split, plus, for every piece of a tile cut in
// more than one, its partial (O_s and LSE_s of each row) written and read back by the merge.
inline double model_hbm_bytes_even(const fa::Problem& p, const std::vector<int>& lens, int elem, int blocks) {
  const int rows = fdec::rows_of(p, true).per_unit(), chunks = fdec::row_chunks(rows);
  double bytes = model_hbm_bytes(p, lens, elem, true, 1);
  for (const fdec::Piece& pc : even_pieces(p, lens, blocks)) {
    const int r0 = (pc.tile % chunks) * fdec::kMaxRows;
    if (pc.parts > 1) bytes += 2.0 * std::min(fdec::kMaxRows, rows - r0) * (p.head_dim + 1) * 4;
  }
  return bytes;
}

}  // namespace fdec_model

// Chapter 05 model: the kernels' tiled algorithm in plain C++, rounding where they round, so that the CPU can
// check the algorithm (and the two warp partitions) against the fp64 reference before any GPU runs it.
//   - S = Q K^T accumulated in fp32 over the 16-bit inputs (given here as their float values), masked to -inf;
//   - the online softmax of FA2 (README, Algorithm 1) per K/V tile of Bc keys, up to kv_end (block skipping);
//   - P rounded to the dtype for the P V product, l summed from the unrounded fp32 P, O rounded at the end;
//   - base e (steps 1-5) or base 2 with scale*log2(e) folded (steps 6-7);
//   - the P V product of tile j either right after its softmax (steps 1-9) or deferred to tile j + 1 and added
//     before that tile's rescale (step 10's software pipeline: O~ = alpha_{j+1} (O~ + P_j V_j));
//   - split-Q (each row's statistics in one place) or split-K (the tile's keys cut into slices of 16, one
//     per warp: the partial maxima combined per tile, a partial l per slice added at the end, O~ the sum of
//     the slices' products), the two partitions of Part A.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "lowp.hpp"
#include "problem.hpp"

namespace wsq_model {

enum class Partition { split_q, split_k };

struct Config {
  int Br = 64, Bc = 64;
  Partition partition = Partition::split_q;
  bool base2 = false;         // step 6 onwards
  int slice = 16;             // split-K: keys per warp
  bool deferred_pv = false;   // step 10: P_j V_j added in the next iteration, before its rescale
};

// The last key any row of the Q block [i0, i0 + Br) sees, plus one: the K/V loop stops there (causal).
inline int kv_end(const fa::Problem& p, int i0, int Br) { return p.visible_keys(std::min(i0 + Br, p.q_len) - 1); }

// Merging two partial softmax results over disjoint key sets (m = max, l = sum of exp(s - m), o = sum of
// exp(s - m) v, unnormalised): the identity split-K relies on, and Flash-Decoding after it.
struct Partial {
  double m = -INFINITY, l = 0;
  std::vector<double> o;
};
inline Partial combine(const Partial& a, const Partial& b) {
  Partial r;
  r.m = std::max(a.m, b.m);
  const double use = r.m == -INFINITY ? 0 : r.m;
  const double fa_ = std::exp(a.m - use), fb = std::exp(b.m - use);
  r.l = a.l * fa_ + b.l * fb;
  r.o.resize(a.o.size());
  for (size_t c = 0; c < a.o.size(); ++c) r.o[c] = a.o[c] * fa_ + b.o[c] * fb;
  return r;
}

// o: [B,H,Nq,d] rounded to the dtype (as floats), lse: [B,H,Nq].
inline void forward(fa::Dtype t, const fa::Problem& p, const Config& cfg, const float* q, const float* k,
                    const float* v, std::vector<float>& o, std::vector<float>& lse) {
  const int d = p.head_dim, Br = cfg.Br, Bc = cfg.Bc;
  const float log2e = 1.4426950408889634f;
  const float mul = cfg.base2 ? p.softmax_scale() * log2e : p.softmax_scale();
  auto ex = [&](float x) { return cfg.base2 ? std::exp2(x) : std::exp(x); };
  const int slices = cfg.partition == Partition::split_k ? Bc / cfg.slice : 1;
  const int width = Bc / slices;
  o.assign(p.q_elems(), 0.f), lse.assign(p.lse_elems(), 0.f);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) {
      const float* Q = q + p.q_offset(b, h);
      const float* K = k + p.kv_offset(b, p.kv_head_of(h));
      const float* V = v + p.kv_offset(b, p.kv_head_of(h));
      for (int i0 = 0; i0 < p.q_len; i0 += Br) {  // one GPU block
        const int end = kv_end(p, i0, Br);
        for (int i = i0; i < std::min(i0 + Br, p.q_len); ++i) {
          float m = -INFINITY;
          std::vector<float> l(slices, 0.f), acc(d, 0.f), pending(d, 0.f), s(Bc);
          for (int j0 = 0; j0 < end; j0 += Bc) {
            for (int c = 0; c < Bc; ++c) {  // S row, fp32 accumulation, masked (tail keys too)
              const int j = j0 + c;
              float dot = 0.f;
              if (j < p.kv_len)
                for (int e = 0; e < d; ++e) dot += Q[size_t(i) * d + e] * K[size_t(j) * d + e];
              s[c] = p.visible(i, j) ? dot * mul : -INFINITY;
            }
            float m_new = m;  // split-K: the max of the slices' maxima, the same number
            for (int w = 0; w < slices; ++w)
              for (int c = w * width; c < (w + 1) * width; ++c) m_new = std::max(m_new, s[c]);
            const float use = m_new == -INFINITY ? 0.f : m_new;
            const float alpha = ex(m - use);
            if (cfg.deferred_pv) {  // the previous tile's P V lands now, then the rescale of this tile
              for (int e = 0; e < d; ++e) acc[e] += pending[e];
              std::fill(pending.begin(), pending.end(), 0.f);
            }
            for (float& a : acc) a *= alpha;
            for (int w = 0; w < slices; ++w) {
              float sum = 0.f;
              std::vector<float> part(d, 0.f);  // split-K: this slice's P V, added to O~ as one piece
              for (int c = w * width; c < (w + 1) * width; ++c) {
                const float pe = ex(s[c] - use);
                sum += pe;
                const float pr = fa::round_to(t, pe);  // P rounded for the mma
                const int j = j0 + c;
                if (j < p.kv_len)
                  for (int e = 0; e < d; ++e) part[e] += pr * V[size_t(j) * d + e];
              }
              l[w] = alpha * l[w] + sum;
              for (int e = 0; e < d; ++e) (cfg.deferred_pv ? pending : acc)[e] += part[e];
            }
            m = m_new;
          }
          for (int e = 0; e < d; ++e) acc[e] += pending[e];  // the last tile's deferred P V (zeros otherwise)
          float l_row = 0.f;
          for (float x : l) l_row += x;
          const float inv = l_row > 0.f ? 1.f / l_row : 0.f;
          for (int e = 0; e < d; ++e) o[p.q_offset(b, h) + size_t(i) * d + e] = fa::round_to(t, acc[e] * inv);
          const float L = cfg.base2 ? (m + std::log2(l_row)) * 0.6931471805599453f : m + std::log(l_row);
          lse[p.lse_offset(b, h) + i] = l_row > 0.f ? L : -INFINITY;
        }
      }
    }
}

// Tiles (Q block, K/V block) the kernels visit per head, and how many of them hold at least one visible pair
// (block skipping must never skip one of those).
inline long long tiles_visited(const fa::Problem& p, int Br, int Bc) {
  long long n = 0;
  for (int i0 = 0; i0 < p.q_len; i0 += Br) n += (kv_end(p, i0, Br) + Bc - 1) / Bc;
  return n;
}

}  // namespace wsq_model

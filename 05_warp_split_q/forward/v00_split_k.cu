// Part A, split-K: the same arithmetic as step 1 (v01_mma.cu: the same mma.sync m16n8k16 products, plain shared
// loads, P rounded to the dtype through shared memory), with the other warp partition. The Br x Bc tile of
// S_ij is cut by columns: warp w owns keys 16w .. 16w+15 of every K_j, V_j tile and computes S, P for ALL Br
// rows of Q_i on them. A row's softmax statistics and its O~ row are then spread over all warps, so they are
// combined through shared memory in every step (FA1's "sliced-K" scheme; seed FA2 section 3.3):
//   line 5   S_ij[:, w] = scale Q_i K_j[w]^T            each warp reads all of Q_i (A fragments) from shared
//   line 6   m_w = rowmax S_ij[:, w] -> shared            barrier: m_new = max(m_i, max_w m_w) in every warp
//            P_ij[:, w] = exp(S_ij[:, w] - m_new) -> shared (this warp's columns)
//   line 7   l_w = exp(m_i - m_new) l_w + rowsum P_ij[:, w]   per warp; the l_w are added once, at the end
//   line 8   O~_i = exp(m_i - m_new) O~_i                  O~_i lives in shared memory (fp32), rescaled, barrier
//            O~_i += P_ij[:, w] V_j[w]                      every warp adds its partial product (shared atomics)
//   line 9   O_i = O~_i / sum_w l_w, L_i = m_i + log sum_w l_w
// Barriers per K/V tile: 4 (split-Q: 2). Shared-memory traffic per tile: see the README's Part A formulas.
// Thread mapping: 4 warps = Bc / 16. Every lane keeps m for its rows (g, g+8) of every 16-row m-tile: all
// warps compute the same m_new from the same shared partial maxima.
// Shared memory: (Br + 2 Bc) d + Br Bc 16-bit values + Br d + 2 x 4 Br floats = 50 KiB (d = 64), 90 KiB (d = 128).
#include "launch.cuh"
#include "tc.cuh"
#include "steps.hpp"

namespace wsq {
namespace {

constexpr int kBr = 64, kBc = 64;

// rows [row0, row0 + Rows) of a [n_rows, D] matrix -> shared [Rows][D]; rows past n_rows are zero-filled.
template <class T, int Rows, int D, int Threads>
__device__ void load_tile(T* dst, const T* src, int row0, int n_rows) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < Rows * kChunks; c += Threads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (row0 + r < n_rows) x = *reinterpret_cast<const uint4*>(src + size_t(row0 + r) * D + col);
    *reinterpret_cast<uint4*>(dst + r * D + col) = x;
  }
}

template <class T, int D, int Br, int Bc>
__global__ void __launch_bounds__(Bc / 16 * 32, 1)
    kernel(fa::Problem p, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
           float* __restrict__ lse) {
  constexpr int kWarps = Bc / 16, kThreads = 32 * kWarps;  // one 16-key slice of K_j, V_j per warp
  constexpr int kMTiles = Br / 16;  // 16-row m-tiles of Q_i: every warp works on all of them
  constexpr int kStepsQK = D / 16;  // k-steps of S = Q K^T
  constexpr int kTilesO = D / 8;    // n-tiles of O
  static_assert(Br % 16 == 0 && Bc % 16 == 0 && D % 16 == 0, "tiles are whole 16x16 mma steps");
  static_assert(kMTiles == kWarps, "warp w rescales the O~ rows of m-tile w: as many m-tiles as warps");

  extern __shared__ __align__(16) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem);
  T* Ks = Qs + Br * D;
  T* Vs = Ks + Bc * D;
  T* Ps = Vs + Bc * D;
  float* Os = reinterpret_cast<float*>(Ps + Br * Bc);  // O~_i [Br][D], shared by all warps
  float* m_parts = Os + Br * D;                           // [kWarps][Br] partial row maxima
  float* l_parts = m_parts + kWarps * Br;                    // [kWarps][Br] partial row sums (at the end)

  const int i0 = blockIdx.x * Br, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = frag::group(lane), t = frag::thread_in_group(lane);
  const int key0 = 16 * warp;  // the warp's first key in each K/V tile
  const T* Q = q + p.q_offset(b, h);
  const T* K = k + p.kv_offset(b, p.kv_head_of(h));
  const T* V = v + p.kv_offset(b, p.kv_head_of(h));

  load_tile<T, Br, D, kThreads>(Qs, Q, i0, p.q_len);  // line 1
  for (int x = threadIdx.x; x < Br * D; x += kThreads) Os[x] = 0.f;  // line 2
  __syncthreads();

  float m[kMTiles][2], l[kMTiles][2];  // rows 16 mt + g + 8r; l: this warp's keys only
  for (int mt = 0; mt < kMTiles; ++mt)
    for (int r = 0; r < 2; ++r) m[mt][r] = -INFINITY, l[mt][r] = 0.f;
  const float scale = p.softmax_scale();
  const int kv_end = p.visible_keys(min(i0 + Br, p.q_len) - 1);  // causal: blocks past the diagonal skipped

  for (int j0 = 0; j0 < kv_end; j0 += Bc) {  // line 3
    __syncthreads();                          // barrier 1: the previous tile's reads and O~ additions are done
    load_tile<T, Bc, D, kThreads>(Ks, K, j0, p.kv_len);  // line 4
    load_tile<T, Bc, D, kThreads>(Vs, V, j0, p.kv_len);
    __syncthreads();  // barrier 2

    float s[kMTiles][2][4] = {};  // line 5: all rows x this warp's 16 keys (two n-tiles)
    for (int mt = 0; mt < kMTiles; ++mt)
      for (int kk = 0; kk < kStepsQK; ++kk) {
        uint32_t qa[4];
        for (int r = 0; r < 4; ++r) {
          const frag::RowCol e = frag::a_elem(lane, 2 * r);
          qa[r] = lds32(Qs + (16 * mt + e.row) * D + 16 * kk + e.col);
        }
        for (int n = 0; n < 2; ++n) {
          uint32_t kb[2];
          for (int r = 0; r < 2; ++r) {
            const frag::RowCol e = frag::b_elem(lane, 2 * r);
            kb[r] = lds32(Ks + (key0 + 8 * n + e.col) * D + 16 * kk + e.row);
          }
          mma_16816<T>(s[mt][n], qa, kb);
        }
      }

    const bool need_mask = j0 + Bc > p.kv_len || (p.causal && j0 + Bc - 1 > i0 + p.causal_shift());
    for (int mt = 0; mt < kMTiles; ++mt)
      for (int n = 0; n < 2; ++n)
        for (int e = 0; e < 4; ++e) {
          const frag::RowCol c = frag::c_elem(lane, e);
          const bool keep = !need_mask || p.visible(i0 + 16 * mt + c.row, j0 + key0 + 8 * n + c.col);
          s[mt][n][e] = keep ? s[mt][n][e] * scale : -INFINITY;
        }
    for (int mt = 0; mt < kMTiles; ++mt)  // line 6: this warp's row maxima -> shared
      for (int r = 0; r < 2; ++r) {
        float mx = -INFINITY;
        for (int n = 0; n < 2; ++n) mx = fmaxf(mx, fmaxf(s[mt][n][2 * r], s[mt][n][2 * r + 1]));
        mx = quad_max(mx);
        if (t == 0) m_parts[warp * Br + 16 * mt + g + 8 * r] = mx;
      }
    __syncthreads();  // barrier 3: every warp's maxima are in

    for (int mt = 0; mt < kMTiles; ++mt)
      for (int r = 0; r < 2; ++r) {
        const int row = 16 * mt + g + 8 * r;
        float m_new = m[mt][r];
        for (int w = 0; w < kWarps; ++w) m_new = fmaxf(m_new, m_parts[w * Br + row]);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;
        const float alpha = expf(m[mt][r] - m_use);
        float sum = 0.f;
        for (int n = 0; n < 2; ++n) {
          float* c = s[mt][n] + 2 * r;
          c[0] = expf(c[0] - m_use), c[1] = expf(c[1] - m_use);
          sum += c[0] + c[1];
          *reinterpret_cast<uint32_t*>(Ps + row * Bc + key0 + 8 * n + 2 * t) = pack2<T>(c[0], c[1]);
        }
        l[mt][r] = alpha * l[mt][r] + sum;  // line 7
        m[mt][r] = m_new;
        if (mt == warp)  // line 8, first half: warp w rescales the O~ rows of m-tile w, 4 lanes per row
          for (int col = t; col < D; col += 4) Os[row * D + col] *= alpha;
      }
    __syncthreads();  // barrier 4: O~ rescaled everywhere before any warp adds to it

    for (int mt = 0; mt < kMTiles; ++mt) {  // line 8, second half: O~ += P[:, w] V[w]
      uint32_t pa[4];
      for (int r = 0; r < 4; ++r) {
        const frag::RowCol e = frag::a_elem(lane, 2 * r);
        pa[r] = lds32(Ps + (16 * mt + e.row) * Bc + key0 + e.col);
      }
      for (int n = 0; n < kTilesO; ++n) {
        uint32_t vb[2];
        for (int r = 0; r < 2; ++r) {
          const frag::RowCol e = frag::b_elem(lane, 2 * r);
          const T* at = Vs + (key0 + e.row) * D + 8 * n + e.col;
          vb[r] = pack2_bits(at[0], at[D]);
        }
        float part[4] = {};
        mma_16816<T>(part, pa, vb);
        for (int e = 0; e < 4; ++e) {
          const frag::RowCol c = frag::c_elem(lane, e);
          atomicAdd(Os + (16 * mt + c.row) * D + 8 * n + c.col, part[e]);
        }
      }
    }
  }

  for (int mt = 0; mt < kMTiles; ++mt)  // line 9: the l_w of all warps are added
    for (int r = 0; r < 2; ++r) {
      const float lw = quad_sum(l[mt][r]);
      if (t == 0) l_parts[warp * Br + 16 * mt + g + 8 * r] = lw;
    }
  __syncthreads();
  for (int x = threadIdx.x; x < Br * D / 2; x += kThreads) {
    const int row = x / (D / 2), col = 2 * (x % (D / 2));
    const int i = i0 + row;
    if (i >= p.q_len) continue;
    float l_row = 0.f;
    for (int w = 0; w < kWarps; ++w) l_row += l_parts[w * Br + row];
    const float inv_l = l_row > 0.f ? 1.f / l_row : 0.f;
    *reinterpret_cast<uint32_t*>(o + p.q_offset(b, h) + size_t(i) * D + col) =
        pack2<T>(Os[row * D + col] * inv_l, Os[row * D + col + 1] * inv_l);
  }
  if (warp == 0 && t == 0)  // every warp holds m for every row; warp 0 writes L
    for (int mt = 0; mt < kMTiles; ++mt)
      for (int r = 0; r < 2; ++r) {
        const int row = 16 * mt + g + 8 * r, i = i0 + row;
        if (i >= p.q_len) continue;
        float l_row = 0.f;
        for (int w = 0; w < kWarps; ++w) l_row += l_parts[w * Br + row];
        lse[p.lse_offset(b, h) + i] = l_row > 0.f ? m[mt][r] + logf(l_row) : -INFINITY;
      }
}

template <class T, int D>
void run(const fa::Problem& p, const T* q, const T* k, const T* v, T* o, float* lse) {
  using Tc = typename fa::CudaType<T>::type;
  constexpr int kWarps = kBc / 16;
  constexpr size_t smem =
      sizeof(Tc) * ((kBr + 2 * kBc) * D + kBr * kBc) + sizeof(float) * (kBr * D + 2 * kWarps * kBr);
  launch<T>(kernel<Tc, D, kBr, kBc>, kBr, kWarps * 32, smem, p, q, k, v, o, lse);
}

}  // namespace

template <class T>
void forward_split_k(const fa::Problem& p, const T* q, const T* k, const T* v, T* o, float* lse) {
  if (p.head_dim == 64) run<T, 64>(p, q, k, v, o, lse);
  else run<T, 128>(p, q, k, v, o, lse);
}
WSQ_INSTANTIATE(forward_split_k)

}  // namespace wsq

// Step 2: ldmatrix. The same kernel as step 1; the operands now reach registers with ldmatrix.x4 (one
// instruction loads a whole 16x16 A fragment, or the B fragments of two n-tiles) and V's B fragments with
// ldmatrix.x4.trans, which transposes 8x8 blocks on the way instead of gathering 16-bit values one by one.
// frag.hpp says which row address each lane supplies (a_tile_*, nk_tile_*); test_frag.cpp checks it.
//
// Computes, for one Q block Q_i of Br rows (README, Algorithm 1):
//   line 1   load Q_i into shared memory, then each warp reads its 16 rows as A fragments, once
//   line 2   m_i = -inf, l_i = 0, O~_i = 0                        (registers of the warp that owns the rows)
//   line 3   for each K/V block j (causal: only up to the last key the block's last row sees)
//   line 4     load K_j, V_j into shared memory (all warps read all of them: split-Q)
//   line 5     S_ij = scale Q_i K_j^T                               mma.sync m16n8k16, fp32 accumulation
//   line 6     m_new = max(m_i, rowmax S_ij), P_ij = exp(S_ij - m_new)  (masked entries are -inf -> P = 0)
//   line 7     l_i = exp(m_i - m_new) l_i + rowsum P_ij
//   line 8     O~_i = exp(m_i - m_new) O~_i + P_ij V_j               P rounded to the dtype for the mma
//   line 9   O_i = O~_i / l_i, L_i = m_i + log l_i                  (l_i = 0: O = 0, L = -inf)
// Thread mapping: Br / 16 warps; warp w owns rows 16w .. 16w+15 of the block (split-Q): its S, P, m, l and O~
// rows never leave the warp, so the only barriers are the two around each K/V load.
// Operands reach the tensor cores by ldmatrix (.trans for V); P goes through shared memory (each warp its own
// rows) to become an A operand.
// Shared memory: (Br + 2 Bc) d + Br Bc 16-bit values = 32 KiB (d = 64), 56 KiB (d = 128) at Br = Bc = 64.
#include "launch.cuh"
#include "tc.cuh"
#include "steps.hpp"

namespace wsq {
namespace {

constexpr int kBr = 64, kBc = 64;

// rows [row0, row0 + Br) of a [n_rows, D] matrix -> shared [Br][D]; rows past n_rows are zero-filled.
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
__global__ void __launch_bounds__(Br / 16 * 32, 1)
    kernel(fa::Problem p, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
           float* __restrict__ lse) {
  constexpr int kWarps = Br / 16, kThreads = 32 * kWarps;
  constexpr int kStepsQK = D / 16;  // k-steps of S = Q K^T
  constexpr int kTilesS = Bc / 8;   // n-tiles of S (8 keys each)
  constexpr int kStepsPV = Bc / 16; // k-steps of O += P V
  constexpr int kTilesO = D / 8;    // n-tiles of O (8 columns each)
  static_assert(Br % 16 == 0 && Bc % 16 == 0 && D % 16 == 0, "tiles are whole 16x16 mma steps");

  extern __shared__ __align__(16) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem);
  T* Ks = Qs + Br * D;
  T* Vs = Ks + Bc * D;
  T* Ps = Vs + Bc * D;

  const int i0 = blockIdx.x * Br, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = frag::group(lane), t = frag::thread_in_group(lane);
  const int wr = 16 * warp;  // the warp's first row in the block
  const T* Q = q + p.q_offset(b, h);
  const T* K = k + p.kv_offset(b, p.kv_head_of(h));
  const T* V = v + p.kv_offset(b, p.kv_head_of(h));

  load_tile<T, Br, D, kThreads>(Qs, Q, i0, p.q_len);  // line 1
  __syncthreads();
  uint32_t qf[kStepsQK][4];
  for (int kk = 0; kk < kStepsQK; ++kk)
    ldmatrix_x4(qf[kk], Qs + (wr + frag::a_tile_row(lane)) * D + 16 * kk + frag::a_tile_col(lane));

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // line 2: rows g and g + 8 of the warp
  float acc[kTilesO][4] = {};
  const float scale = p.softmax_scale();
  const int kv_end = p.visible_keys(min(i0 + Br, p.q_len) - 1);  // causal: blocks past the diagonal skipped

  for (int j0 = 0; j0 < kv_end; j0 += Bc) {  // line 3
    __syncthreads();                          // every warp is done with the previous K_j, V_j
    load_tile<T, Bc, D, kThreads>(Ks, K, j0, p.kv_len);  // line 4
    load_tile<T, Bc, D, kThreads>(Vs, V, j0, p.kv_len);
    __syncthreads();

    float s[kTilesS][4] = {};  // line 5
    for (int np = 0; np < kTilesS / 2; ++np)  // two n-tiles (16 keys) per ldmatrix.x4
      for (int kk = 0; kk < kStepsQK; ++kk) {
        uint32_t kb[4];
        ldmatrix_x4(kb, Ks + (16 * np + frag::nk_tile_row(lane)) * D + 16 * kk + frag::nk_tile_col(lane));
        mma_16816<T>(s[2 * np], qf[kk], kb);
        mma_16816<T>(s[2 * np + 1], qf[kk], kb + 2);
      }

    // Only a tile that crosses the causal diagonal or the end of the keys needs the per-element test.
    const bool need_mask = j0 + Bc > p.kv_len || (p.causal && j0 + Bc - 1 > i0 + p.causal_shift());
    for (int n = 0; n < kTilesS; ++n)
      for (int e = 0; e < 4; ++e) {
        const frag::RowCol c = frag::c_elem(lane, e);
        const bool keep = !need_mask || p.visible(i0 + wr + c.row, j0 + 8 * n + c.col);
        s[n][e] = keep ? s[n][e] * scale : -INFINITY;
      }

    for (int r = 0; r < 2; ++r) {  // lines 6-7, row g + 8r; the 4 lanes of a group share the row
      float mx = m[r];
      for (int n = 0; n < kTilesS; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      const float m_new = quad_max(mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: exp(-inf - 0) = 0
      const float alpha = expf(m[r] - m_use);
      float sum = 0.f;
      for (int n = 0; n < kTilesS; ++n)
        for (int e = 2 * r; e < 2 * r + 2; ++e) sum += (s[n][e] = expf(s[n][e] - m_use));
      l[r] = alpha * l[r] + sum;  // this lane's share of the row sum; the 4 shares are added at the end
      m[r] = m_new;
      for (int n = 0; n < kTilesO; ++n) acc[n][2 * r] *= alpha, acc[n][2 * r + 1] *= alpha;
    }

    // line 8: P (rounded to the dtype) through shared memory, then back as A fragments. Each warp writes and
    // reads only its own 16 rows, so a warp-level barrier is enough.
    for (int n = 0; n < kTilesS; ++n)
      for (int r = 0; r < 2; ++r) {
        const frag::RowCol c = frag::c_elem(lane, 2 * r);
        *reinterpret_cast<uint32_t*>(Ps + (wr + c.row) * Bc + 8 * n + c.col) = pack2<T>(s[n][2 * r], s[n][2 * r + 1]);
      }
    __syncwarp();
    for (int kk = 0; kk < kStepsPV; ++kk) {
      uint32_t pf[4];
      ldmatrix_x4(pf, Ps + (wr + frag::a_tile_row(lane)) * Bc + 16 * kk + frag::a_tile_col(lane));
      for (int np = 0; np < kTilesO / 2; ++np) {  // B[k][n] = V[k][n]: .trans turns V's rows into B columns
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, Vs + (16 * kk + frag::a_tile_row(lane)) * D + 16 * np + frag::a_tile_col(lane));
        mma_16816<T>(acc[2 * np], pf, vb);
        mma_16816<T>(acc[2 * np + 1], pf, vb + 2);
      }
    }
    __syncwarp();  // the next tile's P overwrites these rows
  }

  for (int r = 0; r < 2; ++r) {  // line 9
    const float l_row = quad_sum(l[r]);
    const float inv_l = l_row > 0.f ? 1.f / l_row : 0.f;
    const int i = i0 + wr + g + 8 * r;
    if (i >= p.q_len) continue;
    T* O = o + p.q_offset(b, h) + size_t(i) * D;
    for (int n = 0; n < kTilesO; ++n)
      *reinterpret_cast<uint32_t*>(O + 8 * n + 2 * t) = pack2<T>(acc[n][2 * r] * inv_l, acc[n][2 * r + 1] * inv_l);
    if (t == 0) lse[p.lse_offset(b, h) + i] = l_row > 0.f ? m[r] + logf(l_row) : -INFINITY;
  }
}

template <class T, int D>
void run(const fa::Problem& p, const T* q, const T* k, const T* v, T* o, float* lse) {
  using Tc = typename fa::CudaType<T>::type;
  constexpr size_t smem = sizeof(Tc) * ((kBr + 2 * kBc) * D + kBr * kBc);
  launch<T>(kernel<Tc, D, kBr, kBc>, kBr, kBr / 16 * 32, smem, p, q, k, v, o, lse);
}

}  // namespace

template <class T>
void forward_v2_ldmatrix(const fa::Problem& p, const T* q, const T* k, const T* v, T* o, float* lse) {
  if (p.head_dim == 64) run<T, 64>(p, q, k, v, o, lse);
  else run<T, 128>(p, q, k, v, o, lse);
}
WSQ_INSTANTIATE(forward_v2_ldmatrix)

}  // namespace wsq

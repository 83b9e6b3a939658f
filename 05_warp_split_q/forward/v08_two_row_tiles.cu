// Step 8: two row tiles per warp. Steps 1-7 give each warp 16 query rows (one m16 tile of the mma), so every
// K_j or V_j fragment a warp reads from shared memory by ldmatrix feeds exactly one mma. Here each warp owns
// 32 rows (kM = 2 m16 tiles) and uses every B fragment it reads twice: shared-memory reads per mma halve.
// Why that should help: an SM reads 128 bytes of shared memory per clock, and an m16n8k16 mma (4096 FLOPs)
// needs a 256-byte B fragment, so at one B fragment per mma the shared-memory port alone caps the SM at 2048
// FLOPs per clock, below what its tensor cores can do (a ceiling, not a measurement: README section 4).
// Br = 128 with 4 warps; the registers per lane grow (two sets of S, O~, m, l, and Q's A fragments), so a
// block of 128 threads takes the registers 8 warps took in step 7.
//
// Computes, for one Q block Q_i of Br rows (README, Algorithm 1):
//   line 1   load Q_i into shared memory, then each warp reads its 32 rows as A fragments, once
//   line 2   m_i = -inf, l_i = 0, O~_i = 0                        (registers of the warp that owns the rows)
//   line 3   for each K/V block j (causal: only up to the last key the block's last row sees)
//   line 4     load K_j, V_j into shared memory (all warps read all of them: split-Q)
//   line 5     S_ij = scale Q_i K_j^T                               mma.sync m16n8k16, fp32 accumulation
//   line 6     m_new = max(m_i, rowmax S_ij), P_ij = exp(S_ij - m_new)  (masked entries are -inf -> P = 0)
//   line 7     l_i = exp(m_i - m_new) l_i + rowsum P_ij
//   line 8     O~_i = exp(m_i - m_new) O~_i + P_ij V_j               P rounded to the dtype for the mma
//   line 9   O_i = O~_i / l_i, L_i = m_i + log l_i                  (l_i = 0: O = 0, L = -inf)
// Thread mapping: Br / (16 kM) warps; warp w owns rows 16 kM w .. 16 kM w + 16 kM - 1 of the block, as kM row
// tiles mi of 16 rows: tile mi holds rows 16 kM w + 16 mi + g and + g + 8 in lane (g, t).
// Operands reach the tensor cores by ldmatrix (.trans for V); P never leaves the registers.
// Shared memory: (Br + 4 Bc) d 16-bit values = 48 KiB (d = 64: 128 x 64), 64 KiB (d = 128: 128 x 32).
#include "launch.cuh"
#include "tc.cuh"
#include "steps.hpp"

namespace wsq {
namespace {

// Rows of a Q block and of a K/V block per head_dim, and where Q's A fragments live. At d = 128 the O~
// accumulators alone take 2 x 64 registers per lane; Q's fragments (2 x 32 more) would push the kernel past
// 255 registers into spills, so there each warp re-reads them from shared memory for every K/V tile.
template <int D>
struct Tiles;
template <>
struct Tiles<64> {
  static constexpr int Br = 128, Bc = 64;
  static constexpr bool q_in_registers = true;
};
template <>
struct Tiles<128> {
  static constexpr int Br = 128, Bc = 32;
  static constexpr bool q_in_registers = false;
};
constexpr int kM = 2;  // m16 row tiles per warp

constexpr int kStages = 2;  // K/V buffers: the tile being computed and the one being loaded
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// Starts copying rows [row0, row0 + Rows) of a [n_rows, D] matrix into shared [Rows][D], swizzled; rows past
// n_rows are zero-filled without being read (their source address is clamped to row 0, which exists).
template <class T, int Rows, int D, int Threads>
__device__ void load_tile_async(T* dst, const T* src, int row0, int n_rows) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < Rows * kChunks; c += Threads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = row0 + r < n_rows;
    cp_async_16(dst + frag::swizzled(r, col, D), src + size_t(valid ? row0 + r : 0) * D + col, valid);
  }
}

template <class T, int D, int Br, int Bc>
__global__ void __launch_bounds__(Br / (16 * kM) * 32, 1)
    kernel(fa::Problem p, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
           float* __restrict__ lse) {
  constexpr int kWarps = Br / (16 * kM), kThreads = 32 * kWarps;
  constexpr int kStepsQK = D / 16;  // k-steps of S = Q K^T
  constexpr int kTilesS = Bc / 8;   // n-tiles of S (8 keys each)
  constexpr int kStepsPV = Bc / 16; // k-steps of O += P V
  constexpr int kTilesO = D / 8;    // n-tiles of O (8 columns each)
  static_assert(Br % (16 * kM) == 0 && Bc % 16 == 0 && D % 16 == 0, "tiles are whole 16x16 mma steps");
  static_assert(D % 64 == 0, "the swizzle permutes 8 chunks: rows must be multiples of 8 chunks");

  extern __shared__ __align__(16) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem);
  T* Ks = Qs + Br * D;              // kStages buffers of [Bc][D]
  T* Vs = Ks + kStages * Bc * D;    // kStages buffers of [Bc][D]

  const int i0 = blockIdx.x * Br, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = frag::group(lane), t = frag::thread_in_group(lane);
  const int wr = 16 * kM * warp;  // the warp's first row in the block
  const T* Q = q + p.q_offset(b, h);
  const T* K = k + p.kv_offset(b, p.kv_head_of(h));
  const T* V = v + p.kv_offset(b, p.kv_head_of(h));

  const int kv_end = p.visible_keys(min(i0 + Br, p.q_len) - 1);  // causal: blocks past the diagonal skipped
  const int n_tiles = (kv_end + Bc - 1) / Bc;
  load_tile_async<T, Br, D, kThreads>(Qs, Q, i0, p.q_len);  // line 1, and tile 0 of K and V into buffer 0
  if (n_tiles > 0) {
    load_tile_async<T, Bc, D, kThreads>(Ks, K, 0, p.kv_len);
    load_tile_async<T, Bc, D, kThreads>(Vs, V, 0, p.kv_len);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  // Q's A fragments of row tile mi, k-step kk: read once here, or at every K/V tile (see Tiles).
  constexpr bool kQRegs = Tiles<D>::q_in_registers;
  auto load_q = [&](uint32_t(&a)[4], int mi, int kk) {
    ldmatrix_x4(a, Qs + frag::swizzled(wr + 16 * mi + frag::a_tile_row(lane), 16 * kk + frag::a_tile_col(lane), D));
  };
  uint32_t qf[kQRegs ? kM : 1][kQRegs ? kStepsQK : 1][4];
  if constexpr (kQRegs) {
    #pragma unroll
    for (int mi = 0; mi < kM; ++mi)
      #pragma unroll
      for (int kk = 0; kk < kStepsQK; ++kk) load_q(qf[mi][kk], mi, kk);
  }

  // line 2: per row tile mi, rows g and g + 8 of the tile
  float m[kM][2], l[kM][2], acc[kM][kTilesO][4] = {};
  #pragma unroll
  for (int mi = 0; mi < kM; ++mi) m[mi][0] = m[mi][1] = -INFINITY, l[mi][0] = l[mi][1] = 0.f;
  const float scale_log2 = p.softmax_scale() * kLog2e;  // S in base-2 units

  for (int tile = 0; tile < n_tiles; ++tile) {  // line 3
    const int j0 = tile * Bc;
    if (tile + 1 < n_tiles) {  // line 4 of the next tile, into the other buffer
      const int next = (tile + 1) % kStages;
      load_tile_async<T, Bc, D, kThreads>(Ks + next * Bc * D, K, j0 + Bc, p.kv_len);
      load_tile_async<T, Bc, D, kThreads>(Vs + next * Bc * D, V, j0 + Bc, p.kv_len);
    }
    cp_async_commit();   // possibly an empty group, so that the wait below always means "all but the newest"
    cp_async_wait<1>();  // this thread's copies of tile j have landed ...
    __syncthreads();     // ... and every other thread's too
    const T* Ks_j = Ks + (tile % kStages) * Bc * D;
    const T* Vs_j = Vs + (tile % kStages) * Bc * D;

    float s[kM][kTilesS][4] = {};  // line 5: each K fragment read once, used by both row tiles
    #pragma unroll
    for (int kk = 0; kk < kStepsQK; ++kk) {
      uint32_t qa[kM][4];
      #pragma unroll
      for (int mi = 0; mi < kM; ++mi)
        #pragma unroll
        for (int x = 0; x < 4; ++x) {
          if constexpr (!kQRegs) {
            if (x == 0) load_q(qa[mi], mi, kk);
          } else {
            qa[mi][x] = qf[mi][kk][x];
          }
        }
      #pragma unroll
      for (int np = 0; np < kTilesS / 2; ++np) {  // two n-tiles (16 keys) per ldmatrix.x4
        uint32_t kb[4];
        ldmatrix_x4(kb, Ks_j + frag::swizzled(16 * np + frag::nk_tile_row(lane), 16 * kk + frag::nk_tile_col(lane), D));
        #pragma unroll
        for (int mi = 0; mi < kM; ++mi) {
          mma_16816<T>(s[mi][2 * np], qa[mi], kb);
          mma_16816<T>(s[mi][2 * np + 1], qa[mi], kb + 2);
        }
      }
    }

    // Only a tile that crosses the causal diagonal or the end of the keys needs the per-element test.
    const bool need_mask = j0 + Bc > p.kv_len || (p.causal && j0 + Bc - 1 > i0 + p.causal_shift());
    #pragma unroll
    for (int mi = 0; mi < kM; ++mi)
      #pragma unroll
      for (int n = 0; n < kTilesS; ++n)
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
          const frag::RowCol c = frag::c_elem(lane, e);
          const bool keep = !need_mask || p.visible(i0 + wr + 16 * mi + c.row, j0 + 8 * n + c.col);
          s[mi][n][e] = keep ? s[mi][n][e] * scale_log2 : -INFINITY;
        }

    #pragma unroll
    for (int mi = 0; mi < kM; ++mi)
      #pragma unroll
      for (int r = 0; r < 2; ++r) {  // lines 6-7, row g + 8r of tile mi; the 4 lanes of a group share the row
        float mx = m[mi][r];
        #pragma unroll
        for (int n = 0; n < kTilesS; ++n) mx = fmaxf(mx, fmaxf(s[mi][n][2 * r], s[mi][n][2 * r + 1]));
        const float m_new = quad_max(mx);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: exp(-inf - 0) = 0
        const float alpha = exp2f(m[mi][r] - m_use);
        float sum = 0.f;
        #pragma unroll
        for (int n = 0; n < kTilesS; ++n)
          #pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e) sum += (s[mi][n][e] = exp2f(s[mi][n][e] - m_use));
        l[mi][r] = alpha * l[mi][r] + sum;  // this lane's share of the row sum; the 4 shares are added at the end
        m[mi][r] = m_new;
        #pragma unroll
        for (int n = 0; n < kTilesO; ++n) acc[mi][n][2 * r] *= alpha, acc[mi][n][2 * r + 1] *= alpha;
      }

    // line 8: P (rounded to the dtype) straight from the C fragments of S to the A fragments of P; each V
    // fragment read once, used by both row tiles.
    #pragma unroll
    for (int kk = 0; kk < kStepsPV; ++kk) {
      uint32_t pf[kM][4];
      #pragma unroll
      for (int mi = 0; mi < kM; ++mi)
        #pragma unroll
        for (int r = 0; r < 4; ++r) {
          const float* c = s[mi][2 * kk + frag::p_from_s_ntile(r)] + frag::p_from_s_celem(r);
          pf[mi][r] = pack2<T>(c[0], c[1]);
        }
      #pragma unroll
      for (int np = 0; np < kTilesO / 2; ++np) {  // B[k][n] = V[k][n]: .trans turns V's rows into B columns
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, Vs_j + frag::swizzled(16 * kk + frag::a_tile_row(lane), 16 * np + frag::a_tile_col(lane), D));
        #pragma unroll
        for (int mi = 0; mi < kM; ++mi) {
          mma_16816<T>(acc[mi][2 * np], pf[mi], vb);
          mma_16816<T>(acc[mi][2 * np + 1], pf[mi], vb + 2);
        }
      }
    }
    __syncthreads();  // every warp is done with buffer tile % 2 before it is refilled
  }

  #pragma unroll
  for (int mi = 0; mi < kM; ++mi)
    #pragma unroll
    for (int r = 0; r < 2; ++r) {  // line 9
      const float l_row = quad_sum(l[mi][r]);
      const float inv_l = l_row > 0.f ? 1.f / l_row : 0.f;
      const int i = i0 + wr + 16 * mi + g + 8 * r;
      if (i >= p.q_len) continue;
      T* O = o + p.q_offset(b, h) + size_t(i) * D;
      #pragma unroll
      for (int n = 0; n < kTilesO; ++n)
        *reinterpret_cast<uint32_t*>(O + 8 * n + 2 * t) =
            pack2<T>(acc[mi][n][2 * r] * inv_l, acc[mi][n][2 * r + 1] * inv_l);
      if (t == 0) lse[p.lse_offset(b, h) + i] = l_row > 0.f ? (m[mi][r] + log2f(l_row)) * kLn2 : -INFINITY;
    }
}

template <class T, int D>
void run(const fa::Problem& p, const T* q, const T* k, const T* v, T* o, float* lse) {
  using Tc = typename fa::CudaType<T>::type;
  constexpr int Br = Tiles<D>::Br, Bc = Tiles<D>::Bc;
  constexpr size_t smem = sizeof(Tc) * (Br + 2 * kStages * Bc) * D;
  launch<T>(kernel<Tc, D, Br, Bc>, Br, Br / (16 * kM) * 32, smem, p, q, k, v, o, lse);
}

}  // namespace

template <class T>
void forward_v8_two_row_tiles(const fa::Problem& p, const T* q, const T* k, const T* v, T* o, float* lse) {
  if (p.head_dim == 64) run<T, 64>(p, q, k, v, o, lse);
  else run<T, 128>(p, q, k, v, o, lse);
}
WSQ_INSTANTIATE(forward_v8_two_row_tiles)

}  // namespace wsq

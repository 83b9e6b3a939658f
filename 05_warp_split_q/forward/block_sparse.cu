// Step 8, block-sparse: v08_two_row_tiles.cu with a block mask (04's README, section 6). `diff v08_two_row_tiles.cu
// block_sparse.cu` is the whole change: the K/V loop runs over the tiles the mask lets through, and the cp.async
// pipeline prefetches the next *visible* tile, so a masked tile is never loaded and costs no FLOPs; the buffer
// is chosen by the iteration count, no longer by the tile index. Within a visible tile the per-element test is
// the causal/length one of step 8 (a tile lies inside one mask block, so the mask is constant over it).
// Everything else - thread mapping (4 warps x 32 rows), registers, shared memory (48 / 64 KiB) - is step 8's.
// A null mask runs step 8 itself.
#include "block_mask.hpp"
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
           float* __restrict__ lse, const uint8_t* __restrict__ block_mask) {
  constexpr int kWarps = Br / (16 * kM), kThreads = 32 * kWarps;
  static_assert(fa::kMaskRows % Br == 0 && fa::kMaskCols % Bc == 0, "a tile lies inside one block of the mask");
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
  // The first K/V tile at or after `tile` that the block mask lets through (n_tiles if none); the same for the
  // whole block, so every thread takes the same path.
  const int mask_cols = fa::mask_cols_of(p.kv_len);
  auto next_visible = [&](int tile) {
    while (tile < n_tiles && !fa::block_visible(block_mask, mask_cols, i0, tile * Bc)) ++tile;
    return tile;
  };
  int tile = next_visible(0);
  load_tile_async<T, Br, D, kThreads>(Qs, Q, i0, p.q_len);  // line 1, and the first K/V tile into buffer 0
  if (tile < n_tiles) {
    load_tile_async<T, Bc, D, kThreads>(Ks, K, tile * Bc, p.kv_len);
    load_tile_async<T, Bc, D, kThreads>(Vs, V, tile * Bc, p.kv_len);
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

  for (int it = 0; tile < n_tiles; ++it) {  // line 3: iteration it computes tile `tile` from buffer it % kStages
    const int j0 = tile * Bc;
    const int next_tile = next_visible(tile + 1);
    if (next_tile < n_tiles) {  // line 4 of the next tile, into the other buffer
      const int next = (it + 1) % kStages;
      load_tile_async<T, Bc, D, kThreads>(Ks + next * Bc * D, K, next_tile * Bc, p.kv_len);
      load_tile_async<T, Bc, D, kThreads>(Vs + next * Bc * D, V, next_tile * Bc, p.kv_len);
    }
    cp_async_commit();   // possibly an empty group, so that the wait below always means "all but the newest"
    cp_async_wait<1>();  // this thread's copies of tile j have landed ...
    __syncthreads();     // ... and every other thread's too
    const T* Ks_j = Ks + (it % kStages) * Bc * D;
    const T* Vs_j = Vs + (it % kStages) * Bc * D;

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
    __syncthreads();  // every warp is done with buffer it % 2 before it is refilled
    tile = next_tile;
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
void run(const fa::Problem& p, const T* q, const T* k, const T* v, T* o, float* lse, const uint8_t* block_mask) {
  using Tc = typename fa::CudaType<T>::type;
  constexpr int Br = Tiles<D>::Br, Bc = Tiles<D>::Bc;
  constexpr size_t smem = sizeof(Tc) * (Br + 2 * kStages * Bc) * D;
  launch_masked<T>(kernel<Tc, D, Br, Bc>, Br, Br / (16 * kM) * 32, smem, p, q, k, v, o, lse, block_mask);
}

}  // namespace

template <class T>
void forward_block_sparse(const fa::Problem& p, const T* q, const T* k, const T* v, T* o, float* lse,
                          const uint8_t* block_mask) {
  if (!block_mask) return forward_v8_two_row_tiles<T>(p, q, k, v, o, lse);
  if (p.head_dim == 64) run<T, 64>(p, q, k, v, o, lse, block_mask);
  else run<T, 128>(p, q, k, v, o, lse, block_mask);
}
template void forward_block_sparse<fa::half_t>(const fa::Problem&, const fa::half_t*, const fa::half_t*,
                                               const fa::half_t*, fa::half_t*, float*, const uint8_t*);
template void forward_block_sparse<fa::bfloat16_t>(const fa::Problem&, const fa::bfloat16_t*, const fa::bfloat16_t*,
                                                   const fa::bfloat16_t*, fa::bfloat16_t*, float*, const uint8_t*);

}  // namespace wsq
